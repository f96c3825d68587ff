// Linear layer y = x W^T + b in the HF nn.Linear layout (W is [N, K]) on cuBLASLt, the same math
// as src/ops/cpu/linear.cpp:
//   forward   y[T,N]   = x[T,K] w[N,K]^T (+ b[N])        bf16 in/out, fp32 accumulate, bias in epilogue
//   backward  d_x[T,K] += d_y[T,N] w[N,K]                 bf16 out (beta = 1: accumulated in fp32)
//             d_w[N,K] += d_y^T x                         fp32 out (the fp32 gradient buffer)
//             d_b[N]   += sum_t d_y[t,:]                  fp32, rows summed in order
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

// d_b[n] += sum_t d_y[t,n]: one thread per column walking the rows in order (deterministic).
__global__ void bias_grad_kernel(float* d_b, const bf16* d_y, int64_t T, int64_t N) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  float s = 0.0f;
  for (int64_t t = 0; t < T; ++t) s += __bfloat162float(d_y[t * N + n]);
  d_b[n] += s;
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
  run_gemm(ctx,
           Gemm{CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, w, K, x, K, CUDA_R_16BF, y, N, CUDA_R_16BF, 0.0f,
                b},
           "linear_forward");
}

void linear_backward(const CudaContext& ctx, bf16* d_x, float* d_w, float* d_b, const bf16* d_y,
                     const bf16* x, const bf16* w, int64_t T, int64_t K, int64_t N) {
  check_linear("linear_backward", ctx, T, K, N);
  if (T == 0) return;
  if (d_x != nullptr) {
    // d_x^T[K,T] += w (col-major [K,N]) d_y^T (col-major [N,T]).
    run_gemm(ctx,
             Gemm{CUBLAS_OP_N, CUBLAS_OP_N, K, T, N, w, K, d_y, N, CUDA_R_16BF, d_x, K,
                  CUDA_R_16BF, 1.0f, nullptr},
             "linear_backward (d_x)");
  }
  if (d_w != nullptr) {
    // d_w^T[K,N] += x^T (col-major [K,T]) op_T(d_y^T: col-major [N,T]).
    run_gemm(ctx,
             Gemm{CUBLAS_OP_N, CUBLAS_OP_T, K, N, T, x, K, d_y, N, CUDA_R_16BF, d_w, K,
                  CUDA_R_32F, 1.0f, nullptr},
             "linear_backward (d_w)");
  }
  if (d_b != nullptr) {
    constexpr int kThreads = 256;
    bias_grad_kernel<<<static_cast<unsigned>(detail::ceil_div(N, kThreads)), kThreads, 0,
                       ctx.stream>>>(d_b, d_y, T, N);
    VERL_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace verl::ops::cuda
