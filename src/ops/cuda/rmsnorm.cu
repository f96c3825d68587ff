// RMSNorm (HF LlamaRMSNorm) over R rows of C, the same math as src/ops/cpu/rmsnorm.cpp:
//   rstd[r] = 1 / sqrt(mean_c x[r,c]^2 + eps),  out[r,c] = w[c] * x[r,c] * rstd[r].
// Backward, with g = d_out and a = rstd[r]:
//   d_x[r,c] += a w[c] g[r,c] - a^3 / C x[r,c] sum_k w[k] g[r,k] x[r,k]   (or = 0 + ..., when
//              accumulate_dx is false: the bits of zeroing d_x first, without reading it)
//   d_w[c]   += sum_r g[r,c] x[r,c] a_r
//
// Fast path (rows of at most 1024 packs of V columns): a group of G threads per row (4..32 lanes
// for short rows such as a head dim, a warp for C = 896, the whole block for longer rows), each
// thread keeping its NV packs (pack lane + G k) in registers, so x is read once. The backward
// computes d_x and d_w in one pass: a block owns a fixed range of rows, each thread sums g x a of
// its columns over its rows, the block's groups are added in a fixed order and written to
// ctx.workspace ([blocks, C] floats), and a second kernel adds the blocks in order. The partition
// depends only on R, C, the pack width and the workspace size: deterministic, no atomics.
// Plain path (longer rows): one block per row and a separate two-pass d_w, the reference the fast
// path was developed against.
#include <algorithm>
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/glue.h"
#include "ops/cuda/ops_cuda.h"
#include "ops/cuda/vec.cuh"

namespace verl::ops::cuda {

namespace {

using detail::block_sum;
using detail::from_f32;
using detail::to_f32;
using detail::Vec;
using detail::vload;
using detail::vstore;

constexpr int kThreads = 256;       // every kernel of this file
constexpr int kMaxPacks = 1024;     // fast path: packs per row, G * NV at most
constexpr int kTargetBlocks = 512;  // fast backward with d_w: about this many row blocks

// Sum over the G threads of a group (G a power of two up to 32, or the whole block): a butterfly
// within the warp, then the warps' sums in order through shared memory. Every thread of the block
// must call it; all threads of a group get the same bits.
template <int G>
__device__ __forceinline__ float group_sum(float v) {
  constexpr int kSpan = G < 32 ? G : 32;
#pragma unroll
  for (int off = kSpan / 2; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  if constexpr (G > 32) {
    static_assert(G == kThreads, "a group is at most a warp, or the whole block");
    __shared__ float warp_sums[kThreads / 32];
    __syncthreads();  // the previous call's readers are done
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x / 32] = v;
    __syncthreads();
    v = 0.0f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) v += warp_sums[w];
  }
  return v;
}

// ---- fast path ----------------------------------------------------------------------------------

// With resid (add_rmsnorm_forward): x[r] = x[r] + resid[r] first (rounded to T and stored back),
// the bits of add_inplace followed by the plain op.
template <typename T, int V, int G, int NV>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_forward_fast(T* __restrict__ out, float* __restrict__ rstd, T* __restrict__ x,
                         const T* __restrict__ resid, const T* __restrict__ w, int64_t R, int64_t C,
                         int nvec, float eps) {
  const int lane = threadIdx.x % G;  // blockDim.x: a multiple of G (kThreads when G = kThreads)
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / G) + threadIdx.x / G;
  const bool active = r < R;
  T* xr = x + (active ? r : 0) * C;
  Vec<T, V> xv[NV];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c = lane + k * G;
    if (active && c < nvec) {
      xv[k] = vload<T, V>(xr + c * V);
      if (resid != nullptr) {
        const Vec<T, V> yv = vload<T, V>(resid + (xr - x) + c * V);
#pragma unroll
        for (int i = 0; i < V; ++i) xv[k].set(i, __fadd_rn(xv[k].f(i), yv.f(i)));
        vstore(xr + c * V, xv[k]);
      }
#pragma unroll
      for (int i = 0; i < V; ++i) ss = __fmaf_rn(xv[k].f(i), xv[k].f(i), ss);
    }
  }
  // The weights do not depend on the row: read them before the reduction, not after it (the
  // kernel is a few memory round trips long at decode batch sizes).
  Vec<T, V> wv[NV];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c = lane + k * G;
    if (c < nvec) wv[k] = vload<T, V>(w + c * V);
  }
  ss = group_sum<G>(ss);
  if (!active) return;
  const float a = 1.0f / sqrtf(ss / static_cast<float>(C) + eps);
  if (rstd != nullptr && lane == 0) rstd[r] = a;
  T* yr = out + r * C;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c = lane + k * G;
    if (c < nvec) {
      Vec<T, V> y;
#pragma unroll
      for (int i = 0; i < V; ++i) y.set(i, __fmul_rn(wv[k].f(i), __fmul_rn(xv[k].f(i), a)));
      vstore(yr + c * V, y);
    }
  }
}

