// Tensor-core and async-copy building blocks shared by the mma.sync kernels of src/ops/cuda
// (attention, the batch-invariant GEMM, the quantised GEMM): PTX wrappers for ldmatrix, mma.sync
// m16n8k16 bf16 -> fp32 and cp.async, bf16 packing, staging a bf16 tile into shared memory and the
// per-lane ldmatrix offsets. Internal to src/ops/cuda.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstring>

namespace verl::ops::cuda::detail {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, and register i of
// lane l receives row l/4, columns 2(l%4), 2(l%4)+1 of matrix i (.trans: of its transpose).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c[16x8] += a[16x16] b[16x8]. With g = lane/4, t = lane%4: a holds rows (g, g+8) x columns
// (2t, 2t+1, 2t+8, 2t+9), b holds k rows (2t, 2t+1, 2t+8, 2t+9) of column g, c holds rows
// (g, g+8) x columns (2t, 2t+1) as c[0..1] (row g) and c[2..3] (row g+8).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One 16-input k-step of a warp's MT x NT tile of 16 x 8 accumulators over bf16 tiles in shared
// memory with row stride lds (elements): the A tile (rows = tokens) at shared address a, the B
// tile (rows = features) at b, each with the warp's and the lane's ldmatrix offsets added; inputs
// 16kk..16kk+15. The inner step of the batch-invariant and the quantised GEMMs.
template <int MT, int NT>
__device__ __forceinline__ void mma_k16_step(float (&acc)[MT][NT][4], uint32_t a, uint32_t b,
                                             int lds, int kk) {
  uint32_t af[MT][4], bfr[NT / 2][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    ldsm_x4(af[mt], a + 2u * static_cast<uint32_t>(mt * 16 * lds + kk * 16));
  }
#pragma unroll
  for (int np = 0; np < NT / 2; ++np) {
    ldsm_x4(bfr[np], b + 2u * static_cast<uint32_t>(np * 16 * lds + kk * 16));
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      mma_bf16(acc[mt][2 * np], af[mt], bfr[np][0], bfr[np][1]);
      mma_bf16(acc[mt][2 * np + 1], af[mt], bfr[np][2], bfr[np][3]);
    }
  }
}

// Two fp32 -> one register of two bf16 (round to nearest even); lo is the lower column.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
}

// The A fragment (16 x 16, k = columns 16kk..16kk+15) of a product whose left operand is the
// accumulator tile pair c0 (columns 0..7) and c1 (columns 8..15), rounded to bf16.
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c0)[4],
                                         const float (&c1)[4]) {
  a[0] = pack_bf16(c0[0], c0[1]);
  a[1] = pack_bf16(c0[2], c0[3]);
  a[2] = pack_bf16(c1[0], c1[1]);
  a[3] = pack_bf16(c1[2], c1[3]);
}

// 2^x on the special function unit (relative error ~2^-22); 2^-inf = 0.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst),
               "l"(__cvta_generic_to_global(src)));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Stages rows [r0, r0 + kRows) x columns [k0, k0 + kBK) of a row-major bf16 matrix (row r at
// src + r ld; `rows` rows, K columns) into dst [kRows][kBK + 8]; rows >= `rows` and columns >= K
// become zero. vec: 16-byte cp.async for chunks wholly inside K (the caller commits); otherwise,
// and for a chunk straddling K, plain element loads. Both copy the bits unchanged.
template <int kRows, int kBK, int kThreads>
__device__ __forceinline__ void stage_tile(__nv_bfloat16* dst, const __nv_bfloat16* src, int64_t ld,
                                           int64_t r0, int64_t rows, int k0, int K, bool vec) {
  constexpr int kLds = kBK + 8;
  constexpr int kChunks = kBK / 8;  // 16-byte chunks per row
  constexpr int kTotal = kRows * kChunks;
  constexpr int kIters = (kTotal + kThreads - 1) / kThreads;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int e = it * kThreads + static_cast<int>(threadIdx.x);
    if (kTotal % kThreads == 0 || e < kTotal) {
      const int r = e / kChunks, col = (e % kChunks) * 8;
      __nv_bfloat16* d = dst + r * kLds + col;
      const int64_t row = r0 + r;
      const int kc = k0 + col;
      if (row < rows && kc < K) {
        const __nv_bfloat16* s = src + row * ld + kc;
        if (vec && kc + 8 <= K) {
          cp_async_16(smem_u32(d), s);
        } else {
          const uint16_t* raw = reinterpret_cast<const uint16_t*>(s);
          const int valid = K - kc < 8 ? K - kc : 8;
          uint32_t u[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint32_t lo = 2 * i < valid ? raw[2 * i] : 0u;
            const uint32_t hi = 2 * i + 1 < valid ? raw[2 * i + 1] : 0u;
            u[i] = lo | (hi << 16);  // the lower k in the lower half (little-endian bf16 pairs)
          }
          *reinterpret_cast<uint4*>(d) = make_uint4(u[0], u[1], u[2], u[3]);
        }
      } else {
        *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  }
}

// Per-lane offsets (in elements, for a tile with row stride lds) of the three ldmatrix.x4 uses:
//  a_off:  A operand, 16 rows x 16 k of a row-major [row][k] tile -> a[0..3].
//  bn_off: B operand of 16 n x 16 k from a row-major [n][k] tile (B = tile^T): regs 0,1 are the
//          b0,b1 of n 0..7 and regs 2,3 those of n 8..15.
//  bt_off: B operand of 16 k x 16 n from a row-major [k][n] tile (.trans): same register order.
struct LaneOffsets {
  int a_off, bn_off, bt_off;
  __device__ LaneOffsets(int lane, int lds) {
    a_off = (lane & 15) * lds + (lane >> 4) * 8;
    bn_off = ((lane & 7) + ((lane >> 4) << 3)) * lds + ((lane >> 3) & 1) * 8;
    bt_off = ((lane & 7) + (((lane >> 3) & 1) << 3)) * lds + (lane >> 4) * 8;
  }
};

}  // namespace verl::ops::cuda::detail
