// Attention over the paged KV cache of the rollout engine (paged_attention.h): the KV write (plain
// and fused with q/k-norm and RoPE), copy-on-write block copies, the split-K decode kernel with its
// combine step, and the tiled prefill kernel. bf16 storage, fp32 scores, softmax and sums (the fast
// kernels' products on tensor cores, bf16 x bf16 -> fp32); accurate expf / exp2f / sincosf (no
// fast-math), so the results track the CPU runner to a bf16 rounding.
#include <algorithm>
#include <cmath>
#include <string>

#include "ops/cuda/common.cuh"
#include "ops/cuda/paged_attention.h"

namespace verl::ops::cuda {

namespace {

using detail::allow_dynamic_smem;
using detail::ceil_div;

constexpr int kMaxD = 128;
constexpr float kNegInf = -INFINITY;

__device__ __forceinline__ float bf(bf16 x) {
  return __bfloat162float(x);
}

// ---- KV write
// --------------------------------------------------------------------------------------

// One block per token; bf16 pairs (D is even, so a row of Hkv*D elements is whole pairs).
__global__ void kv_write_kernel(bf16* kc, bf16* vc, const bf16* k, const bf16* v,
                                const int32_t* slots, int64_t row) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  const auto* ks = reinterpret_cast<const __nv_bfloat162*>(k + t * row);
  const auto* vs = reinterpret_cast<const __nv_bfloat162*>(v + t * row);
  auto* kd = reinterpret_cast<__nv_bfloat162*>(kc + slot * row);
  auto* vd = reinterpret_cast<__nv_bfloat162*>(vc + slot * row);
  for (int64_t e = threadIdx.x; e < row / 2; e += blockDim.x) {
    kd[e] = ks[e];
    vd[e] = vs[e];
  }
}

// Keys j0 .. j0 + nt - 1 of kv head g0 from the paged cache into fp32 shared memory (the reference
// kernels' staging): k_s rows of D + 1 floats (no bank conflicts on the column reads), v_s rows of
// D.
__device__ __forceinline__ void stage_kv_f32(float* k_s, float* v_s, const bf16* kc, const bf16* vc,
                                             const int32_t* table, int bs, int j0, int nt, int Hkv,
                                             int g0, int D) {
  const int half_d = D / 2;
  for (int e = threadIdx.x; e < nt * half_d; e += blockDim.x) {
    const int r = e / half_d, d = 2 * (e - r * half_d);
    const int j = j0 + r;
    const int64_t slot = static_cast<int64_t>(table[j / bs]) * bs + j % bs;
    const int64_t off = (slot * Hkv + g0) * D + d;
    const float2 kv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(kc + off));
    const float2 vv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(vc + off));
    k_s[r * (D + 1) + d] = kv.x;
    k_s[r * (D + 1) + d + 1] = kv.y;
    v_s[r * D + d] = vv.x;
    v_s[r * D + d + 1] = vv.y;
  }
}

// Block (token, group of 4 heads), one warp per head of the H q heads, Hkv k heads and Hkv v heads
// (a decode step has few tokens: a block per token alone would leave most SMs idle). Lane l owns
// the rotation pairs (i, i + D/2) for i = l, l + 32, ... (at most 2 for D <= 128).
constexpr int kRopeThreads = 128;
constexpr int kRopePairs = kMaxD / 2 / 32;

