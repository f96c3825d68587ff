// Sum of squares of a float buffer in double, for the global gradient L2 norm (the caller adds
// ranks and takes the sqrt), as src/ops/cpu/grad_norm.cpp. Deterministic two-pass reduction:
// x is cut into at most kBlocks fixed contiguous ranges (the cut depends on n only, not on the
// GPU); pass 1 writes one double per range into the workspace, pass 2 adds them in a fixed tree.
#include "ops/cuda/common.cuh"
#include "ops/cuda/ops_cuda.h"

namespace verl::ops::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kBlocks = 256, kMinPerBlock = 4096;

__global__ void sum_squares_partial_kernel(double* partial, const float* x, int64_t n,
                                           int64_t per) {
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * per;
  const int64_t i1 = i0 + per < n ? i0 + per : n;
  double s = 0.0;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    const double v = x[i];
    s += v * v;
  }
  s = detail::block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_squares_final_kernel(double* out, const double* partial, int64_t nblocks) {
  double s = 0.0;
  for (int64_t b = threadIdx.x; b < nblocks; b += blockDim.x) s += partial[b];
  s = detail::block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

}  // namespace

void sum_squares(const CudaContext& ctx, double* out, const float* x, int64_t n) {
  VERL_CUDA_REQUIRE(n >= 0, "sum_squares: n=" + std::to_string(n) + " is negative");
  VERL_CUDA_REQUIRE(ctx.workspace != nullptr && ctx.workspace_bytes >= kBlocks * sizeof(double),
                    "sum_squares: needs " + std::to_string(kBlocks * sizeof(double)) +
                        " bytes of workspace, have " + std::to_string(ctx.workspace_bytes));
  if (n == 0) {
    VERL_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), ctx.stream));
    return;
  }
  int64_t nblocks = detail::ceil_div(n, kMinPerBlock);
  if (nblocks > kBlocks) nblocks = kBlocks;
  const int64_t per = detail::ceil_div(n, nblocks);
  nblocks = detail::ceil_div(n, per);
  double* partial = static_cast<double*>(ctx.workspace);
  sum_squares_partial_kernel<<<static_cast<unsigned>(nblocks), kThreads, 0, ctx.stream>>>(
      partial, x, n, per);
  VERL_CUDA_CHECK_LAUNCH();
  sum_squares_final_kernel<<<1, kThreads, 0, ctx.stream>>>(out, partial, nblocks);
  VERL_CUDA_CHECK_LAUNCH();
}

}  // namespace verl::ops::cuda
