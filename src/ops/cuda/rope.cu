// Rotary position embedding, HF "rotate_half" layout, in place on x[T, nh, D], the same math as
// src/ops/cpu/rope.cpp:  a = pos[t] * inv_freq[i] (fp32, i < D/2),
//   x'[i] = x[i] cos a - x[i+D/2] sin a,  x'[i+D/2] = x[i+D/2] cos a + x[i] sin a.
// The backward is the rotation by -a applied to the gradient. Both overwrite their buffer.
// One thread per (token, head, i) pair; sincosf is the accurate one (no fast-math).
#include "ops/cuda/common.cuh"
#include "ops/cuda/ops_cuda.h"

namespace verl::ops::cuda {

namespace {

using detail::from_f32;
using detail::to_f32;

template <typename T>
__global__ void rope_kernel(T* x, const int32_t* pos, const float* inv_freq, int64_t T_,
                            int64_t nh, int64_t half, float sign) {
  const int64_t total = T_ * nh * half;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx % half;
    const int64_t row = idx / half;  // t * nh + h
    const int64_t t = row / nh;
    const float a = static_cast<float>(pos[t]) * inv_freq[i];
    float s, c;
    sincosf(a, &s, &c);
    s *= sign;
    T* xr = x + row * 2 * half;
    const float x1 = to_f32(xr[i]), x2 = to_f32(xr[i + half]);
    xr[i] = from_f32<T>(x1 * c - x2 * s);
    xr[i + half] = from_f32<T>(x2 * c + x1 * s);
  }
}

template <typename T>
void rope_impl(const CudaContext& ctx, T* x, const int32_t* pos, const float* inv_freq, int64_t T_,
               int64_t nh, int64_t D, float sign) {
  VERL_CUDA_REQUIRE(T_ >= 0 && nh >= 0 && D >= 0 && D % 2 == 0,
                    detail::shape_str("rope", {T_, nh, D}) + ": the head dim D must be even");
  const int64_t total = T_ * nh * (D / 2);
  if (total == 0) return;
  constexpr int kThreads = 256;
  rope_kernel<T><<<detail::grid_for(total, kThreads), kThreads, 0, ctx.stream>>>(
      x, pos, inv_freq, T_, nh, D / 2, sign);
  VERL_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rope_forward(const CudaContext& ctx, bf16* x, const int32_t* pos, const float* inv_freq,
                  int64_t T, int64_t nh, int64_t D) {
  rope_impl(ctx, x, pos, inv_freq, T, nh, D, 1.0f);
}
void rope_forward(const CudaContext& ctx, float* x, const int32_t* pos, const float* inv_freq,
                  int64_t T, int64_t nh, int64_t D) {
  rope_impl(ctx, x, pos, inv_freq, T, nh, D, 1.0f);
}
void rope_backward(const CudaContext& ctx, bf16* d_x, const int32_t* pos, const float* inv_freq,
                   int64_t T, int64_t nh, int64_t D) {
  rope_impl(ctx, d_x, pos, inv_freq, T, nh, D, -1.0f);
}
void rope_backward(const CudaContext& ctx, float* d_x, const int32_t* pos, const float* inv_freq,
                   int64_t T, int64_t nh, int64_t D) {
  rope_impl(ctx, d_x, pos, inv_freq, T, nh, D, -1.0f);
}

}  // namespace verl::ops::cuda
