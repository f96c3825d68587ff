// Causal GQA attention over packed variable-length sequences, forward and backward, on tensor
// cores: the same math as src/ops/cpu/attention.cpp (see attention.h for the formulas and the
// conventions), organised as FlashAttention-2 (Dao 2023): no T x T matrix, scores in registers.
//
// Matrix products use mma.sync.m16n8k16 (bf16 x bf16 -> fp32) fed by ldmatrix from shared
// memory. Tiles of q/k/v/d_out rows are staged as bf16 in shared memory with a row stride of
// Dp + 8 elements (Dp = D padded to 32, 64 or 128; the padding columns are zero): 8 rows read by
// one ldmatrix phase then start in 8 different 16-byte bank groups, so there are no bank conflicts.
// Rows are copied with cp.async (16 bytes) when D % 8 == 0 and the pointers are 16-byte aligned,
// else element by element; the next key (or query) tile is fetched while the current one is used.
//
//   forward  block (query tile of 64 * kMT rows, head), 4 warps of 16 * kMT rows: for each key tile
//            (64 keys, 32 for D = 128) up to the causal limit, S = Q K^T, online softmax in log2
//            units (running max m and sum l per row), O = O * 2^(m_old - m_new) + P V;
//            out = O / l, lse = (m + log2 l) ln 2.
//   backward one launch, two kinds of blocks (heaviest first, so the short ones fill the tail):
//            d_k/d_v block (key tile of 64, kv head), 4 warps of 16 keys: for each head of the
//              group and each query tile of 64 from the key tile on, S^T = K Q^T, dP^T = V dO^T,
//              P^T = 2^(S^T log2e scale - lse log2e), dS^T = P^T (dP^T - D), dV += P^T dO,
//              dK += dS^T Q;
//            d_q block (query tile of 64, head), 4 warps of 16 rows: for each key tile up to the
//              causal limit, the same P and dS, dQ += dS K.
//            Every d_k/d_v row is summed by one block and every d_q row by one block, in a fixed
//            order: no atomics, the same bits on every run. D_i = d_out_i . out_i comes first.
// Causal masks are applied only on tiles that cross the diagonal; rows past the end of a sequence
// are zero in shared memory and never stored.
//
// attention_forward_paged gives query tokens whose keys sit in the rollout's paged KV cache the
// bits attention_forward gives them (batch-invariant rollout). Two kernels share the forward's
// per-tile code (fwd_key_tile: S, mask, online softmax, P V; fwd_store_row), which is all a row's
// bits come from; they differ only in which rows share a warp's m-tiles, and a row does not depend
// on its neighbours:
//   chunks of >= 2 tokens  the forward kernel, templated on its row source (ContiguousSrc,
//            PagedSrc: where a tile's query and key rows are, which rows to store), with query
//            tiles aligned to the same multiples of 128 positions as attention_forward's, so a row
//            meets the same key tiles with the same mma steps and masks (argument above
//            ContiguousSrc);
//   single tokens (decode) when G = H / Hkv <= 16: the G heads of one token and one kv head are
//            the rows of a 16-row m-tile, all at the token's position p, meeting key tiles
//            0 .. p / kBN as the forward kernel's warp of p does (argument above the decode
//            kernels), and the kv head's keys are read once, not G times: two or four warps per
//            (item, kv head) splitting each key tile for large batches
//            (attention_decode_split_kernel), one block of four warps sharing each round of four
//            key tiles for small ones (attention_decode_block_kernel).
//            For G > 16 a single token takes a tile of the forward kernel.
// A mixed step launches both. The contiguous instantiations compile to the machine code they had
// before the paged op existed.
//
// Precision versus the fp32 reference: scores, softmax statistics, lse and every sum are fp32,
// but P (forward and d_v) and dS (d_q, d_k) are rounded to bf16 to be mma operands, so each term of
// those sums carries a relative error of at most 2^-8, half a bf16 ulp (the sums stay fp32; the
// forward's l sums the unrounded P, so lse is as exact as before). The old fp32 kernels did not
// round P or dS; tests/cuda/test_attention.cpp bounds the difference by 2^-8 sum_j |term_j|.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "ops/cuda/attention.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/mma.cuh"

namespace verl::ops::cuda {

namespace {

using detail::allow_dynamic_smem;
using detail::ceil_div;
using bf16_t = __nv_bfloat16;
using detail::acc_to_a;
using detail::cp_async_16;
using detail::cp_async_commit;
using detail::cp_async_wait;
using detail::exp2_approx;
using detail::LaneOffsets;
using detail::ldsm_x4;
using detail::ldsm_x4_trans;
using detail::mma_bf16;
using detail::pack_bf16;
using detail::smem_u32;

constexpr int kThreads = 128;  // 4 warps in every attention kernel
constexpr int kMaxD = 128;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// ---- Tiles -------------------------------------------------------------------------------------

struct TileRef {
  int64_t s0;  // first token of the sequence
  int L;       // sequence length
  int r0;      // first row of the tile inside the sequence
};

// find_tile's items: the packed sequences of cu_seqlens, ceil(L/rows) tiles each, at rows 0, rows,
// 2 rows, ... of the sequence. load fills the item's tile-independent fields and returns its number
// of tiles; tile sets the first row of its k-th tile.
struct SeqItems {
  using Tile = TileRef;
  const int32_t* cu_seqlens;
  __device__ int load(int64_t b, int rows, TileRef& it) const {
    it.s0 = cu_seqlens[b];
    it.L = static_cast<int>(cu_seqlens[b + 1] - it.s0);
    return (it.L + rows - 1) / rows;
  }
  __device__ TileRef tile(TileRef it, int k, int rows) const {
    it.r0 = k * rows;
    return it;
  }
};

// Tile number t (items in order, items.load tiles each) -> its tile; within an item the tiles are
// numbered from the last (heavy_last: causal rows cost more) or from the first. Called by the whole
// block (the first warp scans the items 32 at a time with a prefix sum); false, for every thread,
// when t is past the last tile.
template <typename Items>
__device__ bool find_tile(const Items& items, int64_t B, int rows, int64_t t, bool heavy_last,
                          typename Items::Tile& ref) {
  using Tile = typename Items::Tile;
  __shared__ Tile s_ref;
  __shared__ int s_found;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int64_t before = 0;  // tiles of the items already scanned
    bool found = false;
    for (int64_t b0 = 0; b0 < B && !found; b0 += 32) {
      const int64_t b = b0 + lane;
      Tile it{};
      const int n = b < B ? items.load(b, rows, it) : 0;
      int incl = n;  // inclusive prefix sum of n over the lanes
      for (int off = 1; off < 32; off <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += y;
      }
      const int total = __shfl_sync(0xffffffffu, incl, 31);
      if (t < before + total) {
        const int64_t first = before + incl - n;
        if (t >= first && t < first + n) {  // exactly one lane
          const int k = static_cast<int>(t - first);
          s_ref = items.tile(it, heavy_last ? n - 1 - k : k, rows);
        }
        found = true;
      }
      before += total;
    }
    if (lane == 0) s_found = found ? 1 : 0;
  }
  __syncthreads();
  ref = s_ref;
  return s_found != 0;
}

// Stages kRows rows (row r at src + r * stride, D elements) into dst [kRows][Dp + 8] bf16; rows
// >= valid and columns >= D become zero. vec: 16-byte cp.async (D % 8 == 0, 16-byte aligned
// pointers; the caller commits and waits), else plain element copies.
template <int Dp, int kRows>
__device__ __forceinline__ void stage_rows(bf16_t* dst, const bf16_t* src, int64_t stride,
                                           int valid, int D, bool vec) {
  constexpr int kLds = Dp + 8;
  if (vec) {
    constexpr int kChunks = Dp / 8;
    constexpr int kIters = (kRows * kChunks + kThreads - 1) / kThreads;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int e = it * kThreads + threadIdx.x;
      if (kRows * kChunks % kThreads == 0 || e < kRows * kChunks) {
        const int r = e / kChunks, c = (e % kChunks) * 8;
        bf16_t* d = dst + r * kLds + c;
        if (r < valid && c < D) {
          cp_async_16(smem_u32(d), src + r * stride + c);
        } else {
          *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
        }
      }
    }
  } else {
    for (int e = threadIdx.x; e < kRows * Dp; e += kThreads) {
      const int r = e / Dp, c = e % Dp;
      dst[r * kLds + c] = (r < valid && c < D) ? src[r * stride + c] : __float2bfloat16_rn(0.0f);
    }
  }
}

// The same for rows given by a functor (the paged forward's): row r at rows.row(r) where
// rows.has(r), zero elsewhere, staged by kLanes threads, tid = 0 .. kLanes - 1 (a block, or one
// warp of the decode kernels, whose warps stage their own tiles: the caller commits, waits and
// __syncwarp()s). (The strided version above is kept apart, as it was: written through a functor,
// its compare and address operands come out of the optimizer in another order and the training
// kernels' machine code would change.)
template <int Dp, int kRows, int kLanes, typename Rows>
__device__ __forceinline__ void stage_rows_by(bf16_t* dst, const Rows& rows, int D, bool vec,
                                              int tid) {
  constexpr int kLds = Dp + 8;
  if (vec) {
    constexpr int kChunks = Dp / 8;
    constexpr int kIters = (kRows * kChunks + kLanes - 1) / kLanes;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int e = it * kLanes + tid;
      if (kRows * kChunks % kLanes == 0 || e < kRows * kChunks) {
        const int r = e / kChunks, c = (e % kChunks) * 8;
        bf16_t* d = dst + r * kLds + c;
        if (rows.has(r) && c < D) {
          cp_async_16(smem_u32(d), rows.row(r) + c);
        } else {
          *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
        }
      }
    }
  } else {
    for (int e = tid; e < kRows * Dp; e += kLanes) {
      const int r = e / Dp, c = e % Dp;
      dst[r * kLds + c] = (rows.has(r) && c < D) ? rows.row(r)[c] : __float2bfloat16_rn(0.0f);
    }
  }
}

template <int Dp, int kRows, typename Rows>
__device__ __forceinline__ void stage_rows(bf16_t* dst, const Rows& rows, int D, bool vec) {
  stage_rows_by<Dp, kRows, kThreads>(dst, rows, D, vec, threadIdx.x);
}

// Row r of a tile at base + r * stride, rows >= valid zero: staged by the strided version.
struct StridedRows {
  const bf16_t* base;
  int64_t stride;
  int valid;
};

template <int Dp, int kRows>
__device__ __forceinline__ void stage_rows(bf16_t* dst, const StridedRows& rows, int D, bool vec) {
  stage_rows<Dp, kRows>(dst, rows.base, rows.stride, rows.valid, D, vec);
}

// ---- Forward -----------------------------------------------------------------------------------

struct FwdArgs {
  bf16_t* out;
  float* lse;
  const bf16_t* q;
  const bf16_t* k;  // [T, Hkv, D] packed, or the paged cache [slots, Hkv, D]
  const bf16_t* v;
  const int32_t* cu_seqlens;
  int64_t B;
  int H, Hkv, D;
  float scale_log2;  // scale * log2(e): scores in log2 units
  bool vec;          // 16-byte staging of q, k, v
  bool out_pairs;    // bf16x2 stores of out (D even, out 4-byte aligned)
};

template <int Dp, int kMT, int kKeys>
struct FwdTile {
  static constexpr int kWarpRows = 16 * kMT;  // query rows per warp
  static constexpr int kBM = 4 * kWarpRows;   // query rows per block
  static constexpr int kBN = kKeys;           // keys per step
  static constexpr int kLds = Dp + 8;
  // sQ [kBM], sK [2][kBN], sV [2][kBN] rows.
  static constexpr size_t kSmem = sizeof(bf16_t) * kLds * (kBM + 4 * kBN);
};