// d_x for rows [blockIdx.x * rows_per_block, +rows_per_block), group j taking rows j, j + NG, ...;
// with dw_partial, the block's column sums of g x a go to dw_partial[blockIdx.x, :].
template <typename T, int V, int G, int NV>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_backward_fast(T* __restrict__ d_x, float* __restrict__ dw_partial,
                          const T* __restrict__ d_out, const T* __restrict__ x,
                          const T* __restrict__ w, const float* __restrict__ rstd, int64_t R,
                          int64_t C, int nvec, int rows_per_block, bool accumulate) {
  extern __shared__ float red[];  // [C], the block's d_w sum
  constexpr int NG = kThreads / G;
  const int lane = threadIdx.x % G, grp = threadIdx.x / G;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < R ? r0 + rows_per_block : R;
  const bool want_dx = d_x != nullptr, want_dw = dw_partial != nullptr;

  Vec<T, V> wv[NV];
  if (want_dx) {
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c = lane + k * G;
      if (c < nvec) wv[k] = vload<T, V>(w + c * V);
    }
  }
  float dw[NV][V];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
#pragma unroll
    for (int i = 0; i < V; ++i) dw[k][i] = 0.0f;
  }

  const int iters = (rows_per_block + NG - 1) / NG;
  for (int it = 0; it < iters; ++it) {
    const int64_t r = r0 + grp + static_cast<int64_t>(it) * NG;
    const bool active = r < r1;
    const float a = active ? rstd[r] : 0.0f;
    const int64_t base = (active ? r : 0) * C;
    Vec<T, V> xv[NV], gv[NV];
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c = lane + k * G;
      if (active && c < nvec) {
        xv[k] = vload<T, V>(x + base + c * V);
        gv[k] = vload<T, V>(d_out + base + c * V);
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const float gx = __fmul_rn(gv[k].f(i), xv[k].f(i));
          if (want_dx) dot = __fmaf_rn(wv[k].f(i), gx, dot);
          if (want_dw) dw[k][i] = __fmaf_rn(gx, a, dw[k][i]);
        }
      }
    }
    if (!want_dx) continue;
    dot = group_sum<G>(dot);
    if (!active) continue;
    const float coef = __fmul_rn(__fmul_rn(__fmul_rn(a, a), a), dot) / static_cast<float>(C);
    T* dxr = d_x + base;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int c = lane + k * G;
      if (c < nvec) {
        Vec<T, V> y;
        if (accumulate) y = vload<T, V>(dxr + c * V);
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const float d =
              __fmaf_rn(__fmul_rn(a, wv[k].f(i)), gv[k].f(i), -__fmul_rn(coef, xv[k].f(i)));
          y.set(i, __fadd_rn(accumulate ? y.f(i) : 0.0f, d));
        }
        vstore(dxr + c * V, y);
      }
    }
  }
  if (!want_dw) return;

  // Groups of a warp hold the same columns: butterfly over the group bits of the lane index.
  for (int off = G; off < 32; off <<= 1) {
#pragma unroll
    for (int k = 0; k < NV; ++k) {
#pragma unroll
      for (int i = 0; i < V; ++i) dw[k][i] += __shfl_xor_sync(0xffffffffu, dw[k][i], off);
    }
  }
  // Then the first group of warp 0 (or group 0, for groups of a warp or more), plus the next
  // one's, ... in order, through shared memory.
  const int step = G < 32 ? static_cast<int>(threadIdx.x / 32) : grp;
  const bool leader = G < 32 ? (threadIdx.x & 31) < G : true;
  constexpr int kSteps = G < 32 ? kThreads / 32 : NG;
  for (int st = 0; st < kSteps; ++st) {
    if (step == st && leader) {
#pragma unroll
      for (int k = 0; k < NV; ++k) {
        const int c = lane + k * G;
        if (c < nvec) {
#pragma unroll
          for (int i = 0; i < V; ++i) {
            float* p = red + c * V + i;
            *p = st == 0 ? dw[k][i] : *p + dw[k][i];
          }
        }
      }
    }
    __syncthreads();
  }
  float* part = dw_partial + static_cast<int64_t>(blockIdx.x) * C;
  for (int c = threadIdx.x; c < C; c += kThreads) part[c] = red[c];
}

