// Causal GQA attention over packed variable-length sequences, forward and backward: the same math
// as src/ops/cpu/attention.cpp (see attention.h for the formulas and conventions).
//
// Layout of the work: a "tile" is up to 64 consecutive rows of one sequence. Blocks have 128
// threads, two per tile row: thread t owns row t/2 and the columns (keys, or feature dims) of
// parity t%2. Rows are staged in shared memory as fp32 with a row stride of D+1 floats, so the 16
// rows a warp touches at once fall in different banks.
//   forward   block (query tile, head):   for each key tile <= causal limit: S = scale Q K^T, online
//             softmax (running max m, sum l per row, O rescaled by exp(m_old - m_new)), O += P V.
//   d_q       block (query tile, head):   for each key tile: P = exp(S - lse), dS = P (dO V^T - D),
//             dQ += dS K; then d_q += scale dQ.
//   d_k, d_v  block (key tile, kv head):  for each head of the group and each 32-row query tile at
//             or after the key tile: the same P, dS (transposed), dV += P^T dO, dK += dS^T Q.
// Plain and correct first; tensor cores (mma/wgmma) come later.
#include <cmath>

#include "ops/cuda/attention.h"
#include "ops/cuda/common.cuh"

namespace verl::ops::cuda {

namespace {

using detail::ceil_div;

constexpr int kThreads = 128;  // two threads per row of a 64-row tile
constexpr int kTile = 64;      // query rows (forward, d_q) / key rows (d_k, d_v) per block
constexpr int kKeyTile = 64;   // key rows per step (forward, d_q)
constexpr int kQTile = 32;     // query rows per step (d_k, d_v)
constexpr int kMaxD = 128;
constexpr float kNegInf = -INFINITY;

struct TileRef {
  int64_t s0;  // first token of the sequence
  int L;       // sequence length
  int r0;      // first row of the tile inside the sequence
};

// Tile number t (counted over the sequences in order, ceil(L_b/rows) tiles each) -> its sequence
// and first row. False when t is past the last tile (the grid is an upper bound).
__device__ bool find_tile(const int32_t* cu_seqlens, int64_t B, int rows, int64_t t, TileRef& ref) {
  for (int64_t b = 0; b < B; ++b) {
    const int64_t s0 = cu_seqlens[b];
    const int L = static_cast<int>(cu_seqlens[b + 1] - s0);
    const int64_t n = (L + rows - 1) / rows;
    if (t < n) {
      ref = TileRef{s0, L, static_cast<int>(t * rows)};
      return true;
    }
    t -= n;
  }
  return false;
}

// dst[r*ld + d] = src[r*stride + d] for r < valid, 0 for valid <= r < rows (d < D).
__device__ void load_rows(float* dst, int ld, const __nv_bfloat16* src, int64_t stride, int rows,
                          int valid, int D) {
  for (int e = threadIdx.x; e < rows * D; e += blockDim.x) {
    const int r = e / D, d = e - r * D;
    dst[r * ld + d] = r < valid ? __bfloat162float(src[r * stride + d]) : 0.0f;
  }
}

__device__ void zero_rows(float* dst, int ld, int rows, int D) {
  for (int e = threadIdx.x; e < rows * D; e += blockDim.x) {
    const int r = e / D, d = e - r * D;
    dst[r * ld + d] = 0.0f;
  }
}

__device__ __forceinline__ float dot_smem(const float* a, const float* b, int D) {
  float s = 0.0f;
  for (int d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

size_t forward_smem(int D) {
  const int ld = D + 1;
  return sizeof(float) * (size_t(kTile) * ld * 2 + size_t(kKeyTile) * ld * 2 +
                          size_t(kTile) * (kKeyTile + 1));
}

// smem: sQ[kTile][ld], sO[kTile][ld], sK[kKeyTile][ld], sV[kKeyTile][ld], sS[kTile][kKeyTile+1].
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q,
                             const __nv_bfloat16* k, const __nv_bfloat16* v,
                             const int32_t* cu_seqlens, int64_t B, int H, int Hkv, int D,
                             float scale) {
  extern __shared__ float smem[];
  TileRef tl;
  if (!find_tile(cu_seqlens, B, kTile, blockIdx.x, tl)) return;
  const int h = blockIdx.y, g = h / (H / Hkv);
  const int ld = D + 1, lds = kKeyTile + 1;
  float* sQ = smem;
  float* sO = sQ + kTile * ld;
  float* sK = sO + kTile * ld;
  float* sV = sK + kKeyTile * ld;
  float* sS = sV + kKeyTile * ld;
  const int64_t qs = int64_t(H) * D, ks = int64_t(Hkv) * D;

  const int nq = min(kTile, tl.L - tl.r0);
  load_rows(sQ, ld, q + (tl.s0 + tl.r0) * qs + int64_t(h) * D, qs, kTile, nq, D);
  zero_rows(sO, ld, kTile, D);

  const int r = threadIdx.x >> 1, half = threadIdx.x & 1;
  const int i = tl.r0 + r;  // query position in the sequence
  const bool row_ok = r < nq;
  float* Sr = sS + r * lds;
  float* Or = sO + r * ld;
  const float* Qr = sQ + r * ld;
  float m = kNegInf, l = 0.0f;
  const int kend = min(tl.L, tl.r0 + kTile);  // keys any row of this tile can see
  for (int j0 = 0; j0 < kend; j0 += kKeyTile) {
    const int nk = min(kKeyTile, kend - j0);
    __syncthreads();  // everyone is done with the previous K, V tile
    load_rows(sK, ld, k + (tl.s0 + j0) * ks + int64_t(g) * D, ks, kKeyTile, nk, D);
    load_rows(sV, ld, v + (tl.s0 + j0) * ks + int64_t(g) * D, ks, kKeyTile, nk, D);
    __syncthreads();

    float tmax = kNegInf;
    for (int jj = half; jj < kKeyTile; jj += 2) {
      float s = kNegInf;
      if (row_ok && jj < nk && j0 + jj <= i) s = scale * dot_smem(Qr, sK + jj * ld, D);
      Sr[jj] = s;
      tmax = fmaxf(tmax, s);
    }
    tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
    const float m_new = fmaxf(m, tmax);
    // m_new = -inf only for a row with nothing visible yet (padding rows): keep everything 0.
    const float alpha = m_new == kNegInf ? 1.0f : expf(m - m_new);
    float psum = 0.0f;
    for (int jj = half; jj < kKeyTile; jj += 2) {
      const float s = Sr[jj];
      const float p = s == kNegInf ? 0.0f : expf(s - m_new);
      Sr[jj] = p;
      psum += p;
    }
    psum += __shfl_xor_sync(0xffffffffu, psum, 1);
    l = l * alpha + psum;
    m = m_new;
    __syncwarp();  // the row's P was written by this thread and its partner (same warp)
    for (int d = half; d < D; d += 2) {
      float acc = Or[d] * alpha;
      for (int jj = 0; jj < nk; ++jj) acc += Sr[jj] * sV[jj * ld + d];
      Or[d] = acc;
    }
  }
  if (row_ok) {
    const float inv_l = 1.0f / l;
    __nv_bfloat16* o = out + (tl.s0 + i) * qs + int64_t(h) * D;
    for (int d = half; d < D; d += 2) o[d] = __float2bfloat16_rn(Or[d] * inv_l);
    if (lse != nullptr && half == 0) lse[(tl.s0 + i) * H + h] = m + logf(l);
  }
}

// Dbuf[t*H + h] = d_out[t,h,:] . out[t,h,:]: one warp per row.
__global__ void attention_rowdot_kernel(float* Dbuf, const __nv_bfloat16* d_out,
                                        const __nv_bfloat16* out, int64_t rows, int D) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t row = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); row < rows;
       row += warps) {
    float s = 0.0f;
    for (int d = lane; d < D; d += 32) {
      s += __bfloat162float(d_out[row * D + d]) * __bfloat162float(out[row * D + d]);
    }
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) Dbuf[row] = s;
  }
}