// Where the forward kernel's rows come from (its Src parameter). A tile is the query rows at
// POSITIONS r0 .. r0 + kBM - 1 of one sequence, r0 a multiple of kBM, with keys at positions
// 0 .. L - 1; warps, key tiles, masks and kvis are all in positions, and the output row of
// position p is token s0 + p. A warp's 32 rows start at a multiple of 32 and a key tile is 32 or
// 64 keys, so the warp of a row at position P runs exactly the key tiles 0 .. P / kBN, with the
// same kvis and mask, whichever source feeds it: P's result depends only on q_P and keys 0..P,
// and the paged op's rows equal attention_forward's bit for bit. (Keys past a paged chunk's end,
// which attention_forward has in the tile that crosses the diagonal, are zero rows here; every
// stored row masks them: p = 0 exactly, and a zero product adds nothing to an mma's sum.)
// A source gives Args (the kernel's parameter), Tile, find (the block's tile), q_rows (tile row r
// = position r0 + r), kv_rows (keys j0 + r), and kChunk: whether the item's query rows start at a
// position p0 (rows below it are zero and never stored; a warp with none of its rows skips the
// key loop) rather than at 0.

// attention_forward: every row of the sequence is a query; q, k and v rows are contiguous.
struct ContiguousSrc {
  using Args = FwdArgs;
  using Tile = TileRef;
  static constexpr bool kChunk = false;
  __device__ static bool find(const Args& a, int rows, int64_t t, Tile& tl) {
    return find_tile(SeqItems{a.cu_seqlens}, a.B, rows, t, true, tl);
  }
  __device__ static StridedRows q_rows(const Args& a, const Tile& tl, int h, int64_t qs, int n) {
    return {a.q + (tl.s0 + tl.r0) * qs + int64_t(h) * a.D, qs, min(n, tl.L - tl.r0)};
  }
  // kv: the kv head's column of the sequence's first row (a.k / a.v + s0 * ks + g * D).
  __device__ static StridedRows kv_rows(const bf16_t* kv, const Args&, const Tile&, int64_t ks,
                                        int j0, int valid) {
    return {kv + j0 * ks, ks, valid};
  }
};

// attention_forward_paged: item b has the query tokens t0 .. t0 + n - 1 at positions p0 .. L - 1
// (L = p0 + n, its context) and reads its keys from the paged cache.
struct PagedFwdArgs : FwdArgs {  // k, v: the caches [slots, Hkv, D]
  const int32_t* positions;
  const int32_t* block_tables;
  int64_t W;
  int block_size;
  // The tiled kernel takes the items of min_tokens .. max_tokens query tokens (the others have no
  // tiles); the decode kernel takes those of one token when the host launches it.
  int min_tokens, max_tokens;
};

// An item's tiles are the kBM-aligned windows of positions that hold one of its query tokens,
// (L - 1) / kBM - p0 / kBM + 1 of them (at most ceil(n / kBM) + 1). s0 = t0 - p0 is the token
// that position 0 would have, so position p's output row is s0 + p as in attention_forward.
struct PagedTile {
  int64_t s0;  // the item's first query token - p0
  int L;       // context: keys 0 .. L - 1
  int r0;      // first position of the tile
  int p0;      // position of the item's first query token
  int64_t b;   // item: its row of the block table
};

// The block's tile for attention_forward_paged (find_tile's contract and numbering: items in
// order, an item's heaviest tile first; false for every thread past the last tile), over the
// items of a.min_tokens .. a.max_tokens query tokens. Warp 0 reads kPer consecutive items per lane
// with every load issued before the first is used, so a pass over up to 32 * kPer items costs one
// or two memory round trips instead of one per 32 items: the grid is sized for the worst case the
// metadata could hold, and in a step that is mostly decode most blocks only scan and exit.
__device__ bool find_paged_tile(const PagedFwdArgs& a, int rows, int64_t t, PagedTile& ref) {
  constexpr int kPer = 8;  // items per lane per pass
  __shared__ PagedTile s_ref;
  __shared__ int s_found;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int64_t before = 0;  // tiles of the items already scanned
    bool found = false;
    for (int64_t b0 = 0; b0 < a.B && !found; b0 += 32 * kPer) {
      const int64_t first = b0 + int64_t(lane) * kPer;  // the lane's items: first + 0 .. kPer - 1
      int32_t cu[kPer + 1];
#pragma unroll
      for (int i = 0; i <= kPer; ++i) cu[i] = first + i <= a.B ? a.cu_seqlens[first + i] : 0;
      int n[kPer], p0[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        n[i] = first + i < a.B ? cu[i + 1] - cu[i] : 0;
        if (n[i] < a.min_tokens || n[i] > a.max_tokens) n[i] = 0;
        p0[i] = n[i] > 0 ? a.positions[cu[i]] : 0;
      }
      int cnt[kPer];  // tiles of each item: the rows-aligned windows holding one of its positions
      int mine = 0;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        cnt[i] = n[i] > 0 ? (p0[i] + n[i] - 1) / rows - p0[i] / rows + 1 : 0;
        mine += cnt[i];
      }
      int incl = mine;  // inclusive prefix sum of mine over the lanes
      for (int off = 1; off < 32; off <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += y;
      }
      const int total = __shfl_sync(0xffffffffu, incl, 31);
      if (t < before + total) {
        int64_t start = before + incl - mine;  // the lane's first tile
        if (t >= start && t < start + mine) {  // exactly one lane, then exactly one item
#pragma unroll
          for (int i = 0; i < kPer; ++i) {
            if (t >= start && t < start + cnt[i]) {
              const int k = static_cast<int>(t - start);
              PagedTile tl;
              tl.p0 = p0[i];
              tl.s0 = int64_t(cu[i]) - p0[i];
              tl.L = p0[i] + n[i];
              tl.b = first + i;
              tl.r0 = (p0[i] / rows + cnt[i] - 1 - k) * rows;
              s_ref = tl;
            }
            start += cnt[i];
          }
        }
        found = true;
      }
      before += total;
    }
    if (lane == 0) s_found = found ? 1 : 0;
  }
  __syncthreads();
  ref = s_ref;
  return s_found != 0;
}

// Query rows of a paged tile: tile row r is token t + r; rows outside [lo, hi) are zero.
struct PagedQueryRows {
  const bf16_t* q;  // the head's column of q
  int64_t t;
  int64_t stride;
  int lo, hi;
  __device__ bool has(int r) const { return r >= lo && r < hi; }
  __device__ const bf16_t* row(int r) const { return q + (t + r) * stride; }
};

// Keys key0 + r of one item: slot table[p / block_size] * block_size + p % block_size of the
// cache (a tile of keys spans several blocks); rows >= valid are zero.
struct PagedKeyRows {
  const bf16_t* cache;   // the kv head's column of the cache
  const int32_t* table;  // the item's row of block_tables
  int64_t stride;        // Hkv * D
  int key0, block_size, valid;
  __device__ bool has(int r) const { return r < valid; }
  __device__ const bf16_t* row(int r) const {
    const int p = key0 + r;
    return cache + (int64_t(table[p / block_size]) * block_size + p % block_size) * stride;
  }
};

struct PagedSrc {
  using Args = PagedFwdArgs;
  using Tile = PagedTile;
  static constexpr bool kChunk = true;
  __device__ static bool find(const Args& a, int rows, int64_t t, Tile& tl) {
    return find_paged_tile(a, rows, t, tl);
  }
  __device__ static PagedQueryRows q_rows(const Args& a, const Tile& tl, int h, int64_t qs, int n) {
    return {a.q + int64_t(h) * a.D, tl.s0 + tl.r0, qs, max(0, tl.p0 - tl.r0), min(n, tl.L - tl.r0)};
  }
  // kv: the kv head's column of the cache (a.k / a.v + g * D).
  __device__ static PagedKeyRows kv_rows(const bf16_t* kv, const Args& a, const Tile& tl,
                                         int64_t ks, int j0, int valid) {
    return {kv, a.block_tables + tl.b * a.W, ks, j0, a.block_size, valid};
  }
};

// The parts of one key tile, in the order fwd_key_tile runs them (the block decode kernel runs
// the same parts for several tiles at once, and the online-softmax chain between them in tile
// order, so a row gets the same operations on the same values).
//
// S = Q K^T over the 16-key steps some row of the warp sees (kvis).
template <int Dp, int kMT, int kBN>
__device__ __forceinline__ void fwd_tile_scores(float (&s)[kMT][kBN / 8][4], uint32_t q_addr,
                                                uint32_t kb, int kvis) {
  constexpr int kLds = Dp + 8;
  constexpr int kNT = kBN / 8;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
      s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < Dp / 16; ++kk) {
    uint32_t qa[kMT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) ldsm_x4(qa[mt], q_addr + 2 * (mt * 16 * kLds + kk * 16));
#pragma unroll
    for (int np = 0; np < kBN / 16; ++np) {
      if (np * 16 < kvis) {
        uint32_t kf[4];
        ldsm_x4(kf, kb + 2 * (np * 16 * kLds + kk * 16));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_bf16(s[mt][2 * np], qa[mt], kf[0], kf[1]);
          mma_bf16(s[mt][2 * np + 1], qa[mt], kf[2], kf[3]);
        }
      }
    }
  }
}

// Scores to log2 units with the causal mask where the tile crosses the diagonal (it also covers
// keys past the sequence end and the n-tiles skipped above); mx: each row's maximum over the tile.
template <int kMT, int kBN, bool kOnePos>
__device__ __forceinline__ void fwd_tile_mask_max(float (&s)[kMT][kBN / 8][4], float (&mx)[kMT][2],
                                                  int key0, int wr0, int gr, int tc,
                                                  float scale_log2) {
  constexpr int kNT = kBN / 8;
  const bool diag = key0 + kBN - 1 > wr0;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int row = kOnePos ? wr0 : wr0 + mt * 16 + gr + 8 * hf;
      float m = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[mt][nt][2 * hf + e];
          const int key = key0 + nt * 8 + 2 * tc + e;
          x = (diag && key > row) ? -INFINITY : x * scale_log2;
          m = fmaxf(m, x);
        }
      }
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      mx[mt][hf] = m;
    }
  }
}

// The online-softmax step of one row: the new running max, the max the row's exponents subtract
// (0 for a row with nothing visible yet, so it stays at zeros instead of NaN) and the rescale of
// what was summed before.
struct SoftmaxStep {
  float m_new, m_use, alpha;
};
__device__ __forceinline__ SoftmaxStep softmax_step(float m_run, float mx) {
  SoftmaxStep st;
  st.m_new = fmaxf(m_run, mx);
  st.m_use = st.m_new == -INFINITY ? 0.0f : st.m_new;
  st.alpha = exp2_approx(m_run - st.m_use);
  return st;
}

// P = 2^(s - m_use) in place; sum: the lane's part of each row's sum over the tile.
template <int kMT, int kBN>
__device__ __forceinline__ void fwd_tile_probs(float (&s)[kMT][kBN / 8][4],
                                               const float (&m_use)[kMT][2], float (&sum)[kMT][2]) {
  constexpr int kNT = kBN / 8;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float acc = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[mt][nt][2 * hf + e];
          x = exp2_approx(x - m_use[mt][hf]);
          acc += x;
        }
      }
      sum[mt][hf] = acc;
    }
  }
}

// l = l * alpha + sum (the lane's part of the row's running sum).
__device__ __forceinline__ float softmax_sum(float l, float alpha, float sum) {
  return l * alpha + sum;
}

