// LM head fused with log-softmax, target gather and entropy, over chunks of `chunk` tokens so
// only chunk x V logits ever exist. h[T,C], w[V,C], targets[T], outputs logprob/entropy/lse [T].
//   z = (h w^T) / temperature,  lse = logsumexp(z),  logprob = z[target] - lse (0 if target < 0),
//   entropy = -sum_j p_j log p_j = lse - sum_j p_j z_j.
// Backward (logits recomputed per chunk), with log p_j = z_j - lse and H = entropy:
//   d_z_j = d_logprob (1[j==target] - p_j) - d_entropy p_j (log p_j + H)
//   d_h += (d_z / temperature) @ w,  d_w += (d_z / temperature)^T @ h.
// Forward overwrites logprob, entropy, lse (each may be null); backward accumulates d_h, d_w.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/cpu/fast_math.h"
#include "ops/cpu/ops.h"

namespace verl::ops::cpu {

namespace {

void check_targets(const int32_t* targets, int64_t T, int64_t V, const char* who) {
  if (targets == nullptr) return;
  for (int64_t t = 0; t < T; ++t) {
    VERL_CHECK(targets[t] < V, "{}: target id {} at position {} is outside the vocabulary [0, {})",
               who, targets[t], t, V);
  }
}

// z[n,V] = h[n,C] @ w[V,C]^T / temperature
void chunk_logits(float* z, const float* h, const float* w, int64_t n, int64_t C, int64_t V,
                  float temperature) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)V, (int)C, 1.0f / temperature,
              h, (int)C, w, (int)C, 0.0f, z, (int)V);
}

// In place on one row: z_j -> (-dl p_j - de p_j (log p_j + ent)) / temperature, log p_j = z_j -
// lse. A plain function (not inside the OpenMP region) so every scalar is a local and the loop
// vectorises.
void dz_row(float* zr, int64_t V, float lse, float dl, float de, float ent, float inv_temp) {
#pragma omp simd
  for (int64_t j = 0; j < V; ++j) {
    const float logp = zr[j] - lse;
    const float p = detail::fast_exp(logp);
    zr[j] = (-dl * p - de * p * (logp + ent)) * inv_temp;
  }
}

}  // namespace

void lm_head_forward(float* logprob, float* entropy, float* lse, const float* h, const float* w,
                     const int32_t* targets, int64_t T, int64_t C, int64_t V, float temperature,
                     int64_t chunk) {
  VERL_CHECK(temperature > 0.0f, "lm_head_forward: temperature={} must be > 0", temperature);
  check_targets(targets, T, V, "lm_head_forward");
  if (T <= 0) return;
  chunk = (chunk <= 0 || chunk > T) ? T : chunk;
  std::vector<float> z(static_cast<size_t>(chunk * V));  // one buffer for the whole call

  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = std::min(chunk, T - t0);
    chunk_logits(z.data(), h + t0 * C, w, n, C, V, temperature);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      const float* zr = z.data() + r * V;
      float m = zr[0];
#pragma omp simd reduction(max : m)
      for (int64_t j = 0; j < V; ++j) m = std::max(m, zr[j]);
      // Sums over shifted logits z - m (in double), so the entropy lse - E[z] = log(se) - E[z - m]
      // does not subtract two large numbers.
      double se = 0.0, sez = 0.0;
#pragma omp simd reduction(+ : se, sez)
      for (int64_t j = 0; j < V; ++j) {
        const float zs = zr[j] - m;
        const float e = detail::fast_exp(zs);
        se += e;
        sez += static_cast<double>(e * zs);
      }
      const double log_se = std::log(se);
      const int64_t t = t0 + r;
      const double lse_t = m + log_se;
      if (lse != nullptr) lse[t] = static_cast<float>(lse_t);
      if (entropy != nullptr) entropy[t] = static_cast<float>(log_se - sez / se);
      if (logprob != nullptr) {
        const int32_t tg = targets != nullptr ? targets[t] : -1;
        logprob[t] = tg >= 0 ? static_cast<float>((zr[tg] - m) - log_se) : 0.0f;
      }
    }
  }
}

void lm_head_backward(float* d_h, float* d_w, const float* d_logprob, const float* d_entropy,
                      const float* h, const float* w, const int32_t* targets, const float* lse,
                      const float* entropy, int64_t T, int64_t C, int64_t V, float temperature,
                      int64_t chunk) {
  VERL_CHECK(temperature > 0.0f, "lm_head_backward: temperature={} must be > 0", temperature);
  VERL_CHECK(lse != nullptr, "lm_head_backward: the saved lse is required");
  VERL_CHECK(d_entropy == nullptr || entropy != nullptr,
             "lm_head_backward: d_entropy given but the saved entropy is null");
  check_targets(targets, T, V, "lm_head_backward");
  if (T <= 0 || (d_h == nullptr && d_w == nullptr)) return;
  if (d_logprob == nullptr && d_entropy == nullptr) return;  // d_z = 0
  chunk = (chunk <= 0 || chunk > T) ? T : chunk;
  std::vector<float> z(static_cast<size_t>(chunk * V));
  const float inv_temp = 1.0f / temperature;

  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = std::min(chunk, T - t0);
    chunk_logits(z.data(), h + t0 * C, w, n, C, V, temperature);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      const int64_t t = t0 + r;
      float* zr = z.data() + r * V;  // overwritten in place by d_z / temperature
      const int32_t tg = targets != nullptr ? targets[t] : -1;
      // logprob is the constant 0 when there is no target, so its gradient does not flow.
      const float dl = (d_logprob != nullptr && tg >= 0) ? d_logprob[t] : 0.0f;
      const float de = d_entropy != nullptr ? d_entropy[t] : 0.0f;
      const float ent = d_entropy != nullptr ? entropy[t] : 0.0f;
      const float lse_t = lse[t];
      dz_row(zr, V, lse_t, dl, de, ent, inv_temp);
      if (tg >= 0) zr[tg] += dl * inv_temp;
    }
    if (d_h != nullptr) {  // [n,V] @ [V,C]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)C, (int)V, 1.0f, z.data(),
                  (int)V, w, (int)C, 1.0f, d_h + t0 * C, (int)C);
    }
    if (d_w != nullptr) {  // [V,n] @ [n,C]
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)V, (int)C, (int)n, 1.0f, z.data(),
                  (int)V, h + t0 * C, (int)C, 1.0f, d_w, (int)C);
    }
  }
}

}  // namespace verl::ops::cpu
