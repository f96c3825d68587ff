// Sampling one token from a logits row. With m = max logits and z_i = (l_i - m) / T:
//   full-vocab log-prob   log p_i = z_i - log sum_j exp(z_j)
//   top-k                 keep the k largest logits (ties -> lower id)
//   top-p (nucleus)       of those, the smallest prefix sorted by probability descending whose
//                         probability (renormalised over the top-k set) sums to >= top_p
//   draw                  u ~ U[0,1) from Philox(seed, stream, counter); the first kept token
//                         whose cumulative weight exceeds u * (kept weight)
#include "rollout/sampler.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"

namespace verl::rollout {
namespace {

// 53 random bits from one Philox block -> a double in [0, 1); fine enough that tokens with tiny
// probability are still drawn at their rate.
double philox_uniform(uint64_t seed, uint64_t stream, uint64_t counter) {
  const auto r = philox4x32(seed, stream, counter);
  const uint64_t bits = (static_cast<uint64_t>(r[0] >> 5) << 26) | (r[1] >> 6);
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);
}

SampleResult greedy_row(const float* l, int32_t V) {
  int32_t best = 0;
  for (int32_t i = 1; i < V; ++i) {
    if (l[i] > l[best]) best = i;  // strict: ties keep the lowest id
  }
  const float m = l[best];
  double sum = 0.0;
  for (int32_t i = 0; i < V; ++i) sum += std::exp(static_cast<double>(l[i] - m));
  VERL_CHECK(std::isfinite(m) && std::isfinite(sum),
             "sampler: logits row is not finite (max {}, sum {})", m, sum);
  return {best, static_cast<float>(-std::log(sum))};
}

SampleResult sample_row(const float* l, int32_t V, const SampleRow& row, float* w, int32_t* order) {
  const SamplingParams& p = *row.params;
  if (p.temperature == 0.0f) return greedy_row(l, V);

  float m = l[0];
  for (int32_t i = 1; i < V; ++i) m = std::max(m, l[i]);
  const float inv_t = 1.0f / p.temperature;
  double total = 0.0;
  for (int32_t i = 0; i < V; ++i) {
    w[i] = std::exp((l[i] - m) * inv_t);
    total += w[i];
  }
  VERL_CHECK(std::isfinite(m) && std::isfinite(total) && total > 0.0,
             "sampler: logits row is not finite (max {}, sum of exp {}); stream {}", m, total,
             row.stream);

  const double u = philox_uniform(p.seed, row.stream, row.counter);
  const int32_t k = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
  const bool nucleus = p.top_p < 1.0f;
  auto full_logprob = [&](int32_t tok) {
    return static_cast<float>(static_cast<double>((l[tok] - m) * inv_t) - std::log(total));
  };

  if (k == V && !nucleus) {
    // No truncation: walk the vocabulary in id order, no sort needed.
    const double target = u * total;
    double cum = 0.0;
    int32_t last = -1;
    for (int32_t i = 0; i < V; ++i) {
      if (w[i] <= 0.0f) continue;
      cum += w[i];
      last = i;
      if (cum > target) return {i, full_logprob(i)};
    }
    return {last, full_logprob(last)};  // rounding left target at the very end
  }

  // Descending logits, ties by lower id: a strict total order, so the kept set is well defined.
  auto before = [l](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  std::iota(order, order + V, 0);
  if (k < V) std::nth_element(order, order + k, order + V, before);
  double kept_mass = 0.0;
  int32_t kept = k;
  if (!nucleus) {
    for (int32_t j = 0; j < k; ++j) kept_mass += w[order[j]];
  } else {
    double top_k_mass = 0.0;
    if (k == V) {
      top_k_mass = total;
    } else {
      for (int32_t j = 0; j < k; ++j) top_k_mass += w[order[j]];
    }
    const double threshold = static_cast<double>(p.top_p) * top_k_mass;
    // Sort only as far as needed: chunks of growing size are split off with nth_element and sorted.
    int32_t sorted = 0, chunk = 64;
    bool done = false;
    while (!done && sorted < k) {
      const int32_t end = std::min(k, sorted + chunk);
      if (end < k) std::nth_element(order + sorted, order + end, order + k, before);
      std::sort(order + sorted, order + end, before);
      for (int32_t j = sorted; j < end; ++j) {
        kept_mass += w[order[j]];
        if (kept_mass >= threshold) {  // first prefix reaching top_p; at least one token
          kept = j + 1;
          done = true;
          break;
        }
      }
      sorted = end;
      chunk *= 4;
    }
  }
  const double target = u * kept_mass;
  double cum = 0.0;
  int32_t last = order[0];
  for (int32_t j = 0; j < kept; ++j) {
    const int32_t tok = order[j];
    if (w[tok] <= 0.0f) continue;
    cum += w[tok];
    last = tok;
    if (cum > target) return {tok, full_logprob(tok)};
  }
  return {last, full_logprob(last)};
}

}  // namespace

template <typename F>
void Sampler::run_rows(int64_t n, F&& fn) {
  // An exception must not leave an OpenMP region: keep the first one and rethrow after it.
  std::exception_ptr error;
  const int max_threads = static_cast<int>(weights_.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(max_threads) if (n > 1)
  for (int64_t i = 0; i < n; ++i) {
    try {
      fn(i, static_cast<size_t>(omp_get_thread_num()));
    } catch (...) {
#pragma omp critical(verl_sampler_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

Sampler::Sampler(int32_t vocab_size) : vocab_(vocab_size) {
  VERL_CHECK(vocab_size > 0, "sampler: vocab_size must be positive, got {}", vocab_size);
  const int threads = std::max(1, omp_get_max_threads());
  weights_.assign(static_cast<size_t>(threads),
                  std::vector<float>(static_cast<size_t>(vocab_size)));
  order_.assign(static_cast<size_t>(threads),
                std::vector<int32_t>(static_cast<size_t>(vocab_size)));
}

void Sampler::sample(const float* logits, std::span<const SampleRow> rows, int32_t* tokens,
                     float* logprobs) {
  const int64_t n = static_cast<int64_t>(rows.size());
  for (int64_t i = 0; i < n; ++i) {
    VERL_CHECK(rows[static_cast<size_t>(i)].params != nullptr,
               "sampler: row {} has no sampling params", i);
  }
  run_rows(n, [&](int64_t i, size_t t) {
    const SampleResult r = sample_row(logits + i * vocab_, vocab_, rows[static_cast<size_t>(i)],
                                      weights_[t].data(), order_[t].data());
    tokens[i] = r.token;
    if (logprobs) logprobs[i] = r.logprob;
  });
}

void Sampler::sample(const float* logits, std::span<Sequence* const> seqs, int32_t* tokens,
                     float* logprobs) {
  const int64_t n = static_cast<int64_t>(seqs.size());
  run_rows(n, [&](int64_t i, size_t t) {
    const SampleResult r =
        sample_row(logits + i * vocab_, vocab_, sample_row_for(*seqs[static_cast<size_t>(i)]),
                   weights_[t].data(), order_[t].data());
    tokens[i] = r.token;
    if (logprobs) logprobs[i] = r.logprob;
  });
}

SampleResult Sampler::sample_one(std::span<const float> logits, const SampleRow& row) {
  VERL_CHECK(static_cast<int32_t>(logits.size()) == vocab_,
             "sampler: row of {} logits for a vocabulary of {}", logits.size(), vocab_);
  VERL_CHECK(row.params != nullptr, "sampler: row has no sampling params");
  return sample_row(logits.data(), vocab_, row, weights_[0].data(), order_[0].data());
}

}  // namespace verl::rollout