size_t dq_smem(int D) {
  const int ld = D + 1;
  return sizeof(float) * (size_t(kTile) * ld * 3 + size_t(kKeyTile) * ld * 2 +
                          size_t(kTile) * (kKeyTile + 1));
}

// smem: sQ, sdO, sdQ [kTile][ld], sK, sV [kKeyTile][ld], sS [kTile][kKeyTile+1] (holds dS).
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(float* d_q, const __nv_bfloat16* d_out, const __nv_bfloat16* q,
                        const __nv_bfloat16* k, const __nv_bfloat16* v, const float* lse,
                        const float* Dbuf, const int32_t* cu_seqlens, int64_t B, int H, int Hkv,
                        int D, float scale) {
  extern __shared__ float smem[];
  TileRef tl;
  if (!find_tile(cu_seqlens, B, kTile, blockIdx.x, tl)) return;
  const int h = blockIdx.y, g = h / (H / Hkv);
  const int ld = D + 1, lds = kKeyTile + 1;
  float* sQ = smem;
  float* sdO = sQ + kTile * ld;
  float* sdQ = sdO + kTile * ld;
  float* sK = sdQ + kTile * ld;
  float* sV = sK + kKeyTile * ld;
  float* sS = sV + kKeyTile * ld;
  const int64_t qs = int64_t(H) * D, ks = int64_t(Hkv) * D;

  const int nq = min(kTile, tl.L - tl.r0);
  const int64_t qoff = (tl.s0 + tl.r0) * qs + int64_t(h) * D;
  load_rows(sQ, ld, q + qoff, qs, kTile, nq, D);
  load_rows(sdO, ld, d_out + qoff, qs, kTile, nq, D);
  zero_rows(sdQ, ld, kTile, D);

  const int r = threadIdx.x >> 1, half = threadIdx.x & 1;
  const int i = tl.r0 + r;
  const bool row_ok = r < nq;
  const float lse_i = row_ok ? lse[(tl.s0 + i) * H + h] : 0.0f;
  const float D_i = row_ok ? Dbuf[(tl.s0 + i) * H + h] : 0.0f;
  float* Sr = sS + r * lds;
  float* dQr = sdQ + r * ld;
  const float* Qr = sQ + r * ld;
  const float* dOr = sdO + r * ld;
  const int kend = min(tl.L, tl.r0 + kTile);
  for (int j0 = 0; j0 < kend; j0 += kKeyTile) {
    const int nk = min(kKeyTile, kend - j0);
    __syncthreads();
    load_rows(sK, ld, k + (tl.s0 + j0) * ks + int64_t(g) * D, ks, kKeyTile, nk, D);
    load_rows(sV, ld, v + (tl.s0 + j0) * ks + int64_t(g) * D, ks, kKeyTile, nk, D);
    __syncthreads();
    for (int jj = half; jj < kKeyTile; jj += 2) {
      float ds = 0.0f;
      if (row_ok && jj < nk && j0 + jj <= i) {
        const float p = expf(scale * dot_smem(Qr, sK + jj * ld, D) - lse_i);
        ds = p * (dot_smem(dOr, sV + jj * ld, D) - D_i);
      }
      Sr[jj] = ds;
    }
    __syncwarp();
    for (int d = half; d < D; d += 2) {
      float acc = dQr[d];
      for (int jj = 0; jj < nk; ++jj) acc += Sr[jj] * sK[jj * ld + d];
      dQr[d] = acc;
    }
  }
  if (row_ok) {
    float* o = d_q + (tl.s0 + i) * qs + int64_t(h) * D;
    for (int d = half; d < D; d += 2) o[d] += scale * dQr[d];
  }
}

