// The token-classification head on CUDA (the critic's value head, HF ...ForTokenClassification
// "score" layer): values[t, n] = h[t,:] . w[n,:] + b[n] for n < NL (NL = num_labels, 1 for a
// critic), the same math as the CPU model's linear head (src/model/cpu/decoder.cpp), in fp32.
// NL is small, so these are plain reductions rather than GEMMs: the values stay fp32 (a bf16 GEMM
// output would round them to 8 bits) and every sum runs in a fixed order (deterministic).
// Conventions as ops_cuda.h: values are overwritten; d_h, d_w, d_b are ACCUMULATED (+=), a null
// one is skipped; enqueued on ctx.stream, no synchronisation.
#pragma once

#include <cstdint>

#include "ops/cuda/ops_cuda.h"

namespace verl::ops::cuda {

// h [T,C] bf16, w [NL,C] bf16, b [NL] bf16 or null -> values [T,NL] fp32.
void value_head_forward(const CudaContext& ctx, float* values, const bf16* h, const bf16* w,
                        const bf16* b, int64_t T, int64_t C, int64_t NL);

// d_h[t,c] += sum_n d_values[t,n] w[n,c] (bf16, one rounding);  d_w[n,c] += sum_t d_values[t,n]
// h[t,c] and d_b[n] += sum_t d_values[t,n] (fp32; a fixed two-pass partition of the rows through
// ctx.workspace, at least NL*(C+1) floats).
void value_head_backward(const CudaContext& ctx, bf16* d_h, float* d_w, float* d_b,
                         const float* d_values, const bf16* h, const bf16* w, int64_t T, int64_t C,
                         int64_t NL);

}  // namespace verl::ops::cuda
