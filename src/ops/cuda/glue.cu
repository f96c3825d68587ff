// Element-wise glue kernels of the CUDA model (glue.h): the residual add, fp32 <-> bf16
// conversion, and the split / pack of the fused q|k|v rows. Flat kernels move one pack of V
// elements per thread with a scalar tail; the q|k|v kernels take one token row per block row
// (vec.cuh). The fused split + RoPE and RoPE backward + pack live in rope.cu with the rotation.
#include "ops/cuda/common.cuh"
#include "ops/cuda/glue.h"
#include "ops/cuda/vec.cuh"

namespace verl::ops::cuda {
namespace {

using detail::Vec;
using detail::vload;
using detail::vstore;

constexpr int kThreads = 256;

// Flat kernels: thread i handles pack i of the first nvec = n / V packs, and threads i < n % V
// also element nvec V + i (the tail).
__device__ __forceinline__ int64_t flat_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

template <int V>
__global__ void add_kernel(bf16* __restrict__ y, const bf16* __restrict__ x, int64_t nvec,
                           int tail) {
  const int64_t i = flat_index();
  if (i < nvec) {
    Vec<bf16, V> a = vload<bf16, V>(y + i * V);
    const Vec<bf16, V> b = vload<bf16, V>(x + i * V);
#pragma unroll
    for (int k = 0; k < V; ++k) a.set(k, __fadd_rn(a.f(k), b.f(k)));
    vstore(y + i * V, a);
  }
  if (i < tail) {
    const int64_t j = nvec * V + i;
    y[j] = __float2bfloat16_rn(__fadd_rn(__bfloat162float(y[j]), __bfloat162float(x[j])));
  }
}

template <typename TO, typename TI, int V>
__global__ void convert_kernel(TO* __restrict__ out, const TI* __restrict__ x, int64_t nvec,
                               int tail) {
  const int64_t i = flat_index();
  if (i < nvec) vstore(out + i * V, detail::vconvert<TO, TI, V>(vload<TI, V>(x + i * V)));
  if (i < tail) {
    const int64_t j = nvec * V + i;
    out[j] = detail::from_f32<TO>(detail::to_f32(x[j]));
  }
}

// One token row per block row; pack c of the row [q | k | v] (W = qd + 2 kvd elements).
template <int V>
__global__ void split_kernel(bf16* __restrict__ q, bf16* __restrict__ k, bf16* __restrict__ v,
                             const bf16* __restrict__ qkv, int64_t T, int64_t qd, int64_t kvd) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (t >= T) return;
  const int nq = static_cast<int>(qd / V), nk = static_cast<int>(kvd / V), n = nq + 2 * nk;
  const bf16* row = qkv + t * (qd + 2 * kvd);
  for (int c = threadIdx.x; c < n; c += blockDim.x) {
    const Vec<bf16, V> x = vload<bf16, V>(row + static_cast<int64_t>(c) * V);
    if (c < nq) {
      vstore(q + t * qd + static_cast<int64_t>(c) * V, x);
    } else if (c < nq + nk) {
      vstore(k + t * kvd + static_cast<int64_t>(c - nq) * V, x);
    } else {
      vstore(v + t * kvd + static_cast<int64_t>(c - nq - nk) * V, x);
    }
  }
}

template <typename TQ, typename TV, int V>
__global__ void pack_kernel(bf16* __restrict__ d_qkv, const TQ* __restrict__ d_q,
                            const TQ* __restrict__ d_k, const TV* __restrict__ d_v, int64_t T,
                            int64_t qd, int64_t kvd) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (t >= T) return;
  const int nq = static_cast<int>(qd / V), nk = static_cast<int>(kvd / V), n = nq + 2 * nk;
  bf16* row = d_qkv + t * (qd + 2 * kvd);
  for (int c = threadIdx.x; c < n; c += blockDim.x) {
    Vec<bf16, V> y;
    if (c < nq) {
      y = detail::vconvert<bf16, TQ, V>(vload<TQ, V>(d_q + t * qd + static_cast<int64_t>(c) * V));
    } else if (c < nq + nk) {
      y = detail::vconvert<bf16, TQ, V>(
          vload<TQ, V>(d_k + t * kvd + static_cast<int64_t>(c - nq) * V));
    } else {
      y = detail::vconvert<bf16, TV, V>(
          vload<TV, V>(d_v + t * kvd + static_cast<int64_t>(c - nq - nk) * V));
    }
    vstore(row + static_cast<int64_t>(c) * V, y);
  }
}