size_t dkdv_smem(int D) {
  const int ld = D + 1;
  return sizeof(float) * (size_t(kTile) * ld * 4 + size_t(kQTile) * ld * 2 +
                          size_t(kTile) * (kQTile + 1) * 2 + size_t(kQTile) * 2);
}

// smem: sK, sV, sdK, sdV [kTile][ld], sQ, sdO [kQTile][ld], sP, sdS [kTile][kQTile+1],
// sLse, sD [kQTile].
__global__ void __launch_bounds__(kThreads)
    attention_dkdv_kernel(float* d_k, float* d_v, const __nv_bfloat16* d_out,
                          const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                          const float* lse, const float* Dbuf, const int32_t* cu_seqlens,
                          int64_t B, int H, int Hkv, int D, float scale) {
  extern __shared__ float smem[];
  TileRef tl;
  if (!find_tile(cu_seqlens, B, kTile, blockIdx.x, tl)) return;
  const int g = blockIdx.y, rep = H / Hkv;
  const int ld = D + 1, ldp = kQTile + 1;
  float* sK = smem;
  float* sV = sK + kTile * ld;
  float* sdK = sV + kTile * ld;
  float* sdV = sdK + kTile * ld;
  float* sQ = sdV + kTile * ld;
  float* sdO = sQ + kQTile * ld;
  float* sP = sdO + kQTile * ld;
  float* sdS = sP + kTile * ldp;
  float* sLse = sdS + kTile * ldp;
  float* sD = sLse + kQTile;
  const int64_t qs = int64_t(H) * D, ks = int64_t(Hkv) * D;

  const int nk = min(kTile, tl.L - tl.r0);
  const int64_t koff = (tl.s0 + tl.r0) * ks + int64_t(g) * D;
  load_rows(sK, ld, k + koff, ks, kTile, nk, D);
  load_rows(sV, ld, v + koff, ks, kTile, nk, D);
  zero_rows(sdK, ld, kTile, D);
  zero_rows(sdV, ld, kTile, D);

  const int c = threadIdx.x >> 1, half = threadIdx.x & 1;
  const int j = tl.r0 + c;  // key position in the sequence
  const bool col_ok = c < nk;
  const float* Kc = sK + c * ld;
  const float* Vc = sV + c * ld;
  float* Pc = sP + c * ldp;
  float* dSc = sdS + c * ldp;
  float* dKc = sdK + c * ld;
  float* dVc = sdV + c * ld;
  for (int h = g * rep; h < (g + 1) * rep; ++h) {
    // Queries i >= j only: the first query tile starts at the key tile (both 32-aligned).
    for (int i0 = tl.r0; i0 < tl.L; i0 += kQTile) {
      const int nq = min(kQTile, tl.L - i0);
      __syncthreads();
      const int64_t qoff = (tl.s0 + i0) * qs + int64_t(h) * D;
      load_rows(sQ, ld, q + qoff, qs, kQTile, nq, D);
      load_rows(sdO, ld, d_out + qoff, qs, kQTile, nq, D);
      if (threadIdx.x < kQTile) {
        const int ii = threadIdx.x;
        sLse[ii] = ii < nq ? lse[(tl.s0 + i0 + ii) * H + h] : 0.0f;
        sD[ii] = ii < nq ? Dbuf[(tl.s0 + i0 + ii) * H + h] : 0.0f;
      }
      __syncthreads();
      for (int ii = half; ii < kQTile; ii += 2) {
        float p = 0.0f, ds = 0.0f;
        if (col_ok && ii < nq && i0 + ii >= j) {
          p = expf(scale * dot_smem(sQ + ii * ld, Kc, D) - sLse[ii]);
          ds = p * (dot_smem(sdO + ii * ld, Vc, D) - sD[ii]);
        }
        Pc[ii] = p;
        dSc[ii] = ds;
      }
      __syncwarp();
      for (int d = half; d < D; d += 2) {
        float av = dVc[d], ak = dKc[d];
        for (int ii = 0; ii < nq; ++ii) {
          av += Pc[ii] * sdO[ii * ld + d];
          ak += dSc[ii] * sQ[ii * ld + d];
        }
        dVc[d] = av;
        dKc[d] = ak;
      }
    }
  }
  if (col_ok) {
    const int64_t off = (tl.s0 + j) * ks + int64_t(g) * D;
    for (int d = half; d < D; d += 2) {
      if (d_k != nullptr) d_k[off + d] += scale * dKc[d];
      if (d_v != nullptr) d_v[off + d] += dVc[d];
    }
  }
}