__global__ void __launch_bounds__(kRopeThreads)
    qkv_rope_write_kernel(bf16* q_out, bf16* kc, bf16* vc, const bf16* qkv, const bf16* q_norm,
                          const bf16* k_norm, float eps, const int32_t* positions,
                          const float* inv_freq, const int32_t* slots, int H, int Hkv, int D) {
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int half = D / 2;
  const int64_t row = static_cast<int64_t>(H + 2 * Hkv) * D;
  const int64_t slot = slots[t];
  const float pos = static_cast<float>(positions[t]);
  for (int hh = blockIdx.y * nwarps + warp; hh < H + 2 * Hkv; hh += nwarps * gridDim.y) {
    const bf16* src = qkv + t * row + static_cast<int64_t>(hh) * D;
    bf16* dst = nullptr;  // q_out or the cache slot (none when slot < 0)
    const bf16* norm = nullptr;
    bool rotate = true;
    if (hh < H) {
      dst = q_out + (t * H + hh) * D;
      norm = q_norm;
    } else if (hh < H + Hkv) {
      if (slot >= 0) dst = kc + (slot * Hkv + (hh - H)) * D;
      norm = k_norm;
    } else {
      if (slot >= 0) dst = vc + (slot * Hkv + (hh - H - Hkv)) * D;
      rotate = false;
    }
    if (dst == nullptr) continue;  // warp-uniform
    float x1[kRopePairs], x2[kRopePairs];
#pragma unroll
    for (int r = 0; r < kRopePairs; ++r) {
      const int i = lane + 32 * r;
      x1[r] = i < half ? bf(src[i]) : 0.0f;
      x2[r] = i < half ? bf(src[i + half]) : 0.0f;
    }
    if (norm != nullptr) {
      // rmsnorm over the head dim, rounded to bf16 as the rmsnorm op's output is, with the
      // rmsnorm op's summation order (rmsnorm.cu's fast path on a row of D = 8 nvec: lane j of a
      // group of G lanes sums its 8 elements 8j..8j+7 in order, then a butterfly over G), so the
      // trainer's separate norm gives the same bits.
      float ss = 0.0f;
      const int nvec = D / 8;
      if (D % 8 == 0 && nvec <= 32) {
        const int G = nvec <= 4 ? 4 : nvec <= 8 ? 8 : nvec <= 16 ? 16 : 32;
        if (lane < nvec) {
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const float v = bf(src[8 * lane + e]);
            ss = __fmaf_rn(v, v, ss);
          }
        }
        for (int off = G / 2; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
        ss = __shfl_sync(0xffffffffu, ss, 0);
      } else {
#pragma unroll
        for (int r = 0; r < kRopePairs; ++r) ss += x1[r] * x1[r] + x2[r] * x2[r];
        for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
      }
      const float a = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
#pragma unroll
      for (int r = 0; r < kRopePairs; ++r) {
        const int i = lane + 32 * r;
        if (i < half) {
          x1[r] = bf(__float2bfloat16_rn(__fmul_rn(bf(norm[i]), __fmul_rn(x1[r], a))));
          x2[r] = bf(__float2bfloat16_rn(__fmul_rn(bf(norm[i + half]), __fmul_rn(x2[r], a))));
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRopePairs; ++r) {
      const int i = lane + 32 * r;
      if (i >= half) continue;
      float y1 = x1[r], y2 = x2[r];
      if (rotate) {
        // rope.cu's expressions, rounding for rounding.
        float s, c;
        sincosf(__fmul_rn(pos, inv_freq[i]), &s, &c);
        y1 = __fmaf_rn(x1[r], c, -__fmul_rn(x2[r], s));
        y2 = __fmaf_rn(x2[r], c, __fmul_rn(x1[r], s));
      }
      const bf16 b1 = __float2bfloat16_rn(y1), b2 = __float2bfloat16_rn(y2);
      dst[i] = b1;
      dst[i + half] = b2;
    }
  }
}

// ---- block copies
// ------------------------------------------------------------------------------------

// Block (pair, array); 16-byte chunks when the block is a whole number of them (always for D % 8 ==
// 0).
__global__ void copy_blocks_kernel(bf16* base, int64_t array_stride, int64_t block_elems,
                                   const int32_t* pairs) {
  const int64_t c = blockIdx.x, a = blockIdx.y;
  const int64_t src = pairs[2 * c], dst = pairs[2 * c + 1];
  const bf16* s = base + a * array_stride + src * block_elems;
  bf16* d = base + a * array_stride + dst * block_elems;
  if (block_elems % 8 == 0) {
    const auto* s4 = reinterpret_cast<const uint4*>(s);
    auto* d4 = reinterpret_cast<uint4*>(d);
    for (int64_t e = threadIdx.x; e < block_elems / 8; e += blockDim.x) d4[e] = s4[e];
  } else {
    for (int64_t e = threadIdx.x; e < block_elems; e += blockDim.x) d[e] = s[e];
  }
}

// ---- decode: split-K over the context
// --------------------------------------------------------------

// An item's partitions: parts of len keys (len a multiple of 64), the last one shorter.
struct Split {
  int len, parts;
};
__device__ __forceinline__ Split item_split(int n_keys, int partition, int max_parts) {
  int parts = min(max_parts, (n_keys + partition - 1) / partition);
  int len = (n_keys + parts - 1) / parts;
  len = (len + 63) / 64 * 64;
  parts = (n_keys + len - 1) / len;
  return Split{len, parts};
}

constexpr int kDecThreads = 128;
constexpr int kDecTile = 64;   // keys staged in shared memory at a time
constexpr int kMaxAcc = 16;    // (head, dim) accumulators per thread: G * D <= 16 * 128
constexpr int kMaxGroup = 64;  // query heads per kv head

size_t decode_smem_bytes(int G, int D) {
  return sizeof(float) * (static_cast<size_t>(G) * D + kDecTile * (D + 1) + kDecTile * D +
                          static_cast<size_t>(G) * kDecTile + 3 * G);
}
// Upper bound of decode_smem_bytes over the supported shapes (G * D <= 2048, D <= 128, G <= 64).
constexpr size_t kDecodeSmemMax =
    sizeof(float) *
    (kMaxAcc * kDecThreads + kDecTile * (2 * kMaxD + 1) + kMaxGroup * kDecTile + 3 * kMaxGroup);

// Block (kv head g0, item, partition). Thread e owns the (head, dim) pairs e, e + 128, ... of the
// group's G x D output. Per 64-key tile: K, V -> shared (fp32; K rows padded to D+1 floats so the
// score loop's 32 rows fall in different banks), scores for all G heads, online softmax per head,
// acc = acc * exp(m_old - m_new) + p V.
__global__ void __launch_bounds__(kDecThreads)
    paged_decode_kernel(bf16* out, float* part, const bf16* q, const bf16* kc, const bf16* vc,
                        const int32_t* block_tables, int64_t W, const int32_t* cu_seqlens,
                        const int32_t* positions, int H, int Hkv, int D, int bs, float scale,
                        int partition, int max_parts) {
  const int g0 = blockIdx.x, item = blockIdx.y, p = blockIdx.z;
  const int64_t t = cu_seqlens[item];
  if (cu_seqlens[item + 1] - t != 1) return;  // not a decode item
  const int n_keys = positions[t] + 1;
  const Split sp = item_split(n_keys, partition, max_parts);
  const int j_begin = p * sp.len;
  if (p >= sp.parts) return;  // partition past this item's context
  const int j_end = min(n_keys, j_begin + sp.len);
  const int n_parts = sp.parts;
  const int G = H / Hkv;

  extern __shared__ float smem[];
  float* q_s = smem;                      // [G][D]
  float* k_s = q_s + G * D;               // [tile][D+1]
  float* v_s = k_s + kDecTile * (D + 1);  // [tile][D]
  float* p_s = v_s + kDecTile * D;        // [G][tile]
  float* m_s = p_s + G * kDecTile;        // [G] running max
  float* l_s = m_s + G;                   // [G] running sum
  float* a_s = l_s + G;                   // [G] rescale of this tile

  const bf16* qt = q + (t * H + static_cast<int64_t>(g0) * G) * D;  // the group's heads, contiguous
  for (int e = threadIdx.x; e < G * D; e += blockDim.x) q_s[e] = bf(qt[e]);
  if (threadIdx.x < G) {
    m_s[threadIdx.x] = kNegInf;
    l_s[threadIdx.x] = 0.0f;
  }
  float acc[kMaxAcc];
#pragma unroll
  for (int r = 0; r < kMaxAcc; ++r) acc[r] = 0.0f;

  const int32_t* table = block_tables + static_cast<int64_t>(item) * W;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int j0 = j_begin; j0 < j_end; j0 += kDecTile) {
    const int nt = min(kDecTile, j_end - j0);
    __syncthreads();  // the previous tile's readers are done; q_s, m_s, l_s are visible
    stage_kv_f32(k_s, v_s, kc, vc, table, bs, j0, nt, Hkv, g0, D);
    __syncthreads();
    for (int e = threadIdx.x; e < G * kDecTile; e += blockDim.x) {
      const int g = e / kDecTile, r = e - g * kDecTile;
      float s = kNegInf;
      if (r < nt) {
        const float* qv = q_s + g * D;
        const float* kr = k_s + r * (D + 1);
        float dot = 0.0f;
        for (int d = 0; d < D; ++d) dot += qv[d] * kr[d];
        s = dot * scale;
      }
      p_s[e] = s;
    }
    __syncthreads();
    for (int g = warp; g < G; g += kDecThreads / 32) {
      float* ps = p_s + g * kDecTile;
      float mx = kNegInf;
      for (int r = lane; r < kDecTile; r += 32) mx = fmaxf(mx, ps[r]);
      for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_old = m_s[g];
      const float m_new = fmaxf(m_old, mx);  // finite: the tile has at least one key
      float sum = 0.0f;
      for (int r = lane; r < kDecTile; r += 32) {
        const float e = r < nt ? expf(ps[r] - m_new) : 0.0f;
        ps[r] = e;
        sum += e;
      }
      for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      if (lane == 0) {
        const float alpha = expf(m_old - m_new);  // 0 on the first tile (m_old = -inf)
        a_s[g] = alpha;
        l_s[g] = l_s[g] * alpha + sum;
        m_s[g] = m_new;
      }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kMaxAcc; ++r) {
      const int idx = threadIdx.x + r * kDecThreads;
      if (idx < G * D) {
        const int g = idx / D, d = idx - g * D;
        const float* ps = p_s + g * kDecTile;
        float a = acc[r] * a_s[g];
        for (int j = 0; j < nt; ++j) a += ps[j] * v_s[j * D + d];
        acc[r] = a;
      }
    }
  }
  __syncthreads();  // (l_s, m_s of the last tile are visible since the sync above; kept for
                    // clarity)
#pragma unroll
  for (int r = 0; r < kMaxAcc; ++r) {
    const int idx = threadIdx.x + r * kDecThreads;
    if (idx < G * D) {
      const int g = idx / D, d = idx - g * D;
      const int64_t h = static_cast<int64_t>(g0) * G + g;
      if (n_parts == 1) {
        out[(t * H + h) * D + d] = __float2bfloat16_rn(acc[r] / l_s[g]);
      } else {
        // part[(item, h, p)] = (m, l, acc[0..D))
        float* pr = part + ((static_cast<int64_t>(item) * H + h) * max_parts + p) * (D + 2);
        if (d == 0) {
          pr[0] = m_s[g];
          pr[1] = l_s[g];
        }
        pr[2 + d] = acc[r];
      }
    }
  }
}

// Block (head, item): out = sum_p exp(m_p - M) acc_p / sum_p exp(m_p - M) l_p over the item's
// partitions; items with one partition were written by the decode kernel itself.
__global__ void paged_decode_combine_kernel(bf16* out, const float* part, const int32_t* cu_seqlens,
                                            const int32_t* positions, int H, int D, int partition,
                                            int max_parts) {
  const int h = blockIdx.x, item = blockIdx.y;
  const int64_t t = cu_seqlens[item];
  if (cu_seqlens[item + 1] - t != 1) return;
  const int n_parts = item_split(positions[t] + 1, partition, max_parts).parts;
  if (n_parts <= 1) return;
  const float* pr = part + (static_cast<int64_t>(item) * H + h) * max_parts * (D + 2);
  float M = kNegInf;
  for (int p = 0; p < n_parts; ++p) M = fmaxf(M, pr[p * (D + 2)]);
  float L = 0.0f;
  for (int p = 0; p < n_parts; ++p) L += expf(pr[p * (D + 2)] - M) * pr[p * (D + 2) + 1];
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float a = 0.0f;
    for (int p = 0; p < n_parts; ++p) a += expf(pr[p * (D + 2)] - M) * pr[p * (D + 2) + 2 + d];
    out[(t * H + h) * D + d] = __float2bfloat16_rn(a / L);
  }
}