// O = O * alpha, then O += P V (P rounded to bf16), skipping 16-key steps no row of the warp sees.
template <int Dp, int kMT, int kBN>
__device__ __forceinline__ void fwd_tile_pv(float (&o)[kMT][Dp / 8][4],
                                            const float (&s)[kMT][kBN / 8][4],
                                            const float (&alpha)[kMT][2], uint32_t vb, int kvis) {
  constexpr int kLds = Dp + 8;
  constexpr int kDT = Dp / 8;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        o[mt][dt][2 * hf] *= alpha[mt][hf];
        o[mt][dt][2 * hf + 1] *= alpha[mt][hf];
      }
    }
  }
#pragma unroll
  for (int kk = 0; kk < kBN / 16; ++kk) {
    if (kk * 16 < kvis) {
      uint32_t pa[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) acc_to_a(pa[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
      for (int np = 0; np < Dp / 16; ++np) {
        uint32_t vf[4];
        ldsm_x4_trans(vf, vb + 2 * (kk * 16 * kLds + np * 16));
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          mma_bf16(o[mt][2 * np], pa[mt], vf[0], vf[1]);
          mma_bf16(o[mt][2 * np + 1], pa[mt], vf[2], vf[3]);
        }
      }
    }
  }
}

// One key tile of the forward for one warp, the arithmetic every output row's bits come from:
// S = Q K^T over the 16-key steps some row of the warp sees (kvis), scores in log2 units, the
// causal mask where the tile crosses the diagonal, the online softmax, O = O * alpha + P V. q_addr,
// kb and vb are the lane's ldmatrix addresses of the warp's query rows and of the key tile's K and
// V. Row (mt, hf) of the lane (gr = lane / 4, tc = lane % 4) is at position wr0 + mt*16 + gr +
// 8*hf, or at wr0 for every row when kOnePos (the decode warp, whose rows are heads of one token).
// A row's value depends only on its own q row, the key tile and its position, never on the other
// rows.
template <int Dp, int kMT, int kBN, bool kOnePos>
__device__ __forceinline__ void fwd_key_tile(float (&o)[kMT][Dp / 8][4], float (&m_run)[kMT][2],
                                             float (&l_run)[kMT][2], uint32_t q_addr, uint32_t kb,
                                             uint32_t vb, int key0, int kvis, int wr0, int gr,
                                             int tc, float scale_log2) {
  float s[kMT][kBN / 8][4];
  fwd_tile_scores<Dp, kMT, kBN>(s, q_addr, kb, kvis);
  float mx[kMT][2], m_use[kMT][2], alpha[kMT][2], sum[kMT][2];
  fwd_tile_mask_max<kMT, kBN, kOnePos>(s, mx, key0, wr0, gr, tc, scale_log2);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const SoftmaxStep st = softmax_step(m_run[mt][hf], mx[mt][hf]);
      m_use[mt][hf] = st.m_use;
      alpha[mt][hf] = st.alpha;
      m_run[mt][hf] = st.m_new;
    }
  }
  fwd_tile_probs<kMT, kBN>(s, m_use, sum);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
      l_run[mt][hf] = softmax_sum(l_run[mt][hf], alpha[mt][hf], sum[mt][hf]);
  }
  fwd_tile_pv<Dp, kMT, kBN>(o, s, alpha, vb, kvis);
}

// Columns col and col + 1 of an output row (those < D), rounded to bf16; pairs: one bf16x2 store.
__device__ __forceinline__ void store_out_cols(bf16_t* orow, int col, float x0, float x1, int D,
                                               bool pairs) {
  if (pairs) {
    if (col < D) *reinterpret_cast<__nv_bfloat162*>(orow + col) = __floats2bfloat162_rn(x0, x1);
  } else {
    if (col < D) orow[col] = __float2bfloat16_rn(x0);
    if (col + 1 < D) orow[col + 1] = __float2bfloat16_rn(x1);
  }
}

// Row (mt, hf) of the lane's O, divided by the row's sum l (already summed over the row's four
// lanes) and rounded to bf16, into orow (the row of out). pairs: bf16x2 stores.
template <int Dp, int kMT>
__device__ __forceinline__ void fwd_store_row(bf16_t* orow, const float (&o)[kMT][Dp / 8][4],
                                              int mt, int hf, float l, int tc, int D, bool pairs) {
  constexpr int kDT = Dp / 8;
  const float inv_l = 1.0f / l;
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) {
    const int col = dt * 8 + 2 * tc;
    store_out_cols(orow, col, o[mt][dt][2 * hf] * inv_l, o[mt][dt][2 * hf + 1] * inv_l, D, pairs);
  }
}

template <int Dp, int kMT, int kKeys, int kMinBlocks, typename Src>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    attention_forward_kernel(const typename Src::Args a) {
  using Cfg = FwdTile<Dp, kMT, kKeys>;
  constexpr int kBM = Cfg::kBM, kBN = Cfg::kBN, kLds = Cfg::kLds, kWarpRows = Cfg::kWarpRows;
  constexpr int kDT = Dp / 8;  // 8-column accumulator tiles of the head dim
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16_t* sQ = reinterpret_cast<bf16_t*>(smem_raw);
  bf16_t* sK = sQ + kBM * kLds;
  bf16_t* sV = sK + 2 * kBN * kLds;

  const int h = static_cast<int>(blockIdx.x % a.H);
  typename Src::Tile tl;
  if (!Src::find(a, kBM, blockIdx.x / a.H, tl)) return;
  const int g = h / (a.H / a.Hkv);
  const int64_t qs = int64_t(a.H) * a.D, ks = int64_t(a.Hkv) * a.D;
  const int kend = min(tl.L, tl.r0 + kBM);  // keys some row of the tile sees
  const int nkt = (kend + kBN - 1) / kBN;
  const int64_t kv0 = Src::kChunk ? 0 : tl.s0 * ks;  // paged: the block table finds the rows
  const bf16_t* kg = a.k + kv0 + int64_t(g) * a.D;
  const bf16_t* vg = a.v + kv0 + int64_t(g) * a.D;

  stage_rows<Dp, kBM>(sQ, Src::q_rows(a, tl, h, qs, kBM), a.D, a.vec);
  stage_rows<Dp, kBN>(sK, Src::kv_rows(kg, a, tl, ks, 0, min(kBN, kend)), a.D, a.vec);
  stage_rows<Dp, kBN>(sV, Src::kv_rows(vg, a, tl, ks, 0, min(kBN, kend)), a.D, a.vec);
  cp_async_commit();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gr = lane >> 2, tc = lane & 3;
  const int wr0 = tl.r0 + warp * kWarpRows;  // position of this warp's first query row
  const int wlast = wr0 + kWarpRows - 1;
  bool live = wr0 < tl.L;  // the warp has a query row to store
  if constexpr (Src::kChunk) live = live && wlast >= tl.p0;
  const LaneOffsets lo(lane, kLds);
  const uint32_t q_addr = smem_u32(sQ + warp * kWarpRows * kLds + lo.a_off);
  const uint32_t k_addr = smem_u32(sK + lo.bn_off), v_addr = smem_u32(sV + lo.bt_off);
  constexpr uint32_t kBufBytes = sizeof(bf16_t) * kBN * kLds;

  float o[kMT][kDT][4];
  float m_run[kMT][2], l_run[kMT][2];  // per row g / g+8: running max (log2 units), partial sum
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
      o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.0f;
    m_run[mt][0] = m_run[mt][1] = -INFINITY;
    l_run[mt][0] = l_run[mt][1] = 0.0f;
  }

  for (int j = 0; j < nkt; ++j) {
    if (j + 1 < nkt) {  // prefetch the next key tile into the other buffer
      const int j0 = (j + 1) * kBN, buf = (j + 1) & 1;
      stage_rows<Dp, kBN>(sK + buf * kBN * kLds,
                          Src::kv_rows(kg, a, tl, ks, j0, min(kBN, kend - j0)), a.D, a.vec);
      stage_rows<Dp, kBN>(sV + buf * kBN * kLds,
                          Src::kv_rows(vg, a, tl, ks, j0, min(kBN, kend - j0)), a.D, a.vec);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int key0 = j * kBN;
    if (live && key0 <= wlast) {  // warp-uniform: a warp above the diagonal skips the tile
      const uint32_t kb = k_addr + (j & 1) * kBufBytes, vb = v_addr + (j & 1) * kBufBytes;
      const int kvis = min(kBN, wlast - key0 + 1);  // keys of the tile some row of the warp sees
      fwd_key_tile<Dp, kMT, kBN, false>(o, m_run, l_run, q_addr, kb, vb, key0, kvis, wr0, gr, tc,
                                        a.scale_log2);
    }
    __syncthreads();  // the buffer just read is the next prefetch's target
  }

  if (!live) return;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float l = l_run[mt][hf];  // the row's sum over the four lanes that share it
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int row = wr0 + mt * 16 + gr + 8 * hf;
      if (row >= tl.L) continue;
      if constexpr (Src::kChunk) {
        if (row < tl.p0) continue;
      }
      fwd_store_row<Dp, kMT>(a.out + (tl.s0 + row) * qs + int64_t(h) * a.D, o, mt, hf, l, tc, a.D,
                             a.out_pairs);
      if (a.lse != nullptr && tc == 0) {
        a.lse[(tl.s0 + row) * a.H + h] = (m_run[mt][hf] + log2f(l)) * kLn2;
      }
    }
  }
}

// ---- Decode (attention_forward_paged's single-token items) --------------------------------------

// The tiled kernel gives a decode token a whole block with one live warp and one live row, and
// each of the G = H / Hkv heads of a kv head reads that kv head's keys again. The decode kernel
// puts the G heads of one token and one kv head in the rows of one 16-row m-tile (rows >= G zero)
// and streams the kv head's keys once for all of them. Every row meets the same key tiles as in
// the tiled kernel (kBN keys, tiles 0 .. p / kBN for the token at position p) with the same
// operations; what differs from the tiled kernel's warp of position p is only which rows sit
// beside it (other heads instead of other positions: a row does not depend on them), the columns
// its mma steps skip and the staged keys past p (all masked to -inf: the row's P is exactly zero
// there, and adding 0 * v to the mma sum or skipping the step gives the same bits; kvis = keys
// 0 .. p of the tile), and the mask's `diag` test (a tile that does not cross p masks nothing
// either way). So each head's output has attention_forward's bits at position p.
//
// Two kernels do this, both splitting fwd_key_tile's work between warps: it is a chain only
// through the running max m, the lanes' running sums l and O; the scores, their tile maxima, P
// and each tile's lane sums depend on nothing before the tile, and the columns of O are
// independent sums. The split kernel (attention_decode_split_kernel, above the block kernel)
// splits each key tile between two or four warps, for batches with enough (item, kv head) pairs to
// fill the GPU. The block kernel (attention_decode_block_kernel), for smaller batches, splits one
// (item, kv head) over a block: a block of kDecodeWarps warps takes one (item, kv head) and the
// key tiles in rounds of kDecodeWarps, warp w taking tile r * kDecodeWarps + w:
//   1. each warp: its tile's scores and row maxima (fwd_tile_scores, fwd_tile_mask_max);
//   2. each warp: the running max through the round's tiles in order from the maxima (fmaxf, so
//      exactly fwd_key_tile's m), hence every tile's alpha and its own tile's m_use
//      (softmax_step); its tile's P and lane sums (fwd_tile_probs), P rounded to bf16 as the
//      A fragments fwd_tile_pv would build;
//   3. each warp: the l chain through the round's tiles in order (softmax_sum), and O = O * alpha
//      + P V through the round's tiles in order for its own 16 * kNPW columns of the head dim
//      (columns of an mma product are independent sums: the same steps, the same bits).
// The lane layout of the m-tile is the same in every warp, so each lane meets the same values in
// the same order as the one warp of fwd_key_tile: the same bits. Shared state between the steps
// goes through shared memory (maxima, sums, P fragments), two block barriers a round. Each warp
// stages its own tiles: the query rows, its round tile's K (the next round's is fetched as soon as
// the scores are done) and the V columns of its head-dim slice for the round's tiles (the next
// round's fetched once P V is done).
// Warps per decode block: the block kernel's warps per pair and key tiles per round; the split
// kernel's warps of one or two pairs.
constexpr int kDecodeWarps = kThreads / 32;

