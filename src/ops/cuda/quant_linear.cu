// Linear layers over int8 / int4 weight-only quantised matrices (quant_linear.h): the fused
// dequantising GEMM, the dequantisation into bf16 for cuBLASLt, and the choice between them.
//
// Fused kernel: out[t][n] = sum_k x[t][k] deq(W)[n][k], tokens t as the mma's A rows, features n
// as its B columns (the layout of gemm_invariant.cu). A block owns kBM tokens x kBN features and
// a range of k-tiles of kBK = 128 inputs. Per k-tile:
//   1. cp.async ring (kStages deep): the x tile [kBM][kBK + 8] bf16 and the raw code tile
//      [kBN][code bytes + 16] (int8: 128 bytes a row, int4: 64), straight from global memory;
//   2. the block dequantises the code tile into one bf16 tile [kBN][kBK + 8], 8 weights (one
//      16-byte store) a thread a step: int8 the integer code itself (exact in bf16; the row's
//      scale is applied to the fp32 sum in the epilogue), int4 bf16((q - z) s), the group's scale
//      and zero point loaded into registers one tile ahead;
//   3. ldmatrix + mma.sync m16n8k16 over the two tiles (mma.cuh's fragment helpers).
// Two barriers a tile: after the ring's wait (the tile has landed; everyone is done with the
// previous tile's dequantised weights and ring stage) and after the dequantisation.
// Configurations (tokens x features): small 16 x 64, 4 warps (1 x 4) of 16 x 16, 4 stages, for
// T <= 16; narrow 32 x 64, 4 warps (2 x 2) of 16 x 32, 4 stages, for T <= 32; mid 64 x 64, 4 warps
// (2 x 2) of 32 x 32, 3 stages, above. (A token tile larger than T wastes mma work, which is
// free only while the weights' bytes bound the time.) When the grid would not fill the GPU
// twice over (few features, few tokens) K is split over blockIdx.z: each split writes its fp32
// sums to ctx.workspace [split][T][N] and a second kernel adds them in split order, then scale
// and bias (deterministic).
// Rows past N, tokens past T and inputs past K are zero in shared memory (codes past K are zero
// padding up to the row stride, and int4 chunks that straddle K are masked), so they add nothing.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "ops/cuda/common.cuh"
#include "ops/cuda/mma.cuh"
#include "ops/cuda/quant_linear.h"

