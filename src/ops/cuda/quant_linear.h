// Linear layers over weight-only quantised matrices (model/quantize.h; docs/reward_model.md,
// "Quantisation"): y[T,N] = x[T,K] deq(W)[N,K]^T (+ b[N]), bf16 in and out, fp32 accumulation.
// The forward-only model (a reward model, a reference policy) keeps its linear matrices in this
// form on the device instead of bf16: about 1 byte (int8) or 0.55 byte (int4, group 128) a weight
// against 2.
//
// Device storage of one [N, K] matrix (QuantMatrixView; model/cuda/quantized_linears.h uploads it
// from a model::QuantizedMatrix):
//   codes  [N][ld] bytes, ld = the row's bytes rounded up to 16 (zero padded), so that every row
//          starts 16-byte aligned whatever K is: int8 one signed code a weight (K bytes a row),
//          int4 two unsigned codes a byte, low nibble first (ceil(K/2) bytes a row);
//   scales [N][G] fp32, G = ceil(K / group) (int8: G = 1, group = K), the host's values exactly;
//   zeros  [N][G] uint8, int4 only: w ~ (q - z) s; int8 is symmetric: w ~ q s.
//
// Two ways to compute the product (QuantPath), both on ctx.stream with no allocation:
//   Fused:   one kernel stages x and the raw codes tile by tile (cp.async), dequantises the codes
//            into a bf16 tile in shared memory and feeds mma.sync (quant_linear.cu). Weight bytes
//            read once: what pays when the GEMM is memory-bound (few tokens: decode-like scoring,
//            small batches). int8 multiplies the integer codes (exact in bf16) and applies the
//            row's scale in the epilogue; int4 rounds (q - z) s to bf16.
//   Dequant: the whole matrix is dequantised into a caller-provided bf16 scratch [N, K] (rounded
//            once, (q - z) s in fp32) and the cuBLASLt linear_forward runs on it: for many tokens,
//            where the GEMM is compute-bound and cuBLASLt's kernels beat the fused one. Memory:
//            one matrix of scratch, shared by every layer.
// Auto takes Fused up to fused_max_tokens tokens (or when no scratch is given) and Dequant above.
// int4 with a group that is not a multiple of 8 (and more than one group a row) always takes
// Dequant (a fused 8-weight chunk must sit in one group).
#pragma once

#include <cstdint>

#include "ops/cuda/ops_cuda.h"

namespace verl::ops::cuda {

// A quantised [rows = N, cols = K] matrix on the device (header comment for the layout).
struct QuantMatrixView {
  int bits = 8;                    // 8 or 4
  int64_t rows = 0, cols = 0;      // N outputs, K inputs
  int64_t group = 0;               // inputs per scale (int8: cols)
  int64_t ld = 0;                  // bytes between rows of codes (quant_codes_stride)
  const uint8_t* codes = nullptr;  // [rows][ld]
  const float* scales = nullptr;   // [rows][groups()]
  const uint8_t* zeros = nullptr;  // int4: [rows][groups()]; int8: null
  int64_t groups() const { return group > 0 ? (cols + group - 1) / group : 0; }
  // Device bytes of the three arrays.
  size_t bytes() const {
    const auto g = static_cast<size_t>(rows * groups());
    return static_cast<size_t>(rows * ld) + 4 * g + (bits == 4 ? g : 0);
  }
};

// The device row stride of the codes: the row's bytes rounded up to 16.
int64_t quant_codes_stride(int bits, int64_t cols);

// Gemv: at most 8 tokens (quant_gemv_supported), the codes streamed from global memory into
// registers, dequantised there and multiplied with an x chunk staged in shared memory: no
// shared-memory round trip for the weights (quant_linear.cu). Auto takes it up to
// quant_gemv_auto_max_tokens tokens.
enum class QuantPath { Auto, Fused, Dequant, Gemv };

// Auto's GEMV crossover: int8 up to 4 tokens, int4 up to 2. Measured on the H200 (`verl bench
// quant-linear --tokens 1 2 4 8`, the 1.5B and 7B matrices, docs/benchmarks.md 2026-12-04): at
// T = 1 the GEMV kernel takes 0.42-0.98x bf16 cuBLASLt's time for int8 and 0.44-1.19x for int4
// (the fused kernel 0.74-1.90x), and it is faster than the fused kernel at every matrix up to
// T = 2; at T = 4 int8 still wins at all eight, int4 at five; at T = 8 it loses at seven of eight.
inline constexpr int64_t quant_gemv_auto_max_tokens(int bits) {
  return bits == 8 ? 4 : 2;
}

// Whether QuantPath::Gemv takes this product: 1 <= T <= 8, K a multiple of 8 with x 16-byte
// aligned, int8, or int4 with groups of a multiple of 32 inputs (or one group a row).
bool quant_gemv_supported(const QuantMatrixView& w, int64_t T, const bf16* x);

// Auto's default crossover: at most this many tokens take the fused kernel. Measured on the H200
// (`verl bench quant-linear`, 1.5B and 7B matrices, docs/benchmarks.md): the fused kernel beats
// dequantise + cuBLASLt at every matrix up to T = 32 (by 1.3-4x) and loses at T = 128 at most.
inline constexpr int64_t kQuantFusedMaxTokens = 32;

// Whether the fused kernel takes this matrix: int8, or int4 groups of a multiple of 8 inputs (or
// one group a row).
bool quant_fusable(const QuantMatrixView& w);

// The path QuantPath::Auto takes for T tokens: the GEMV kernel up to quant_gemv_auto_max_tokens
// where it applies, the fused kernel up to fused_max_tokens (or with no scratch), else
// dequantise + cuBLASLt (always for a matrix the fused kernel does not take).
QuantPath quant_auto_path(const QuantMatrixView& w, int64_t T, const bf16* x, bool have_scratch,
                          int64_t fused_max_tokens = kQuantFusedMaxTokens);

// y[T,N] = x[T,K] deq(w)^T (+ b[N]), overwritten. w.rows == N and w.cols == K. scratch: a bf16
// [N*K] buffer for the Dequant path (may be null when only Fused can be taken). The fused kernel
// may split K over blocks for small grids, through ctx.workspace (fp32 partial sums added in a
// fixed order: deterministic).
void quant_linear_forward(const CudaContext& ctx, bf16* y, const bf16* x, const QuantMatrixView& w,
                          const bf16* b, int64_t T, int64_t K, int64_t N, bf16* scratch,
                          QuantPath path = QuantPath::Auto,
                          int64_t fused_max_tokens = kQuantFusedMaxTokens);

// out[r*cols + c] = bf16((code - zero) * scale), row-major [rows, cols] (the Dequant path's
// first step; model::dequantize_matrix rounded to bf16).
void quant_dequantize(const CudaContext& ctx, bf16* out, const QuantMatrixView& w);

}  // namespace verl::ops::cuda
