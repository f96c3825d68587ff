// Batch-invariant GEMM: the forward form of gemm.h (ta = T, tb = N, bf16 operands) when
// ctx.numerics is BatchInvariant, so that the trainer's forward (thousands of rows) and the
// rollout's decode steps (1..256 rows) give the same bits for the same row. In row-major terms,
// with W = A ([m rows, k], row stride lda), X = B ([n rows, k], row stride ldb), out = D ([n rows,
// m], row stride ldd) and C (D's type and ldd; D itself unless given):
//   out[t][j] = alpha sum_k X[t][k] W[j][k]  (+ beta C[t][j])  (+ bias[j])
// out is overwritten (C is read first when beta != 0, so C == D accumulates in place).
//
// Kernel: mma.sync m16n8k16 (bf16 x bf16 -> fp32) fed by ldmatrix, tokens t as the mma's A rows
// and features j as its B columns. A block owns kBM tokens x kBN features and walks k in tiles of
// kBK, staged in a kStages-deep cp.async ring: X [kBM][kBK + 8] and W [kBN][kBK + 8] bf16 per stage
// (8 rows of one ldmatrix phase start in 8 different 16-byte bank groups: no bank conflicts). Rows
// past n or m and columns past K are zero in shared memory. Rows that are not 16-byte aligned (lda
// or ldb not a multiple of 8, unaligned pointer) and chunks that straddle K are staged element by
// element into the same layout. Configurations (tile = tokens x features), the largest whose grid
// fills the GPU twice over (launch_by_rows):
//   small  16 x 64 tile,   k-tile 64, 4 warps (1 x 4) of 16 x 16, 4 stages  (decode, narrow m)
//   mid    64 x 64 tile,   k-tile 64, 4 warps (2 x 2) of 32 x 32, 4 stages
//   large  128 x 128 tile, k-tile 32, 8 warps (2 x 4) of 64 x 32, 4 stages  (prefill, training)
//
// Why the bits of out[t][j] do not depend on n, m, the tile or the configuration: every element
// has its own fp32 accumulator, starting at +0, updated by exactly ceil(K/16) mma steps, one per
// 16-wide k chunk [16c, 16c + 16) in ascending c (chunks at or past K are skipped, so the chain
// length depends on K only, not on kBK). The inputs of step c are the element's X row and W row
// over that chunk (values past K are zero in every configuration, staged bit for bit by cp.async
// or by the element copies) and the accumulator: the same in every configuration. An mma's output
// element depends only on its own A row, B column and C value, not on its place in the fragment,
// so the chain gives the same fp32 sum wherever the element lands. No split-K, no reduction across
// warps or blocks. The epilogue is then a fixed formula in round-to-nearest intrinsics (never
// contracted into an FMA), the same for every element:
//   v = alpha acc;  v += beta c (beta != 0);  v += bias[j] (bias);  store (bf16: nearest even).
// Different tile shapes per n are therefore free; only K fixes the numbers.
#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "ops/cuda/common.cuh"
#include "ops/cuda/gemm.h"
#include "ops/cuda/mma.cuh"