namespace verl::ops::cuda {

namespace detail {
namespace {

using bf16_t = __nv_bfloat16;

constexpr int kBK = 128;  // inputs per k-tile

template <int BM, int BN, int WM, int WN, int Stages, int Bits>
struct QuantCfg {
  static constexpr int kBM = BM, kBN = BN, kWN = WN, kStages = Stages, kBits = Bits;
  static constexpr int kThreads = 32 * WM * WN;
  static constexpr int kWarpRows = BM / WM, kWarpCols = BN / WN;
  static constexpr int kMT = kWarpRows / 16, kNT = kWarpCols / 8;
  static constexpr int kLds = kBK + 8;               // bf16 row stride of the x and W tiles
  static constexpr int kCodeBytes = kBK * Bits / 8;  // code bytes of a row per k-tile
  static constexpr int kCodeLd = kCodeBytes + 16;    // their row stride in shared memory
  static constexpr int kXBytes = 2 * BM * kLds;
  static constexpr int kStageBytes = kXBytes + BN * kCodeLd;
  static constexpr int kWBytes = 2 * BN * kLds;
  static constexpr size_t kSmem = static_cast<size_t>(Stages) * kStageBytes + kWBytes;
  static constexpr int kChunksPerRow = kBK / 8;  // dequantised 8-weight chunks a row
  static constexpr int kDeqIters = BN * kChunksPerRow / kThreads;
  static_assert(kWarpRows % 16 == 0 && kWarpCols % 16 == 0, "mma tile shapes");
  static_assert(kThreads % kChunksPerRow == 0 && (BN * kChunksPerRow) % kThreads == 0,
                "a thread dequantises the same 8 inputs of kDeqIters rows");
  static_assert(kStageBytes % 16 == 0 && kXBytes % 16 == 0, "16-byte aligned tiles");
  static_assert(Stages >= 2, "a ring of at least two stages");
};

template <int Bits>
using SmallCfg = QuantCfg<16, 64, 1, 4, 4, Bits>;
template <int Bits>
using NarrowCfg = QuantCfg<32, 64, 2, 2, 4, Bits>;
template <int Bits>
using MidCfg = QuantCfg<64, 64, 2, 2, 3, Bits>;

struct QuantArgs {
  const bf16_t* x;     // [T][K]
  bf16_t* y;           // [T][N] (one split)
  float* partial;      // [splits][T][N] (several splits)
  const bf16_t* bias;  // [N] or null
  const uint8_t* codes;
  const float* scales;
  const uint8_t* zeros;
  int64_t T, N, ld;
  int K, group, groups;
  int units_per_split;  // k units a split: k-tiles (fused kernel) or warp-step chunks (GEMV)
  bool vec_x;           // 16-byte cp.async of x rows (K % 8 == 0, x aligned)
};

// Stages the code bytes [kb0, kb0 + kCodeBytes) of rows [n0, n0 + kBN) into dst [kBN][kCodeLd].
// The row stride ld is a multiple of 16, so a 16-byte chunk is wholly inside the row or past it.
template <class Cfg>
__device__ __forceinline__ void stage_codes(uint8_t* dst, const uint8_t* codes, int64_t ld,
                                            int64_t n0, int64_t N, int64_t kb0) {
  constexpr int kChunks = Cfg::kCodeBytes / 16, kTotal = Cfg::kBN * kChunks;
  static_assert(kTotal % Cfg::kThreads == 0, "whole chunks per thread");
#pragma unroll
  for (int it = 0; it < kTotal / Cfg::kThreads; ++it) {
    const int e = it * Cfg::kThreads + static_cast<int>(threadIdx.x);
    const int r = e / kChunks, cb = (e % kChunks) * 16;
    uint8_t* d = dst + r * Cfg::kCodeLd + cb;
    const int64_t n = n0 + r, kb = kb0 + cb;
    if (n < N && kb < ld) {
      cp_async_16(smem_u32(d), codes + n * ld + kb);
    } else {
      *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

// Eight int8 codes (two little-endian words) -> four registers of two bf16 (exact: |q| <= 127).
__device__ __forceinline__ uint4 int8x8_to_bf16(uint2 raw) {
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t word = i < 2 ? raw.x : raw.y;
    const int sh = 16 * (i & 1);
    const float lo = static_cast<float>(static_cast<int8_t>(word >> sh));
    const float hi = static_cast<float>(static_cast<int8_t>(word >> (sh + 8)));
    out[i] = pack_bf16(lo, hi);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// Eight int4 codes (one word, low nibble first) -> bf16((q - z) s); inputs from `valid` on are 0.
__device__ __forceinline__ uint4 int4x8_to_bf16(uint32_t word, float s, int z, int valid) {
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int q0 = static_cast<int>((word >> (8 * i)) & 15u);
    const int q1 = static_cast<int>((word >> (8 * i + 4)) & 15u);
    const float lo = 2 * i < valid ? static_cast<float>(q0 - z) * s : 0.0f;
    const float hi = 2 * i + 1 < valid ? static_cast<float>(q1 - z) * s : 0.0f;
    out[i] = pack_bf16(lo, hi);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// Block (feature tile blockIdx.x, token tile blockIdx.y, k split blockIdx.z).
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) quant_gemm_kernel(const QuantArgs a) {
  constexpr int kBM = Cfg::kBM, kBN = Cfg::kBN, kLds = Cfg::kLds, kStages = Cfg::kStages;
  constexpr int kThreads = Cfg::kThreads, kMT = Cfg::kMT, kNT = Cfg::kNT;
  constexpr int kDeqIters = Cfg::kDeqIters, kRowsPerIter = kThreads / Cfg::kChunksPerRow;
  constexpr bool kInt4 = Cfg::kBits == 4;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16_t* wtile = reinterpret_cast<bf16_t*>(smem + kStages * Cfg::kStageBytes);

  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kBM;
  const int K = a.K;
  const int ktiles = (K + kBK - 1) / kBK;
  const int kt0 = static_cast<int>(blockIdx.z) * a.units_per_split;
  const int ntiles = min(ktiles, kt0 + a.units_per_split) - kt0;  // >= 1 (the host's split)

  auto load = [&](int stage, int kt) {
    unsigned char* base = smem + stage * Cfg::kStageBytes;
    stage_tile<kBM, kBK, kThreads>(reinterpret_cast<bf16_t*>(base), a.x, K, t0, a.T, kt * kBK, K,
                                   a.vec_x);
    stage_codes<Cfg>(base + Cfg::kXBytes, a.codes, a.ld, n0, a.N,
                     static_cast<int64_t>(kt) * Cfg::kCodeBytes);
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ntiles) load(s, kt0 + s);
    cp_async_commit();
  }

  // This thread's dequantisation chunks: inputs [8 dc, 8 dc + 8) of the tile, rows dr + i
  // kRowsPerIter. int4: their scales and zero points, fetched one tile ahead.
  const int dc = static_cast<int>(threadIdx.x) % Cfg::kChunksPerRow;
  const int dr = static_cast<int>(threadIdx.x) / Cfg::kChunksPerRow;
  float sc[kDeqIters], sc_next[kDeqIters];
  int zp[kDeqIters], zp_next[kDeqIters];
  auto fetch_grid = [&](int kt) {
    const int k = kt * kBK + 8 * dc;
    const int g = min(k / a.group, a.groups - 1);  // chunks past K read the last group (masked)
#pragma unroll
    for (int i = 0; i < kDeqIters; ++i) {
      const int64_t n = n0 + dr + i * kRowsPerIter;
      sc_next[i] = n < a.N ? __ldg(a.scales + n * a.groups + g) : 0.0f;
      zp_next[i] = n < a.N ? static_cast<int>(__ldg(a.zeros + n * a.groups + g)) : 0;
    }
  };
  if constexpr (kInt4) fetch_grid(kt0);

  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int wm = warp / Cfg::kWN, wn = warp % Cfg::kWN;
  const LaneOffsets lo(lane, kLds);
  const uint32_t x_off = 2u * static_cast<uint32_t>(wm * Cfg::kWarpRows * kLds + lo.a_off);
  const uint32_t w_base =
      smem_u32(wtile) + 2u * static_cast<uint32_t>(wn * Cfg::kWarpCols * kLds + lo.bn_off);

  float acc[kMT][kNT][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
      acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
  }

  for (int i = 0; i < ntiles; ++i) {
    // Groups committed: kStages - 1 + i; leaving kStages - 2 in flight completes tile i. The
    // barrier also ends every warp's reads of stage (i - 1) % kStages and of the W tile.
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int next = i + kStages - 1;
    if (next < ntiles) load(next % kStages, kt0 + next);
    cp_async_commit();

    const int kt = kt0 + i;
    const unsigned char* stage = smem + (i % kStages) * Cfg::kStageBytes;
    const uint8_t* codes = stage + Cfg::kXBytes;
    if constexpr (kInt4) {
#pragma unroll
      for (int j = 0; j < kDeqIters; ++j) {
        sc[j] = sc_next[j];
        zp[j] = zp_next[j];
      }
      if (i + 1 < ntiles) fetch_grid(kt + 1);     // in flight during this tile's work
      const int valid = K - (kt * kBK + 8 * dc);  // inputs of the chunk inside K (may be <= 0)
#pragma unroll
      for (int j = 0; j < kDeqIters; ++j) {
        const int r = dr + j * kRowsPerIter;
        const uint32_t word = *reinterpret_cast<const uint32_t*>(codes + r * Cfg::kCodeLd + 4 * dc);
        *reinterpret_cast<uint4*>(wtile + r * kLds + 8 * dc) =
            int4x8_to_bf16(word, sc[j], zp[j], valid);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kDeqIters; ++j) {
        const int r = dr + j * kRowsPerIter;
        const uint2 raw = *reinterpret_cast<const uint2*>(codes + r * Cfg::kCodeLd + 8 * dc);
        *reinterpret_cast<uint4*>(wtile + r * kLds + 8 * dc) = int8x8_to_bf16(raw);
      }
    }
    __syncthreads();

    const uint32_t xs = smem_u32(stage) + x_off;
    const int k0 = kt * kBK;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      if (k0 + kk * 16 < K) {  // block-uniform: 16-input steps past K add nothing
        mma_k16_step(acc, xs, w_base, kLds, kk);
      }
    }
  }
  cp_async_wait<0>();  // only empty groups remain

  // Epilogue: acc[mt][nt] holds tokens (g, g + 8) x features (2 tq, 2 tq + 1) of its 16 x 8 tile.
  const int g = lane >> 2, tq = lane & 3;
  const bool split = gridDim.z > 1;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t t = t0 + wm * Cfg::kWarpRows + mt * 16 + g + 8 * half;
      if (t >= a.T) continue;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t n = n0 + wn * Cfg::kWarpCols + nt * 8 + 2 * tq + e;
          if (n >= a.N) continue;
          const float v = acc[mt][nt][2 * half + e];
          if (split) {
            a.partial[(static_cast<int64_t>(blockIdx.z) * a.T + t) * a.N + n] = v;
          } else {
            float o = kInt4 ? v : v * a.scales[n];  // int8: the row's scale on the fp32 sum
            if (a.bias != nullptr) o += __bfloat162float(a.bias[n]);
            a.y[t * a.N + n] = __float2bfloat16_rn(o);
          }
        }
      }
    }
  }
}

// y[t][n] = bf16(sum_s partial[s][t][n] (x scale[n] for int8) + bias[n]), splits in order.
__global__ void quant_split_sum_kernel(bf16_t* y, const float* partial, const float* scales,
                                       const bf16_t* bias, int64_t T, int64_t N, int splits) {
  const int64_t total = T * N;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i % N;
    float v = 0.0f;
    for (int s = 0; s < splits; ++s) v += partial[s * total + i];
    if (scales != nullptr) v *= scales[n];
    if (bias != nullptr) v += __bfloat162float(bias[n]);
    y[i] = __float2bfloat16_rn(v);
  }
}