template <int Dp, int kKeys>
struct DecodeBlockTile {
  static constexpr int kBN = kKeys;  // keys per step: the tiled kernel's for this Dp
  static constexpr int kLds = Dp + 8;
  static constexpr int kKK = kBN / 16;  // 16-key steps of P V
  // Head-dim columns per warp in P V: 16-column steps, at least one per warp (Dp = 32 leaves the
  // last two warps without columns).
  static constexpr int kNPW = Dp / 16 / kDecodeWarps > 0 ? Dp / 16 / kDecodeWarps : 1;
  static constexpr int kDW = 16 * kNPW;
  static constexpr int kLdsV = kDW + 8;  // 16-byte rows starting in distinct bank groups
  // Per warp (bf16): sQ [16][kLds], sK [kBN][kLds], sV [kDecodeWarps tiles][kBN][kLdsV].
  static constexpr int kWarpElems = 16 * kLds + kBN * kLds + kDecodeWarps * kBN * kLdsV;
  // Per block: P fragments [tile][kKK][4][32 lanes] (u32), maxima and sums [tile][32 lanes][2].
  static constexpr int kPWords = kDecodeWarps * kKK * 4 * 32;
  static constexpr int kStatFloats = kDecodeWarps * 32 * 2;
  static constexpr size_t kSmem = sizeof(bf16_t) * kWarpElems * kDecodeWarps +
                                  sizeof(uint32_t) * kPWords + sizeof(float) * 2 * kStatFloats;
};

// Row r of the decode warp's query tile: head g * G + r of the token (consecutive heads of one q
// row, stride D); rows >= valid (= G) are zero.
struct GroupQueryRows {
  const bf16_t* q;  // the token's row of q, at the group's first head
  int stride;       // D
  int valid;        // G
  __device__ bool has(int r) const { return r < valid; }
  __device__ const bf16_t* row(int r) const { return q + int64_t(r) * stride; }
};

// Columns c0 .. c0 + kCols - 1 of keys key0 .. key0 + kRows - 1 of one item's kv head (cache
// column base kv) into dst [kRows][kLdsDst], by one warp: key p sits at slot table[p / block_size]
// * block_size + p % block_size; keys >= key0 + valid and columns >= D are zero.
// The decode kernel is bound by instruction issue, and addressing is most of its staging: when
// block_size = 2^bs_log2 divides key0 and the rows span at most 32 blocks (bs_log2 >= 0 given only
// then), lane i reads the table entry of the rows' i-th block once and every copy takes its row's
// first slot from that lane by a shuffle, with shifts instead of divisions. kTwo: the same rows
// and columns of a second cache (kv2, the values) into dst2 as well, on the same addressing.
template <int kRows, int kCols, int kLdsDst, bool kTwo = false>
__device__ __forceinline__ void stage_cache_warp(bf16_t* dst, const bf16_t* kv, bf16_t* dst2,
                                                 const bf16_t* kv2, const int32_t* table,
                                                 int64_t stride, int block_size, int bs_log2,
                                                 int key0, int valid, int c0, int D, bool vec,
                                                 int lane) {
  constexpr int kChunks = kCols / 8;
  constexpr int kIters = (kRows * kChunks + 31) / 32;
  if (vec && bs_log2 >= 0 && (kRows >> bs_log2) <= 32) {
    const int b0 = key0 >> bs_log2;
    const bool blk_in = lane < (kRows >> bs_log2) && (lane << bs_log2) < valid;
    const int64_t first = blk_in ? int64_t(table[b0 + lane]) << bs_log2 : 0;  // block's 1st slot
    const int64_t off0 = first * stride + c0;  // elements from kv (and kv2)
    const unsigned lo = static_cast<unsigned>(off0), hi = static_cast<unsigned>(off0 >> 32);
    const int in_mask = block_size - 1;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int e = it * 32 + lane;
      const int r = e / kChunks, c = (e % kChunks) * 8;
      const int src = (r >> bs_log2) & 31;  // every lane shuffles, whatever its row
      const int64_t off = static_cast<int64_t>((uint64_t(__shfl_sync(0xffffffffu, hi, src)) << 32) |
                                               __shfl_sync(0xffffffffu, lo, src)) +
                          int64_t(r & in_mask) * stride + c;
      if (kRows * kChunks % 32 == 0 || e < kRows * kChunks) {
        const int d = r * kLdsDst + c;
        if (r < valid && c0 + c < D) {
          cp_async_16(smem_u32(dst + d), kv + off);
          if constexpr (kTwo) cp_async_16(smem_u32(dst2 + d), kv2 + off);
        } else {
          *reinterpret_cast<uint4*>(dst + d) = make_uint4(0u, 0u, 0u, 0u);
          if constexpr (kTwo) *reinterpret_cast<uint4*>(dst2 + d) = make_uint4(0u, 0u, 0u, 0u);
        }
      }
    }
    return;
  }
  const unsigned bs = static_cast<unsigned>(block_size);
  if (vec) {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int e = it * 32 + lane;
      if (kRows * kChunks % 32 == 0 || e < kRows * kChunks) {
        const int r = e / kChunks, c = (e % kChunks) * 8;
        const int d = r * kLdsDst + c;
        if (r < valid && c0 + c < D) {
          const unsigned p = static_cast<unsigned>(key0 + r), blk = p / bs;
          const int64_t off = (int64_t(table[blk]) * block_size + (p - blk * bs)) * stride + c0 + c;
          cp_async_16(smem_u32(dst + d), kv + off);
          if constexpr (kTwo) cp_async_16(smem_u32(dst2 + d), kv2 + off);
        } else {
          *reinterpret_cast<uint4*>(dst + d) = make_uint4(0u, 0u, 0u, 0u);
          if constexpr (kTwo) *reinterpret_cast<uint4*>(dst2 + d) = make_uint4(0u, 0u, 0u, 0u);
        }
      }
    }
  } else {
    for (int r = 0; r < kRows; ++r) {
      int64_t slot = 0;
      if (r < valid) {
        const unsigned p = static_cast<unsigned>(key0 + r), blk = p / bs;
        slot = int64_t(table[blk]) * block_size + (p - blk * bs);
      }
      for (int c = lane; c < kCols; c += 32) {
        const bool in = r < valid && c0 + c < D;
        const int64_t off = slot * stride + c0 + c;
        dst[r * kLdsDst + c] = in ? kv[off] : __float2bfloat16_rn(0.0f);
        if constexpr (kTwo) dst2[r * kLdsDst + c] = in ? kv2[off] : __float2bfloat16_rn(0.0f);
      }
    }
  }
}

// log2(block_size) when it is a power of two dividing kBN (every key tile then starts a block),
// else -1: stage_cache_warp's fast addressing.
__device__ __forceinline__ int block_size_log2(int block_size, int kBN) {
  return (block_size & (block_size - 1)) == 0 && kBN % block_size == 0 ? __ffs(block_size) - 1 : -1;
}

// The decode kernels' stores: the warp's 8-column accumulator tiles o[0 .. kTiles) of head dims
// c0 + 8 i .., rows gr and gr + 8 of the m-tile (heads gr and gr + 8 of the group at out, rows
// >= G are padding), divided by the row's sum l (l_run summed over the four lanes that share the
// row): fwd_store_row's arithmetic, for the warp's columns.
template <int kTiles>
__device__ __forceinline__ void decode_store(bf16_t* out, const float (&o)[kTiles][4],
                                             const float (&l_run)[2], int G, int D, bool pairs,
                                             int c0, int gr, int tc) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float l = l_run[hf];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int i = gr + 8 * hf;  // the row's head in the group
    if (i >= G) continue;
    const float inv_l = 1.0f / l;
    bf16_t* orow = out + int64_t(i) * D;
#pragma unroll
    for (int dt = 0; dt < kTiles; ++dt) {
      store_out_cols(orow, c0 + dt * 8 + 2 * tc, o[dt][2 * hf] * inv_l, o[dt][2 * hf + 1] * inv_l,
                     D, pairs);
    }
  }
}

// The split kernel: kSplit warps per (item, kv head) pair, kDecodeWarps / kSplit pairs per block,
// fwd_key_tile's work on each key tile split between them. (One warp per pair running
// fwd_key_tile itself was bound by instruction issue, one warp per scheduler at large batch; with
// two warps a pair the 0.5B rollout's decode step went from 1.97 to 1.82 ms, and four gain a
// little more at D = 64: kDecodeSplit, docs/benchmarks.md.)
// Warp h of a pair:
//   1. stages rows h * kOwnRows .. of each tile's K and V (the pair's barrier makes every warp's
//      rows visible to all);
//   2. computes the scores of those keys (fwd_tile_scores' mma steps for those accumulators) and
//      their row maxima; the pair exchanges the maxima (fmaxf: exact in any order);
//   3. applies the online-softmax step (the same in every warp) and takes the exponentials of its
//      keys; the pair exchanges P in fp32, so every warp holds the whole tile's P;
//   4. sums each lane's row part over the whole tile in fwd_tile_probs' order (every warp keeps
//      the same l), and runs O = O * alpha + P V for its 16 * kNPW columns of the head dimension
//      (columns are independent sums).
// Three barriers of the pair's threads a tile.
template <int Dp, int kKeys, int kSplit>
struct DecodeSplitTile {
  static constexpr int kBN = kKeys;
  static constexpr int kLds = Dp + 8;
  static constexpr int kNT = kBN / 8;            // 8-key accumulator tiles of a key tile
  static constexpr int kOwnRows = kBN / kSplit;  // keys a warp stages and scores
  static constexpr int kOwnNT = kNT / kSplit, kOwnSteps = kOwnRows / 16;
  static constexpr int kNPW = Dp / 16 / kSplit;  // 16-column P V steps a warp
  static constexpr int kQRows = 16 / kSplit;     // query rows a warp stages
  static constexpr int kPairs = kDecodeWarps / kSplit;
  static_assert(kDecodeWarps % kSplit == 0 && kOwnRows % 16 == 0 && kNPW >= 1,
                "a warp takes whole 16-key steps and 16-column steps");
  // Per pair: bf16 sQ [16][kLds], sK [2][kBN][kLds], sV [2][kBN][kLds]; floats sMx [kSplit][32][2]
  // and sP [kNT][32 lanes][4] (one 16-byte read per lane and accumulator tile).
  static constexpr int kPairElems = kLds * (16 + 4 * kBN);
  static constexpr int kMxFloats = kSplit * 32 * 2, kPFloats = kNT * 32 * 4;
  static constexpr size_t kPairBytes =
      sizeof(bf16_t) * kPairElems + sizeof(float) * (kMxFloats + kPFloats);
  static_assert(kPairBytes % 16 == 0, "pairs start on 16-byte boundaries");
  static constexpr size_t kSmem = kPairs * kPairBytes;
};

