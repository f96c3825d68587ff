// SwiGLU activation of HF LlamaMLP on the fused gate|up projection gu[T, 2F], the same math as
// src/ops/cpu/swiglu.cpp:  out[t,f] = silu(g) u,  g = gu[t,f], u = gu[t,F+f], s = sigmoid(g).
// Backward:  d_g += d_out u s (1 + g (1 - s));  d_u += d_out silu(g)  (accumulate = false: d_gu is
// overwritten with 0 + the update, the same bits as zeroing it first, without reading it).
// Forward overwrites out[T,F]. One block row per token, threads over packs of V columns (vec.cuh);
// the arithmetic is spelled with _rn intrinsics so no compiler contraction changes it between
// the vector and scalar paths.
#include "ops/cuda/common.cuh"
#include "ops/cuda/ops_cuda.h"
#include "ops/cuda/vec.cuh"

namespace verl::ops::cuda {

namespace {

using detail::Vec;
using detail::vload;
using detail::vstore;

__device__ __forceinline__ float sigmoid(float g) {
  return __frcp_rn(__fadd_rn(1.0f, expf(-g)));
}

template <typename T, int V>
__global__ void swiglu_forward_kernel(T* __restrict__ out, const T* __restrict__ gu, int64_t T_,
                                      int64_t F, int nvec) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (t >= T_) return;
  const T* g_row = gu + t * 2 * F;
  const T* u_row = g_row + F;
  T* o_row = out + t * F;
  for (int c = threadIdx.x; c < nvec; c += blockDim.x) {
    const Vec<T, V> g = vload<T, V>(g_row + c * V), u = vload<T, V>(u_row + c * V);
    Vec<T, V> o;
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float gi = g.f(i);
      o.set(i, __fmul_rn(__fmul_rn(gi, sigmoid(gi)), u.f(i)));
    }
    vstore(o_row + c * V, o);
  }
}

// One pack per thread over the flattened [T_, nvec] packs: every thread's loads are issued at
// once, where the row kernel's threads walk a row's packs one round trip after another (a decode
// step's 256 rows of 4864 columns: three passes).
template <typename T, int V>
__global__ void swiglu_forward_flat_kernel(T* __restrict__ out, const T* __restrict__ gu,
                                           int64_t packs, int64_t F, int nvec) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= packs) return;
  const int64_t t = i / nvec;
  const int c = static_cast<int>(i - t * nvec);
  const Vec<T, V> g = vload<T, V>(gu + t * 2 * F + c * V),
                  u = vload<T, V>(gu + t * 2 * F + F + c * V);
  Vec<T, V> o;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float gk = g.f(k);
    o.set(k, __fmul_rn(__fmul_rn(gk, sigmoid(gk)), u.f(k)));
  }
  vstore(out + t * F + c * V, o);
}

template <typename T, int V>
__global__ void swiglu_backward_kernel(T* __restrict__ d_gu, const T* __restrict__ d_out,
                                       const T* __restrict__ gu, int64_t T_, int64_t F, int nvec,
                                       bool accumulate) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (t >= T_) return;
  const int64_t row = t * 2 * F;
  for (int c = threadIdx.x; c < nvec; c += blockDim.x) {
    const int64_t ig = row + c * V, iu = ig + F;
    const Vec<T, V> g = vload<T, V>(gu + ig), u = vload<T, V>(gu + iu);
    const Vec<T, V> dout = vload<T, V>(d_out + t * F + c * V);
    Vec<T, V> dg, du;
    if (accumulate) {
      dg = vload<T, V>(d_gu + ig);
      du = vload<T, V>(d_gu + iu);
    }
#pragma unroll
    for (int i = 0; i < V; ++i) {
      const float gi = g.f(i), ui = u.f(i), di = dout.f(i);
      const float s = sigmoid(gi);
      const float dgi =
          __fmul_rn(__fmul_rn(__fmul_rn(di, ui), s), __fmaf_rn(gi, __fsub_rn(1.0f, s), 1.0f));
      const float dui = __fmul_rn(di, __fmul_rn(gi, s));
      dg.set(i, __fadd_rn(accumulate ? dg.f(i) : 0.0f, dgi));
      du.set(i, __fadd_rn(accumulate ? du.f(i) : 0.0f, dui));
    }
    vstore(d_gu + ig, dg);
    vstore(d_gu + iu, du);
  }
}

void check_shape(const char* op, int64_t T, int64_t F) {
  VERL_CUDA_REQUIRE(T >= 0 && F >= 0 && F < (int64_t{1} << 31) && T < (int64_t{1} << 31),
                    detail::shape_str(op, {T, F}) + ": need 0 <= T, F < 2^31");
}

// Widest pack that divides F with every pointer aligned for it.
template <typename T>
int swiglu_vec(int64_t F, const T* a, const T* b, const T* c) {
  return detail::pick_vec([&](int v) {
    return F % v == 0 && detail::vec_aligned(a, v) && detail::vec_aligned(b, v) &&
           detail::vec_aligned(c, v);
  });
}

template <typename T>
void forward_impl(const CudaContext& ctx, T* out, const T* gu, int64_t T_, int64_t F) {
  check_shape("swiglu_forward", T_, F);
  if (T_ * F == 0) return;
  detail::dispatch_vec(swiglu_vec(F, out, gu, gu), [&](auto vc) {
    constexpr int V = decltype(vc)::value;
    const int nvec = static_cast<int>(F / V);
    const int64_t packs = T_ * nvec;
    if (packs < (int64_t{1} << 31) * 256) {
      swiglu_forward_flat_kernel<T, V>
          <<<static_cast<unsigned>(detail::ceil_div(packs, 256)), 256, 0, ctx.stream>>>(
              out, gu, packs, F, nvec);
    } else {
      const auto L = detail::row_launch(T_, nvec);
      swiglu_forward_kernel<T, V><<<L.grid, L.block, 0, ctx.stream>>>(out, gu, T_, F, nvec);
    }
  });
  VERL_CUDA_CHECK_LAUNCH();
}

template <typename T>
void backward_impl(const CudaContext& ctx, T* d_gu, const T* d_out, const T* gu, int64_t T_,
                   int64_t F, bool accumulate) {
  check_shape("swiglu_backward", T_, F);
  if (d_gu == nullptr || T_ * F == 0) return;
  detail::dispatch_vec(swiglu_vec(F, d_gu, d_out, gu), [&](auto vc) {
    constexpr int V = decltype(vc)::value;
    const int nvec = static_cast<int>(F / V);
    const auto L = detail::row_launch(T_, nvec);
    swiglu_backward_kernel<T, V>
        <<<L.grid, L.block, 0, ctx.stream>>>(d_gu, d_out, gu, T_, F, nvec, accumulate);
  });
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
                     int64_t T, int64_t F, bool accumulate) {
  backward_impl(ctx, d_gu, d_out, gu, T, F, accumulate);
}
void swiglu_backward(const CudaContext& ctx, float* d_gu, const float* d_out, const float* gu,
                     int64_t T, int64_t F, bool accumulate) {
  backward_impl(ctx, d_gu, d_out, gu, T, F, accumulate);
}

}  // namespace verl::ops::cuda
