// Batch-invariant linear layer y[T,N] = x[T,K] @ w[N,K]^T (+ b), forward only; overwrites y.
// Every output element is a dot product evaluated as: 8 lane accumulators acc[j] = fma(x[k], w[k],
// acc[j]) over k = 8i + j in increasing i, reduced as ((a0+a4)+(a1+a5)) + ((a2+a6)+(a3+a7)), then
// a scalar fma tail over the last K % 8 terms, then + b. Blocking (2 rows x 6 columns share loads;
// a 6-row weight panel stays in L1 while every row block streams past it) and threading (over
// column panels) never change that sequence, so results do not depend on T.
#include <algorithm>
#include <cmath>

#include "ops/cpu/ops.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VERL_LINEAR_AVX2 1
#endif

namespace verl::ops::cpu {
namespace {

constexpr int64_t kRows = 2, kCols = 6;

inline float reduce_lanes(const float* a) {
  return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

// Finishes one element from its 8 lane sums: reduction, scalar tail, bias.
inline float finish(const float* lanes, const float* xr, const float* wr, int64_t k8, int64_t K,
                    const float* b, int64_t n) {
  float s = reduce_lanes(lanes);
  for (int64_t k = k8; k < K; ++k) s = std::fma(xr[k], wr[k], s);
  return b ? s + b[n] : s;
}

#ifdef VERL_LINEAR_AVX2
// R rows x C columns (R <= 2, C <= 6) with the same per-element arithmetic as the full block.
template <int R, int C>
void block(float* y, const float* x, const float* w, const float* b, int64_t t0, int64_t n0,
           int64_t K, int64_t N) {
  const int64_t k8 = K / 8 * 8;
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t k = 0; k < k8; k += 8) {
    __m256 xv[R];
    for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_ps(x + (t0 + r) * K + k);
    for (int c = 0; c < C; ++c) {
      const __m256 wv = _mm256_loadu_ps(w + (n0 + c) * K + k);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
    }
  }
  alignas(32) float lanes[8];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      _mm256_store_ps(lanes, acc[r][c]);
      y[(t0 + r) * N + n0 + c] =
          finish(lanes, x + (t0 + r) * K, w + (n0 + c) * K, k8, K, b, n0 + c);
    }
}
#else
template <int R, int C>
void block(float* y, const float* x, const float* w, const float* b, int64_t t0, int64_t n0,
           int64_t K, int64_t N) {
  const int64_t k8 = K / 8 * 8;
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      const float* xr = x + (t0 + r) * K;
      const float* wr = w + (n0 + c) * K;
      float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t k = 0; k < k8; k += 8)
        for (int j = 0; j < 8; ++j) lanes[j] = std::fma(xr[k + j], wr[k + j], lanes[j]);
      y[(t0 + r) * N + n0 + c] = finish(lanes, xr, wr, k8, K, b, n0 + c);
    }
}
#endif

template <int C>
void column_block(float* y, const float* x, const float* w, const float* b, int64_t n0, int64_t T,
                  int64_t K, int64_t N) {
  int64_t t = 0;
  for (; t + kRows <= T; t += kRows) block<kRows, C>(y, x, w, b, t, n0, K, N);
  if (t < T) block<1, C>(y, x, w, b, t, n0, K, N);
}

}  // namespace

void linear_forward_invariant(float* y, const float* x, const float* w, const float* b, int64_t T,
                              int64_t K, int64_t N) {
  if (T <= 0 || N <= 0) return;
  // Column panels of 48 outputs per task (a multiple of kCols).
  constexpr int64_t kPanel = 48;
  const int64_t panels = (N + kPanel - 1) / kPanel;
#pragma omp parallel for schedule(dynamic, 1) if (T * N * K > (1 << 18))
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t n_end = std::min(N, (p + 1) * kPanel);
    int64_t n = p * kPanel;
    for (; n + kCols <= n_end; n += kCols) column_block<kCols>(y, x, w, b, n, T, K, N);
    switch (n_end - n) {
      case 5:
        column_block<5>(y, x, w, b, n, T, K, N);
        break;
      case 4:
        column_block<4>(y, x, w, b, n, T, K, N);
        break;
      case 3:
        column_block<3>(y, x, w, b, n, T, K, N);
        break;
      case 2:
        column_block<2>(y, x, w, b, n, T, K, N);
        break;
      case 1:
        column_block<1>(y, x, w, b, n, T, K, N);
        break;
      default:
        break;
    }
  }
}

}  // namespace verl::ops::cpu