// ---- prefill: 64-query tiles x 64-key tiles
// ------------------------------------------------------

constexpr int kPreThreads = 128;
constexpr int kPreRows = 64;

// Prefill tile number `tile` (items with more than one query token in order, ceil(n / kPreRows)
// tiles each) -> its item, first token and row count. The first warp scans cu_seqlens 32 items at
// a time with a prefix sum (a step mixes up to max_num_seqs decode items with the prefill chunks);
// false, for the whole block, past the last tile.
struct PrefillTile {
  int64_t t0;
  int item, rows;
};
__device__ bool find_prefill_tile(const int32_t* cu_seqlens, int64_t B, int64_t tile,
                                  PrefillTile& out) {
  __shared__ PrefillTile s_tile;
  __shared__ int s_found;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int64_t before = 0;
    bool found = false;
    for (int64_t b0 = 0; b0 < B && !found; b0 += 32) {
      const int64_t b = b0 + lane;
      int64_t t0 = 0;
      int n = 0, tiles = 0;
      if (b < B) {
        t0 = cu_seqlens[b];
        n = static_cast<int>(cu_seqlens[b + 1] - t0);
        tiles = n > 1 ? (n + kPreRows - 1) / kPreRows : 0;
      }
      int incl = tiles;
      for (int off = 1; off < 32; off <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += y;
      }
      const int total = __shfl_sync(0xffffffffu, incl, 31);
      if (tile < before + total) {
        const int64_t first = before + incl - tiles;
        if (tile >= first && tile < first + tiles) {
          const int k = static_cast<int>(tile - first);
          s_tile = PrefillTile{t0 + static_cast<int64_t>(k) * kPreRows, static_cast<int>(b),
                               min(kPreRows, n - k * kPreRows)};
        }
        found = true;
      }
      before += total;
    }
    if (lane == 0) s_found = found ? 1 : 0;
  }
  __syncthreads();
  out = s_tile;
  return s_found != 0;
}

constexpr int kPreKeys = 64;
constexpr int kRowsPerThread = 4;  // 16 row groups x 4 rows
constexpr int kColsPerThread = 8;  // 8 column groups x 8 columns (strided by 8)
constexpr int kDPerThread = kMaxD / 8;

size_t prefill_smem_bytes(int D) {
  return sizeof(float) * (2 * kPreRows * (D + 1) + kPreKeys * D + kPreRows * (kPreKeys + 1));
}

