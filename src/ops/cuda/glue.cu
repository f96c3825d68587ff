// Element-wise glue kernels of the CUDA model (glue.h). One thread per element, grid-stride loops.
#include "ops/cuda/common.cuh"
#include "ops/cuda/glue.h"

namespace verl::ops::cuda {
namespace {

using detail::from_f32;
using detail::to_f32;

constexpr int kThreads = 256;

__global__ void add_kernel(bf16* y, const bf16* x, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = __float2bfloat16_rn(__bfloat162float(y[i]) + __bfloat162float(x[i]));
  }
}

template <typename TO, typename TI>
__global__ void convert_kernel(TO* out, const TI* x, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = from_f32<TO>(to_f32(x[i]));
  }
}

__global__ void split_kernel(bf16* q, bf16* k, bf16* v, const bf16* qkv, int64_t T, int64_t qd,
                             int64_t kvd) {
  const int64_t W = qd + 2 * kvd, n = T * W;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / W, c = i % W;
    if (c < qd) {
      q[t * qd + c] = qkv[i];
    } else if (c < qd + kvd) {
      k[t * kvd + (c - qd)] = qkv[i];
    } else {
      v[t * kvd + (c - qd - kvd)] = qkv[i];
    }
  }
}

template <typename TQ, typename TV>
__global__ void pack_kernel(bf16* d_qkv, const TQ* d_q, const TQ* d_k, const TV* d_v, int64_t T,
                            int64_t qd, int64_t kvd) {
  const int64_t W = qd + 2 * kvd, n = T * W;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / W, c = i % W;
    float x;
    if (c < qd) {
      x = to_f32(d_q[t * qd + c]);
    } else if (c < qd + kvd) {
      x = to_f32(d_k[t * kvd + (c - qd)]);
    } else {
      x = to_f32(d_v[t * kvd + (c - qd - kvd)]);
    }
    d_qkv[i] = __float2bfloat16_rn(x);
  }
}

template <typename TQ>
void pack_impl(const CudaContext& ctx, bf16* d_qkv, const TQ* d_q, const TQ* d_k, const float* d_v,
               int64_t T, int64_t qd, int64_t kvd) {
  const int64_t n = T * (qd + 2 * kvd);
  if (n <= 0) return;
  pack_kernel<TQ, float><<<detail::grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(
      d_qkv, d_q, d_k, d_v, T, qd, kvd);
  VERL_CUDA_CHECK_LAUNCH();
}

template <typename TO, typename TI>
void convert_impl(const CudaContext& ctx, TO* out, const TI* x, int64_t n) {
  if (n <= 0) return;
  convert_kernel<TO, TI><<<detail::grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(out, x, n);
  VERL_CUDA_CHECK_LAUNCH();
}

}  // namespace

void add_inplace(const CudaContext& ctx, bf16* y, const bf16* x, int64_t n) {
  if (n <= 0) return;
  add_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(y, x, n);
  VERL_CUDA_CHECK_LAUNCH();
}

void convert(const CudaContext& ctx, bf16* out, const float* x, int64_t n) {
  convert_impl(ctx, out, x, n);
}
void convert(const CudaContext& ctx, float* out, const bf16* x, int64_t n) {
  convert_impl(ctx, out, x, n);
}

void split_qkv(const CudaContext& ctx, bf16* q, bf16* k, bf16* v, const bf16* qkv, int64_t T,
               int64_t qd, int64_t kvd) {
  const int64_t n = T * (qd + 2 * kvd);
  if (n <= 0) return;
  split_kernel<<<detail::grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(q, k, v, qkv, T, qd,
                                                                          kvd);
  VERL_CUDA_CHECK_LAUNCH();
}

void pack_qkv(const CudaContext& ctx, bf16* d_qkv, const float* d_q, const float* d_k,
              const float* d_v, int64_t T, int64_t qd, int64_t kvd) {
  pack_impl(ctx, d_qkv, d_q, d_k, d_v, T, qd, kvd);
}
void pack_qkv(const CudaContext& ctx, bf16* d_qkv, const bf16* d_q, const bf16* d_k,
              const float* d_v, int64_t T, int64_t qd, int64_t kvd) {
  pack_impl(ctx, d_qkv, d_q, d_k, d_v, T, qd, kvd);
}

}  // namespace verl::ops::cuda
