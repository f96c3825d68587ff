// SwiGLU activation of HF LlamaMLP on the fused gate|up projection gu[T, 2F], the same math as
// src/ops/cpu/swiglu.cpp:  out[t,f] = silu(g) u,  g = gu[t,f], u = gu[t,F+f], s = sigmoid(g).
// Backward:  d_g += d_out u s (1 + g (1 - s));  d_u += d_out silu(g).
// Forward overwrites out[T,F]; backward accumulates into d_gu[T,2F]. One thread per (t, f).
#include "ops/cuda/common.cuh"
#include "ops/cuda/ops_cuda.h"

namespace verl::ops::cuda {

namespace {

using detail::from_f32;
using detail::to_f32;

constexpr int kThreads = 256;

template <typename T>
__global__ void swiglu_forward_kernel(T* out, const T* gu, int64_t T_, int64_t F) {
  const int64_t total = T_ * F;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / F, f = idx % F;
    const float g = to_f32(gu[t * 2 * F + f]);
    const float u = to_f32(gu[t * 2 * F + F + f]);
    const float s = 1.0f / (1.0f + expf(-g));
    out[idx] = from_f32<T>(g * s * u);
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(T* d_gu, const T* d_out, const T* gu, int64_t T_,
                                       int64_t F) {
  const int64_t total = T_ * F;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / F, f = idx % F;
    const int64_t ig = t * 2 * F + f, iu = ig + F;
    const float g = to_f32(gu[ig]), u = to_f32(gu[iu]);
    const float dout = to_f32(d_out[idx]);
    const float s = 1.0f / (1.0f + expf(-g));
    d_gu[ig] = from_f32<T>(to_f32(d_gu[ig]) + dout * u * s * (1.0f + g * (1.0f - s)));
    d_gu[iu] = from_f32<T>(to_f32(d_gu[iu]) + dout * (g * s));
  }
}

void check_shape(const char* op, int64_t T, int64_t F) {
  VERL_CUDA_REQUIRE(T >= 0 && F >= 0, detail::shape_str(op, {T, F}) + ": negative size");
}

template <typename T>
void forward_impl(const CudaContext& ctx, T* out, const T* gu, int64_t T_, int64_t F) {
  check_shape("swiglu_forward", T_, F);
  if (T_ * F == 0) return;
  swiglu_forward_kernel<T><<<detail::grid_for(T_ * F, kThreads), kThreads, 0, ctx.stream>>>(
      out, gu, T_, F);
  VERL_CUDA_CHECK_LAUNCH();
}

template <typename T>
void backward_impl(const CudaContext& ctx, T* d_gu, const T* d_out, const T* gu, int64_t T_,
                   int64_t F) {
  check_shape("swiglu_backward", T_, F);
  if (d_gu == nullptr || T_ * F == 0) return;
  swiglu_backward_kernel<T><<<detail::grid_for(T_ * F, kThreads), kThreads, 0, ctx.stream>>>(
      d_gu, d_out, gu, T_, F);
  VERL_CUDA_CHECK_LAUNCH();
}

}  // namespace

void swiglu_forward(const CudaContext& ctx, bf16* out, const bf16* gu, int64_t T, int64_t F) {
  forward_impl(ctx, out, gu, T, F);
}
void swiglu_forward(const CudaContext& ctx, float* out, const float* gu, int64_t T, int64_t F) {
  forward_impl(ctx, out, gu, T, F);
}
void swiglu_backward(const CudaContext& ctx, bf16* d_gu, const bf16* d_out, const bf16* gu,
                     int64_t T, int64_t F) {
  backward_impl(ctx, d_gu, d_out, gu, T, F);
}
void swiglu_backward(const CudaContext& ctx, float* d_gu, const float* d_out, const float* gu,
                     int64_t T, int64_t F) {
  backward_impl(ctx, d_gu, d_out, gu, T, F);
}

}  // namespace verl::ops::cuda