// d_w[c] += sum over blocks b of partial[b, c]: 16 lanes each add every 16th block in order, then
// the 16 lane sums are added in order.
__global__ void rmsnorm_dw_reduce_kernel(float* d_w, const float* partial, int nblocks, int64_t C) {
  __shared__ float s[16][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float acc = 0.0f;
  if (c < C) {
    for (int b = threadIdx.y; b < nblocks; b += 16) acc += partial[b * C + c];
  }
  s[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float total = 0.0f;
    for (int y = 0; y < 16; ++y) total += s[y][threadIdx.x];
    d_w[c] += total;
  }
}

// ---- plain path ---------------------------------------------------------------------------------

template <typename T>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* x, const T* w, int64_t C,
                                       float eps) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * C;
  T* yr = out + r * C;
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = to_f32(xr[c]);
    ss += v * v;
  }
  ss = block_sum(ss);
  const float a = 1.0f / sqrtf(ss / static_cast<float>(C) + eps);
  if (rstd != nullptr && threadIdx.x == 0) rstd[r] = a;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    yr[c] = from_f32<T>(to_f32(w[c]) * (to_f32(xr[c]) * a));
  }
}

template <typename T>
__global__ void rmsnorm_backward_dx_kernel(T* d_x, const T* d_out, const T* x, const T* w,
                                           const float* rstd, int64_t C, bool accumulate) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * C;
  const T* gr = d_out + r * C;
  T* dxr = d_x + r * C;
  const float a = rstd[r];
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    dot += to_f32(w[c]) * to_f32(gr[c]) * to_f32(xr[c]);
  }
  dot = block_sum(dot);
  const float coef = a * a * a * dot / static_cast<float>(C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = a * to_f32(w[c]) * to_f32(gr[c]) - coef * to_f32(xr[c]);
    dxr[c] = from_f32<T>(__fadd_rn(accumulate ? to_f32(dxr[c]) : 0.0f, d));
  }
}

// Pass 1 of d_w: block (32 columns x 8 row lanes) sums rows [chunk*rows_per, ...) of its columns.
constexpr int kColTile = 32, kRowLanes = 8;

template <typename T>
__global__ void rmsnorm_dw_partial_kernel(float* partial, const T* d_out, const T* x,
                                          const float* rstd, int64_t R, int64_t C,
                                          int64_t rows_per) {
  __shared__ float tile[kRowLanes][kColTile];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per;
  const int64_t r1 = r0 + rows_per < R ? r0 + rows_per : R;
  float acc = 0.0f;
  if (c < C) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      acc += to_f32(d_out[r * C + c]) * to_f32(x[r * C + c]) * rstd[r];
    }
  }
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float s = 0.0f;
    for (int i = 0; i < kRowLanes; ++i) s += tile[i][threadIdx.x];
    partial[chunk * C + c] = s;
  }
}

