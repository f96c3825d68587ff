// Helpers shared by the kernels of src/ops/cuda (internal; not part of the op interface):
// fp32 <-> storage conversions, block-wide sums, launch-size arithmetic and the dynamic shared
// memory limit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "ops/cuda/cuda_check.h"

namespace verl::ops::cuda::detail {

// Storage is fp32 or bf16; arithmetic is always fp32 (round to nearest even on store).
__device__ __forceinline__ float to_f32(float x) {
  return x;
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Sum of v over the block, returned to every thread. blockDim.x must be a multiple of 32 and at
// most 1024. The order of additions is fixed by the block size, so results are reproducible.
// The leading __syncthreads lets a caller use it twice in a row.
template <typename T>
__device__ __forceinline__ T block_sum(T v) {
  __shared__ T warp_sums[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  __syncthreads();
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  T total = T(0);
  for (int w = 0; w < nwarps; ++w) total += warp_sums[w];
  return total;
}

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Raises a kernel's dynamic shared memory limit on the current device to at least `bytes`. The
// runtime is called only when the (kernel, device) needs more than it was given before, not on
// every launch.
inline void allow_dynamic_smem(const void* kernel, size_t bytes) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, size_t> given;
  int device = 0;
  VERL_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  size_t& have = given[{kernel, device}];
  if (have >= bytes) return;
  VERL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
  have = bytes;
}
template <typename Kernel>
void allow_dynamic_smem(Kernel* kernel, size_t bytes) {
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), bytes);
}

// Blocks for an element-wise kernel over n items with a grid-stride loop.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = ceil_div(n, threads);
  return static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

inline std::string shape_str(const char* op, std::initializer_list<int64_t> dims) {
  std::string s = op;
  s += ": dims (";
  bool first = true;
  for (int64_t d : dims) {
    if (!first) s += ", ";
    s += std::to_string(d);
    first = false;
  }
  return s + ")";
}

}  // namespace verl::ops::cuda::detail