// Block (tile, head). Tiles are counted over the items with more than one query token, in order,
// ceil(n/64) each; the grid is an upper bound and surplus blocks exit. Thread (rg = tid / 8,
// cg = tid % 8) owns rows 4 rg .. 4 rg + 3 and columns cg, cg + 8, ... of the score tile, and the
// same rows x dims cg, cg + 8, ... of the output; the 8 threads of a row group are 8 consecutive
// lanes, so row max / sum are shuffles within them.
__global__ void __launch_bounds__(kPreThreads)
    paged_prefill_kernel(bf16* out, const bf16* q, const bf16* kc, const bf16* vc,
                         const int32_t* block_tables, int64_t W, const int32_t* cu_seqlens,
                         const int32_t* positions, int64_t B, int H, int Hkv, int D, int bs,
                         float scale) {
  PrefillTile tl;
  if (!find_prefill_tile(cu_seqlens, B, blockIdx.x, tl)) return;
  const int item = tl.item, rows = tl.rows;
  const int64_t t0 = tl.t0;
  const int h = blockIdx.y, g0 = h / (H / Hkv);

  extern __shared__ float smem[];
  float* q_s = smem;                      // [64][D+1]
  float* k_s = q_s + kPreRows * (D + 1);  // [64][D+1]
  float* v_s = k_s + kPreKeys * (D + 1);  // [64][D]
  float* p_s = v_s + kPreKeys * D;        // [64][65]

  for (int e = threadIdx.x; e < kPreRows * D; e += blockDim.x) {
    const int r = e / D, d = e - r * D;
    q_s[r * (D + 1) + d] = r < rows ? bf(q[((t0 + r) * H + h) * D + d]) : 0.0f;
  }
  const int rg = threadIdx.x / 8, cg = threadIdx.x % 8;
  int pos[kRowsPerThread];
  float m[kRowsPerThread], l[kRowsPerThread];
  float acc[kRowsPerThread][kDPerThread];
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int r = rg * kRowsPerThread + i;
    pos[i] = r < rows ? positions[t0 + r] : -1;  // a padding row attends to nothing
    m[i] = kNegInf;
    l[i] = 0.0f;
#pragma unroll
    for (int e = 0; e < kDPerThread; ++e) acc[i][e] = 0.0f;
  }
  const int n_keys = positions[t0 + rows - 1] + 1;  // positions ascend within an item
  const int32_t* table = block_tables + static_cast<int64_t>(item) * W;

  for (int j0 = 0; j0 < n_keys; j0 += kPreKeys) {
    const int nt = min(kPreKeys, n_keys - j0);
    __syncthreads();
    stage_kv_f32(k_s, v_s, kc, vc, table, bs, j0, nt, Hkv, g0, D);
    __syncthreads();
    float s[kRowsPerThread][kColsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
      for (int c = 0; c < kColsPerThread; ++c) s[i][c] = 0.0f;
    for (int d = 0; d < D; ++d) {
      float qv[kRowsPerThread], kv[kColsPerThread];
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) qv[i] = q_s[(rg * kRowsPerThread + i) * (D + 1) + d];
#pragma unroll
      for (int c = 0; c < kColsPerThread; ++c) kv[c] = k_s[(cg + 8 * c) * (D + 1) + d];
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
        for (int c = 0; c < kColsPerThread; ++c) s[i][c] += qv[i] * kv[c];
    }
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      float mx = kNegInf;
#pragma unroll
      for (int c = 0; c < kColsPerThread; ++c) {
        const int col = cg + 8 * c;
        const bool ok = col < nt && j0 + col <= pos[i];
        s[i][c] = ok ? s[i][c] * scale : kNegInf;
        mx = fmaxf(mx, s[i][c]);
      }
      for (int off = 1; off < 8; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_new = fmaxf(m[i], mx);
      // A row with no key yet (padding rows) keeps m = -inf: its p and rescale are 0 and 1.
      const bool live = m_new != kNegInf;
      const float alpha = live ? expf(m[i] - m_new) : 1.0f;
      float sum = 0.0f;
#pragma unroll
      for (int c = 0; c < kColsPerThread; ++c) {
        const float e = live ? expf(s[i][c] - m_new) : 0.0f;
        p_s[(rg * kRowsPerThread + i) * (kPreKeys + 1) + cg + 8 * c] = e;
        sum += e;
      }
      for (int off = 1; off < 8; off <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      l[i] = l[i] * alpha + sum;
      m[i] = m_new;
#pragma unroll
      for (int e = 0; e < kDPerThread; ++e) acc[i][e] *= alpha;
    }
    __syncthreads();
    for (int j = 0; j < nt; ++j) {
      float pv[kRowsPerThread];
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i)
        pv[i] = p_s[(rg * kRowsPerThread + i) * (kPreKeys + 1) + j];
#pragma unroll
      for (int e = 0; e < kDPerThread; ++e) {
        const int d = cg + 8 * e;
        if (d < D) {
          const float vv = v_s[j * D + d];
#pragma unroll
          for (int i = 0; i < kRowsPerThread; ++i) acc[i][e] += pv[i] * vv;
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int r = rg * kRowsPerThread + i;
    if (r >= rows) continue;
    const float inv = 1.0f / l[i];
#pragma unroll
    for (int e = 0; e < kDPerThread; ++e) {
      const int d = cg + 8 * e;
      if (d < D) out[((t0 + r) * H + h) * D + d] = __float2bfloat16_rn(acc[i][e] * inv);
    }
  }
}

// ---- fast decode: tensor cores, the group's heads as the rows of one mma tile
// ----------------------

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kTableSmem = 512;  // block-table entries of a partition staged in shared memory
constexpr int kTcThreads = 128;  // 8 warps were measured slower (2.00 vs 1.88 ms per 0.5B step)
constexpr int kTcWarps = kTcThreads / 32;
constexpr int kTcKeys = 16;  // keys per warp step: two n-tiles of S, one k-step of P V

__device__ __forceinline__ void mma_bf16_16816(float* c, const uint32_t* a, uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float2 unpack_bf16(uint32_t w) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
}

__device__ __forceinline__ uint32_t ld32(const bf16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// NB bytes at p (aligned to min(NB, 16)) into NB/4 words: 16-byte loads when NB % 16 == 0.
template <int NB>
__device__ __forceinline__ void ld_chunk(uint32_t* w, const bf16* p) {
  if constexpr (NB % 16 == 0) {
#pragma unroll
    for (int i = 0; i < NB / 16; ++i) {
      const uint4 u = reinterpret_cast<const uint4*>(p)[i];
      w[4 * i] = u.x;
      w[4 * i + 1] = u.y;
      w[4 * i + 2] = u.z;
      w[4 * i + 3] = u.w;
    }
  } else if constexpr (NB == 8) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    w[0] = u.x;
    w[1] = u.y;
  } else {
    static_assert(NB == 4, "ld_chunk: 4, 8 or a multiple of 16 bytes");
    w[0] = *reinterpret_cast<const uint32_t*>(p);
  }
}

// Block (kv head g0, item, partition), 4 warps; warp w takes the 16-key steps w, w + 4, ... of the
// partition, keeps its own online softmax, and the warps are merged in shared memory at the end.
// Per step, with mma.m16n8k16 (bf16 -> fp32; lane = 4 gid + tig, fragments as in the PTX ISA):
//   S [16 x 16] = Q K^T: rows are the G <= 8 query heads of the group (rows G..15 zero), two
//     n-tiles of 8 keys. The reduction index k of a dot product may be permuted as long as A and
//     B agree, so lane (gid, tig) holds dims tig D/4 .. tig D/4 + D/4 - 1 of q (head gid) and of
//     K (key gid of each n-tile): whole 16-byte loads straight from the cache, no shared memory.
//   O [16 x D] += P V: the k index runs over the 16 keys, the n index over dims permuted so that
//     output column gid of n-tile n is dim gid D/8 + n: lane (gid, tig) loads dims gid D/8 ..
//     gid D/8 + D/8 - 1 of the 4 V rows it needs (keys 2 tig, 2 tig + 1, 8 + 2 tig, 9 + 2 tig)
//     and pairs their halves with byte permutes.
// P enters the mma as bf16 hi + lo (p = hi + lo to 2^-16 relative; two mma), so the result keeps
// the fp32 accuracy of the CUDA-core kernel. (Rounding P to bf16 as the training kernel does was
// measured: it neither brought the rollout's log-probs closer to the trainer's nor made the step
// faster, and it moved them further from the fp32 model.) Scores are scaled by scale log2 e.
// The K/V rows of the next step are loaded before this step's math (D <= 64: registers allow).
template <int D>
__global__ void __launch_bounds__(kTcThreads)
    paged_decode_mma_kernel(bf16* out, float* part, const bf16* q, const bf16* kc, const bf16* vc,
                            const int32_t* block_tables, int64_t W, const int32_t* cu_seqlens,
                            const int32_t* positions, int H, int Hkv, int bs, float scale,
                            int partition, int max_parts) {
  constexpr int KS = D / 16;  // k-steps of Q K^T
  constexpr int DN = D / 8;   // n-tiles of O, and the V elements a lane holds per key
  constexpr int KW = D / 8;   // 32-bit words of a lane's K (and q) chunk: D/4 bf16
  constexpr int VW = D / 16;  // words of a lane's V chunk: D/8 bf16
  constexpr int STEP = kTcWarps * kTcKeys;
  constexpr bool kPrefetch = D <= 64;
  const int g0 = blockIdx.x, item = blockIdx.y, p = blockIdx.z;
  const int64_t t = cu_seqlens[item];
  if (cu_seqlens[item + 1] - t != 1) return;
  const int n_keys = positions[t] + 1;
  const Split sp = item_split(n_keys, partition, max_parts);
  if (p >= sp.parts) return;
  const int j_begin = p * sp.len;
  const int j_end = min(n_keys, j_begin + sp.len);
  const int n_parts = sp.parts;
  const int G = H / Hkv;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gid = lane >> 2, tig = lane & 3;

  __shared__ int s_table[kTableSmem];
  const int32_t* table = block_tables + static_cast<int64_t>(item) * W;
  const int e_begin = j_begin / bs, e_count = (j_end - 1) / bs + 1 - e_begin;
  const bool table_smem = e_count <= kTableSmem;
  if (table_smem) {
    for (int e = threadIdx.x; e < e_count; e += kTcThreads) s_table[e] = table[e_begin + e];
  }
  __syncthreads();

  uint32_t qw[KW];
  if (gid < G) {
    ld_chunk<D / 2>(qw, q + (t * H + static_cast<int64_t>(g0) * G + gid) * D + tig * (D / 4));
  } else {
#pragma unroll
    for (int i = 0; i < KW; ++i) qw[i] = 0u;
  }

  // Row offset (elements) of key j's K/V row of kv head g0.
  auto row_of = [&](int j) -> int64_t {
    const int e = j / bs;
    const int blk = table_smem ? s_table[e - e_begin] : table[e];
    return ((static_cast<int64_t>(blk) * bs + (j - e * bs)) * Hkv + g0) * D;
  };
  // base is a multiple of 16 (partitions start at multiples of 64), so when 16 divides the block
  // size the step's 16 keys share one cache block: one table lookup per step.
  const bool one_block = bs % kTcKeys == 0;
  // K rows of keys base + gid and base + 8 + gid; V rows of keys base + {0, 1, 8, 9} + 2 tig.
  // Keys past the partition read nothing and hold zeros (the pool may hold non-finite garbage).
  auto load = [&](int base, uint32_t(&kw)[2][KW], uint32_t(&vw)[4][VW]) {
    const int64_t row_base = one_block && base < j_end ? row_of(base) : 0;
    auto row = [&](int j) -> int64_t {
      return one_block ? row_base + static_cast<int64_t>(j - base) * Hkv * D : row_of(j);
    };
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int j = base + 8 * n + gid;
      if (j < j_end) {
        ld_chunk<D / 2>(kw[n], kc + row(j) + tig * (D / 4));
      } else {
#pragma unroll
        for (int i = 0; i < KW; ++i) kw[n][i] = 0u;
      }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int j = base + 8 * (r >> 1) + 2 * tig + (r & 1);
      if (j < j_end) {
        ld_chunk<D / 4>(vw[r], vc + row(j) + gid * (D / 8));
      } else {
#pragma unroll
        for (int i = 0; i < VW; ++i) vw[r][i] = 0u;
      }
    }
  };

  float o[DN][2];
#pragma unroll
  for (int n = 0; n < DN; ++n) o[n][0] = o[n][1] = 0.0f;
  float m = kNegInf, l = 0.0f;  // row gid's running max (exp2 units) and this lane's partial sum
  const float sl2 = scale * kLog2e;

  uint32_t kw[2][KW], vw[4][VW];
  int base = j_begin + warp * kTcKeys;
  if constexpr (kPrefetch) load(base, kw, vw);
  for (; base < j_end; base += STEP) {
    uint32_t kn[2][KW], vn[4][VW];
    if constexpr (kPrefetch) {
      load(base + STEP, kn, vn);  // in flight during this step's math
    } else {
      load(base, kw, vw);
    }
    float s[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        const uint32_t a[4] = {qw[2 * ks], 0u, qw[2 * ks + 1], 0u};
        mma_bf16_16816(s[n], a, kw[n][2 * ks], kw[n][2 * ks + 1]);
      }
    }
    // s[n][e]: head gid, key base + 8 n + 2 tig + e. Key `base` is valid, so the row max over
    // the 4 lanes of the row is finite.
    float mx = kNegInf;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        s[n][e] = base + 8 * n + 2 * tig + e < j_end ? s[n][e] * sl2 : kNegInf;
        mx = fmaxf(mx, s[n][e]);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m, mx);
    const float alpha = exp2f(m - m_new);  // 0 on the warp's first step (m = -inf)
    float pr[2][2];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      pr[n][0] = exp2f(s[n][0] - m_new);  // 0 for a masked key
      pr[n][1] = exp2f(s[n][1] - m_new);
    }
    l = l * alpha + (pr[0][0] + pr[0][1] + pr[1][0] + pr[1][1]);
    m = m_new;
    const uint32_t h0 = pack_bf16(pr[0][0], pr[0][1]), h1 = pack_bf16(pr[1][0], pr[1][1]);
    const float2 f0 = unpack_bf16(h0), f1 = unpack_bf16(h1);
    const uint32_t ahi[4] = {h0, 0u, h1, 0u};
    const uint32_t alo[4] = {pack_bf16(pr[0][0] - f0.x, pr[0][1] - f0.y), 0u,
                             pack_bf16(pr[1][0] - f1.x, pr[1][1] - f1.y), 0u};