// Pass 2: d_w[c] += sum over chunks in order.
__global__ void rmsnorm_dw_final_kernel(float* d_w, const float* partial, int64_t nchunks,
                                        int64_t C) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s = 0.0f;
  for (int64_t k = 0; k < nchunks; ++k) s += partial[k * C + c];
  d_w[c] += s;
}

// ---- host ---------------------------------------------------------------------------------------

void check_rows(const char* op, int64_t R, int64_t C) {
  VERL_CUDA_REQUIRE(R >= 0 && C >= 0 && R < (int64_t{1} << 31),
                    detail::shape_str(op, {R, C}) + ": need 0 <= R < 2^31, C >= 0");
}

// The fast path's launch: pack width V (8, or 1 when C or a pointer does not allow it), lanes
// per row G and packs per lane NV; ok = false means the plain path.
struct FastShape {
  bool ok = false;
  int V = 1, G = 32, NV = 1, nvec = 0;
};

template <typename T>
FastShape fast_shape(int64_t C, std::initializer_list<const T*> ptrs) {
  FastShape s;
  bool aligned = C % detail::kMaxVec == 0;
  for (const T* p : ptrs) aligned = aligned && detail::vec_aligned(p, detail::kMaxVec);
  s.V = aligned ? detail::kMaxVec : 1;
  if (C / s.V > kMaxPacks) return s;
  s.nvec = static_cast<int>(C / s.V);
  s.ok = true;
  // Short rows: a few lanes each; C = 896 (bf16): a warp, 4 packs a lane; longer: the block.
  if (s.nvec <= 4)
    s.G = 4;
  else if (s.nvec <= 8)
    s.G = 8;
  else if (s.nvec <= 16)
    s.G = 16;
  else if (s.nvec <= 128)
    s.G = 32;
  else
    s.G = kThreads;
  s.NV = static_cast<int>(detail::ceil_div(s.nvec, s.G));
  s.NV = s.NV <= 1 ? 1 : s.NV <= 2 ? 2 : 4;
  return s;
}

// Calls f(V, G, NV as integral constants) for a fast shape.
template <typename F>
void dispatch_fast(const FastShape& s, F&& f) {
  auto with_v = [&](auto g, auto nv) {
    if (s.V == detail::kMaxVec)
      f(std::integral_constant<int, detail::kMaxVec>{}, g, nv);
    else
      f(std::integral_constant<int, 1>{}, g, nv);
  };
  using I1 = std::integral_constant<int, 1>;
  using I2 = std::integral_constant<int, 2>;
  using I4 = std::integral_constant<int, 4>;
  using I32 = std::integral_constant<int, 32>;
  using IB = std::integral_constant<int, kThreads>;
  if (s.G == 4)
    with_v(I4{}, I1{});
  else if (s.G == 8)
    with_v(std::integral_constant<int, 8>{}, I1{});
  else if (s.G == 16)
    with_v(std::integral_constant<int, 16>{}, I1{});
  else if (s.G == 32 && s.NV == 1)
    with_v(I32{}, I1{});
  else if (s.G == 32)
    with_v(I32{}, I4{});  // 2 packs a lane: the same registers as 4
  else if (s.NV == 1)
    with_v(IB{}, I1{});
  else if (s.NV == 2)
    with_v(IB{}, I2{});
  else
    with_v(IB{}, I4{});
}