namespace verl::ops::cuda::detail {

namespace {

using bf16_t = __nv_bfloat16;

// One tile configuration: BM tokens x BN features per block, k-tiles of BK, WM x WN warps.
template <int BM, int BN, int BK, int WM, int WN, int Stages>
struct TileCfg {
  static constexpr int kBM = BM, kBN = BN, kBK = BK, kWN = WN, kStages = Stages;
  static constexpr int kThreads = 32 * WM * WN;
  static constexpr int kWarpRows = BM / WM;             // tokens per warp
  static constexpr int kWarpCols = BN / WN;             // features per warp
  static constexpr int kMT = kWarpRows / 16;            // m16 accumulator tiles per warp
  static constexpr int kNT = kWarpCols / 8;             // n8 accumulator tiles per warp
  static constexpr int kLds = BK + 8;                   // shared-memory row stride (elements)
  static constexpr int kStageElems = (BM + BN) * kLds;  // X tile, then W tile
  static constexpr size_t kSmem = sizeof(bf16_t) * kStageElems * Stages;
  static_assert(BK % 16 == 0 && kWarpRows % 16 == 0 && kWarpCols % 16 == 0, "mma tile shapes");
  static_assert(Stages >= 2, "a ring of at least two stages");
};

using SmallCfg = TileCfg<16, 64, 64, 1, 4, 4>;
using NarrowCfg = TileCfg<32, 32, 64, 2, 2, 6>;
using MidCfg = TileCfg<64, 64, 64, 2, 2, 4>;
using LargeCfg = TileCfg<128, 128, 32, 2, 4, 4>;

struct Args {
  const bf16_t* w;   // A: [m][k], row stride lda
  const bf16_t* x;   // B: [n][k], row stride ldb
  void* d;           // [n][m], row stride ldd, OutT
  const void* c;     // beta term, D's layout and type (D itself unless given)
  const void* bias;  // [m], OutT, or nullptr
  int64_t lda, ldb, ldd, m, n;
  int k;
  float alpha, beta;
  bool vec_w, vec_x;  // 16-byte cp.async staging of W / X rows
  bool pairs;         // two-element stores of out (ldd even, d aligned to two elements)
};

// The fixed epilogue of one element (header comment); c is read only when beta != 0.
template <typename OutT>
__device__ __forceinline__ float finish(float acc, const Args& a, const OutT* c, const OutT* bias,
                                        int64_t j) {
  float v = __fmul_rn(a.alpha, acc);
  if (a.beta != 0.0f) v = __fadd_rn(v, __fmul_rn(a.beta, to_f32(c[j])));
  if (bias != nullptr) v = __fadd_rn(v, to_f32(bias[j]));
  return v;
}

__device__ __forceinline__ void store_pair(float* p, float v0, float v1) {
  *reinterpret_cast<float2*>(p) = make_float2(v0, v1);
}
__device__ __forceinline__ void store_pair(bf16_t* p, float v0, float v1) {
  // Each value rounded on its own, exactly as the one-element store does.
  *reinterpret_cast<__nv_bfloat162*>(p) =
      __halves2bfloat162(__float2bfloat16_rn(v0), __float2bfloat16_rn(v1));
}

// Block (feature tile blockIdx.x, token tile blockIdx.y): out tile = X tile W tile^T over all of K.
template <class Cfg, typename OutT>
__global__ void __launch_bounds__(Cfg::kThreads) gemm_invariant_kernel(const Args a) {
  constexpr int kBM = Cfg::kBM, kBN = Cfg::kBN, kBK = Cfg::kBK, kLds = Cfg::kLds;
  constexpr int kStages = Cfg::kStages, kThreads = Cfg::kThreads;
  constexpr int kMT = Cfg::kMT, kNT = Cfg::kNT;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16_t* smem = reinterpret_cast<bf16_t*>(smem_raw);

  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kBN;  // first feature (column of out)
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kBM;  // first token (row of out)
  const int K = a.k;
  const int ktiles = (K + kBK - 1) / kBK;

  auto load = [&](int stage, int kt) {
    bf16_t* sx = smem + stage * Cfg::kStageElems;
    bf16_t* sw = sx + kBM * kLds;
    stage_tile<kBM, kBK, kThreads>(sx, a.x, a.ldb, t0, a.n, kt * kBK, K, a.vec_x);
    stage_tile<kBN, kBK, kThreads>(sw, a.w, a.lda, j0, a.m, kt * kBK, K, a.vec_w);
  };
  // Prologue: k-tiles 0 .. kStages-2, one commit group each (empty groups past the last tile keep
  // the count of groups, and so the wait below, uniform).
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load(s, s);
    cp_async_commit();
  }

  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int wm = warp / Cfg::kWN, wn = warp % Cfg::kWN;
  const LaneOffsets lo(lane, kLds);
  // Byte offsets inside a stage of this lane's ldmatrix rows: X (A operand, rows = tokens) and
  // W (B operand from the row-major [feature][k] tile).
  const uint32_t x_off = 2u * static_cast<uint32_t>(wm * Cfg::kWarpRows * kLds + lo.a_off);
  const uint32_t w_off = 2u * static_cast<uint32_t>((kBM + wn * Cfg::kWarpCols) * kLds + lo.bn_off);
  const uint32_t smem_base = smem_u32(smem);
  constexpr uint32_t kStageBytes = 2u * Cfg::kStageElems;

  float acc[kMT][kNT][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
    }
  }

  for (int kt = 0; kt < ktiles; ++kt) {
    // Groups committed so far: kStages - 1 + kt; leaving kStages - 2 in flight completes tile kt.
    // The barrier also ends every warp's reads of tile kt - 1, whose stage is refilled next.
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int next = kt + kStages - 1;
    if (next < ktiles) load(next % kStages, next);
    cp_async_commit();

    const uint32_t base = smem_base + static_cast<uint32_t>(kt % kStages) * kStageBytes;
    const int k0 = kt * kBK;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      // Chunks at or past K are skipped (block-uniform): the chain has ceil(K/16) steps whatever
      // kBK is (header comment).
      if (k0 + kk * 16 < K) {
        mma_k16_step(acc, base + x_off, base + w_off, kLds, kk);
      }
    }
  }
  cp_async_wait<0>();  // only empty groups remain; nothing in flight when the block exits

  // Epilogue: acc[mt][nt] holds tokens (g, g + 8) x features (2 tq, 2 tq + 1) of its 16 x 8 tile.
  const int g = lane >> 2, tq = lane & 3;
  OutT* out = static_cast<OutT*>(a.d);
  const OutT* cm = static_cast<const OutT*>(a.c);
  const OutT* bias = static_cast<const OutT*>(a.bias);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t t = t0 + wm * Cfg::kWarpRows + mt * 16 + g + 8 * half;
      if (t >= a.n) continue;
      OutT* drow = out + t * a.ldd;
      const OutT* crow = cm + t * a.ldd;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const int64_t j = j0 + wn * Cfg::kWarpCols + nt * 8 + 2 * tq;
        if (j >= a.m) continue;
        const float v0 = finish(acc[mt][nt][2 * half], a, crow, bias, j);
        if (j + 1 < a.m) {
          // Both C values are read before either store (C may be D).
          const float v1 = finish(acc[mt][nt][2 * half + 1], a, crow, bias, j + 1);
          if (a.pairs) {
            store_pair(drow + j, v0, v1);
          } else {
            drow[j] = from_f32<OutT>(v0);
            drow[j + 1] = from_f32<OutT>(v1);
          }
        } else {
          drow[j] = from_f32<OutT>(v0);
        }
      }
    }
  }
}

