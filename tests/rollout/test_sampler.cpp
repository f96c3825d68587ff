// Sampler: empirical frequencies match the intended distribution (chi-square at fixed seeds)
// under temperature, top-k and top-p; greedy; log-probs over the full vocabulary; and the same
// (seed, stream, counter) giving the same token wherever the row sits in the batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <string>

#include "core/error.h"
#include "core/rng.h"
#include "rollout/sampler.h"

namespace verl::rollout {
namespace {

const std::vector<float> kLogits = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 0.0f, 1.5f, -0.5f, 2.5f, 0.2f};

std::vector<double> softmax(const std::vector<float>& l, double t) {
  double m = *std::max_element(l.begin(), l.end());
  std::vector<double> p(l.size());
  double s = 0;
  for (size_t i = 0; i < l.size(); ++i) s += p[i] = std::exp((l[i] - m) / t);
  for (double& x : p) x /= s;
  return p;
}

// 0.999 quantiles of chi-square with df = 1..9.
double chi2_q999(int df) {
  static const double q[] = {0,      10.828, 13.816, 16.266, 18.467,
                             20.515, 22.458, 24.322, 26.124, 27.877};
  return q[df];
}

std::vector<int> draw_counts(Sampler& s, const SamplingParams& p, int draws, uint64_t stream) {
  std::vector<int> counts(kLogits.size(), 0);
  for (int i = 0; i < draws; ++i) {
    ++counts[static_cast<size_t>(
        s.sample_one(kLogits, {&p, stream, static_cast<uint64_t>(i)}).token)];
  }
  return counts;
}

// Pearson chi-square over the tokens with expected probability > 0; a draw of a token with
// expected probability 0 is reported through `impossible`.
double chi_square(const std::vector<int>& counts, const std::vector<double>& expected, int draws,
                  int* df, int* impossible) {
  double chi = 0;
  *df = -1;
  *impossible = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected[i] == 0) {
      *impossible += counts[i];
      continue;
    }
    const double e = expected[i] * draws;
    chi += (counts[i] - e) * (counts[i] - e) / e;
    ++*df;
  }
  return chi;
}

TEST(Sampler, TemperatureMatchesSoftmaxChiSquare) {
  Sampler s(10);
  constexpr int kDraws = 20000;
  for (float t : {0.7f, 1.3f}) {
    SamplingParams p;
    p.temperature = t;
    p.seed = 2024;
    const auto counts = draw_counts(s, p, kDraws, 3);
    int df, impossible;
    const double chi = chi_square(counts, softmax(kLogits, t), kDraws, &df, &impossible);
    EXPECT_EQ(df, 9);
    EXPECT_LT(chi, chi2_q999(df)) << "temperature " << t;
    // Power check: the same counts are clearly not from the temperature-1 distribution.
    const double chi_wrong = chi_square(counts, softmax(kLogits, 1.0), kDraws, &df, &impossible);
    EXPECT_GT(chi_wrong, 10 * chi2_q999(df)) << "temperature " << t;
  }
}

TEST(Sampler, TopKKeepsOnlyTheKLargest) {
  Sampler s(10);
  SamplingParams p;
  p.top_k = 3;
  p.seed = 99;
  constexpr int kDraws = 20000;
  const auto counts = draw_counts(s, p, kDraws, 0);
  // Top 3 logits: token 4 (3.0), 8 (2.5), 1 (2.0), renormalised.
  std::vector<double> e(10, 0.0);
  const auto full = softmax(kLogits, 1.0);
  const double z = full[4] + full[8] + full[1];
  for (int i : {4, 8, 1}) e[static_cast<size_t>(i)] = full[static_cast<size_t>(i)] / z;
  int df, impossible;
  const double chi = chi_square(counts, e, kDraws, &df, &impossible);
  EXPECT_EQ(df, 2);
  EXPECT_EQ(impossible, 0);
  EXPECT_LT(chi, chi2_q999(df));
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
  Sampler s(10);
  SamplingParams p;
  p.top_p = 0.8f;
  p.seed = 5;
  constexpr int kDraws = 20000;
  const auto counts = draw_counts(s, p, kDraws, 11);
  // Sorted probabilities of kLogits at T=1: token 4 .389, 8 .236, 1 .143, 6 .087 (cumulative
  // .767, .854): the nucleus for 0.8 is {4, 8, 1, 6}, far enough from the boundary.
  const auto full = softmax(kLogits, 1.0);
  std::vector<double> e(10, 0.0);
  double z = 0;
  for (int i : {4, 8, 1, 6}) z += full[static_cast<size_t>(i)];
  ASSERT_LT(z - full[6], 0.79);
  ASSERT_GT(z, 0.81);
  for (int i : {4, 8, 1, 6}) e[static_cast<size_t>(i)] = full[static_cast<size_t>(i)] / z;
  int df, impossible;
  const double chi = chi_square(counts, e, kDraws, &df, &impossible);
  EXPECT_EQ(df, 3);
  EXPECT_EQ(impossible, 0);
  EXPECT_LT(chi, chi2_q999(df));
}