// One thread per 8 consecutive weights of a row: out = bf16((q - z) s), row-major [N][K].
template <int Bits>
__global__ void quant_dequantize_kernel(bf16_t* out, const uint8_t* codes, const float* scales,
                                        const uint8_t* zeros, int64_t N, int64_t K, int64_t ld,
                                        int64_t group, int64_t groups) {
  const int64_t chunks = (K + 7) / 8, total = N * chunks;
  const bool vec = K % 8 == 0;  // rows of out 16-byte aligned
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = e / chunks, k = (e % chunks) * 8;
    const uint8_t* row = codes + n * ld;
    // The chunk's bytes are inside the padded row (ld is a multiple of 16): one load.
    uint32_t w[2];
    if (Bits == 8) {
      const uint2 raw = *reinterpret_cast<const uint2*>(row + k);
      w[0] = raw.x;
      w[1] = raw.y;
    } else {
      w[0] = *reinterpret_cast<const uint32_t*>(row + k / 2);
      w[1] = 0;
    }
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t c = k + i < K ? k + i : K - 1;
      const int64_t gi = n * groups + c / group;
      if (Bits == 8) {
        v[i] = static_cast<float>(static_cast<int8_t>(w[i / 4] >> (8 * (i % 4)))) * scales[gi];
      } else {
        const int q = static_cast<int>((w[0] >> (4 * i)) & 15u);
        v[i] = static_cast<float>(q - static_cast<int>(zeros[gi])) * scales[gi];
      }
    }
    bf16_t* o = out + n * K + k;
    if (vec) {
      *reinterpret_cast<uint4*>(o) = make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]),
                                                pack_bf16(v[4], v[5]), pack_bf16(v[6], v[7]));
    } else {
      for (int i = 0; i < 8 && k + i < K; ++i) o[i] = __float2bfloat16_rn(v[i]);
    }
  }
}

