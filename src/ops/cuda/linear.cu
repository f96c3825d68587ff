// Linear layer y = x W^T + b in the HF nn.Linear layout (W is [N, K]) on cuBLASLt, the same math
// as src/ops/cpu/linear.cpp:
//   forward   y[T,N]   = x[T,K] w[N,K]^T (+ b[N])        bf16 in/out, fp32 accumulate, bias in
//   epilogue backward  d_x[T,K] += d_y[T,N] w[N,K]                 bf16 out (beta = 1: accumulated
//   in fp32)
//             d_w[N,K] += d_y^T x                         fp32 out (the fp32 gradient buffer)
//             d_b[N]   += sum_t d_y[t,:]                  fp32, fixed two-pass row partition
// cuBLASLt is column-major: a row-major [R, S] matrix is a column-major [S, R] one with ld = S.
// So y^T[N,T] = op(w)[N,K] x^T[K,T] with w read transposed ("TN"), d_x^T[K,T] = w^T[K,N] d_y^T[N,T]
// ("NN") and d_w^T[K,N] = x^T[K,T] d_y[T,N] ("NT"). The accumulating GEMMs run in place (C == D).
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/gemm.h"
#include "ops/cuda/ops_cuda.h"

namespace verl::ops::cuda {

namespace {

using detail::Gemm;
using detail::run_gemm;

// d_b[n] += sum_t d_y[t,n], deterministic in two passes (a fixed partition of the rows):
// pass 1, block (32 columns x 8 row lanes) per (column tile, row chunk) writes the chunk's column
// sums to partial[chunk, n]; pass 2 adds the chunks in order.
constexpr int kBiasCols = 32, kBiasLanes = 8;

__global__ void bias_grad_partial_kernel(float* partial, const bf16* d_y, int64_t T, int64_t N,
                                         int64_t rows_per) {
  __shared__ float tile[kBiasLanes][kBiasCols];
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kBiasCols + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per;
  const int64_t r1 = r0 + rows_per < T ? r0 + rows_per : T;
  float s = 0.0f;
  if (n < N) {
    for (int64_t t = r0 + threadIdx.y; t < r1; t += kBiasLanes)
      s += __bfloat162float(d_y[t * N + n]);
  }
  tile[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && n < N) {
    float total = 0.0f;
    for (int i = 0; i < kBiasLanes; ++i) total += tile[i][threadIdx.x];
    partial[blockIdx.y * N + n] = total;
  }
}

__global__ void bias_grad_final_kernel(float* d_b, const float* partial, int64_t chunks,
                                       int64_t N) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  float s = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) s += partial[c * N + n];
  d_b[n] += s;
}

void bias_grad(const CudaContext& ctx, float* d_b, const bf16* d_y, int64_t T, int64_t N) {
  // About 64 rows per chunk, at most 256 chunks, as many as the workspace holds.
  const int64_t fit = static_cast<int64_t>(ctx.workspace_bytes / (sizeof(float) * N));
  int64_t chunks = detail::ceil_div(T, 64);
  if (chunks > 256) chunks = 256;
  if (chunks > fit) chunks = fit;
  VERL_CUDA_REQUIRE(chunks >= 1 && ctx.workspace != nullptr,
                    detail::shape_str("linear_backward (d_b)", {T, N}) +
                        ": needs a workspace of at least N floats");
  const int64_t rows_per = detail::ceil_div(T, chunks);
  chunks = detail::ceil_div(T, rows_per);
  float* partial = static_cast<float*>(ctx.workspace);
  const dim3 grid(static_cast<unsigned>(detail::ceil_div(N, kBiasCols)),
                  static_cast<unsigned>(chunks));
  bias_grad_partial_kernel<<<grid, dim3(kBiasCols, kBiasLanes), 0, ctx.stream>>>(partial, d_y, T, N,
                                                                                 rows_per);
  VERL_CUDA_CHECK_LAUNCH();
  bias_grad_final_kernel<<<static_cast<unsigned>(detail::ceil_div(N, 256)), 256, 0, ctx.stream>>>(
      d_b, partial, chunks, N);
  VERL_CUDA_CHECK_LAUNCH();
}

void check_linear(const char* op, const CudaContext& ctx, int64_t T, int64_t K, int64_t N) {
  VERL_CUDA_REQUIRE(T >= 0 && K >= 1 && N >= 1,
                    detail::shape_str(op, {T, K, N}) + ": need T >= 0, K >= 1, N >= 1");
  VERL_CUDA_REQUIRE(ctx.lt != nullptr, std::string(op) + ": the context has no cuBLASLt handle");
}

}  // namespace

void linear_forward(const CudaContext& ctx, bf16* y, const bf16* x, const bf16* w, const bf16* b,
                    int64_t T, int64_t K, int64_t N) {
  check_linear("linear_forward", ctx, T, K, N);
  if (T == 0) return;
  // y^T[N,T] = op_T(w: col-major [K,N]) x^T (col-major [K,T]).
  run_gemm(
      ctx,
      Gemm{CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, w, K, x, K, CUDA_R_16BF, y, N, CUDA_R_16BF, 0.0f, b},
      "linear_forward");
}

void linear_forward(const CudaContext& ctx, bf16* y, const bf16* x, const bf16* w, const bf16* b,
                    const bf16* residual, int64_t T, int64_t K, int64_t N) {
  check_linear("linear_forward", ctx, T, K, N);
  if (T == 0) return;
  Gemm g{CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, w, K, x, K, CUDA_R_16BF, y, N, CUDA_R_16BF, 1.0f, b};
  g.c = residual;
  run_gemm(ctx, g, "linear_forward (residual)");
}

void linear_backward(const CudaContext& ctx, bf16* d_x, float* d_w, float* d_b, const bf16* d_y,
                     const bf16* x, const bf16* w, int64_t T, int64_t K, int64_t N,
                     bool accumulate_dx) {
  check_linear("linear_backward", ctx, T, K, N);
  if (T == 0) return;
  if (d_x != nullptr) {
    // d_x^T[K,T] += w (col-major [K,N]) d_y^T (col-major [N,T]).
    run_gemm(ctx,
             Gemm{CUBLAS_OP_N, CUBLAS_OP_N, K, T, N, w, K, d_y, N, CUDA_R_16BF, d_x, K, CUDA_R_16BF,
                  accumulate_dx ? 1.0f : 0.0f, nullptr},
             "linear_backward (d_x)");
  }
  if (d_w != nullptr) {
    // d_w^T[K,N] += x^T (col-major [K,T]) op_T(d_y^T: col-major [N,T]).
    run_gemm(ctx,
             Gemm{CUBLAS_OP_N, CUBLAS_OP_T, K, N, T, x, K, d_y, N, CUDA_R_16BF, d_w, K, CUDA_R_32F,
                  1.0f, nullptr},
             "linear_backward (d_w)");
  }
  if (d_b != nullptr) bias_grad(ctx, d_b, d_y, T, N);
}

}  // namespace verl::ops::cuda