TEST(Sampler, TopKThenTopPWithTemperature) {
  Sampler s(10);
  SamplingParams p;
  p.temperature = 1.3f;
  p.top_k = 5;
  p.top_p = 0.7f;
  p.seed = 17;
  constexpr int kDraws = 20000;
  const auto counts = draw_counts(s, p, kDraws, 2);
  // Expected: the top-5 at T = 1.3 renormalised, then the smallest prefix reaching 0.7.
  const auto full = softmax(kLogits, 1.3);
  std::vector<int> order(10);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return full[static_cast<size_t>(a)] > full[static_cast<size_t>(b)];
  });
  double zk = 0;
  for (int j = 0; j < 5; ++j) zk += full[static_cast<size_t>(order[static_cast<size_t>(j)])];
  std::vector<double> e(10, 0.0);
  double cum = 0;
  int kept = 0;
  while (cum < 0.7) cum += full[static_cast<size_t>(order[static_cast<size_t>(kept++)])] / zk;
  ASSERT_EQ(kept, 3);  // renormalised .374, .254, .173: cumulative .628 < 0.7 <= .801
  double zp = 0;
  for (int j = 0; j < kept; ++j) zp += full[static_cast<size_t>(order[static_cast<size_t>(j)])];
  for (int j = 0; j < kept; ++j) {
    e[static_cast<size_t>(order[static_cast<size_t>(j)])] =
        full[static_cast<size_t>(order[static_cast<size_t>(j)])] / zp;
  }
  int df, impossible;
  const double chi = chi_square(counts, e, kDraws, &df, &impossible);
  EXPECT_EQ(df, 2);
  EXPECT_EQ(impossible, 0);
  EXPECT_LT(chi, chi2_q999(df));
}

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler s(6);
  SamplingParams p;
  p.temperature = 0.0f;
  const std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 0.0f};
  const SampleResult r = s.sample_one(l, {&p, 0, 0});
  EXPECT_EQ(r.token, 1);
  const auto full = softmax(l, 1.0);
  EXPECT_NEAR(r.logprob, std::log(full[1]), 1e-6);
  // Greedy ignores the random stream entirely.
  for (uint64_t c = 1; c < 20; ++c) EXPECT_EQ(s.sample_one(l, {&p, c, c}).token, 1);
}

// The returned log-prob is over the full vocabulary at the temperature, even when top-k/top-p
// truncate what can be drawn.
TEST(Sampler, LogprobIsFullVocabLogSoftmaxAtTemperature) {
  constexpr int32_t V = 1000;
  std::vector<float> l(V);
  Rng rng(77, 0);
  for (float& x : l) x = 3.0f * rng.normal();
  Sampler s(V);
  struct Case {
    float t;
    int32_t k;
    float top_p;
  };
  for (const Case c :
       {Case{1.0f, -1, 1.0f}, Case{0.6f, 20, 1.0f}, Case{1.7f, -1, 0.9f}, Case{0.9f, 50, 0.5f}}) {
    SamplingParams p;
    p.temperature = c.t;
    p.top_k = c.k;
    p.top_p = c.top_p;
    const auto full = softmax(l, c.t);
    for (uint64_t i = 0; i < 50; ++i) {
      const SampleResult r = s.sample_one(l, {&p, 1, i});
      ASSERT_GE(r.token, 0);
      ASSERT_LT(r.token, V);
      EXPECT_NEAR(r.logprob, std::log(full[static_cast<size_t>(r.token)]), 2e-5)
          << "T " << c.t << " k " << c.k;
    }
  }
}

// Large vocabulary, flat logits: the nucleus holds hundreds of tokens, so the chunked partial
// sort runs several rounds; draws stay inside the nucleus computed by a full sort.
TEST(Sampler, TopPOnLargeVocabStaysInNucleus) {
  constexpr int32_t V = 5000;
  std::vector<float> l(V);
  Rng rng(3, 1);
  for (float& x : l) x = 0.5f * rng.normal();
  const auto full = softmax(l, 1.0);
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return l[static_cast<size_t>(a)] > l[static_cast<size_t>(b)];
  });
  double cum = 0;
  std::set<int32_t> nucleus;
  for (int32_t j = 0; j < V && cum < 0.9; ++j) {
    cum += full[static_cast<size_t>(order[static_cast<size_t>(j)])];
    nucleus.insert(order[static_cast<size_t>(j)]);
  }
  ASSERT_GT(nucleus.size(), 1000u);
  Sampler s(V);
  SamplingParams p;
  p.top_p = 0.9f;
  std::set<int32_t> seen;
  for (uint64_t i = 0; i < 3000; ++i) {
    const int32_t tok = s.sample_one(l, {&p, 0, i}).token;
    ASSERT_TRUE(nucleus.count(tok)) << "token " << tok << " outside the 0.9 nucleus";
    seen.insert(tok);
  }
  EXPECT_GT(seen.size(), 500u);  // and it really samples across it
}