// K split over blocks while a grid of `blocks` blocks holds fewer than `fill`: as many splits as
// bring it there, each at least two of the `units` k units, the fp32 partial sums inside
// ctx.workspace, at most 16. Sets a.units_per_split and a.partial; returns the split count (no
// split empty).
int64_t plan_k_split(const CudaContext& ctx, QuantArgs& a, int64_t blocks, int64_t fill,
                     int units) {
  int64_t splits = 1;
  if (blocks < fill && ctx.workspace != nullptr) {
    const int64_t fit = static_cast<int64_t>(ctx.workspace_bytes / (sizeof(float) * a.T * a.N));
    splits = std::max<int64_t>(
        1, std::min({ceil_div(fill, blocks), int64_t{units / 2}, fit, int64_t{16}}));
  }
  a.units_per_split = static_cast<int>(ceil_div(units, splits));
  splits = ceil_div(units, a.units_per_split);
  a.partial = splits > 1 ? static_cast<float*>(ctx.workspace) : nullptr;
  return splits;
}

// After a split kernel: the splits' partial sums added in order, int8's row scale, the bias.
void sum_k_splits(const CudaContext& ctx, const QuantArgs& a, int64_t splits, int bits) {
  if (splits <= 1) return;
  quant_split_sum_kernel<<<grid_for(a.T * a.N, 256), 256, 0, ctx.stream>>>(
      a.y, a.partial, bits == 8 ? a.scales : nullptr, a.bias, a.T, a.N, static_cast<int>(splits));
  VERL_CUDA_CHECK_LAUNCH();
}