unsigned flat_blocks(int64_t nvec, int tail) {
  const int64_t threads = nvec > tail ? nvec : tail;
  return static_cast<unsigned>(detail::ceil_div(threads, kThreads));
}

void check_flat(const char* op, int64_t n) {
  VERL_CUDA_REQUIRE(n < (int64_t{1} << 38),
                    std::string(op) + ": n = " + std::to_string(n) + " elements, need n < 2^38");
}

void check_qkv(const char* op, int64_t T, int64_t qd, int64_t kvd) {
  VERL_CUDA_REQUIRE(
      T >= 0 && qd >= 0 && kvd >= 0 && T < (int64_t{1} << 31) && qd + 2 * kvd < (int64_t{1} << 31),
      detail::shape_str(op, {T, qd, kvd}) + ": need 0 <= T, qd + 2 kvd < 2^31");
}

template <typename TQ>
void pack_impl(const CudaContext& ctx, bf16* d_qkv, const TQ* d_q, const TQ* d_k, const float* d_v,
               int64_t T, int64_t qd, int64_t kvd) {
  check_qkv("pack_qkv", T, qd, kvd);
  if (T * (qd + 2 * kvd) == 0) return;
  const int vec = detail::pick_vec([&](int w) {
    return qd % w == 0 && kvd % w == 0 && detail::vec_aligned(d_qkv, w) &&
           detail::vec_aligned(d_q, w) && detail::vec_aligned(d_k, w) &&
           detail::vec_aligned(d_v, w);
  });
  detail::dispatch_vec(vec, [&](auto vc) {
    constexpr int V = decltype(vc)::value;
    const auto L = detail::row_launch(T, (qd + 2 * kvd) / V);
    pack_kernel<TQ, float, V><<<L.grid, L.block, 0, ctx.stream>>>(d_qkv, d_q, d_k, d_v, T, qd, kvd);
  });
  VERL_CUDA_CHECK_LAUNCH();
}

template <typename TO, typename TI>
void convert_impl(const CudaContext& ctx, TO* out, const TI* x, int64_t n) {
  check_flat("convert", n);
  if (n <= 0) return;
  const int vec = detail::pick_vec(
      [&](int w) { return detail::vec_aligned(out, w) && detail::vec_aligned(x, w); });
  detail::dispatch_vec(vec, [&](auto vc) {
    constexpr int V = decltype(vc)::value;
    const int64_t nvec = n / V;
    const int tail = static_cast<int>(n - nvec * V);
    convert_kernel<TO, TI, V>
        <<<flat_blocks(nvec, tail), kThreads, 0, ctx.stream>>>(out, x, nvec, tail);
  });
  VERL_CUDA_CHECK_LAUNCH();
}

}  // namespace

