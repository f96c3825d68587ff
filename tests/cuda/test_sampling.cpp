// GPU sampling (src/ops/cuda/sampling.cu) against the CPU Sampler (src/rollout/sampler.cpp, the
// oracle) on identical fp32 logits: Philox bit equality with the host generator; greedy, plain
// temperature, top-k, top-p and both, at V = 151936, 1000 and 7, on smooth, bf16-tied, flat and
// spiky rows. The GPU's cumulative weights are fixed-point sums (sampling.h), so a token may differ
// only where the cumulative weight lies within kSampleNearTie of its threshold; log-probs agree
// within kSampleLogprob; the split path (several blocks per row) equals the one-block kernel. With
// top-k alone the CPU walks its kept set in an unspecified order (see
// reference_sample), so there the oracle is the definition restated in this file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/cuda/sampling.h"
#include "rollout/sampler.h"
#include "test_util.h"

namespace verl::ops::cuda::test {
namespace {

using CudaSampling = CudaTest;

TEST_F(CudaSampling, PhiloxMatchesHost) {
  const int64_t n = 1000;
  std::vector<uint64_t> keys(3 * n);
  Rng rng(77);
  for (int64_t i = 0; i < n; ++i) {
    keys[3 * i] = rng.next_u64();
    keys[3 * i + 1] = i % 3 == 0 ? static_cast<uint64_t>(i) : rng.next_u64();
    keys[3 * i + 2] = i % 5 == 0 ? static_cast<uint64_t>(i) : rng.next_u64();
  }
  DeviceBuffer<uint64_t> d_keys(keys);
  DeviceBuffer<uint32_t> d_out(static_cast<size_t>(4 * n));
  philox4x32_batch(ctx(), d_out.data(), d_keys.data(), n);
  const std::vector<uint32_t> got = d_out.download();
  for (int64_t i = 0; i < n; ++i) {
    const auto want = philox4x32(keys[3 * i], keys[3 * i + 1], keys[3 * i + 2]);
    for (int j = 0; j < 4; ++j)
      ASSERT_EQ(got[4 * i + j], want[j]) << "block " << i << " word " << j;
  }
}

// The sampler's definition restated with a full sort in double: the token, and how close its
// decisions were, i.e. the smallest |cumulative - threshold| (relative to the mass it is a fraction
// of) over the top-p cut and the draw. Below kSampleNearTie the GPU may pick a neighbour.
// The CPU Sampler follows the same definition except in one case: with top-k alone it walks the k
// kept tokens in std::nth_element's (unspecified) order rather than by descending logit, which
// samples the same distribution but maps a given u to another token; the GPU walks them in
// descending order, so there this reference, not the CPU, is the oracle.
struct Reference {
  int32_t token;
  double margin;
};

Reference reference_sample(const std::vector<float>& l, const rollout::SamplingParams& p,
                           uint64_t stream, uint64_t counter) {
  const int64_t V = static_cast<int64_t>(l.size());
  if (p.temperature == 0.0f) {
    return {static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()), INFINITY};
  }
  const float m = *std::max_element(l.begin(), l.end());
  const float inv_t = 1.0f / p.temperature;
  std::vector<float> w(V);
  for (int64_t i = 0; i < V; ++i) w[i] = std::exp((l[i] - m) * inv_t);
  const auto r = philox4x32(p.seed, stream, counter);
  const double u = static_cast<double>((static_cast<uint64_t>(r[0] >> 5) << 26) | (r[1] >> 6)) /
                   9007199254740992.0;
  // First index whose cumulative reaches (>=) or exceeds (>) target, and the margin around it.
  auto crossing = [](const std::vector<double>& cum, double target, double mass, bool strict,
                     double& margin) {
    size_t j = 0;
    while (j + 1 < cum.size() && !(strict ? cum[j] > target : cum[j] >= target)) ++j;
    const double before = j == 0 ? 0.0 : cum[j - 1];
    margin =
        std::min(margin, std::min(std::abs(cum[j] - target), std::abs(before - target)) / mass);
    return j;
  };
  const int64_t k = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
  const bool nucleus = p.top_p < 1.0f;
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  if (k < V || nucleus) {  // descending logits, ties to the lower id; vocabulary order otherwise
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  }
  order.resize(static_cast<size_t>(k));
  std::vector<double> cum(order.size());
  double c = 0.0;
  for (size_t j = 0; j < order.size(); ++j) cum[j] = c += w[order[j]];
  double margin = INFINITY;
  if (nucleus) {
    const size_t j =
        crossing(cum, static_cast<double>(p.top_p) * cum.back(), cum.back(), false, margin);
    cum.resize(j + 1);
  }
  const double kept = cum.back();
  return {order[crossing(cum, u * kept, kept, true, margin)], margin};
}

// Full-vocabulary log-prob of `tok` at the row's temperature (1 when greedy), as the CPU reports
// it.
double full_logprob(const std::vector<float>& l, float temperature, int32_t tok) {
  const float m = *std::max_element(l.begin(), l.end());
  const float inv_t = temperature == 0.0f ? 1.0f : 1.0f / temperature;
  double total = 0.0;
  for (float x : l)
    total += temperature == 0.0f ? std::exp(static_cast<double>(x - m)) : std::exp((x - m) * inv_t);
  return static_cast<double>((l[tok] - m) * inv_t) - std::log(total);
}

enum class Shape { Smooth, Bf16Ties, Flat, Spiky };

std::vector<float> make_row(int64_t V, Shape shape, Rng& rng) {
  std::vector<float> l(V);
  switch (shape) {
    case Shape::Smooth:
      for (auto& x : l) x = 2.5f * rng.normal();
      break;
    case Shape::Bf16Ties:  // few distinct values: the tie order (lower id first) decides
      for (auto& x : l) x = bf16_to_f32(f32_to_bf16(std::round(4.0f * rng.normal()) * 0.5f));
      break;
    case Shape::Flat:  // every logit equal but a few
      for (auto& x : l) x = 1.0f;
      for (int i = 0; i < 3; ++i) l[rng.below(V)] = 1.5f;
      break;
    case Shape::Spiky:  // one dominant token and a long tail, as a trained LM
      for (auto& x : l) x = 1.5f * rng.normal() - 4.0f;
      l[rng.below(V)] = 12.0f;
      l[rng.below(V)] = 10.5f;
      break;
  }
  return l;
}

struct Setting {
  float temperature;
  int32_t top_k;
  float top_p;
};

void check_setting(const CudaContext& ctx, const CudaSession& session, int64_t V, int64_t rows,
                   const Setting& st, uint64_t seed) {
  std::string trace = "V ";
  trace += std::to_string(V);
  trace += " T ";
  trace += std::to_string(st.temperature);
  trace += " top_k ";
  trace += std::to_string(st.top_k);
  trace += " top_p ";
  trace += std::to_string(st.top_p);
  SCOPED_TRACE(trace);
  Rng rng(seed);
  std::vector<float> logits;
  std::vector<std::vector<float>> row_logits;
  std::vector<rollout::SamplingParams> params(static_cast<size_t>(rows));
  std::vector<SampleParamsDevice> dev(static_cast<size_t>(rows));
  std::vector<rollout::SampleRow> cpu_rows(static_cast<size_t>(rows));
  const Shape shapes[] = {Shape::Smooth, Shape::Bf16Ties, Shape::Flat, Shape::Spiky};
  for (int64_t r = 0; r < rows; ++r) {
    row_logits.push_back(make_row(V, shapes[r % 4], rng));
    logits.insert(logits.end(), row_logits.back().begin(), row_logits.back().end());
    rollout::SamplingParams& p = params[r];
    p.temperature = st.temperature;
    p.top_k = st.top_k;
    p.top_p = st.top_p;
    p.seed = seed * 1000 + static_cast<uint64_t>(r);
    const uint64_t stream = (static_cast<uint64_t>(r) << 32) | 3u,
                   counter = static_cast<uint64_t>(r % 9);
    cpu_rows[r] = rollout::SampleRow{&p, stream, counter};
    dev[r] = SampleParamsDevice{p.temperature, p.top_k, p.top_p, 0, p.seed, stream, counter};
  }
  rollout::Sampler cpu(static_cast<int32_t>(V));
  std::vector<int32_t> want_tok(rows);
  std::vector<float> want_lp(rows);
  cpu.sample(logits.data(), cpu_rows, want_tok.data(), want_lp.data());

  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<SampleParamsDevice> d_params(dev);
  DeviceBuffer<int32_t> d_tok(static_cast<size_t>(rows));
  DeviceBuffer<float> d_lp(static_cast<size_t>(rows));
  sample_tokens(ctx, d_tok.data(), d_lp.data(), d_logits.data(), V, d_params.data(), rows, V);
  session.synchronize();
  const std::vector<int32_t> tok = d_tok.download();
  const std::vector<float> lp = d_lp.download();

  // Run twice: the same bits.
  sample_tokens(ctx, d_tok.data(), d_lp.data(), d_logits.data(), V, d_params.data(), rows, V);
  session.synchronize();
  EXPECT_TRUE(d_tok.download() == tok) << "sampling is not deterministic";

  // The split path (several blocks per row) picks the same tokens bit for bit; its log-prob differs
  // only by the order of a double sum.
  DeviceBuffer<uint8_t> ws(sample_workspace_bytes(rows, V));
  sample_tokens(ctx, d_tok.data(), d_lp.data(), d_logits.data(), V, d_params.data(), rows, V,
                ws.data(), ws.size());
  session.synchronize();
  EXPECT_TRUE(d_tok.download() == tok) << "the split path picked other tokens";
  const std::vector<float> split_lp = d_lp.download();
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_NEAR(split_lp[r], lp[r], 1e-6 + 1e-6 * std::abs(lp[r])) << "split path, row " << r;
  }