// ---- the GEMV kernel (QuantPath::Gemv): up to 8 tokens
// -------------------------------------------- A warp owns kGemvRowsPerWarp output rows; each lane
// reads 16 code bytes of each row per step (int8: 16 inputs, int4: 32; a warp step covers
// kGemvChunk inputs, coalesced 512 bytes a row), dequantises them in registers (int8: the integer
// code, the row's scale applied to the sum at the end; int4: (q - z) s of the lane's group) and
// multiplies them with the step's x chunk, which the block stages in shared memory for all its
// rows. Codes stream from global memory straight into registers: no shared-memory round trip and no
// barrier between a load and its use, so many loads stay in flight, which is what the memory-bound
// regime needs. The lanes' partial sums are reduced over the warp in a fixed order. Inputs past K
// read zero x, so the padding codes add nothing. K is split over blockIdx.y while the grid is small
// (fp32 partial sums in the workspace, added by quant_split_sum_kernel in split order:
// deterministic).
constexpr int kGemvThreads = 256, kGemvWarps = kGemvThreads / 32, kGemvRowsPerWarp = 4;
constexpr int kGemvRows = kGemvWarps * kGemvRowsPerWarp;  // rows a block
constexpr int kGemvMaxTokens = 8;

template <int Bits>
constexpr int kGemvInputsPerLane = Bits == 8 ? 16 : 32;
template <int Bits>
constexpr int kGemvChunk = 32 * kGemvInputsPerLane<Bits>;  // inputs a warp step

