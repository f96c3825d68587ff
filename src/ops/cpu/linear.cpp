// Linear layer in HF nn.Linear layout: y[T,N] = x[T,K] @ w[N,K]^T + b[N].
// Backward: d_x[T,K] += d_y @ w;  d_w[N,K] += d_y^T @ x;  d_b[N] += sum_t d_y[t,:].
// Forward overwrites y; backward accumulates into d_x, d_w, d_b (null = skip). Matmuls are OpenBLAS
// sgemm (threaded by OpenBLAS itself, so these calls must not sit inside an OpenMP region).
#include <cblas.h>

#include <algorithm>

#include "ops/cpu/ops.h"

namespace verl::ops::cpu {

void linear_forward(float* y, const float* x, const float* w, const float* b, int64_t T, int64_t K,
                    int64_t N) {
  if (T <= 0 || N <= 0) return;
  float beta = 0.0f;
  if (b != nullptr) {
    // Seed every row with the bias and let sgemm add x w^T on top (beta = 1): one pass over y.
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < T; ++t) std::copy(b, b + N, y + t * N);
    beta = 1.0f;
  }
  if (K <= 0) {
    if (b == nullptr) std::fill(y, y + T * N, 0.0f);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)N, (int)K, 1.0f, x, (int)K, w,
              (int)K, beta, y, (int)N);
}

void linear_backward(float* d_x, float* d_w, float* d_b, const float* d_y, const float* x,
                     const float* w, int64_t T, int64_t K, int64_t N) {
  if (T <= 0 || N <= 0 || K <= 0) return;
  if (d_x != nullptr) {  // [T,N] @ [N,K]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)K, (int)N, 1.0f, d_y,
                (int)N, w, (int)K, 1.0f, d_x, (int)K);
  }
  if (d_w != nullptr) {  // [N,T] @ [T,K]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)N, (int)K, (int)T, 1.0f, d_y, (int)N,
                x, (int)K, 1.0f, d_w, (int)K);
  }
  if (d_b != nullptr) {
    // Column sums. Each thread owns a block of columns and walks all rows in order, so the result
    // is race-free and does not depend on the thread count.
    constexpr int64_t kBlock = 64;
    const int64_t nblocks = (N + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const int64_t n0 = blk * kBlock, n1 = std::min(N, n0 + kBlock);
      float acc[kBlock] = {};
      for (int64_t t = 0; t < T; ++t) {
        const float* row = d_y + t * N;
        for (int64_t n = n0; n < n1; ++n) acc[n - n0] += row[n];
      }
      for (int64_t n = n0; n < n1; ++n) d_b[n] += acc[n - n0];
    }
  }
}

}  // namespace verl::ops::cpu
