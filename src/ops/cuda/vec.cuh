// Vectorised access for the memory-bound kernels (swiglu, rope, rmsnorm, embedding, glue): V
// consecutive elements move as 16-byte transactions (8 x bf16 or 4 x fp32; 8 x fp32 is two), and
// the host picks the widest V that the pointers' alignment and the row sizes allow, down to V = 1
// (the scalar fallback, same math). Rows come from blockIdx, columns from a loop over packs, so
// no 64-bit division runs per element. Internal to src/ops/cuda.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ops/cuda/common.cuh"

namespace verl::ops::cuda::detail {

// ---- device side --------------------------------------------------------------------------------

template <int Bytes>
struct WordOf;
template <>
struct WordOf<2> {
  using type = unsigned short;
};
template <>
struct WordOf<4> {
  using type = unsigned int;
};
template <>
struct WordOf<8> {
  using type = uint2;
};
template <>
struct WordOf<16> {
  using type = uint4;
};

// V elements of T held in registers; moved to and from memory as words of min(16, V sizeof(T))
// bytes, so the address must be aligned to that (vec_aligned checks it on the host).
template <typename T, int V>
struct VecWords {
  static constexpr int kBytes = V * static_cast<int>(sizeof(T));
  static constexpr int kWordBytes = kBytes < 16 ? kBytes : 16;
  static constexpr int kWords = kBytes / kWordBytes;
  using Word = typename WordOf<kWordBytes>::type;
};

// f(i) reads element i as fp32, set(i, x) rounds x into it (i a constant after unrolling).
template <typename T, int V>
struct Vec {
  T e[V] = {};
  __device__ __forceinline__ float f(int i) const { return to_f32(e[i]); }
  __device__ __forceinline__ void set(int i, float x) { e[i] = from_f32<T>(x); }
};

// bf16 pairs stay packed in 32-bit words (a lone bf16 would take a whole register); bf16 -> fp32
// is the top half of the fp32 bits.
template <int V>
struct Vec<__nv_bfloat16, V> {
  static_assert(V == 1 || V % 2 == 0, "bf16 packs of 1, 2, 4 or 8");
  static constexpr int kRegs = V == 1 ? 1 : V / 2;
  using Reg = std::conditional_t<V == 1, unsigned short, unsigned int>;
  Reg w[kRegs] = {};  // set() fills one half of a word at a time: no undefined other half
  __device__ __forceinline__ float f(int i) const {
    if constexpr (V == 1)
      return __uint_as_float(static_cast<unsigned int>(w[0]) << 16);
    else
      return __uint_as_float(i % 2 == 0 ? w[i / 2] << 16 : w[i / 2] & 0xffff0000u);
  }
  __device__ __forceinline__ void set(int i, float x) {
    const unsigned short h = __bfloat16_as_ushort(__float2bfloat16_rn(x));
    if constexpr (V == 1) {
      w[0] = h;
    } else if (i % 2 == 0) {
      w[i / 2] = (w[i / 2] & 0xffff0000u) | h;
    } else {
      w[i / 2] = (w[i / 2] & 0x0000ffffu) | (static_cast<unsigned int>(h) << 16);
    }
  }
};

template <typename T, int V>
__device__ __forceinline__ Vec<T, V> vload(const T* p) {
  using W = VecWords<T, V>;
  static_assert(sizeof(Vec<T, V>) == W::kBytes, "a pack is its elements");
  typename W::Word w[W::kWords];
#pragma unroll
  for (int k = 0; k < W::kWords; ++k) w[k] = reinterpret_cast<const typename W::Word*>(p)[k];
  Vec<T, V> v;
  memcpy(&v, w, sizeof(w));
  return v;
}

template <typename T, int V>
__device__ __forceinline__ void vstore(T* p, const Vec<T, V>& v) {
  using W = VecWords<T, V>;
  typename W::Word w[W::kWords];
  memcpy(w, &v, sizeof(w));
#pragma unroll
  for (int k = 0; k < W::kWords; ++k) reinterpret_cast<typename W::Word*>(p)[k] = w[k];
}

// Converting copy of a pack; a same-type copy keeps the bits (NaN payloads included).
template <typename TO, typename TI, int V>
__device__ __forceinline__ Vec<TO, V> vconvert(const Vec<TI, V>& x) {
  if constexpr (std::is_same_v<TO, TI>) {
    return x;
  } else {
    Vec<TO, V> y;
#pragma unroll
    for (int i = 0; i < V; ++i) y.set(i, x.f(i));
    return y;
  }
}

// ---- host side
// ------------------------------------------------------------------------------------

constexpr int kMaxVec = 8;

// True when p can be accessed as Vec<T, V> at every offset that is a multiple of V.
template <typename T>
bool vec_aligned(const T* p, int V) {
  const size_t bytes = static_cast<size_t>(V) * sizeof(T);
  return reinterpret_cast<uintptr_t>(p) % (bytes < 16 ? bytes : 16) == 0;
}

// The widest V in {8, 4, 2, 1} for which ok(V) holds (ok(1) must hold).
template <typename Ok>
int pick_vec(Ok ok) {
  for (int v = kMaxVec; v > 1; v /= 2) {
    if (ok(v)) return v;
  }
  return 1;
}

// Calls f(std::integral_constant<int, V>{}) for the runtime V in {8, 4, 2, 1}.
template <typename F>
void dispatch_vec(int v, F&& f) {
  switch (v) {
    case 8:
      f(std::integral_constant<int, 8>{});
      break;
    case 4:
      f(std::integral_constant<int, 4>{});
      break;
    case 2:
      f(std::integral_constant<int, 2>{});
      break;
    default:
      f(std::integral_constant<int, 1>{});
      break;
  }
}

// Launch shape of a row kernel: blockDim.y rows per block, blockDim.x threads looping over the
// `items` packs of a row. blockDim.x is a multiple of 32 sized so the last pass over a row leaves
// few threads idle; about 256 threads per block.
struct RowLaunch {
  dim3 grid, block;
};
inline RowLaunch row_launch(int64_t rows, int64_t items) {
  const int64_t passes = ceil_div(items, 256);
  const int64_t bx = ceil_div(ceil_div(items, passes), 32) * 32;
  const int64_t by = 256 / bx > 0 ? 256 / bx : 1;
  return {dim3(static_cast<unsigned>(ceil_div(rows, by))),
          dim3(static_cast<unsigned>(bx), static_cast<unsigned>(by))};
}

}  // namespace verl::ops::cuda::detail