TEST(Sampler, MaskedTokensAreNeverDrawn) {
  std::vector<float> l = kLogits;
  l[4] = -INFINITY;
  l[8] = -INFINITY;
  Sampler s(10);
  SamplingParams p;
  for (uint64_t i = 0; i < 2000; ++i) {
    const int32_t tok = s.sample_one(l, {&p, 0, i}).token;
    ASSERT_NE(tok, 4);
    ASSERT_NE(tok, 8);
  }
  std::vector<float> bad(10, -INFINITY);
  EXPECT_THROW(s.sample_one(bad, {&p, 0, 0}), Error);
}

// A row's token and log-prob depend only on its logits and (seed, stream, counter), not on the
// batch it is in or its position there.
TEST(Sampler, SameKeySameTokenAnywhereInTheBatch) {
  constexpr int32_t V = 300;
  constexpr int kRows = 12;
  std::vector<float> logits(static_cast<size_t>(kRows) * V);
  Rng rng(11, 0);
  for (float& x : logits) x = 2.0f * rng.normal();
  std::vector<SamplingParams> params(kRows);
  std::vector<SampleRow> rows(kRows);
  for (int i = 0; i < kRows; ++i) {
    params[static_cast<size_t>(i)].temperature = 0.5f + 0.1f * static_cast<float>(i);
    params[static_cast<size_t>(i)].top_k = i % 3 == 0 ? 40 : -1;
    params[static_cast<size_t>(i)].top_p = i % 2 == 0 ? 0.9f : 1.0f;
    params[static_cast<size_t>(i)].seed = 1000 + static_cast<uint64_t>(i % 4);
    rows[static_cast<size_t>(i)] = {&params[static_cast<size_t>(i)], static_cast<uint64_t>(i * 7),
                                    static_cast<uint64_t>(i)};
  }
  Sampler s(V);
  std::vector<int32_t> tok(kRows);
  std::vector<float> lp(kRows);
  s.sample(logits.data(), rows, tok.data(), lp.data());
  // Reversed batch order.
  std::vector<float> rev_logits(logits.size());
  std::vector<SampleRow> rev_rows(kRows);
  for (int i = 0; i < kRows; ++i) {
    std::copy_n(logits.begin() + i * V, V, rev_logits.begin() + (kRows - 1 - i) * V);
    rev_rows[static_cast<size_t>(kRows - 1 - i)] = rows[static_cast<size_t>(i)];
  }
  std::vector<int32_t> rev_tok(kRows);
  std::vector<float> rev_lp(kRows);
  s.sample(rev_logits.data(), rev_rows, rev_tok.data(), rev_lp.data());
  for (int i = 0; i < kRows; ++i) {
    EXPECT_EQ(tok[static_cast<size_t>(i)], rev_tok[static_cast<size_t>(kRows - 1 - i)])
        << "row " << i;
    EXPECT_EQ(lp[static_cast<size_t>(i)], rev_lp[static_cast<size_t>(kRows - 1 - i)])
        << "row " << i;
    // Alone, as a batch of one.
    const SampleResult r =
        s.sample_one({logits.data() + i * V, static_cast<size_t>(V)}, rows[static_cast<size_t>(i)]);
    EXPECT_EQ(r.token, tok[static_cast<size_t>(i)]);
  }
  // The key matters: other counters of row 1 give other tokens (so the equality above is not
  // trivially true), and the seed too.
  std::set<int32_t> by_counter, by_seed;
  for (uint64_t c = 0; c < 40; ++c) {
    SampleRow r = rows[1];
    r.counter = c;
    by_counter.insert(s.sample_one({logits.data() + V, static_cast<size_t>(V)}, r).token);
    SamplingParams q = params[1];
    q.seed = c;
    by_seed.insert(s.sample_one({logits.data() + V, static_cast<size_t>(V)},
                                {&q, rows[1].stream, rows[1].counter})
                       .token);
  }
  EXPECT_GT(by_counter.size(), 5u);
  EXPECT_GT(by_seed.size(), 5u);
}

TEST(Sampler, BadParamsNameTheField) {
  SamplingParams p;
  p.top_p = 0.0f;
  try {
    p.validate();
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos);
  }
  p.top_p = 1.0f;
  p.temperature = -0.5f;
  EXPECT_THROW(p.validate(), Error);
  p.temperature = 1.0f;
  p.max_tokens = 0;
  EXPECT_THROW(Sequence(0, {1}, p), Error);
}

}  // namespace
}  // namespace verl::rollout