  const bool topk_only = st.top_k > 0 && st.top_k < V && st.top_p >= 1.0f && st.temperature > 0.0f;
  int64_t same = 0;
  for (int64_t r = 0; r < rows; ++r) {
    ASSERT_GE(tok[r], 0) << "row " << r;
    ASSERT_LT(tok[r], V) << "row " << r;
    const Reference ref =
        reference_sample(row_logits[r], params[r], cpu_rows[r].stream, cpu_rows[r].counter);
    const bool near_tie = ref.margin < kSampleNearTie;
    // The test's reference agrees with the CPU Sampler (the oracle) wherever the definitions agree.
    if (!topk_only && !near_tie) {
      EXPECT_EQ(want_tok[r], ref.token)
          << "row " << r << ": the test's reference disagrees with the CPU";
    }
    const int32_t oracle = topk_only ? ref.token : want_tok[r];
    if (tok[r] == oracle) {
      ++same;
    } else {
      EXPECT_TRUE(near_tie) << "row " << r << ": GPU token " << tok[r] << ", expected " << oracle
                            << " though the decision margin is " << ref.margin;
    }
    if (tok[r] == want_tok[r]) {
      EXPECT_NEAR(lp[r], want_lp[r], kSampleLogprob) << "row " << r;
    } else {
      EXPECT_NEAR(lp[r], full_logprob(row_logits[r], st.temperature, tok[r]), kSampleLogprob)
          << "row " << r;
    }
  }
  EXPECT_GE(same, (rows * 99 + 99) / 100) << same << " of " << rows << " tokens equal the oracle's";
}