void add_inplace(const CudaContext& ctx, bf16* y, const bf16* x, int64_t n) {
  check_flat("add_inplace", n);
  if (n <= 0) return;
  const int vec = detail::pick_vec(
      [&](int w) { return detail::vec_aligned(y, w) && detail::vec_aligned(x, w); });
  detail::dispatch_vec(vec, [&](auto vc) {
    constexpr int V = decltype(vc)::value;
    const int64_t nvec = n / V;
    const int tail = static_cast<int>(n - nvec * V);
    add_kernel<V><<<flat_blocks(nvec, tail), kThreads, 0, ctx.stream>>>(y, x, nvec, tail);
  });
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
  check_qkv("split_qkv", T, qd, kvd);
  if (T * (qd + 2 * kvd) == 0) return;
  const int vec = detail::pick_vec([&](int w) {
    return qd % w == 0 && kvd % w == 0 && detail::vec_aligned(qkv, w) &&
           detail::vec_aligned(q, w) && detail::vec_aligned(k, w) && detail::vec_aligned(v, w);
  });
  detail::dispatch_vec(vec, [&](auto vc) {
    constexpr int V = decltype(vc)::value;
    const auto L = detail::row_launch(T, (qd + 2 * kvd) / V);
    split_kernel<V><<<L.grid, L.block, 0, ctx.stream>>>(q, k, v, qkv, T, qd, kvd);
  });
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

namespace {

// One block row per indexed row; the row moves as 16-byte words when its bytes and both bases
// allow, else element by element. Scatter = gather with the index on the other side.
template <typename W, bool kScatter>
__global__ void rows_kernel(W* __restrict__ out, const W* __restrict__ in,
                            const int32_t* __restrict__ rows, int64_t words) {
  const int64_t i = blockIdx.x;
  const int64_t r = rows[i];
  W* dst = out + (kScatter ? r : i) * words;
  const W* src = in + (kScatter ? i : r) * words;
  for (int64_t j = threadIdx.x; j < words; j += blockDim.x) dst[j] = src[j];
}

template <bool kScatter, typename T>
void move_rows(const CudaContext& ctx, T* out, const T* in, const int32_t* rows, int64_t n,
               int64_t width) {
  if (n <= 0 || width <= 0) return;
  const int64_t bytes = width * static_cast<int64_t>(sizeof(T));
  const bool wide = bytes % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0 &&
                    reinterpret_cast<uintptr_t>(in) % 16 == 0;
  const int threads = 128;
  if (wide) {
    rows_kernel<uint4, kScatter><<<static_cast<unsigned>(n), threads, 0, ctx.stream>>>(
        reinterpret_cast<uint4*>(out), reinterpret_cast<const uint4*>(in), rows, bytes / 16);
  } else {
    rows_kernel<T, kScatter>
        <<<static_cast<unsigned>(n), threads, 0, ctx.stream>>>(out, in, rows, width);
  }
  VERL_CUDA_CHECK_LAUNCH();
}

}  // namespace

void gather_rows(const CudaContext& ctx, bf16* out, const bf16* in, const int32_t* rows, int64_t n,
                 int64_t width) {
  move_rows<false>(ctx, out, in, rows, n, width);
}
void gather_rows(const CudaContext& ctx, float* out, const float* in, const int32_t* rows,
                 int64_t n, int64_t width) {
  move_rows<false>(ctx, out, in, rows, n, width);
}
void gather_rows(const CudaContext& ctx, int32_t* out, const int32_t* in, const int32_t* rows,
                 int64_t n, int64_t width) {
  move_rows<false>(ctx, out, in, rows, n, width);
}
void scatter_rows(const CudaContext& ctx, bf16* out, const bf16* in, const int32_t* rows, int64_t n,
                  int64_t width) {
  move_rows<true>(ctx, out, in, rows, n, width);
}
void scatter_rows(const CudaContext& ctx, float* out, const float* in, const int32_t* rows,
                  int64_t n, int64_t width) {
  move_rows<true>(ctx, out, in, rows, n, width);
}

namespace {
__global__ void spin_kernel(uint64_t ns) {
  uint64_t t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
}  // namespace

void gpu_spin(const CudaContext& ctx, uint32_t microseconds) {
  spin_kernel<<<1, 1, 0, ctx.stream>>>(static_cast<uint64_t>(microseconds) * 1000u);
  VERL_CUDA_CHECK_LAUNCH();
}

}  // namespace verl::ops::cuda