#pragma unroll
    for (int n = 0; n < DN; ++n) {
      // B: V[key 2 tig (+1)][dim gid D/8 + n] and V[key 8 + 2 tig (+1)][same dim].
      const uint32_t sel = (n & 1) ? 0x7632u : 0x5410u;
      const uint32_t b0 = __byte_perm(vw[0][n >> 1], vw[1][n >> 1], sel);
      const uint32_t b1 = __byte_perm(vw[2][n >> 1], vw[3][n >> 1], sel);
      float c[4] = {o[n][0] * alpha, o[n][1] * alpha, 0.0f, 0.0f};
      mma_bf16_16816(c, ahi, b0, b1);
      mma_bf16_16816(c, alo, b0, b1);
      o[n][0] = c[0];
      o[n][1] = c[1];
    }
    if constexpr (kPrefetch) {
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int i = 0; i < KW; ++i) kw[n][i] = kn[n][i];
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int i = 0; i < VW; ++i) vw[r][i] = vn[r][i];
    }
  }
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);

  // Merge the warps: M = max m, L = sum l 2^(m - M), A = sum acc 2^(m - M) (a warp that saw no
  // key has m = -inf and is skipped).
  __shared__ float sm_m[kTcWarps][8], sm_l[kTcWarps][8];
  __shared__ float sm_o[kTcWarps][8][D];
  if (tig == 0) {
    sm_m[warp][gid] = m;
    sm_l[warp][gid] = l;
  }