// Block (row block blockIdx.x, k split blockIdx.y); TT >= T tokens computed (x rows past T are 0).
template <int Bits, int TT>
__global__ void __launch_bounds__(kGemvThreads) quant_gemv_kernel(const QuantArgs a) {
  constexpr int kIn = kGemvInputsPerLane<Bits>, kChunk = kGemvChunk<Bits>;
  __shared__ __align__(16) bf16_t xs[TT][kChunk];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kGemvRows + warp * kGemvRowsPerWarp;
  const int chunks = (a.K + kChunk - 1) / kChunk;
  const int c_begin = static_cast<int>(blockIdx.y) * a.units_per_split;
  const int c_end = min(chunks, c_begin + a.units_per_split);
  float acc[kGemvRowsPerWarp][TT];
#pragma unroll
  for (int r = 0; r < kGemvRowsPerWarp; ++r)
#pragma unroll
    for (int t = 0; t < TT; ++t) acc[r][t] = 0.0f;
  for (int c = c_begin; c < c_end; ++c) {
    const int k0 = c * kChunk;
    // This lane's 16 code bytes of each row: issued before the barriers below.
    const int64_t kb = static_cast<int64_t>(k0) * Bits / 8 + 16 * lane;
    uint4 raw[kGemvRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kGemvRowsPerWarp; ++r) {
      const int64_t n = n0 + r;
      raw[r] = n < a.N && kb < a.ld ? __ldg(reinterpret_cast<const uint4*>(a.codes + n * a.ld + kb))
                                    : make_uint4(0u, 0u, 0u, 0u);
    }
    __syncthreads();  // every warp is done with the previous chunk's x
    for (int e = static_cast<int>(threadIdx.x); e < TT * (kChunk / 8); e += kGemvThreads) {
      const int t = e / (kChunk / 8), j = (e % (kChunk / 8)) * 8, k = k0 + j;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (t < a.T && k < a.K)
        v = *reinterpret_cast<const uint4*>(a.x + static_cast<int64_t>(t) * a.K + k);
      *reinterpret_cast<uint4*>(&xs[t][j]) = v;
    }
    __syncthreads();
    const int kl = lane * kIn;  // the lane's first input in the chunk
    float s4 = 1.0f, z4 = 0.0f;
#pragma unroll
    for (int r = 0; r < kGemvRowsPerWarp; ++r) {
      const uint32_t words[4] = {raw[r].x, raw[r].y, raw[r].z, raw[r].w};
      if (Bits == 4) {
        const int64_t n = min(n0 + r, a.N - 1);
        const int g = min((k0 + kl) / a.group, a.groups - 1);
        s4 = a.scales[n * a.groups + g];
        z4 = static_cast<float>(a.zeros[n * a.groups + g]);
      }
#pragma unroll
      for (int i8 = 0; i8 < kIn / 8; ++i8) {  // 8 inputs at a time: one 16-byte x load a token
        float w[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          if (Bits == 8) {
            const int byte = i8 * 8 + i;
            w[i] = static_cast<float>(static_cast<int8_t>(words[byte / 4] >> (8 * (byte % 4))));
          } else {
            const int nib = i8 * 8 + i;
            const float q = static_cast<float>((words[nib / 8] >> (4 * (nib % 8))) & 15u);
            w[i] = (q - z4) * s4;
          }
        }
#pragma unroll
        for (int t = 0; t < TT; ++t) {
          const uint4 xv = *reinterpret_cast<const uint4*>(&xs[t][kl + i8 * 8]);
          const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const uint32_t half = (xw[i / 2] >> (16 * (i % 2))) & 0xffffu;
            acc[r][t] += w[i] * __uint_as_float(half << 16);
          }
        }
      }
    }
  }
  // Warp sums in a fixed butterfly order; lane r * TT + t (mod 32) writes (row r, token t).
#pragma unroll
  for (int r = 0; r < kGemvRowsPerWarp; ++r)
#pragma unroll
    for (int t = 0; t < TT; ++t)
#pragma unroll
      for (int off = 16; off > 0; off /= 2)
        acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], off);
#pragma unroll
  for (int r = 0; r < kGemvRowsPerWarp; ++r) {
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      const int64_t n = n0 + r;
      if (lane != (r * TT + t) % 32 || t >= a.T || n >= a.N) continue;
      float v = acc[r][t];
      if (a.partial != nullptr) {
        a.partial[(static_cast<int64_t>(blockIdx.y) * a.T + t) * a.N + n] = v;
      } else {
        if (Bits == 8) v *= a.scales[n];
        if (a.bias != nullptr) v += __bfloat162float(a.bias[n]);
        a.y[t * a.N + n] = __float2bfloat16_rn(v);
      }
    }
  }
}

template <int Bits, int TT>
void launch_gemv(const CudaContext& ctx, QuantArgs a) {
  const int64_t blocks = ceil_div(a.N, kGemvRows);
  const int chunks = static_cast<int>(ceil_div(a.K, kGemvChunk<Bits>));
  VERL_CUDA_REQUIRE(blocks < (int64_t{1} << 31), "quant_linear_forward (gemv): too many rows");
  // K split while the grid holds fewer than four blocks an SM.
  const int64_t splits = plan_k_split(ctx, a, blocks, int64_t{4} * cuda_sm_count(), chunks);
  quant_gemv_kernel<Bits, TT><<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(splits)),
                                kGemvThreads, 0, ctx.stream>>>(a);
  VERL_CUDA_CHECK_LAUNCH();
  sum_k_splits(ctx, a, splits, Bits);
}