const Setting kSettings[] = {
    {0.0f, -1, 1.0f},     // greedy
    {1.0f, -1, 1.0f},     // plain temperature: vocabulary order
    {0.7f, 50, 1.0f},     // top-k
    {1.0f, -1, 0.9f},     // top-p
    {1.3f, 1000, 0.95f},  // both
    {0.5f, 1, 1.0f},      // top-k = 1: argmax
    {1.0f, -1, 0.3f},     // small nucleus
    {2.0f, 3, 0.5f},
};

TEST_F(CudaSampling, LargeVocabularyMatchesCpu) {
  uint64_t seed = 1;
  for (const Setting& st : kSettings) check_setting(ctx(), *session_, 151936, 40, st, seed++);
}

TEST_F(CudaSampling, SmallVocabulariesMatchCpu) {
  uint64_t seed = 100;
  for (int64_t V : {1000, 7}) {
    for (const Setting& st : kSettings) check_setting(ctx(), *session_, V, 200, st, seed++);
  }
  check_setting(ctx(), *session_, 1, 5, {1.0f, -1, 0.5f}, seed++);
}

// Ties at the maximum go to the lowest id; a non-finite row is reported as token -1.
TEST_F(CudaSampling, GreedyTiesAndNonFiniteRows) {
  const int64_t V = 4099;
  std::vector<float> logits(2 * V, 0.0f);
  logits[17] = logits[300] = logits[4000] = 3.0f;
  logits[V + 5] = NAN;
  std::vector<SampleParamsDevice> p(2);
  p[0].temperature = p[1].temperature = 0.0f;
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<SampleParamsDevice> d_p(p);
  DeviceBuffer<int32_t> d_tok(2);
  DeviceBuffer<float> d_lp(2);
  sample_tokens(ctx(), d_tok.data(), d_lp.data(), d_logits.data(), V, d_p.data(), 2, V);
  sync();
  const std::vector<int32_t> tok = d_tok.download();
  EXPECT_EQ(tok[0], 17);
  EXPECT_EQ(tok[1], -1);
  EXPECT_NEAR(d_lp.download()[0], full_logprob({logits.begin(), logits.begin() + V}, 0.0f, 17),
              kSampleLogprob);
}