template <int Dp, int kKeys, int kSplit>
__global__ void __launch_bounds__(kThreads, 2) attention_decode_split_kernel(const PagedFwdArgs a) {
  using Cfg = DecodeSplitTile<Dp, kKeys, kSplit>;
  constexpr int kBN = Cfg::kBN, kLds = Cfg::kLds, kNT = Cfg::kNT, kOwnNT = Cfg::kOwnNT;
  constexpr int kOwnRows = Cfg::kOwnRows, kOwnSteps = Cfg::kOwnSteps, kNPW = Cfg::kNPW;
  constexpr int kQRows = Cfg::kQRows;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int pb = warp / kSplit, h = warp % kSplit;  // the pair in the block, the warp's part
  const int64_t pr = int64_t(blockIdx.x) * Cfg::kPairs + pb;
  const int64_t b = pr / a.Hkv;
  if (b >= a.B) return;  // pair-uniform, as is every branch on b, t, pos and j below
  const int64_t t = a.cu_seqlens[b];
  if (a.cu_seqlens[b + 1] - t != 1) return;
  const int g = static_cast<int>(pr % a.Hkv), G = a.H / a.Hkv;
  const int pos = a.positions[t];  // the token attends to keys 0 .. pos
  const int64_t qs = int64_t(a.H) * a.D, ks = int64_t(a.Hkv) * a.D;
  const bf16_t* kg = a.k + int64_t(g) * a.D;
  const bf16_t* vg = a.v + int64_t(g) * a.D;
  const int32_t* table = a.block_tables + b * a.W;
  unsigned char* base = smem_raw + pb * Cfg::kPairBytes;
  bf16_t* sQ = reinterpret_cast<bf16_t*>(base);
  bf16_t* sK = sQ + 16 * kLds;
  bf16_t* sV = sK + 2 * kBN * kLds;
  float* sMx = reinterpret_cast<float*>(base + sizeof(bf16_t) * Cfg::kPairElems);  // [h][lane][hf]
  float* sP = sMx + Cfg::kMxFloats;                                                // [nt][lane][c]
  const int nkt = pos / kBN + 1;  // key tiles 0 .. pos / kBN, as for the tiled kernel's row pos
  const int bs_log2 = block_size_log2(a.block_size, kOwnRows);
  const int bar = 1 + pb;  // named barrier of the pair's threads (0 is __syncthreads)
  auto pair_sync = [bar] {
    asm volatile("bar.sync %0, %1;\n" ::"r"(bar), "r"(kSplit * 32) : "memory");
  };
  auto stage_kv = [&](int j, int buf) {  // the warp's rows of tile j
    const int key0 = j * kBN + h * kOwnRows, off = (buf * kBN + h * kOwnRows) * kLds;
    stage_cache_warp<kOwnRows, Dp, kLds, true>(sK + off, kg, sV + off, vg, table, ks, a.block_size,
                                               bs_log2, key0, min(kOwnRows, pos + 1 - key0), 0, a.D,
                                               a.vec, lane);
  };

  const int q0 = kQRows * h;  // the warp's query rows: heads g * G + q0 ..
  const GroupQueryRows q_rows{a.q + t * qs + int64_t(g * G + q0) * a.D, a.D, G - q0};
  stage_rows_by<Dp, kQRows, 32>(sQ + q0 * kLds, q_rows, a.D, a.vec, lane);
  stage_kv(0, 0);
  cp_async_commit();

  const int gr = lane >> 2, tc = lane & 3;
  const LaneOffsets lo(lane, kLds);
  const uint32_t q_addr = smem_u32(sQ + lo.a_off);
  const uint32_t k_addr = smem_u32(sK + lo.bn_off), v_addr = smem_u32(sV + lo.bt_off);
  constexpr uint32_t kBufBytes = sizeof(bf16_t) * kBN * kLds;

  float o[2 * kNPW][4];  // the warp's columns: 16 * (h * kNPW + i / 2) + 8 * (i % 2) ..
#pragma unroll
  for (int i = 0; i < 2 * kNPW; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};  // the same in every warp

  for (int j = 0; j < nkt; ++j) {
    cp_async_wait<0>();
    pair_sync();  // tile j (every warp's rows; the query rows at j = 0) staged; tile j - 1 done
    if (j + 1 < nkt) stage_kv(j + 1, (j + 1) & 1);
    cp_async_commit();
    const int key0 = j * kBN, kvis = min(kBN, pos - key0 + 1);
    const uint32_t kb = k_addr + (j & 1) * kBufBytes, vb = v_addr + (j & 1) * kBufBytes;

    // Scores of the warp's keys (accumulator tiles h * kOwnNT ..): fwd_tile_scores' steps for
    // those accumulators. Register arrays are indexed by constants only (h is not one).
    float own[kOwnNT][4];
#pragma unroll
    for (int u = 0; u < kOwnNT; ++u) own[u][0] = own[u][1] = own[u][2] = own[u][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < Dp / 16; ++kk) {
      uint32_t qa[4];
      ldsm_x4(qa, q_addr + 2 * (kk * 16));
#pragma unroll
      for (int u = 0; u < kOwnSteps; ++u) {
        const int np = h * kOwnSteps + u;
        if (np * 16 < kvis) {
          uint32_t kf[4];
          ldsm_x4(kf, kb + 2 * (np * 16 * kLds + kk * 16));
          mma_bf16(own[2 * u], qa, kf[0], kf[1]);
          mma_bf16(own[2 * u + 1], qa, kf[2], kf[3]);
        }
      }
    }
    // fwd_tile_mask_max over the warp's keys; the pair's maxima combined (fmaxf is exact).
    const bool diag = key0 + kBN - 1 > pos;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float m = -INFINITY;
#pragma unroll
      for (int u = 0; u < kOwnNT; ++u) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = own[u][2 * hf + e];
          const int key = key0 + (h * kOwnNT + u) * 8 + 2 * tc + e;
          x = (diag && key > pos) ? -INFINITY : x * a.scale_log2;
          m = fmaxf(m, x);
        }
      }
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      sMx[(h * 32 + lane) * 2 + hf] = m;
    }
    pair_sync();
    float alpha[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = sMx[lane * 2 + hf];
#pragma unroll
      for (int w = 1; w < kSplit; ++w) mx = fmaxf(mx, sMx[(w * 32 + lane) * 2 + hf]);
      const SoftmaxStep st = softmax_step(m_run[hf], mx);
      alpha[hf] = st.alpha;
      m_run[hf] = st.m_new;
#pragma unroll
      for (int u = 0; u < kOwnNT; ++u) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = own[u][2 * hf + e];
          x = exp2_approx(x - st.m_use);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kOwnNT; ++u) {
      *reinterpret_cast<float4*>(sP + ((h * kOwnNT + u) * 32 + lane) * 4) =
          make_float4(own[u][0], own[u][1], own[u][2], own[u][3]);
    }
    pair_sync();
    // The whole tile's P in key order, every warp's part.
    float s[kNT][4];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const float4 v = *reinterpret_cast<const float4*>(sP + (nt * 32 + lane) * 4);
      s[nt][0] = v.x;
      s[nt][1] = v.y;
      s[nt][2] = v.z;
      s[nt][3] = v.w;
    }
    // The lane's row sums in fwd_tile_probs' order, over the whole tile.
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float acc = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        acc += s[nt][2 * hf];
        acc += s[nt][2 * hf + 1];
      }
      l_run[hf] = softmax_sum(l_run[hf], alpha[hf], acc);
    }
    // fwd_tile_pv for the warp's columns.
#pragma unroll
    for (int i = 0; i < 2 * kNPW; ++i) {
      o[i][0] *= alpha[0];
      o[i][1] *= alpha[0];
      o[i][2] *= alpha[1];
      o[i][3] *= alpha[1];
    }
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      if (kk * 16 < kvis) {
        uint32_t pa[4];
        acc_to_a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
        for (int u = 0; u < kNPW; ++u) {
          uint32_t vf[4];
          ldsm_x4_trans(vf, vb + 2 * (kk * 16 * kLds + (h * kNPW + u) * 16));
          mma_bf16(o[2 * u], pa, vf[0], vf[1]);
          mma_bf16(o[2 * u + 1], pa, vf[2], vf[3]);
        }
      }
    }
  }

  decode_store(a.out + t * qs + int64_t(g * G) * a.D, o, l_run, G, a.D, a.out_pairs, 16 * kNPW * h,
               gr, tc);
}

// Block (item b, kv head g) = blockIdx.x (b = x / Hkv); a block whose item does not have exactly
// one query token exits (the tiled kernel has it). Needs G = H / Hkv <= 16. Every branch on b,
// t, pos and the round is block-uniform; `mine` and `has_cols` are warp-uniform.
template <int Dp, int kKeys>
__global__ void __launch_bounds__(kThreads, 2) attention_decode_block_kernel(const PagedFwdArgs a) {
  using Cfg = DecodeBlockTile<Dp, kKeys>;
  constexpr int kBN = Cfg::kBN, kLds = Cfg::kLds, kLdsV = Cfg::kLdsV, kKK = Cfg::kKK;
  constexpr int kNPW = Cfg::kNPW, kDW = Cfg::kDW, kNT = kBN / 8, kR = kDecodeWarps;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t b = blockIdx.x / a.Hkv;
  if (b >= a.B) return;
  const int64_t t = a.cu_seqlens[b];
  if (a.cu_seqlens[b + 1] - t != 1) return;
  const int g = static_cast<int>(blockIdx.x % a.Hkv), G = a.H / a.Hkv;
  const int pos = a.positions[t];  // the token attends to keys 0 .. pos
  const int64_t qs = int64_t(a.H) * a.D, ks = int64_t(a.Hkv) * a.D;
  const bf16_t* kg = a.k + int64_t(g) * a.D;
  const bf16_t* vg = a.v + int64_t(g) * a.D;
  const int32_t* table = a.block_tables + b * a.W;
  bf16_t* sQ = reinterpret_cast<bf16_t*>(smem_raw) + warp * Cfg::kWarpElems;
  bf16_t* sK = sQ + 16 * kLds;
  bf16_t* sV = sK + kBN * kLds;
  uint32_t* sP =
      reinterpret_cast<uint32_t*>(reinterpret_cast<bf16_t*>(smem_raw) + kR * Cfg::kWarpElems);
  float* sMx = reinterpret_cast<float*>(sP + Cfg::kPWords);  // [tile][lane][hf]
  float* sSum = sMx + Cfg::kStatFloats;                      // [tile][lane][hf]
  const int nkt = pos / kBN + 1;  // key tiles 0 .. pos / kBN, as for the tiled kernel's row pos
  const int c0 = warp * kDW;      // the warp's head-dim columns in P V
  const bool has_cols = c0 < Dp;
  const int bs_log2 = block_size_log2(a.block_size, kBN);

  // Stages the warp's tile of round r0's keys, or its columns of the round's values.
  auto stage_k = [&](int r0) {
    const int key0 = (r0 + warp) * kBN;
    if (r0 + warp < nkt) {
      stage_cache_warp<kBN, Dp, kLds>(sK, kg, nullptr, nullptr, table, ks, a.block_size, bs_log2,
                                      key0, min(kBN, pos + 1 - key0), 0, a.D, a.vec, lane);
    }
  };
  auto stage_v = [&](int r0) {  // the round's tiles are consecutive keys, and rows in sV
    const int key0 = r0 * kBN;
    if (has_cols && r0 < nkt) {
      stage_cache_warp<kR * kBN, kDW, kLdsV>(sV, vg, nullptr, nullptr, table, ks, a.block_size,
                                             bs_log2, key0, min(kR * kBN, pos + 1 - key0), c0, a.D,
                                             a.vec, lane);
    }
  };
  stage_rows_by<Dp, 16, 32>(sQ, GroupQueryRows{a.q + t * qs + int64_t(g) * G * a.D, a.D, G}, a.D,
                            a.vec, lane);
  stage_k(0);
  cp_async_commit();
  stage_v(0);
  cp_async_commit();

  const int gr = lane >> 2, tc = lane & 3;
  const LaneOffsets lo(lane, kLds), lov(lane, kLdsV);
  const uint32_t q_addr = smem_u32(sQ + lo.a_off), kb = smem_u32(sK + lo.bn_off);
  const uint32_t vb = smem_u32(sV + lov.bt_off);

  float o[2 * kNPW][4];  // the warp's 8-column accumulator tiles: dims c0 + 8 i ..
#pragma unroll
  for (int i = 0; i < 2 * kNPW; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};  // the same in every warp

  for (int r0 = 0; r0 < nkt; r0 += kR) {
    const int n_round = min(kR, nkt - r0);
    const int key0 = (r0 + warp) * kBN;
    const bool mine = warp < n_round;
    cp_async_wait<1>();  // the query rows and this round's K; V may still be in flight
    __syncwarp();
    float s[1][kNT][4];
    if (mine) {
      fwd_tile_scores<Dp, 1, kBN>(s, q_addr, kb, min(kBN, pos - key0 + 1));
      float mx[1][2];
      fwd_tile_mask_max<1, kBN, true>(s, mx, key0, pos, gr, tc, a.scale_log2);
      sMx[(warp * 32 + lane) * 2] = mx[0][0];
      sMx[(warp * 32 + lane) * 2 + 1] = mx[0][1];
    }
    __syncwarp();  // every lane is done with sK
    stage_k(r0 + kR);
    cp_async_commit();
    __syncthreads();  // the round's maxima

    float alpha[kR][2], m_use[1][2] = {{0.0f, 0.0f}};
#pragma unroll
    for (int u = 0; u < kR; ++u) {
      if (u < n_round) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const SoftmaxStep st = softmax_step(m_run[hf], sMx[(u * 32 + lane) * 2 + hf]);
          alpha[u][hf] = st.alpha;
          if (u == warp) m_use[0][hf] = st.m_use;
          m_run[hf] = st.m_new;
        }
      }
    }
    if (mine) {
      float sum[1][2];
      fwd_tile_probs<1, kBN>(s, m_use, sum);
      sSum[(warp * 32 + lane) * 2] = sum[0][0];
      sSum[(warp * 32 + lane) * 2 + 1] = sum[0][1];
      uint32_t* pw = sP + warp * kKK * 4 * 32;
#pragma unroll
      for (int kk = 0; kk < kKK; ++kk) {
        uint32_t pa[4];
        acc_to_a(pa, s[0][2 * kk], s[0][2 * kk + 1]);
#pragma unroll
        for (int i = 0; i < 4; ++i) pw[(kk * 4 + i) * 32 + lane] = pa[i];
      }
    }
    cp_async_wait<1>();  // this round's V; the next round's K may still be in flight
    __syncthreads();     // the round's sums and P; every warp's V columns