void check_args(const char* op, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  VERL_CUDA_REQUIRE(B >= 0 && T >= 0 && H > 0 && Hkv > 0 && H % Hkv == 0 && D > 0 && D <= kMaxD &&
                        H <= 65535 && Hkv <= 65535,
                    detail::shape_str(op, {B, T, H, Hkv, D}) +
                        ": need H a multiple of Hkv, 0 < D <= 128");
}

template <typename Kernel>
void set_smem(Kernel kernel, size_t bytes) {
  VERL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
}

unsigned tile_grid(int64_t T, int64_t B) {
  return static_cast<unsigned>(ceil_div(T, kTile) + B);
}

}  // namespace

void attention_forward(const CudaContext& ctx, bf16* out, float* lse, const bf16* q, const bf16* k,
                       const bf16* v, const int32_t* cu_seqlens, int64_t B, int64_t T, int64_t H,
                       int64_t Hkv, int64_t D, float scale) {
  check_args("attention_forward", B, T, H, Hkv, D);
  if (T == 0 || B == 0) return;
  const size_t smem = forward_smem(static_cast<int>(D));
  set_smem(attention_forward_kernel, smem);
  const dim3 grid(tile_grid(T, B), static_cast<unsigned>(H));
  attention_forward_kernel<<<grid, kThreads, smem, ctx.stream>>>(
      out, lse, q, k, v, cu_seqlens, B, static_cast<int>(H), static_cast<int>(Hkv),
      static_cast<int>(D), scale);
  VERL_CUDA_CHECK_LAUNCH();
}