// One batch mixing greedy, plain and truncated rows, with a row stride that is not a multiple of 4
// (scalar loads) and rows not 16-byte aligned: the split path handles the greedy and plain rows,
// the one-block kernel the rest, and together they equal the one-block kernel on every row.
TEST_F(CudaSampling, SplitPathMixedRowsEqualReference) {
  for (int64_t V : {int64_t{151936}, int64_t{4099}, int64_t{1}}) {
    SCOPED_TRACE("V " + std::to_string(V));
    const int64_t rows = 67, ld = V + 3;
    Rng rng(5 + static_cast<uint64_t>(V));
    std::vector<float> logits(static_cast<size_t>(rows * ld), -1e30f);
    std::vector<SampleParamsDevice> p(static_cast<size_t>(rows));
    const Shape shapes[] = {Shape::Smooth, Shape::Bf16Ties, Shape::Flat, Shape::Spiky};
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> row = make_row(V, shapes[r % 4], rng);
      std::copy(row.begin(), row.end(), logits.begin() + r * ld);
      const Setting& st = kSettings[r % (sizeof(kSettings) / sizeof(kSettings[0]))];
      p[r] = SampleParamsDevice{st.temperature,
                                st.top_k,
                                st.top_p,
                                0,
                                99 + static_cast<uint64_t>(r),
                                static_cast<uint64_t>(r),
                                static_cast<uint64_t>(r % 5)};
    }
    DeviceBuffer<float> d_logits(logits);
    DeviceBuffer<SampleParamsDevice> d_p(p);
    DeviceBuffer<int32_t> d_tok(static_cast<size_t>(rows));
    DeviceBuffer<float> d_lp(static_cast<size_t>(rows));
    sample_tokens(ctx(), d_tok.data(), d_lp.data(), d_logits.data(), ld, d_p.data(), rows, V);
    sync();
    const std::vector<int32_t> want_tok = d_tok.download();
    const std::vector<float> want_lp = d_lp.download();
    DeviceBuffer<uint8_t> ws(sample_workspace_bytes(rows, V));
    DeviceBuffer<int32_t> d_tok2(std::vector<int32_t>(static_cast<size_t>(rows), -7));
    sample_tokens(ctx(), d_tok2.data(), d_lp.data(), d_logits.data(), ld, d_p.data(), rows, V,
                  ws.data(), ws.size());
    sync();
    const std::vector<int32_t> tok = d_tok2.download();
    const std::vector<float> lp = d_lp.download();
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_EQ(tok[r], want_tok[r]) << "row " << r;
      EXPECT_NEAR(lp[r], want_lp[r], 1e-6 + 1e-6 * std::abs(want_lp[r])) << "row " << r;
    }
  }
}

}  // namespace
}  // namespace verl::ops::cuda::test