#pragma unroll
    for (int u = 0; u < kR; ++u) {
      if (u < n_round) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
          l_run[hf] = softmax_sum(l_run[hf], alpha[u][hf], sSum[(u * 32 + lane) * 2 + hf]);
      }
    }
    if (has_cols) {
#pragma unroll
      for (int u = 0; u < kR; ++u) {
        if (u < n_round) {
          const int kvis = min(kBN, pos - (r0 + u) * kBN + 1);
#pragma unroll
          for (int i = 0; i < 2 * kNPW; ++i) {
            o[i][0] *= alpha[u][0];
            o[i][1] *= alpha[u][0];
            o[i][2] *= alpha[u][1];
            o[i][3] *= alpha[u][1];
          }
          const uint32_t* pu = sP + u * kKK * 4 * 32;
          const uint32_t vu = vb + 2 * u * kBN * kLdsV;
#pragma unroll
          for (int kk = 0; kk < kKK; ++kk) {
            if (kk * 16 < kvis) {
              uint32_t pa[4];
#pragma unroll
              for (int i = 0; i < 4; ++i) pa[i] = pu[(kk * 4 + i) * 32 + lane];
#pragma unroll
              for (int np = 0; np < kNPW; ++np) {
                uint32_t vf[4];
                ldsm_x4_trans(vf, vu + 2 * (kk * 16 * kLdsV + np * 16));
                mma_bf16(o[2 * np], pa, vf[0], vf[1]);
                mma_bf16(o[2 * np + 1], pa, vf[2], vf[3]);
              }
            }
          }
        }
      }
    }
    __syncwarp();  // every lane is done with sV
    stage_v(r0 + kR);
    cp_async_commit();
  }

  if (!has_cols) return;
  decode_store(a.out + t * qs + int64_t(g * G) * a.D, o, l_run, G, a.D, a.out_pairs, c0, gr, tc);
}

// ---- Backward ----------------------------------------------------------------------------------

// Dbuf[r] = d_out[r,:] . out[r,:] for the T*H rows of D elements: 16 lanes per row, two rows per
// warp, fixed reduction tree. vec: 16-byte loads (D % 8 == 0, 16-byte aligned pointers).
__global__ void attention_rowdot_kernel(float* Dbuf, const bf16_t* d_out, const bf16_t* out,
                                        int64_t rows, int D, bool vec) {
  const int lane = threadIdx.x & 31, sub = lane & 15;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x >> 5);
  for (int64_t w = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); 2 * w < rows;
       w += warps) {
    const int64_t row = 2 * w + (lane >> 4);
    float s = 0.0f;
    if (row < rows) {
      const bf16_t* x = d_out + row * D;
      const bf16_t* y = out + row * D;
      if (vec) {
        const int c = sub * 8;
        if (c < D) {
          const uint4 xv = *reinterpret_cast<const uint4*>(x + c);
          const uint4 yv = *reinterpret_cast<const uint4*>(y + c);
          __nv_bfloat162 x2[4], y2[4];
          memcpy(x2, &xv, sizeof(xv));
          memcpy(y2, &yv, sizeof(yv));
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float2 xf = __bfloat1622float2(x2[i]), yf = __bfloat1622float2(y2[i]);
            s += xf.x * yf.x + xf.y * yf.y;
          }
        }
      } else {
        for (int d = sub; d < D; d += 16) s += __bfloat162float(x[d]) * __bfloat162float(y[d]);
      }
    }
    for (int off = 8; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (row < rows && sub == 0) Dbuf[row] = s;
  }
}

struct BwdArgs {
  float* d_q;
  float* d_k;
  float* d_v;
  const bf16_t* d_out;
  const bf16_t* q;
  const bf16_t* k;
  const bf16_t* v;
  const float* lse;
  const float* Dbuf;
  const int32_t* cu_seqlens;
  int64_t B;
  int H, Hkv, D;
  float scale, scale_log2;
  bool vec;               // 16-byte staging of q, k, v, d_out
  int64_t n_dkdv_blocks;  // blocks [0, n) compute d_k/d_v, the rest d_q
};

// Both block kinds: 64 own rows (keys, or queries) x 2 operands, and 64 streamed rows x 2 operands
// double-buffered; the d_k/d_v blocks also stage lse (log2 units) and D of their 64 queries.
template <int Dp, int kSubQ>
struct BwdTile {
  static constexpr int kRows = 64;
  static constexpr int kLds = Dp + 8;
  static constexpr size_t kTileElems = size_t(kRows) * kLds;
  static constexpr size_t kSmem = sizeof(bf16_t) * 6 * kTileElems + sizeof(float) * 4 * kRows;
  // d_k/d_v: queries per register sub-block (S^T and dP^T of 16 keys x kSub queries per warp).
  static constexpr int kSub = kSubQ;
};

// d_k/d_v for the 64 keys of tile `tile_kv` (tile index * Hkv + kv head).
template <int Dp, int kSubQ>
__device__ __forceinline__ void dkdv_block(const BwdArgs& a, int64_t tile_kv, unsigned char* smem) {
  using Cfg = BwdTile<Dp, kSubQ>;
  constexpr int kRows = Cfg::kRows, kLds = Cfg::kLds, kSub = Cfg::kSub;
  constexpr int kDT = Dp / 8, kNT = kSub / 8;
  bf16_t* sK = reinterpret_cast<bf16_t*>(smem);
  bf16_t* sV = sK + Cfg::kTileElems;
  bf16_t* sQ = sV + Cfg::kTileElems;                                // [2]
  bf16_t* sdO = sQ + 2 * Cfg::kTileElems;                           // [2]
  float* sL = reinterpret_cast<float*>(sdO + 2 * Cfg::kTileElems);  // [2][kRows] lse * log2(e)
  float* sDi = sL + 2 * kRows;                                      // [2][kRows] D

  const int g = static_cast<int>(tile_kv % a.Hkv);
  TileRef tl;
  if (!find_tile(SeqItems{a.cu_seqlens}, a.B, kRows, tile_kv / a.Hkv, false, tl)) return;
  const int rep = a.H / a.Hkv;
  const int64_t qs = int64_t(a.H) * a.D, ks = int64_t(a.Hkv) * a.D;
  const int64_t koff = (tl.s0 + tl.r0) * ks + int64_t(g) * a.D;
  stage_rows<Dp, kRows>(sK, a.k + koff, ks, min(kRows, tl.L - tl.r0), a.D, a.vec);
  stage_rows<Dp, kRows>(sV, a.v + koff, ks, min(kRows, tl.L - tl.r0), a.D, a.vec);

  // Steps: (head of the group, query tile from the key tile on); queries before r0 see no key here.
  const int nqt = (tl.L - tl.r0 + kRows - 1) / kRows;
  const int steps = rep * nqt;
  auto stage_step = [&](int it, int buf) {
    const int h = g * rep + it / nqt, i0 = tl.r0 + (it % nqt) * kRows;
    const int nq = min(kRows, tl.L - i0);
    const int64_t off = (tl.s0 + i0) * qs + int64_t(h) * a.D;
    stage_rows<Dp, kRows>(sQ + buf * Cfg::kTileElems, a.q + off, qs, nq, a.D, a.vec);
    stage_rows<Dp, kRows>(sdO + buf * Cfg::kTileElems, a.d_out + off, qs, nq, a.D, a.vec);
    if (threadIdx.x < kRows) {
      const int r = threadIdx.x;
      // A query past the end gets lse = +inf, so its P (and dS) is exactly 0.
      float l2 = INFINITY, di = 0.0f;
      if (r < nq) {
        const int64_t idx = (tl.s0 + i0 + r) * a.H + h;
        l2 = a.lse[idx] * kLog2e;
        di = a.Dbuf[idx];
      }
      sL[buf * kRows + r] = l2;
      sDi[buf * kRows + r] = di;
    }
  };
  stage_step(0, 0);
  cp_async_commit();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gr = lane >> 2, tc = lane & 3;
  const int wk0 = tl.r0 + warp * 16;  // first key of this warp (in the sequence)
  const bool live = wk0 < tl.L;
  const LaneOffsets lo(lane, kLds);
  const uint32_t k_addr = smem_u32(sK + warp * 16 * kLds + lo.a_off);
  const uint32_t v_addr = smem_u32(sV + warp * 16 * kLds + lo.a_off);
  const uint32_t qn_addr = smem_u32(sQ + lo.bn_off), qt_addr = smem_u32(sQ + lo.bt_off);
  const uint32_t on_addr = smem_u32(sdO + lo.bn_off), ot_addr = smem_u32(sdO + lo.bt_off);
  constexpr uint32_t kBufBytes = sizeof(bf16_t) * Cfg::kTileElems;

  float dk[kDT][4], dv[kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) {
    dk[dt][0] = dk[dt][1] = dk[dt][2] = dk[dt][3] = 0.0f;
    dv[dt][0] = dv[dt][1] = dv[dt][2] = dv[dt][3] = 0.0f;
  }

  for (int it = 0; it < steps; ++it) {
    const int buf = it & 1;
    if (it + 1 < steps) {
      stage_step(it + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int i0 = tl.r0 + (it % nqt) * kRows;
    if (live) {
      const uint32_t boff = buf * kBufBytes;
      const float* lrow = sL + buf * kRows;
      const float* drow = sDi + buf * kRows;
#pragma unroll
      for (int sb = 0; sb < kRows / kSub; ++sb) {
        const int q0 = i0 + sb * kSub;                    // first query of the sub-block
        if (q0 + kSub - 1 < wk0 || q0 >= tl.L) continue;  // all pairs masked / no queries

        float st[kNT][4], dpt[kNT][4];  // S^T, dP^T: rows = the warp's 16 keys, cols = queries
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          st[nt][0] = st[nt][1] = st[nt][2] = st[nt][3] = 0.0f;
          dpt[nt][0] = dpt[nt][1] = dpt[nt][2] = dpt[nt][3] = 0.0f;
        }
#pragma unroll
        for (int kk = 0; kk < Dp / 16; ++kk) {
          uint32_t ka[4], va[4];
          ldsm_x4(ka, k_addr + 2 * kk * 16);
          ldsm_x4(va, v_addr + 2 * kk * 16);
#pragma unroll
          for (int np = 0; np < kSub / 16; ++np) {
            const uint32_t off = boff + 2 * ((sb * kSub + np * 16) * kLds + kk * 16);
            uint32_t qf[4], of[4];
            ldsm_x4(qf, qn_addr + off);
            mma_bf16(st[2 * np], ka, qf[0], qf[1]);
            mma_bf16(st[2 * np + 1], ka, qf[2], qf[3]);
            ldsm_x4(of, on_addr + off);
            mma_bf16(dpt[2 * np], va, of[0], of[1]);
            mma_bf16(dpt[2 * np + 1], va, of[2], of[3]);
          }
        }

        // P^T = 2^(S^T scale log2e - lse log2e), masked where query < key; dS^T = P^T (dP^T - D).
        const bool diag = q0 < wk0 + 15;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int qc = sb * kSub + nt * 8 + 2 * tc + e;  // query inside the staged tile
            const float l2 = lrow[qc], di = drow[qc];
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
              const int key = wk0 + gr + 8 * hf;
              float p = exp2_approx(st[nt][2 * hf + e] * a.scale_log2 - l2);
              if (diag && i0 + qc < key) p = 0.0f;
              st[nt][2 * hf + e] = p;
              dpt[nt][2 * hf + e] = p * (dpt[nt][2 * hf + e] - di);
            }
          }
        }

        // dV += P^T dO, dK += dS^T Q over the sub-block's queries (P, dS rounded to bf16).
#pragma unroll
        for (int kk = 0; kk < kSub / 16; ++kk) {
          uint32_t pa[4], sa[4];
          acc_to_a(pa, st[2 * kk], st[2 * kk + 1]);
          acc_to_a(sa, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
          for (int np = 0; np < Dp / 16; ++np) {
            const uint32_t off = boff + 2 * ((sb * kSub + kk * 16) * kLds + np * 16);
            uint32_t of[4], qf[4];
            ldsm_x4_trans(of, ot_addr + off);
            mma_bf16(dv[2 * np], pa, of[0], of[1]);
            mma_bf16(dv[2 * np + 1], pa, of[2], of[3]);
            ldsm_x4_trans(qf, qt_addr + off);
            mma_bf16(dk[2 * np], sa, qf[0], qf[1]);
            mma_bf16(dk[2 * np + 1], sa, qf[2], qf[3]);
          }
        }
      }
    }
    __syncthreads();  // the buffer just read is the next prefetch's target
  }

  if (!live) return;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int key = wk0 + gr + 8 * hf;
    if (key >= tl.L) continue;
    const int64_t off = (tl.s0 + key) * ks + int64_t(g) * a.D;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = dt * 8 + 2 * tc + e;
        if (col < a.D) {
          if (a.d_k != nullptr) a.d_k[off + col] += a.scale * dk[dt][2 * hf + e];
          if (a.d_v != nullptr) a.d_v[off + col] += dv[dt][2 * hf + e];
        }
      }
    }
  }
}