#pragma unroll
  for (int n = 0; n < DN; ++n) {
    sm_o[warp][gid][(2 * tig) * DN + n] = o[n][0];
    sm_o[warp][gid][(2 * tig + 1) * DN + n] = o[n][1];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * D; idx += kTcThreads) {
    const int g = idx / D, d = idx - g * D;
    float M = kNegInf;
    for (int w = 0; w < kTcWarps; ++w) M = fmaxf(M, sm_m[w][g]);
    float L = 0.0f, A = 0.0f;
    for (int w = 0; w < kTcWarps; ++w) {
      if (sm_m[w][g] == kNegInf) continue;
      const float wt = exp2f(sm_m[w][g] - M);
      L += sm_l[w][g] * wt;
      A += sm_o[w][g][d] * wt;
    }
    const int64_t h = static_cast<int64_t>(g0) * G + g;
    if (n_parts == 1) {
      out[(t * H + h) * D + d] = __float2bfloat16_rn(A / L);
    } else {
      float* pr = part + ((static_cast<int64_t>(item) * H + h) * max_parts + p) * (D + 2);
      if (d == 0) {
        pr[0] = M * kLn2;  // natural-log units, as the combine kernel reads them
        pr[1] = L;
      }
      pr[2 + d] = A;
    }
  }
}

// ---- fast prefill: tensor cores
// ------------------------------------------------------------------

// Block (64-query tile, head), 4 warps of 16 query rows. Fragments of mma.m16n8k16 (PTX ISA): lane
// = 4 gid + tig; A holds rows gid, gid + 8 and columns 2 tig (+1), (+8); B columns gid, rows 2 tig
// (+1), (+8); C rows gid, gid + 8, columns 2 tig (+1). Q stays in A fragments for the whole block;
// per 64-key tile K is staged [key][D] and V transposed [D][key] (bf16, rows padded by 8 so the
// fragment loads of a warp hit 32 different banks). The S accumulators of two adjacent key n-tiles
// are exactly the A fragment of P for the next mma (FlashAttention-2).
template <int D>
__global__ void __launch_bounds__(kPreThreads)
    paged_prefill_mma_kernel(bf16* out, const bf16* q, const bf16* kc, const bf16* vc,
                             const int32_t* block_tables, int64_t W, const int32_t* cu_seqlens,
                             const int32_t* positions, int64_t B, int H, int Hkv, int bs,
                             float scale) {
  constexpr int KS = D / 16, DN = D / 8, KT = 64, KPAD = D + 8, VPAD = KT + 8;
  __shared__ __align__(16) bf16 k_s[KT * KPAD];
  __shared__ __align__(16) bf16 vt_s[D * VPAD];
  PrefillTile tl;
  if (!find_prefill_tile(cu_seqlens, B, blockIdx.x, tl)) return;
  const int item = tl.item, rows = tl.rows;
  const int64_t t0 = tl.t0;
  const int h = blockIdx.y, g0 = h / (H / Hkv);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  const int r0 = warp * 16 + gid, r1 = r0 + 8;
  const int pos0 = r0 < rows ? positions[t0 + r0] : -1;
  const int pos1 = r1 < rows ? positions[t0 + r1] : -1;
  int warp_pos = max(pos0, pos1);
  for (int off = 16; off > 0; off >>= 1)
    warp_pos = max(warp_pos, __shfl_xor_sync(0xffffffffu, warp_pos, off));

  uint32_t qa[KS][4];
  {
    const bf16* q0 = q + ((t0 + r0) * H + h) * D;
    const bf16* q1 = q + ((t0 + r1) * H + h) * D;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      const int c = ks * 16 + 2 * tig;
      qa[ks][0] = r0 < rows ? ld32(q0 + c) : 0u;
      qa[ks][1] = r1 < rows ? ld32(q1 + c) : 0u;
      qa[ks][2] = r0 < rows ? ld32(q0 + c + 8) : 0u;
      qa[ks][3] = r1 < rows ? ld32(q1 + c + 8) : 0u;
    }
  }
  float o[DN][4];