bool aligned(const void* p, size_t n) {
  return reinterpret_cast<uintptr_t>(p) % n == 0;
}

template <class Cfg, typename OutT>
void launch(const CudaContext& ctx, const Args& a, const char* what) {
  const int64_t gx = ceil_div(a.m, Cfg::kBN), gy = ceil_div(a.n, Cfg::kBM);
  VERL_CUDA_REQUIRE(gx < (int64_t{1} << 31) && gy <= 65535,
                    std::string(what) + ": batch-invariant GEMM with m=" + std::to_string(a.m) +
                        " n=" + std::to_string(a.n) + " needs more blocks than one grid holds");
  const auto kernel = gemm_invariant_kernel<Cfg, OutT>;
  allow_dynamic_smem(kernel, Cfg::kSmem);
  kernel<<<dim3(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), Cfg::kThreads, Cfg::kSmem,
           ctx.stream>>>(a);
  VERL_CUDA_CHECK_LAUNCH();
}

template <class Cfg>
int64_t blocks_of(const Args& a) {
  return ceil_div(a.m, Cfg::kBN) * ceil_div(a.n, Cfg::kBM);
}

// The configuration (any choice gives the same bits): the largest tile whose grid still fills the
// GPU twice over (a decode GEMM with m = 896 outputs has 14 large tiles at n = 256, so it takes
// the narrow ones), else the narrow one; at most 16 tokens take the small tile that fits them.
template <typename OutT>
void launch_by_rows(const CudaContext& ctx, const Args& a, const char* what) {
  const int64_t fill = int64_t{2} * cuda_sm_count();
  if (a.n <= SmallCfg::kBM) {
    launch<SmallCfg, OutT>(ctx, a, what);
  } else if (a.n > MidCfg::kBM && blocks_of<LargeCfg>(a) >= fill) {
    launch<LargeCfg, OutT>(ctx, a, what);
  } else if (blocks_of<MidCfg>(a) >= fill) {
    launch<MidCfg, OutT>(ctx, a, what);
  } else {
    launch<NarrowCfg, OutT>(ctx, a, what);
  }
}

}  // namespace

void run_gemm_invariant(const CudaContext& ctx, const Gemm& g, const char* what) {
  // The messages are built only on failure (no host allocation per call in the decode loop).
  const auto op = [what] { return std::string(what) + " (batch-invariant GEMM)"; };
  VERL_CUDA_REQUIRE(g.ta == CUBLAS_OP_T && g.tb == CUBLAS_OP_N && g.ab_type == CUDA_R_16BF,
                    op() + ": only op(A) = A^T, op(B) = B with bf16 A and B (the forward form)");
  VERL_CUDA_REQUIRE(g.d_type == CUDA_R_16BF || g.d_type == CUDA_R_32F,
                    op() + ": D must be bf16 or fp32");
  VERL_CUDA_REQUIRE(g.m >= 1 && g.n >= 1 && g.k >= 1 && g.k < (int64_t{1} << 30) && g.lda >= g.k &&
                        g.ldb >= g.k && g.ldd >= g.m,
                    shape_str(op().c_str(), {g.m, g.n, g.k, g.lda, g.ldb, g.ldd}) +
                        " = (m, n, k, lda, ldb, ldd): need m, n, k >= 1, lda >= k, ldb >= k, "
                        "ldd >= m");
  VERL_CUDA_REQUIRE(g.a != nullptr && g.b != nullptr && g.d != nullptr,
                    op() + ": A, B and D must be given");
  Args a{};
  a.w = static_cast<const bf16_t*>(g.a);
  a.x = static_cast<const bf16_t*>(g.b);
  a.d = g.d;
  a.c = g.c != nullptr ? g.c : g.d;
  a.bias = g.bias;
  a.lda = g.lda;
  a.ldb = g.ldb;
  a.ldd = g.ldd;
  a.m = g.m;
  a.n = g.n;
  a.k = static_cast<int>(g.k);
  a.alpha = g.alpha;
  a.beta = g.beta;
  a.vec_w = g.lda % 8 == 0 && aligned(g.a, 16);
  a.vec_x = g.ldb % 8 == 0 && aligned(g.b, 16);
  const size_t out_bytes = g.d_type == CUDA_R_32F ? sizeof(float) : sizeof(bf16_t);
  a.pairs = g.ldd % 2 == 0 && aligned(g.d, 2 * out_bytes);
  if (g.d_type == CUDA_R_32F) {
    launch_by_rows<float>(ctx, a, what);
  } else {
    launch_by_rows<bf16_t>(ctx, a, what);
  }
}

}  // namespace verl::ops::cuda::detail