// d_q for the 64 queries of tile `tile_h` (tile index * H + head).
template <int Dp, int kSubQ>
__device__ __forceinline__ void dq_block(const BwdArgs& a, int64_t tile_h, unsigned char* smem) {
  using Cfg = BwdTile<Dp, kSubQ>;
  constexpr int kRows = Cfg::kRows, kLds = Cfg::kLds;
  constexpr int kDT = Dp / 8, kNT = kRows / 8;
  bf16_t* sQ = reinterpret_cast<bf16_t*>(smem);
  bf16_t* sdO = sQ + Cfg::kTileElems;
  bf16_t* sK = sdO + Cfg::kTileElems;     // [2]
  bf16_t* sV = sK + 2 * Cfg::kTileElems;  // [2]

  const int h = static_cast<int>(tile_h % a.H);
  TileRef tl;
  if (!find_tile(SeqItems{a.cu_seqlens}, a.B, kRows, tile_h / a.H, true, tl)) return;
  const int g = h / (a.H / a.Hkv);
  const int64_t qs = int64_t(a.H) * a.D, ks = int64_t(a.Hkv) * a.D;
  const int64_t qoff = (tl.s0 + tl.r0) * qs + int64_t(h) * a.D;
  const int kend = min(tl.L, tl.r0 + kRows);
  const int nkt = (kend + kRows - 1) / kRows;
  const bf16_t* kg = a.k + tl.s0 * ks + int64_t(g) * a.D;
  const bf16_t* vg = a.v + tl.s0 * ks + int64_t(g) * a.D;
  stage_rows<Dp, kRows>(sQ, a.q + qoff, qs, min(kRows, tl.L - tl.r0), a.D, a.vec);
  stage_rows<Dp, kRows>(sdO, a.d_out + qoff, qs, min(kRows, tl.L - tl.r0), a.D, a.vec);
  stage_rows<Dp, kRows>(sK, kg, ks, min(kRows, kend), a.D, a.vec);
  stage_rows<Dp, kRows>(sV, vg, ks, min(kRows, kend), a.D, a.vec);
  cp_async_commit();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int gr = lane >> 2, tc = lane & 3;
  const int wr0 = tl.r0 + warp * 16, wlast = wr0 + 15;
  const bool live = wr0 < tl.L;
  float l2[2], di[2];  // rows g, g+8: lse log2(e) (+inf past the end: P = 0) and D
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int row = wr0 + gr + 8 * hf;
    l2[hf] = INFINITY;
    di[hf] = 0.0f;
    if (row < tl.L) {
      const int64_t idx = (tl.s0 + row) * a.H + h;
      l2[hf] = a.lse[idx] * kLog2e;
      di[hf] = a.Dbuf[idx];
    }
  }
  const LaneOffsets lo(lane, kLds);
  const uint32_t q_addr = smem_u32(sQ + warp * 16 * kLds + lo.a_off);
  const uint32_t o_addr = smem_u32(sdO + warp * 16 * kLds + lo.a_off);
  const uint32_t kn_addr = smem_u32(sK + lo.bn_off), kt_addr = smem_u32(sK + lo.bt_off);
  const uint32_t vn_addr = smem_u32(sV + lo.bn_off);
  constexpr uint32_t kBufBytes = sizeof(bf16_t) * Cfg::kTileElems;

  float dq[kDT][4];
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) dq[dt][0] = dq[dt][1] = dq[dt][2] = dq[dt][3] = 0.0f;

  for (int j = 0; j < nkt; ++j) {
    if (j + 1 < nkt) {
      const int j0 = (j + 1) * kRows, buf = (j + 1) & 1;
      stage_rows<Dp, kRows>(sK + buf * Cfg::kTileElems, kg + j0 * ks, ks, min(kRows, kend - j0),
                            a.D, a.vec);
      stage_rows<Dp, kRows>(sV + buf * Cfg::kTileElems, vg + j0 * ks, ks, min(kRows, kend - j0),
                            a.D, a.vec);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int key0 = j * kRows;
    if (live && key0 <= wlast) {
      const uint32_t boff = (j & 1) * kBufBytes;
      const int kvis = min(kRows, wlast - key0 + 1);
      float s[kNT][4], dp[kNT][4];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        dp[nt][0] = dp[nt][1] = dp[nt][2] = dp[nt][3] = 0.0f;
      }
#pragma unroll
      for (int kk = 0; kk < Dp / 16; ++kk) {
        uint32_t qa[4], oa[4];
        ldsm_x4(qa, q_addr + 2 * kk * 16);
        ldsm_x4(oa, o_addr + 2 * kk * 16);
#pragma unroll
        for (int np = 0; np < kRows / 16; ++np) {
          if (np * 16 < kvis) {
            const uint32_t off = boff + 2 * (np * 16 * kLds + kk * 16);
            uint32_t kf[4], vf[4];
            ldsm_x4(kf, kn_addr + off);
            mma_bf16(s[2 * np], qa, kf[0], kf[1]);
            mma_bf16(s[2 * np + 1], qa, kf[2], kf[3]);
            ldsm_x4(vf, vn_addr + off);
            mma_bf16(dp[2 * np], oa, vf[0], vf[1]);
            mma_bf16(dp[2 * np + 1], oa, vf[2], vf[3]);
          }
        }
      }
      // P = 2^(S scale log2e - lse log2e), masked where key > row (this also covers keys past
      // the end and the skipped n-tiles); dS = P (dP - D), kept in s.
      const bool diag = key0 + kRows - 1 > wr0;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int row = wr0 + gr + 8 * hf;
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = key0 + nt * 8 + 2 * tc + e;
            float p = exp2_approx(s[nt][2 * hf + e] * a.scale_log2 - l2[hf]);
            if (diag && key > row) p = 0.0f;
            s[nt][2 * hf + e] = p * (dp[nt][2 * hf + e] - di[hf]);
          }
        }
      }
      // dQ += dS K (dS rounded to bf16).
#pragma unroll
      for (int kk = 0; kk < kRows / 16; ++kk) {
        if (kk * 16 < kvis) {
          uint32_t sa[4];
          acc_to_a(sa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
          for (int np = 0; np < Dp / 16; ++np) {
            uint32_t kf[4];
            ldsm_x4_trans(kf, kt_addr + boff + 2 * (kk * 16 * kLds + np * 16));
            mma_bf16(dq[2 * np], sa, kf[0], kf[1]);
            mma_bf16(dq[2 * np + 1], sa, kf[2], kf[3]);
          }
        }
      }
    }
    __syncthreads();
  }

  if (!live) return;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int row = wr0 + gr + 8 * hf;
    if (row >= tl.L) continue;
    float* dqr = a.d_q + (tl.s0 + row) * qs + int64_t(h) * a.D;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = dt * 8 + 2 * tc + e;
        if (col < a.D) dqr[col] += a.scale * dq[dt][2 * hf + e];
      }
    }
  }
}

template <int Dp, int kSubQ, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) attention_backward_kernel(const BwdArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  if (blockIdx.x < a.n_dkdv_blocks) {
    dkdv_block<Dp, kSubQ>(a, blockIdx.x, smem_raw);
  } else {
    dq_block<Dp, kSubQ>(a, blockIdx.x - a.n_dkdv_blocks, smem_raw);
  }
}

// ---- Host side ---------------------------------------------------------------------------------

void check_args(const char* op, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  VERL_CUDA_REQUIRE(
      B >= 0 && T >= 0 && T < (int64_t{1} << 31) && H > 0 && Hkv > 0 && H % Hkv == 0 && D > 0 &&
          D <= kMaxD && H <= 65535,
      detail::shape_str(op, {B, T, H, Hkv, D}) + ": need H a multiple of Hkv, 0 < D <= 128");
}

