// RMSNorm as HF LlamaRMSNorm, over R rows of C:
//   rstd[r] = 1 / sqrt(mean_c x[r,c]^2 + eps),  out[r,c] = w[c] * x[r,c] * rstd[r].
// Backward, with g = d_out and a = rstd[r]:
//   d_x[r,c] += a * w[c] g[r,c] - a^3 / C * x[r,c] * sum_k w[k] g[r,k] x[r,k]
//   d_w[c]   += sum_r g[r,c] x[r,c] a_r
// Forward overwrites out and rstd; backward accumulates into d_x and d_w (null = skip).
#include <algorithm>
#include <cmath>

#include "ops/cpu/ops.h"

namespace verl::ops::cpu {

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t R, int64_t C,
                     float eps) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x + r * C;
    float* yr = out + r * C;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
    const float a = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
    if (rstd != nullptr) rstd[r] = a;
    for (int64_t c = 0; c < C; ++c) yr[c] = w[c] * (xr[c] * a);
  }
}

void rmsnorm_backward(float* d_x, float* d_w, const float* d_out, const float* x, const float* w,
                      const float* rstd, int64_t R, int64_t C) {
  if (d_x != nullptr) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      const float* xr = x + r * C;
      const float* gr = d_out + r * C;
      float* dxr = d_x + r * C;
      const float a = rstd[r];
      float dot = 0.0f;  // sum_k w_k g_k x_k
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < C; ++c) dot += w[c] * gr[c] * xr[c];
      const float coef = a * a * a * dot / static_cast<float>(C);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dxr[c] += a * w[c] * gr[c] - coef * xr[c];
    }
  }
  if (d_w != nullptr) {
    // Column blocks walk the rows in order: race-free and independent of the thread count.
    constexpr int64_t kBlock = 16;
    const int64_t nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const int64_t c0 = blk * kBlock, c1 = std::min(C, c0 + kBlock);
      float acc[kBlock] = {};
      for (int64_t r = 0; r < R; ++r) {
        const float a = rstd[r];
        const float* xr = x + r * C;
        const float* gr = d_out + r * C;
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += gr[c] * xr[c] * a;
      }
      for (int64_t c = c0; c < c1; ++c) d_w[c] += acc[c - c0];
    }
  }
}

}  // namespace verl::ops::cpu
