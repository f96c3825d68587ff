// One fused AdamW update (Loshchilov & Hutter 2019) over flat fp32 master weights, the same math
// as src/ops/cpu/adamw.cpp (torch.optim.AdamW):
//   g = grad * grad_scale;  p *= 1 - lr wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps).   step counts from 1.
// Mixed precision: param, m, v and grad are fp32; the same pass writes bf16(p) into param_bf16
// (the weights that forward/backward read), so no separate cast kernel runs after the step.
#include <cmath>

#include "ops/cuda/common.cuh"
#include "ops/cuda/ops_cuda.h"

namespace verl::ops::cuda {

namespace {

struct AdamWScalars {
  float beta1, beta2, one_m_b1, one_m_b2, eps, step_size, bc2_sqrt, decay, grad_scale;
};

__global__ void adamw_kernel(float* param, bf16* param_bf16, const float* grad, float* m, float* v,
                             int64_t n, AdamWScalars k) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = grad[i] * k.grad_scale;
    const float mi = k.beta1 * m[i] + k.one_m_b1 * g;
    const float vi = k.beta2 * v[i] + k.one_m_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / k.bc2_sqrt + k.eps;
    const float p = param[i] * k.decay - k.step_size * mi / denom;
    param[i] = p;
    if (param_bf16 != nullptr) param_bf16[i] = __float2bfloat16_rn(p);
  }
}

}  // namespace

void adamw_step(const CudaContext& ctx, float* param, bf16* param_bf16, const float* grad, float* m,
                float* v, int64_t n, float lr, float beta1, float beta2, float eps,
                float weight_decay, int64_t step, float grad_scale) {
  VERL_CUDA_REQUIRE(step >= 1, "adamw_step: step=" + std::to_string(step) + " must count from 1");
  VERL_CUDA_REQUIRE(n >= 0, "adamw_step: n=" + std::to_string(n) + " is negative");
  if (n == 0) return;
  // Scalars in double as torch does (Python floats there), then used in fp32: as the CPU op.
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
  AdamWScalars k;
  k.beta1 = beta1;
  k.beta2 = beta2;
  k.one_m_b1 = 1.0f - beta1;
  k.one_m_b2 = 1.0f - beta2;
  k.eps = eps;
  k.step_size = static_cast<float>(static_cast<double>(lr) / bc1);
  k.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  k.decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);
  k.grad_scale = grad_scale;
  constexpr int kThreads = 256;
  adamw_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(param, param_bf16, grad,
                                                                           m, v, n, k);
  VERL_CUDA_CHECK_LAUNCH();
}

}  // namespace verl::ops::cuda