bool aligned(const void* p, size_t n) {
  return reinterpret_cast<uintptr_t>(p) % n == 0;
}

// Blocks for `per_tile` blocks per tile of `rows` rows: ceil(T/rows) + B bounds sum_b
// ceil(L_b/rows), and `max_tiles` caps that; surplus blocks exit at once. (The paged forward
// passes its own B and cap: an item's chunk of n tokens may start inside a window of rows, so it
// has at most ceil(n/rows) + 1 tiles, and at most n.)
unsigned tile_blocks(int64_t T, int64_t B, int rows, int64_t per_tile,
                     int64_t max_tiles = INT64_MAX) {
  const int64_t n = std::min(ceil_div(T, rows) + B, max_tiles) * per_tile;
  VERL_CUDA_REQUIRE(n < (int64_t{1} << 31), detail::shape_str("attention", {T, B, per_tile}) +
                                                ": too many tiles for one grid");
  return static_cast<unsigned>(n);
}

template <int Dp, int kMT, int kKeys, int kMinBlocks, typename Src>
void launch_forward(const CudaContext& ctx, const typename Src::Args& a, int64_t T, int64_t items,
                    int64_t max_tiles) {
  using Cfg = FwdTile<Dp, kMT, kKeys>;
  const auto kernel = attention_forward_kernel<Dp, kMT, kKeys, kMinBlocks, Src>;
  allow_dynamic_smem(kernel, Cfg::kSmem);
  kernel<<<tile_blocks(T, items, Cfg::kBM, a.H, max_tiles), kThreads, Cfg::kSmem, ctx.stream>>>(a);
  VERL_CUDA_CHECK_LAUNCH();
}

// Keys per step of the forward for head dims padded to Dp. A row's bits depend on it, so
// attention_forward, the paged op's tiled kernel and its decode kernel all take it from here.
template <int Dp>
constexpr int kFwdKeys = Dp == 128 ? 32 : 64;

// The tile shape depends on D alone, the same for both sources. <Dp, 16-row m-tiles per warp,
// keys per step, min blocks per SM>: 32 query rows per warp halve the shared-memory reads per mma;
// the register caps were chosen so ptxas spills nothing in the contiguous kernel (D=32: 162
// registers, D=64: 213, D=128: 245).
template <typename Src>
void dispatch_forward(const CudaContext& ctx, const typename Src::Args& a, int64_t T, int64_t items,
                      int64_t max_tiles = INT64_MAX) {
  if (a.D <= 32) {
    launch_forward<32, 2, kFwdKeys<32>, 3, Src>(ctx, a, T, items, max_tiles);
  } else if (a.D <= 64) {
    launch_forward<64, 2, kFwdKeys<64>, 2, Src>(ctx, a, T, items, max_tiles);
  } else {
    launch_forward<128, 2, kFwdKeys<128>, 2, Src>(ctx, a, T, items, max_tiles);
  }
}

// The decode kernels: the split kernel when the grid gives each SM at least kSplitKernelPairsPerSm
// (item, kv head) pairs, else one block per pair (both give the same bits). Measured on the H200
// (bench_decode_attention_cuda, Qwen2.5-0.5B's heads, caches read from HBM): 256 items of 384 keys
// (512 pairs) 19.3 us a layer with four warps per pair, 20.0 with two; 8 items of 4096 keys (16
// pairs) 92 us with two warps per pair against 66 with the block kernel. The crossing point
// between was not measured.
constexpr int kSplitKernelPairsPerSm = 2;

// Warps per pair of the split kernel: 4 where each warp still takes whole 16-key and 16-column
// steps (Dp = 64: 64-key tiles, 16 columns a warp), else 2. Four against two at Qwen2.5-0.5B
// (bench, HBM): 19.3 against 20.0 us a layer at 256 x 384 keys, 20.8 against 22.7 with lengths
// spread by 128; decode step 1.804 / 1.819 against 1.851 / 1.834 ms in one call.
template <int Dp>
constexpr int kDecodeSplit = Dp == 64 ? 4 : 2;

template <int Dp>
void launch_decode(const CudaContext& ctx, const PagedFwdArgs& a) {
  const int64_t pairs = a.B * a.Hkv;
  VERL_CUDA_REQUIRE(pairs < (int64_t{1} << 31),
                    detail::shape_str("attention_forward_paged", {a.B, a.Hkv}) +
                        ": too many decode items for one grid");
  if (pairs >= int64_t{kSplitKernelPairsPerSm} * cuda_sm_count()) {
    using Cfg = DecodeSplitTile<Dp, kFwdKeys<Dp>, kDecodeSplit<Dp>>;
    const auto kernel = attention_decode_split_kernel<Dp, kFwdKeys<Dp>, kDecodeSplit<Dp>>;
    allow_dynamic_smem(kernel, Cfg::kSmem);
    kernel<<<static_cast<unsigned>(ceil_div(pairs, Cfg::kPairs)), kThreads, Cfg::kSmem,
             ctx.stream>>>(a);
  } else {
    using Cfg = DecodeBlockTile<Dp, kFwdKeys<Dp>>;
    const auto kernel = attention_decode_block_kernel<Dp, kFwdKeys<Dp>>;
    allow_dynamic_smem(kernel, Cfg::kSmem);
    kernel<<<static_cast<unsigned>(pairs), kThreads, Cfg::kSmem, ctx.stream>>>(a);
  }
  VERL_CUDA_CHECK_LAUNCH();
}

void dispatch_decode(const CudaContext& ctx, const PagedFwdArgs& a) {
  if (a.D <= 32) {
    launch_decode<32>(ctx, a);
  } else if (a.D <= 64) {
    launch_decode<64>(ctx, a);
  } else {
    launch_decode<128>(ctx, a);
  }
}

template <int Dp, int kSubQ, int kMinBlocks>
void launch_backward(const CudaContext& ctx, BwdArgs a, int64_t T) {
  using Cfg = BwdTile<Dp, kSubQ>;
  const bool dkdv = a.d_k != nullptr || a.d_v != nullptr;
  a.n_dkdv_blocks = dkdv ? tile_blocks(T, a.B, Cfg::kRows, a.Hkv) : 0;
  const int64_t n_dq = a.d_q != nullptr ? tile_blocks(T, a.B, Cfg::kRows, a.H) : 0;
  const int64_t blocks = a.n_dkdv_blocks + n_dq;
  VERL_CUDA_REQUIRE(blocks < (int64_t{1} << 31),
                    detail::shape_str("attention_backward", {T, a.B}) + ": grid too large");
  const auto kernel = attention_backward_kernel<Dp, kSubQ, kMinBlocks>;
  allow_dynamic_smem(kernel, Cfg::kSmem);
  kernel<<<static_cast<unsigned>(blocks), kThreads, Cfg::kSmem, ctx.stream>>>(a);
  VERL_CUDA_CHECK_LAUNCH();
}

// The fields both forward argument structs share (contiguous and paged rows).
template <typename Args>
void set_forward_args(Args& a, bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                      const int32_t* cu_seqlens, int64_t B, int64_t H, int64_t Hkv, int64_t D,
                      float scale) {
  a.out = out;
  a.lse = lse;
  a.q = q;
  a.k = k;
  a.v = v;
  a.cu_seqlens = cu_seqlens;
  a.B = B;
  a.H = static_cast<int>(H);
  a.Hkv = static_cast<int>(Hkv);
  a.D = static_cast<int>(D);
  a.scale_log2 = scale * kLog2e;
  a.vec = D % 8 == 0 && aligned(q, 16) && aligned(k, 16) && aligned(v, 16);
  a.out_pairs = D % 2 == 0 && aligned(out, 4);
}

}  // namespace

void attention_forward(const CudaContext& ctx, bf16* out, float* lse, const bf16* q, const bf16* k,
                       const bf16* v, const int32_t* cu_seqlens, int64_t B, int64_t T, int64_t H,
                       int64_t Hkv, int64_t D, float scale) {
  check_args("attention_forward", B, T, H, Hkv, D);
  if (T == 0 || B == 0) return;
  FwdArgs a{};
  set_forward_args(a, out, lse, q, k, v, cu_seqlens, B, H, Hkv, D, scale);
  dispatch_forward<ContiguousSrc>(ctx, a, T, B);
}

void attention_forward_paged(const CudaContext& ctx, bf16* out, const bf16* q, const bf16* k_cache,
                             const bf16* v_cache, const int32_t* block_tables, int64_t W,
                             int64_t block_size, const int32_t* cu_seqlens,
                             const int32_t* positions, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                             int64_t D, float scale, bool single_token_items,
                             bool multi_token_items) {
  check_args("attention_forward_paged", B, T, H, Hkv, D);
  VERL_CUDA_REQUIRE(W > 0 && block_size > 0 && block_size < (int64_t{1} << 30),
                    detail::shape_str("attention_forward_paged", {W, block_size}) +
                        ": need a block table width W > 0 and 0 < block_size < 2^30");
  if (T == 0 || B == 0) return;
  PagedFwdArgs a{};
  set_forward_args(a, out, nullptr, q, k_cache, v_cache, cu_seqlens, B, H, Hkv, D, scale);
  a.positions = positions;
  a.block_tables = block_tables;
  a.W = W;
  a.block_size = static_cast<int>(block_size);
  // Single-token items go to the decode kernel when a warp's m-tile holds their G heads, else to
  // the tiled kernel with the rest.
  const bool decode_kernel = single_token_items && H / Hkv <= 16;
  a.min_tokens = single_token_items && !decode_kernel ? 1 : 2;
  a.max_tokens = multi_token_items ? INT32_MAX : 1;
  if (decode_kernel) dispatch_decode(ctx, a);
  if (a.min_tokens > a.max_tokens) return;
  // At most c = min(B, T / min_tokens) items have tiles; item i has at most ceil(n_i / 128) + 1
  // of them, and at most n_i: sum_i <= min(T, ceil(T / 128) + 2c) (0 when c = 0).
  const int64_t c = std::min(B, T / a.min_tokens);
  if (c == 0) return;
  dispatch_forward<PagedSrc>(ctx, a, T, 2 * c, T);
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

  const bool rowdot_vec = D % 8 == 0 && aligned(d_out, 16) && aligned(out, 16);
  attention_rowdot_kernel<<<detail::grid_for(T * H, 16), 256, 0, ctx.stream>>>(
      Dbuf, d_out, out, T * H, static_cast<int>(D), rowdot_vec);
  VERL_CUDA_CHECK_LAUNCH();

  BwdArgs a{};
  a.d_q = d_q;
  a.d_k = d_k;
  a.d_v = d_v;
  a.d_out = d_out;
  a.q = q;
  a.k = k;
  a.v = v;
  a.lse = lse;
  a.Dbuf = Dbuf;
  a.cu_seqlens = cu_seqlens;
  a.B = B;
  a.H = static_cast<int>(H);
  a.Hkv = static_cast<int>(Hkv);
  a.D = static_cast<int>(D);
  a.scale = scale;
  a.scale_log2 = scale * kLog2e;
  a.vec = D % 8 == 0 && aligned(q, 16) && aligned(k, 16) && aligned(v, 16) && aligned(d_out, 16);
  // <Dp, queries per d_k/d_v register sub-block, min blocks per SM>: a warp holds dK and dV for
  // its 16 keys (Dp registers) plus S^T and dP^T of the sub-block; chosen so ptxas spills nothing
  // (D=32: 164 registers, D=64: 199, D=128: 255).
  if (D <= 32) {
    launch_backward<32, 64, 3>(ctx, a, T);
  } else if (D <= 64) {
    launch_backward<64, 32, 2>(ctx, a, T);
  } else {
    launch_backward<128, 16, 2>(ctx, a, T);
  }
}

}  // namespace verl::ops::cuda