template <typename T>
void forward_impl(const CudaContext& ctx, T* out, float* rstd, T* x, const T* resid, const T* w,
                  int64_t R, int64_t C, float eps) {
  check_rows("rmsnorm_forward", R, C);
  if (R == 0 || C == 0) return;
  const FastShape s = fast_shape<T>(C, {out, x, w});
  if (resid != nullptr && (!s.ok || !detail::vec_aligned(resid, s.V))) {
    // The same bits in two launches: the sum, then the plain op on it.
    if constexpr (std::is_same_v<T, bf16>) {
      add_inplace(ctx, x, resid, R * C);
    } else {
      VERL_CUDA_REQUIRE(false, "add_rmsnorm_forward: bf16 only");
    }
    resid = nullptr;
  }
  if (!s.ok) {
    rmsnorm_forward_kernel<T>
        <<<static_cast<unsigned>(R), kThreads, 0, ctx.stream>>>(out, rstd, x, w, C, eps);
    VERL_CUDA_CHECK_LAUNCH();
    return;
  }
  dispatch_fast(s, [&](auto v, auto g, auto nv) {
    constexpr int V = decltype(v)::value, G = decltype(g)::value, NV = decltype(nv)::value;
    // Groups of at most a warp: fewer rows per block for few rows (a decode step's 256 rows as
    // 256 one-warp blocks instead of 32 of eight warps), so they spread over the SMs.
    // At least a whole warp per block: group_sum's shuffles name all 32 lanes.
    const int64_t rows_per_block =
        G < kThreads ? std::clamp<int64_t>(detail::ceil_div(R, 512), 32 / G, kThreads / G) : 1;
    const unsigned blocks = static_cast<unsigned>(detail::ceil_div(R, rows_per_block));
    rmsnorm_forward_fast<T, V, G, NV>
        <<<blocks, static_cast<unsigned>(rows_per_block * G), 0, ctx.stream>>>(
            out, rstd, x, resid, w, R, C, s.nvec, eps);
  });
  VERL_CUDA_CHECK_LAUNCH();
}

// Rows per d_w chunk so that [chunks, C] floats fit in the workspace; throws when not even one
// row of C floats fits.
int64_t dw_chunks_fit(const CudaContext& ctx, int64_t R, int64_t C) {
  const int64_t fit = static_cast<int64_t>(ctx.workspace_bytes / (sizeof(float) * C));
  VERL_CUDA_REQUIRE(fit >= 1 && ctx.workspace != nullptr,
                    detail::shape_str("rmsnorm_backward", {R, C}) +
                        ": d_w needs a workspace of at least C floats, have " +
                        std::to_string(ctx.workspace_bytes) + " bytes");
  return fit;
}

template <typename T>
void backward_plain(const CudaContext& ctx, T* d_x, float* d_w, const T* d_out, const T* x,
                    const T* w, const float* rstd, int64_t R, int64_t C, bool accumulate_dx) {
  if (d_x != nullptr) {
    rmsnorm_backward_dx_kernel<T><<<static_cast<unsigned>(R), kThreads, 0, ctx.stream>>>(
        d_x, d_out, x, w, rstd, C, accumulate_dx);
    VERL_CUDA_CHECK_LAUNCH();
  }
  if (d_w != nullptr) {
    // About 64 rows per chunk, at most 128 chunks, as many as the workspace holds.
    const int64_t fit = dw_chunks_fit(ctx, R, C);
    int64_t nchunks = detail::ceil_div(R, 64);
    if (nchunks > 128) nchunks = 128;
    if (nchunks > fit) nchunks = fit;
    const int64_t rows_per = detail::ceil_div(R, nchunks);
    nchunks = detail::ceil_div(R, rows_per);
    float* partial = static_cast<float*>(ctx.workspace);
    const dim3 grid(static_cast<unsigned>(detail::ceil_div(C, kColTile)),
                    static_cast<unsigned>(nchunks));
    rmsnorm_dw_partial_kernel<T><<<grid, dim3(kColTile, kRowLanes), 0, ctx.stream>>>(
        partial, d_out, x, rstd, R, C, rows_per);
    VERL_CUDA_CHECK_LAUNCH();
    rmsnorm_dw_final_kernel<<<static_cast<unsigned>(detail::ceil_div(C, 256)), 256, 0,
                              ctx.stream>>>(d_w, partial, nchunks, C);
    VERL_CUDA_CHECK_LAUNCH();
  }
}