void attention_backward(const CudaContext& ctx, float* d_q, float* d_k, float* d_v,
                        const bf16* d_out, const bf16* q, const bf16* k, const bf16* v,
                        const bf16* out, const float* lse, const int32_t* cu_seqlens, int64_t B,
                        int64_t T, int64_t H, int64_t Hkv, int64_t D, float scale) {
  check_args("attention_backward", B, T, H, Hkv, D);
  if (T == 0 || B == 0 || (d_q == nullptr && d_k == nullptr && d_v == nullptr)) return;
  const size_t dbytes = sizeof(float) * static_cast<size_t>(T * H);
  VERL_CUDA_REQUIRE(ctx.workspace != nullptr && ctx.workspace_bytes >= dbytes,
                    detail::shape_str("attention_backward", {T, H}) + ": needs " +
                        std::to_string(dbytes) + " bytes of workspace, has " +
                        std::to_string(ctx.workspace_bytes));
  float* Dbuf = static_cast<float*>(ctx.workspace);
  const int Di = static_cast<int>(D), Hi = static_cast<int>(H), Hkvi = static_cast<int>(Hkv);

  const int rows_per_block = 256 / 32;
  attention_rowdot_kernel<<<detail::grid_for(T * H, rows_per_block), 256, 0, ctx.stream>>>(
      Dbuf, d_out, out, T * H, Di);
  VERL_CUDA_CHECK_LAUNCH();

  if (d_q != nullptr) {
    const size_t smem = dq_smem(Di);
    set_smem(attention_dq_kernel, smem);
    const dim3 grid(tile_grid(T, B), static_cast<unsigned>(H));
    attention_dq_kernel<<<grid, kThreads, smem, ctx.stream>>>(d_q, d_out, q, k, v, lse, Dbuf,
                                                              cu_seqlens, B, Hi, Hkvi, Di, scale);
    VERL_CUDA_CHECK_LAUNCH();
  }
  if (d_k != nullptr || d_v != nullptr) {
    const size_t smem = dkdv_smem(Di);
    set_smem(attention_dkdv_kernel, smem);
    const dim3 grid(tile_grid(T, B), static_cast<unsigned>(Hkv));
    attention_dkdv_kernel<<<grid, kThreads, smem, ctx.stream>>>(
        d_k, d_v, d_out, q, k, v, lse, Dbuf, cu_seqlens, B, Hi, Hkvi, Di, scale);
    VERL_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace verl::ops::cuda