#pragma unroll
  for (int n = 0; n < DN; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m0 = kNegInf, m1 = kNegInf, l0 = 0.0f, l1 = 0.0f;  // l: this lane's partial row sums
  const float sl2 = scale * kLog2e;
  const int n_keys = positions[t0 + rows - 1] + 1;
  const int32_t* table = block_tables + static_cast<int64_t>(item) * W;

  for (int j0 = 0; j0 < n_keys; j0 += KT) {
    const int nt = min(KT, n_keys - j0);
    __syncthreads();  // the previous tile's readers are done
    for (int c = threadIdx.x; c < KT * (D / 8); c += kPreThreads) {
      const int r = c / (D / 8), c8 = c % (D / 8);
      uint4 kr = make_uint4(0, 0, 0, 0), vr = kr;
      if (r < nt) {
        const int j = j0 + r;
        const int64_t slot = static_cast<int64_t>(table[j / bs]) * bs + j % bs;
        const int64_t off = (slot * Hkv + g0) * D + c8 * 8;
        kr = *reinterpret_cast<const uint4*>(kc + off);
        vr = *reinterpret_cast<const uint4*>(vc + off);
      }
      *reinterpret_cast<uint4*>(k_s + r * KPAD + c8 * 8) = kr;
      const bf16* ve = reinterpret_cast<const bf16*>(&vr);
#pragma unroll
      for (int i = 0; i < 8; ++i) vt_s[(c8 * 8 + i) * VPAD + r] = ve[i];
    }
    __syncthreads();
    if (j0 > warp_pos) continue;  // every key of this tile is masked for the warp's rows

    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        const bf16* kp = k_s + (n * 8 + gid) * KPAD + ks * 16 + 2 * tig;
        mma_bf16_16816(s[n], qa[ks], ld32(kp), ld32(kp + 8));
      }
    }
    float mx0 = kNegInf, mx1 = kNegInf;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = j0 + n * 8 + 2 * tig + (e & 1);
        const int pos = e < 2 ? pos0 : pos1;
        s[n][e] = key <= pos ? s[n][e] * sl2 : kNegInf;
      }
      mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
      mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
    }
    for (int off = 1; off < 4; off <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
    }
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    // A row with no key yet keeps m = -inf: p = 0, rescale 1.
    const float a0 = mn0 == kNegInf ? 1.0f : exp2f(m0 - mn0);
    const float a1 = mn1 == kNegInf ? 1.0f : exp2f(m1 - mn1);
    l0 *= a0;
    l1 *= a1;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      s[n][0] = mn0 == kNegInf ? 0.0f : exp2f(s[n][0] - mn0);
      s[n][1] = mn0 == kNegInf ? 0.0f : exp2f(s[n][1] - mn0);
      s[n][2] = mn1 == kNegInf ? 0.0f : exp2f(s[n][2] - mn1);
      s[n][3] = mn1 == kNegInf ? 0.0f : exp2f(s[n][3] - mn1);
      l0 += s[n][0] + s[n][1];
      l1 += s[n][2] + s[n][3];
    }
    m0 = mn0;
    m1 = mn1;
#pragma unroll
    for (int n = 0; n < DN; ++n) {
      o[n][0] *= a0;
      o[n][1] *= a0;
      o[n][2] *= a1;
      o[n][3] *= a1;
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]),
                              pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                              pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int n = 0; n < DN; ++n) {
        const bf16* vp = vt_s + (n * 8 + gid) * VPAD + kk * 16 + 2 * tig;
        mma_bf16_16816(o[n], pa, ld32(vp), ld32(vp + 8));
      }
    }
  }
  for (int off = 1; off < 4; off <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
#pragma unroll
  for (int n = 0; n < DN; ++n) {
    const int c = n * 8 + 2 * tig;
    if (r0 < rows) {
      *reinterpret_cast<__nv_bfloat162*>(out + ((t0 + r0) * H + h) * D + c) =
          __floats2bfloat162_rn(o[n][0] / l0, o[n][1] / l0);
    }
    if (r1 < rows) {
      *reinterpret_cast<__nv_bfloat162*>(out + ((t0 + r1) * H + h) * D + c) =
          __floats2bfloat162_rn(o[n][2] / l1, o[n][3] / l1);
    }
  }
}

bool fast_head_dim(int64_t D) {
  return D == 16 || D == 32 || D == 64 || D == 128;
}

template <typename... Args>
void launch_decode_mma(int64_t D, dim3 grid, cudaStream_t st, Args... args) {
  switch (D) {
    case 16:
      paged_decode_mma_kernel<16><<<grid, kTcThreads, 0, st>>>(args...);
      break;
    case 32:
      paged_decode_mma_kernel<32><<<grid, kTcThreads, 0, st>>>(args...);
      break;
    case 64:
      paged_decode_mma_kernel<64><<<grid, kTcThreads, 0, st>>>(args...);
      break;
    default:
      paged_decode_mma_kernel<128><<<grid, kTcThreads, 0, st>>>(args...);
      break;
  }
}

template <typename... Args>
void launch_prefill_mma(int64_t D, dim3 grid, cudaStream_t st, Args... args) {
  switch (D) {
    case 16:
      paged_prefill_mma_kernel<16><<<grid, kPreThreads, 0, st>>>(args...);
      break;
    case 32:
      paged_prefill_mma_kernel<32><<<grid, kPreThreads, 0, st>>>(args...);
      break;
    case 64:
      paged_prefill_mma_kernel<64><<<grid, kPreThreads, 0, st>>>(args...);
      break;
    default:
      paged_prefill_mma_kernel<128><<<grid, kPreThreads, 0, st>>>(args...);
      break;
  }
}

}  // namespace

void paged_kv_write(const CudaContext& ctx, bf16* k_cache, bf16* v_cache, const bf16* k,
                    const bf16* v, const int32_t* slot_mapping, int64_t T, int64_t Hkv, int64_t D) {
  VERL_CUDA_REQUIRE(T >= 0 && Hkv > 0 && D > 0 && D % 2 == 0,
                    detail::shape_str("paged_kv_write", {T, Hkv, D}) + ": D must be even");
  if (T == 0) return;
  kv_write_kernel<<<static_cast<unsigned>(T), 128, 0, ctx.stream>>>(k_cache, v_cache, k, v,
                                                                    slot_mapping, Hkv * D);
  VERL_CUDA_CHECK_LAUNCH();
}

void qkv_rope_paged_write(const CudaContext& ctx, bf16* q_out, bf16* k_cache, bf16* v_cache,
                          const bf16* qkv, const bf16* q_norm, const bf16* k_norm, float eps,
                          const int32_t* positions, const float* inv_freq,
                          const int32_t* slot_mapping, int64_t T, int64_t H, int64_t Hkv,
                          int64_t D) {
  VERL_CUDA_REQUIRE(T >= 0 && H > 0 && Hkv > 0 && H % Hkv == 0 && D > 0 && D % 2 == 0 &&
                        D <= kMaxD && (q_norm == nullptr) == (k_norm == nullptr),
                    detail::shape_str("qkv_rope_paged_write", {T, H, Hkv, D}) +
                        ": needs H % Hkv == 0, D even and <= 128, both or no q/k norms");
  if (T == 0) return;
  const unsigned head_groups = static_cast<unsigned>(ceil_div(H + 2 * Hkv, kRopeThreads / 32));
  qkv_rope_write_kernel<<<dim3(static_cast<unsigned>(T), head_groups), kRopeThreads, 0,
                          ctx.stream>>>(q_out, k_cache, v_cache, qkv, q_norm, k_norm, eps,
                                        positions, inv_freq, slot_mapping, static_cast<int>(H),
                                        static_cast<int>(Hkv), static_cast<int>(D));
  VERL_CUDA_CHECK_LAUNCH();
}

