// Small element-wise kernels that glue the ops into a model (src/ops/cuda/glue.cu): the residual
// add, fp32 <-> bf16 conversion, and the split / pack of the fused q|k|v projection rows, alone
// or fused with RoPE (src/ops/cuda/rope.cu, the same kernel as rope_forward / rope_backward).
// Same conventions as ops_cuda.h: enqueued on ctx.stream, no synchronisation, sizes of 0 no-ops.
#pragma once

#include <cstdint>

#include "ops/cuda/ops_cuda.h"

namespace verl::ops::cuda {

// y[i] = bf16(y[i] + x[i]) (fp32 add, one rounding).
void add_inplace(const CudaContext& ctx, bf16* y, const bf16* x, int64_t n);
// out[i] = bf16(x[i]) / out[i] = float(x[i]).
void convert(const CudaContext& ctx, bf16* out, const float* x, int64_t n);
void convert(const CudaContext& ctx, float* out, const bf16* x, int64_t n);
// qkv[T, qd+2kvd] -> q[T,qd], k[T,kvd], v[T,kvd] (contiguous copies).
void split_qkv(const CudaContext& ctx, bf16* q, bf16* k, bf16* v, const bf16* qkv, int64_t T,
               int64_t qd, int64_t kvd);
// d_qkv[T, qd+2kvd] = [d_q | d_k | d_v] rounded to bf16 (overwrites). Sources fp32 or bf16.
void pack_qkv(const CudaContext& ctx, bf16* d_qkv, const float* d_q, const float* d_k,
              const float* d_v, int64_t T, int64_t qd, int64_t kvd);
void pack_qkv(const CudaContext& ctx, bf16* d_qkv, const bf16* d_q, const bf16* d_k,
              const float* d_v, int64_t T, int64_t qd, int64_t kvd);

// split_qkv then rope_forward on q [T,H,D] and k [T,Hkv,D], in one pass over qkv [T, (H+2Hkv)D]:
// the same bits as the two steps (fp32 rotation, one rounding). q, k, v are overwritten.
void split_qkv_rope(const CudaContext& ctx, bf16* q, bf16* k, bf16* v, const bf16* qkv,
                    const int32_t* pos, const float* inv_freq, int64_t T, int64_t H, int64_t Hkv,
                    int64_t D);
// rope_backward on d_q [T,H,D] and d_k [T,Hkv,D] (fp32, read only here: not rotated in place),
// then pack_qkv into d_qkv [T, (H+2Hkv)D] (overwritten): the same bits as the two steps (the
// fp32 rotation rounded once to bf16).
void rope_backward_pack_qkv(const CudaContext& ctx, bf16* d_qkv, const float* d_q, const float* d_k,
                            const float* d_v, const int32_t* pos, const float* inv_freq, int64_t T,
                            int64_t H, int64_t Hkv, int64_t D);

// Rows of row-major matrices by index (rows: device int32 [n], each in range): gather_rows writes
// out[i, :] = in[rows[i], :] for i < n; scatter_rows writes out[rows[i], :] = in[i, :] and leaves
// out's other rows as they are. `width` elements a row. Copies, no arithmetic: bit for bit.
void gather_rows(const CudaContext& ctx, bf16* out, const bf16* in, const int32_t* rows, int64_t n,
                 int64_t width);
void gather_rows(const CudaContext& ctx, float* out, const float* in, const int32_t* rows,
                 int64_t n, int64_t width);
void gather_rows(const CudaContext& ctx, int32_t* out, const int32_t* in, const int32_t* rows,
                 int64_t n, int64_t width);
void scatter_rows(const CudaContext& ctx, bf16* out, const bf16* in, const int32_t* rows, int64_t n,
                  int64_t width);
void scatter_rows(const CudaContext& ctx, float* out, const float* in, const int32_t* rows,
                  int64_t n, int64_t width);

// Keeps the stream busy for about `microseconds` of GPU time (a one-thread kernel polling the
// global timer). Profiling puts one before a step so the host enqueues the whole step while the
// GPU waits: the events between kernels then time the kernels, not the launch gaps.
void gpu_spin(const CudaContext& ctx, uint32_t microseconds);

}  // namespace verl::ops::cuda
