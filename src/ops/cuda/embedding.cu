// Token embedding lookup, the same math as src/ops/cpu/embedding.cpp:
//   out[t,:] = table[ids[t],:]  (table [V,C]);  backward d_table[ids[t],:] += d_out[t,:].
// The backward scatters with fp32 atomicAdd (repeated ids add in arrival order). Ids outside
// [0,V) give a zero row / are skipped: the host validates ids before they reach the device.
// Forward overwrites out; backward accumulates into d_table. One token row per block row, threads
// over packs of V columns (vec.cuh).
#include "ops/cuda/common.cuh"
#include "ops/cuda/ops_cuda.h"
#include "ops/cuda/vec.cuh"

namespace verl::ops::cuda {

namespace {

using detail::Vec;
using detail::vload;
using detail::vstore;

template <typename T, int V>
__global__ void embedding_forward_kernel(T* __restrict__ out, const int32_t* __restrict__ ids,
                                         const T* __restrict__ table, int64_t T_, int64_t C,
                                         int64_t V_, int nvec) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (t >= T_) return;
  const int64_t id = ids[t];
  const bool valid = id >= 0 && id < V_;
  const T* src = table + (valid ? id : 0) * C;
  T* dst = out + t * C;
  for (int c = threadIdx.x; c < nvec; c += blockDim.x) {
    Vec<T, V> x;
    if (valid) {
      x = vload<T, V>(src + static_cast<int64_t>(c) * V);
    } else {
#pragma unroll
      for (int i = 0; i < V; ++i) x.set(i, 0.0f);
    }
    vstore(dst + static_cast<int64_t>(c) * V, x);
  }
}

template <typename T, int V>
__global__ void embedding_backward_kernel(float* __restrict__ d_table, const T* __restrict__ d_out,
                                          const int32_t* __restrict__ ids, int64_t T_, int64_t C,
                                          int64_t V_, int nvec) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (t >= T_) return;
  const int64_t id = ids[t];
  if (id < 0 || id >= V_) return;
  float* dst = d_table + id * C;
  for (int c = threadIdx.x; c < nvec; c += blockDim.x) {
    const Vec<T, V> g = vload<T, V>(d_out + t * C + static_cast<int64_t>(c) * V);
#pragma unroll
    for (int i = 0; i < V; ++i) atomicAdd(dst + static_cast<int64_t>(c) * V + i, g.f(i));
  }
}

void check_shape(const char* op, int64_t T, int64_t C, int64_t V) {
  VERL_CUDA_REQUIRE(T >= 0 && C >= 0 && V >= 0 && T < (int64_t{1} << 31) && C < (int64_t{1} << 31),
                    detail::shape_str(op, {T, C, V}) + ": need 0 <= T, C < 2^31, V >= 0");
}

template <typename T>
int row_vec(int64_t C, const T* a, const T* b) {
  return detail::pick_vec(
      [&](int w) { return C % w == 0 && detail::vec_aligned(a, w) && detail::vec_aligned(b, w); });
}

template <typename T>
void forward_impl(const CudaContext& ctx, T* out, const int32_t* ids, const T* table, int64_t T_,
                  int64_t C, int64_t V) {
  check_shape("embedding_forward", T_, C, V);
  if (T_ * C == 0) return;
  detail::dispatch_vec(row_vec(C, out, table), [&](auto vc) {
    constexpr int W = decltype(vc)::value;
    const int nvec = static_cast<int>(C / W);
    const auto L = detail::row_launch(T_, nvec);
    embedding_forward_kernel<T, W>
        <<<L.grid, L.block, 0, ctx.stream>>>(out, ids, table, T_, C, V, nvec);
  });
  VERL_CUDA_CHECK_LAUNCH();
}

template <typename T>
void backward_impl(const CudaContext& ctx, float* d_table, const T* d_out, const int32_t* ids,
                   int64_t T_, int64_t C, int64_t V) {
  check_shape("embedding_backward", T_, C, V);
  if (d_table == nullptr || T_ * C == 0) return;
  detail::dispatch_vec(row_vec(C, d_out, d_out), [&](auto vc) {
    constexpr int W = decltype(vc)::value;
    const int nvec = static_cast<int>(C / W);
    const auto L = detail::row_launch(T_, nvec);
    embedding_backward_kernel<T, W>
        <<<L.grid, L.block, 0, ctx.stream>>>(d_table, d_out, ids, T_, C, V, nvec);
  });
  VERL_CUDA_CHECK_LAUNCH();
}

}  // namespace

void embedding_forward(const CudaContext& ctx, bf16* out, const int32_t* ids, const bf16* table,
                       int64_t T, int64_t C, int64_t V) {
  forward_impl(ctx, out, ids, table, T, C, V);
}
void embedding_forward(const CudaContext& ctx, float* out, const int32_t* ids, const float* table,
                       int64_t T, int64_t C, int64_t V) {
  forward_impl(ctx, out, ids, table, T, C, V);
}
void embedding_backward(const CudaContext& ctx, float* d_table, const bf16* d_out,
                        const int32_t* ids, int64_t T, int64_t C, int64_t V) {
  backward_impl(ctx, d_table, d_out, ids, T, C, V);
}
void embedding_backward(const CudaContext& ctx, float* d_table, const float* d_out,
                        const int32_t* ids, int64_t T, int64_t C, int64_t V) {
  backward_impl(ctx, d_table, d_out, ids, T, C, V);
}

}  // namespace verl::ops::cuda
