// Token embedding lookup, the same math as src/ops/cpu/embedding.cpp:
//   out[t,:] = table[ids[t],:]  (table [V,C]);  backward d_table[ids[t],:] += d_out[t,:].
// The backward scatters with fp32 atomicAdd (repeated ids add in arrival order). Ids outside
// [0,V) give a zero row / are skipped: the host validates ids before they reach the device.
// Forward overwrites out; backward accumulates into d_table. One thread per (t, c).
#include "ops/cuda/common.cuh"
#include "ops/cuda/ops_cuda.h"

namespace verl::ops::cuda {

namespace {

using detail::from_f32;
using detail::to_f32;

constexpr int kThreads = 256;

template <typename T>
__global__ void embedding_forward_kernel(T* out, const int32_t* ids, const T* table, int64_t T_,
                                         int64_t C, int64_t V) {
  const int64_t total = T_ * C;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / C, c = idx % C;
    const int64_t id = ids[t];
    out[idx] = (id >= 0 && id < V) ? table[id * C + c] : from_f32<T>(0.0f);
  }
}

template <typename T>
__global__ void embedding_backward_kernel(float* d_table, const T* d_out, const int32_t* ids,
                                          int64_t T_, int64_t C, int64_t V) {
  const int64_t total = T_ * C;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / C, c = idx % C;
    const int64_t id = ids[t];
    if (id >= 0 && id < V) atomicAdd(d_table + id * C + c, to_f32(d_out[idx]));
  }
}

void check_shape(const char* op, int64_t T, int64_t C, int64_t V) {
  VERL_CUDA_REQUIRE(T >= 0 && C >= 0 && V >= 0, detail::shape_str(op, {T, C, V}) + ": negative size");
}

template <typename T>
void forward_impl(const CudaContext& ctx, T* out, const int32_t* ids, const T* table, int64_t T_,
                  int64_t C, int64_t V) {
  check_shape("embedding_forward", T_, C, V);
  if (T_ * C == 0) return;
  embedding_forward_kernel<T><<<detail::grid_for(T_ * C, kThreads), kThreads, 0, ctx.stream>>>(
      out, ids, table, T_, C, V);
  VERL_CUDA_CHECK_LAUNCH();
}

template <typename T>
void backward_impl(const CudaContext& ctx, float* d_table, const T* d_out, const int32_t* ids,
                   int64_t T_, int64_t C, int64_t V) {
  check_shape("embedding_backward", T_, C, V);
  if (d_table == nullptr || T_ * C == 0) return;
  embedding_backward_kernel<T><<<detail::grid_for(T_ * C, kThreads), kThreads, 0, ctx.stream>>>(
      d_table, d_out, ids, T_, C, V);
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
