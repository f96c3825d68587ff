#include "ops/cuda/common.cuh"
#include "optim/cuda/carry.h"

namespace verl::optim::cuda {
namespace {

__global__ void add_into_kernel(float* y, const float* x, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = __fadd_rn(y[i], x[i]);
}

}  // namespace

void add_into(const ops::cuda::CudaContext& ctx, float* y, const float* x, int64_t n) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  int64_t blocks = ops::cuda::detail::ceil_div(n, kThreads);
  if (blocks > 4096) blocks = 4096;
  add_into_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, ctx.stream>>>(y, x, n);
  VERL_CUDA_CHECK_LAUNCH();
}

}  // namespace verl::optim::cuda