void paged_kv_copy_blocks(const CudaContext& ctx, bf16* base, int64_t num_arrays,
                          int64_t array_stride, int64_t block_elems, const int32_t* pairs,
                          int64_t n) {
  VERL_CUDA_REQUIRE(
      num_arrays >= 0 && block_elems > 0 && n >= 0 && n < 65536 * 1024 && num_arrays < 65536,
      detail::shape_str("paged_kv_copy_blocks", {num_arrays, block_elems, n}));
  if (n == 0 || num_arrays == 0) return;
  copy_blocks_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(num_arrays)), 256, 0,
                       ctx.stream>>>(base, array_stride, block_elems, pairs);
  VERL_CUDA_CHECK_LAUNCH();
}

int64_t decode_grid_partitions(int64_t max_context, int32_t partition, int32_t max_partitions) {
  if (partition <= 0 || max_context <= 0) return 1;
  const int64_t parts = ceil_div(max_context, partition);
  return max_partitions > 0 ? std::min<int64_t>(parts, max_partitions) : parts;
}

int32_t decode_partitions_for(int64_t B, int64_t Hkv, int64_t max_context, int32_t partition,
                              int sm_count) {
  const int64_t items = std::max<int64_t>(1, B * Hkv);
  const int64_t want = ceil_div(2 * static_cast<int64_t>(std::max(1, sm_count)), items);
  const int64_t cap = decode_grid_partitions(max_context, partition, 0);
  return static_cast<int32_t>(std::max<int64_t>(1, std::min(want, cap)));
}

size_t paged_attention_workspace_bytes(int64_t B, int64_t H, int64_t D, int64_t max_context,
                                       int32_t partition, int32_t max_partitions) {
  const int64_t parts = decode_grid_partitions(max_context, partition, max_partitions);
  if (parts <= 1) return 0;
  return static_cast<size_t>(B * H * parts * (D + 2)) * sizeof(float);
}

void paged_attention(const CudaContext& ctx, bf16* out, const bf16* q, const bf16* k_cache,
                     const bf16* v_cache, const int32_t* block_tables, int64_t W,
                     const int32_t* cu_seqlens, const int32_t* positions, int64_t B, int64_t T,
                     int64_t H, int64_t Hkv, int64_t D, int64_t block_size, float scale,
                     const PagedAttentionPlan& plan, void* workspace, size_t workspace_bytes) {
  const std::string shape =
      detail::shape_str("paged_attention", {B, T, H, Hkv, D, block_size, W, plan.max_context});
  VERL_CUDA_REQUIRE(
      B >= 0 && T >= 0 && H > 0 && Hkv > 0 && H % Hkv == 0 && D > 0 && D % 2 == 0 && D <= kMaxD &&
          (H / Hkv) * D <= kMaxAcc * kDecThreads && H / Hkv <= kMaxGroup && block_size > 0 &&
          W > 0 && B < 65536,
      shape + ": needs H % Hkv == 0, D even and <= 128, H/Hkv <= 64, (H/Hkv) * D <= 2048");
  VERL_CUDA_REQUIRE(plan.partition > 0 && plan.partition % kDecTile == 0,
                    shape + ": the decode partition must be a positive multiple of 64");
  if (B == 0 || T == 0) return;
  const int G = static_cast<int>(H / Hkv);
  if (plan.decode) {
    VERL_CUDA_REQUIRE(plan.max_context > 0, shape + ": decode needs max_context > 0");
    const int64_t parts =
        decode_grid_partitions(plan.max_context, plan.partition, plan.max_partitions);
    VERL_CUDA_REQUIRE(parts < 65536, shape + ": too many decode partitions");
    const size_t need = paged_attention_workspace_bytes(B, H, D, plan.max_context, plan.partition,
                                                        plan.max_partitions);
    VERL_CUDA_REQUIRE(need <= workspace_bytes && (need == 0 || workspace != nullptr),
                      shape + ": workspace of " + std::to_string(workspace_bytes) +
                          " bytes, the split-K decode needs " + std::to_string(need));
    const dim3 grid(static_cast<unsigned>(Hkv), static_cast<unsigned>(B),
                    static_cast<unsigned>(parts));
    if (!plan.reference && G <= 8 && fast_head_dim(D)) {
      launch_decode_mma(D, grid, ctx.stream, out, static_cast<float*>(workspace), q, k_cache,
                        v_cache, block_tables, W, cu_seqlens, positions, static_cast<int>(H),
                        static_cast<int>(Hkv), static_cast<int>(block_size), scale,
                        static_cast<int>(plan.partition), static_cast<int>(parts));
    } else {
      allow_dynamic_smem(paged_decode_kernel, kDecodeSmemMax);
      paged_decode_kernel<<<grid, kDecThreads, decode_smem_bytes(G, static_cast<int>(D)),
                            ctx.stream>>>(
          out, static_cast<float*>(workspace), q, k_cache, v_cache, block_tables, W, cu_seqlens,
          positions, static_cast<int>(H), static_cast<int>(Hkv), static_cast<int>(D),
          static_cast<int>(block_size), scale, plan.partition, static_cast<int>(parts));
    }
    VERL_CUDA_CHECK_LAUNCH();
    if (parts > 1) {
      paged_decode_combine_kernel<<<dim3(static_cast<unsigned>(H), static_cast<unsigned>(B)), 128,
                                    0, ctx.stream>>>(
          out, static_cast<const float*>(workspace), cu_seqlens, positions, static_cast<int>(H),
          static_cast<int>(D), plan.partition, static_cast<int>(parts));
      VERL_CUDA_CHECK_LAUNCH();
    }
  }
  if (plan.prefill) {
    const int64_t tiles = ceil_div(T, kPreRows) + B;
    VERL_CUDA_REQUIRE(tiles < (int64_t{1} << 31), shape + ": too many prefill tiles");
    const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(H));
    if (!plan.reference && fast_head_dim(D)) {
      launch_prefill_mma(D, grid, ctx.stream, out, q, k_cache, v_cache, block_tables, W, cu_seqlens,
                         positions, B, static_cast<int>(H), static_cast<int>(Hkv),
                         static_cast<int>(block_size), scale);
    } else {
      allow_dynamic_smem(paged_prefill_kernel, prefill_smem_bytes(kMaxD));
      paged_prefill_kernel<<<grid, kPreThreads, prefill_smem_bytes(static_cast<int>(D)),
                             ctx.stream>>>(
          out, q, k_cache, v_cache, block_tables, W, cu_seqlens, positions, B, static_cast<int>(H),
          static_cast<int>(Hkv), static_cast<int>(D), static_cast<int>(block_size), scale);
    }
    VERL_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace verl::ops::cuda