template <typename T>
void backward_impl(const CudaContext& ctx, T* d_x, float* d_w, const T* d_out, const T* x,
                   const T* w, const float* rstd, int64_t R, int64_t C, bool accumulate_dx) {
  check_rows("rmsnorm_backward", R, C);
  if (R == 0 || C == 0 || (d_x == nullptr && d_w == nullptr)) return;
  // w is only read for d_x (a caller may pass null with d_x null).
  const FastShape s =
      d_x != nullptr ? fast_shape<T>(C, {d_x, d_out, x, w}) : fast_shape<T>(C, {d_out, x});
  if (!s.ok) {
    backward_plain(ctx, d_x, d_w, d_out, x, w, rstd, R, C, accumulate_dx);
    return;
  }
  dispatch_fast(s, [&](auto v, auto g, auto nv) {
    constexpr int V = decltype(v)::value, G = decltype(g)::value, NV = decltype(nv)::value;
    constexpr int NG = kThreads / G;
    int64_t rows_per_block = NG;  // one row per group
    float* partial = nullptr;
    if (d_w != nullptr) {
      // A fixed number of row blocks (about kTargetBlocks, fewer if the workspace is small):
      // each block writes one row of partial sums.
      const int64_t fit = dw_chunks_fit(ctx, R, C);
      int64_t nblocks = R < kTargetBlocks * int64_t{NG} ? detail::ceil_div(R, NG) : kTargetBlocks;
      if (nblocks > fit) nblocks = fit;
      rows_per_block = detail::ceil_div(detail::ceil_div(R, nblocks), NG) * NG;
      partial = static_cast<float*>(ctx.workspace);
    }
    const int64_t nblocks = detail::ceil_div(R, rows_per_block);
    const size_t smem = d_w != nullptr ? sizeof(float) * static_cast<size_t>(C) : 0;
    rmsnorm_backward_fast<T, V, G, NV>
        <<<static_cast<unsigned>(nblocks), kThreads, smem, ctx.stream>>>(
            d_x, partial, d_out, x, w, rstd, R, C, s.nvec, static_cast<int>(rows_per_block),
            accumulate_dx);
    VERL_CUDA_CHECK_LAUNCH();
    if (d_w != nullptr) {
      rmsnorm_dw_reduce_kernel<<<static_cast<unsigned>(detail::ceil_div(C, 32)), dim3(32, 16), 0,
                                 ctx.stream>>>(d_w, partial, static_cast<int>(nblocks), C);
      VERL_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace

// x is only read when resid is null.
void rmsnorm_forward(const CudaContext& ctx, bf16* out, float* rstd, const bf16* x, const bf16* w,
                     int64_t R, int64_t C, float eps) {
  forward_impl<bf16>(ctx, out, rstd, const_cast<bf16*>(x), nullptr, w, R, C, eps);
}
void rmsnorm_forward(const CudaContext& ctx, float* out, float* rstd, const float* x,
                     const float* w, int64_t R, int64_t C, float eps) {
  forward_impl<float>(ctx, out, rstd, const_cast<float*>(x), nullptr, w, R, C, eps);
}
void add_rmsnorm_forward(const CudaContext& ctx, bf16* out, float* rstd, bf16* x, const bf16* resid,
                         const bf16* w, int64_t R, int64_t C, float eps) {
  forward_impl<bf16>(ctx, out, rstd, x, resid, w, R, C, eps);
}
void rmsnorm_backward(const CudaContext& ctx, bf16* d_x, float* d_w, const bf16* d_out,
                      const bf16* x, const bf16* w, const float* rstd, int64_t R, int64_t C,
                      bool accumulate_dx) {
  backward_impl(ctx, d_x, d_w, d_out, x, w, rstd, R, C, accumulate_dx);
}
void rmsnorm_backward(const CudaContext& ctx, float* d_x, float* d_w, const float* d_out,
                      const float* x, const float* w, const float* rstd, int64_t R, int64_t C,
                      bool accumulate_dx) {
  backward_impl(ctx, d_x, d_w, d_out, x, w, rstd, R, C, accumulate_dx);
}

}  // namespace verl::ops::cuda