template <int Bits>
void run_gemv(const CudaContext& ctx, const QuantArgs& a) {
  if (a.T <= 1) {
    launch_gemv<Bits, 1>(ctx, a);
  } else if (a.T <= 2) {
    launch_gemv<Bits, 2>(ctx, a);
  } else if (a.T <= 4) {
    launch_gemv<Bits, 4>(ctx, a);
  } else {
    launch_gemv<Bits, 8>(ctx, a);
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <class Cfg>
void launch_fused(const CudaContext& ctx, QuantArgs a, const char* what) {
  const int64_t gx = ceil_div(a.N, Cfg::kBN), gy = ceil_div(a.T, Cfg::kBM);
  const int ktiles = static_cast<int>(ceil_div(a.K, kBK));
  VERL_CUDA_REQUIRE(gx < (int64_t{1} << 31) && gy <= 65535,
                    shape_str(what, {a.T, a.K, a.N}) + ": more blocks than one grid holds");
  // K split while the grid fills the GPU less than twice.
  const int64_t splits = plan_k_split(ctx, a, gx * gy, int64_t{2} * cuda_sm_count(), ktiles);
  const auto kernel = quant_gemm_kernel<Cfg>;
  allow_dynamic_smem(kernel, Cfg::kSmem);
  kernel<<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy),
                static_cast<unsigned>(splits)),
           Cfg::kThreads, Cfg::kSmem, ctx.stream>>>(a);
  VERL_CUDA_CHECK_LAUNCH();
  sum_k_splits(ctx, a, splits, Cfg::kBits);
}

template <int Bits>
void run_fused(const CudaContext& ctx, const QuantArgs& a, const char* what) {
  if (a.T <= SmallCfg<Bits>::kBM) {
    launch_fused<SmallCfg<Bits>>(ctx, a, what);
  } else if (a.T <= NarrowCfg<Bits>::kBM) {
    launch_fused<NarrowCfg<Bits>>(ctx, a, what);
  } else {
    launch_fused<MidCfg<Bits>>(ctx, a, what);
  }
}

}  // namespace
}  // namespace detail

int64_t quant_codes_stride(int bits, int64_t cols) {
  const int64_t row = bits == 8 ? cols : (cols + 1) / 2;
  return (row + 15) / 16 * 16;
}

namespace {

void check_view(const char* op, const QuantMatrixView& w) {
  VERL_CUDA_REQUIRE(w.bits == 8 || w.bits == 4,
                    std::string(op) + ": " + std::to_string(w.bits) + "-bit codes (want 8 or 4)");
  VERL_CUDA_REQUIRE(w.rows >= 1 && w.cols >= 1 && w.cols < (int64_t{1} << 30) && w.group >= 1 &&
                        w.ld == quant_codes_stride(w.bits, w.cols),
                    detail::shape_str(op, {w.rows, w.cols, w.group, w.ld}) +
                        " = (rows, cols, group, ld): need rows, cols, group >= 1 and ld = the "
                        "row's code bytes rounded up to 16");
  VERL_CUDA_REQUIRE(
      w.codes != nullptr && w.scales != nullptr && (w.bits == 8 || w.zeros != nullptr),
      std::string(op) +
          ": the matrix's codes, scales (and int4 zero points) must be on the device");
  VERL_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(w.codes) % 16 == 0,
                    std::string(op) + ": codes must be 16-byte aligned");
}

}  // namespace

bool quant_gemv_supported(const QuantMatrixView& w, int64_t T, const bf16* x) {
  return T >= 1 && T <= detail::kGemvMaxTokens && w.cols % 8 == 0 && detail::aligned16(x) &&
         (w.bits == 8 || w.group % 32 == 0 || w.groups() == 1);
}

// int4 chunks of 8 inputs must sit in one group for the fused kernel's per-chunk scale (a row of
// one group, group = K after model::quantize_matrix's clamp, has no boundary to straddle).
bool quant_fusable(const QuantMatrixView& w) {
  return w.bits == 8 || w.group % 8 == 0 || w.groups() == 1;
}

QuantPath quant_auto_path(const QuantMatrixView& w, int64_t T, const bf16* x, bool have_scratch,
                          int64_t fused_max_tokens) {
  if (T <= quant_gemv_auto_max_tokens(w.bits) && quant_gemv_supported(w, T, x))
    return QuantPath::Gemv;
  if (!quant_fusable(w)) return QuantPath::Dequant;
  return T <= fused_max_tokens || !have_scratch ? QuantPath::Fused : QuantPath::Dequant;
}

void quant_dequantize(const CudaContext& ctx, bf16* out, const QuantMatrixView& w) {
  check_view("quant_dequantize", w);
  const int64_t total = w.rows * ((w.cols + 7) / 8);
  const unsigned grid = detail::grid_for(total, 256);
  if (w.bits == 8) {
    detail::quant_dequantize_kernel<8><<<grid, 256, 0, ctx.stream>>>(
        out, w.codes, w.scales, w.zeros, w.rows, w.cols, w.ld, w.group, w.groups());
  } else {
    detail::quant_dequantize_kernel<4><<<grid, 256, 0, ctx.stream>>>(
        out, w.codes, w.scales, w.zeros, w.rows, w.cols, w.ld, w.group, w.groups());
  }
  VERL_CUDA_CHECK_LAUNCH();
}

void quant_linear_forward(const CudaContext& ctx, bf16* y, const bf16* x, const QuantMatrixView& w,
                          const bf16* b, int64_t T, int64_t K, int64_t N, bf16* scratch,
                          QuantPath path, int64_t fused_max_tokens) {
  const char* op = "quant_linear_forward";
  check_view(op, w);
  VERL_CUDA_REQUIRE(T >= 0 && w.rows == N && w.cols == K,
                    detail::shape_str(op, {T, K, N, w.rows, w.cols}) +
                        " = (T, K, N, rows, cols): the matrix must be [N, K]");
  if (T == 0) return;
  // The kernels' arguments (the GEMV and the fused kernel take the same).
  detail::QuantArgs a{};
  a.x = x;
  a.y = y;
  a.bias = b;
  a.codes = w.codes;
  a.scales = w.scales;
  a.zeros = w.zeros;
  a.T = T;
  a.N = N;
  a.ld = w.ld;
  a.K = static_cast<int>(K);
  a.group = static_cast<int>(std::min<int64_t>(w.group, K));
  a.groups = static_cast<int>(w.groups());
  a.vec_x = K % 8 == 0 && detail::aligned16(x);
  if (path == QuantPath::Auto)
    path = quant_auto_path(w, T, x, scratch != nullptr, fused_max_tokens);
  if (path == QuantPath::Gemv) {
    VERL_CUDA_REQUIRE(quant_gemv_supported(w, T, x),
                      detail::shape_str(op, {T, K, N, w.group}) +
                          " = (T, K, N, group): the GEMV kernel takes at most 8 tokens, K a "
                          "multiple of 8 with 16-byte aligned x, and int4 groups of a multiple of "
                          "32 inputs (or one group a row)");
    if (w.bits == 8) {
      detail::run_gemv<8>(ctx, a);
    } else {
      detail::run_gemv<4>(ctx, a);
    }
    return;
  }
  const bool fused = path == QuantPath::Fused;
  VERL_CUDA_REQUIRE(!fused || quant_fusable(w),
                    std::string(op) +
                        ": the fused kernel takes int4 groups that are a multiple "
                        "of 8, not " +
                        std::to_string(w.group));
  if (!fused) {
    VERL_CUDA_REQUIRE(
        scratch != nullptr,
        std::string(op) + ": the dequantising path needs a bf16 scratch of N*K elements");
    quant_dequantize(ctx, scratch, w);
    linear_forward(ctx, y, x, scratch, b, T, K, N);
    return;
  }
  if (w.bits == 8) {
    detail::run_fused<8>(ctx, a, op);
  } else {
    detail::run_fused<4>(ctx, a, op);
  }
}

}  // namespace verl::ops::cuda
