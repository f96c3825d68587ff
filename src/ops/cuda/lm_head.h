// LM head fused with log-softmax, target gather and entropy on CUDA: the same math as
// cpu::lm_head_forward / cpu::lm_head_backward (src/ops/cpu/ops.h, the oracle), on device
// pointers. Implemented in src/ops/cuda/lm_head.cu.
//
//   z[t,:]     = (h[t,:] @ w^T) / temperature       h [T,C] bf16, w [V,C] bf16 (HF lm_head layout)
//   lse[t]     = logsumexp(z[t,:])                   (saved for the backward)
//   logprob[t] = z[t,target] - lse[t]                (0 when targets[t] < 0: no next token)
//   entropy[t] = -sum_j p_j log p_j = lse[t] - sum_j p_j z[t,j]
//
// Tokens are processed in chunks of `chunk` rows (chunk <= 0 or > T means T), so only chunk x V
// fp32 logits exist at once. Per chunk: one cuBLASLt GEMM (bf16 operands, fp32 accumulation, fp32
// logits, 1/temperature as its alpha), then one block per row that reads the row once (float4
// loads) with online statistics per thread (running max m, sum of e^(z-m) and of e^(z-m)(z-m),
// rescaled when m grows), combined warp by warp then across warps in a fixed order (all fp32, no
// atomics: the results are bitwise reproducible).
//
// Backward (the logits are recomputed per chunk; lse and entropy come from the forward), with
// log p_j = z_j - lse and H = entropy:
//   d_z_j = d_logprob (1[j==target] - p_j) - d_entropy p_j (log p_j + H),   scaled by 1/temperature
//   d_h[T,C] += d_z @ w      (bf16, beta = 1: accumulated in fp32 inside the GEMM, rounded once;
//                             every row of d_h belongs to one chunk, so one rounding per call)
//   d_w[V,C] += d_z^T @ h    (fp32: the fp32 gradient buffer; accumulated over chunks in fp32)
// Precision: d_z is computed in fp32 and stored as bf16 (a relative error of at most u = 2^-8 per
// element, see below) as the operand of both GEMMs, which accumulate in fp32. So d_h and d_w carry
// an error of about 2^-8 of sum_j |d_z_j| |w_j| (resp. sum_t |d_z_t| |h_t|) relative to the fp32
// CPU op: bounded by the magnitude of the terms, not of the (possibly cancelled) sum.
//
// Conventions, as the other CUDA ops (ops_cuda.h): forward outputs logprob, entropy, lse (fp32
// [T], each may be null) are overwritten; backward outputs d_h, d_w are ACCUMULATED (+=), a null
// one is skipped; a null d_logprob or d_entropy counts as zero. Everything is enqueued on
// ctx.stream without synchronising. The GEMMs take ctx.workspace (cuBLASLt), so the logits need
// their own scratch:
//   - the overloads with (scratch, scratch_bytes) use a caller-provided device buffer of at least
//     lm_head_forward_scratch_bytes / lm_head_backward_scratch_bytes; like ctx.workspace it may be
//     reused by the next op on the same stream once this one is enqueued;
//   - the DeviceArena overloads take that many bytes from the arena (a slice that stays taken
//     until the arena's next reset(); reserve it once per phase, no cudaMalloc in the step loop).
//
// Kept probabilities (lm_head_forward_keep_probs / lm_head_backward_from_probs): the forward also
// writes p[t,j] = e^(z[t,j] - lse[t]) as bf16 to a caller buffer probs [T,V] (T x V x 2 bytes,
// lm_head_probs_bytes; a second pass over each row of the chunk's logits, after its lse), and the
// backward forms d_z from it instead of recomputing the logits GEMM and reading them in fp32:
//   d_z_j = (d_logprob (1[j==target] - p~_j) - d_entropy p~_j (log p~_j + H)) / temperature
// with p~ the stored bf16 p and log p~_j = log(p~_j) (p~_j == 0 contributes 0). The forward's
// outputs are bitwise those of lm_head_forward.
// Precision: with u = 2^-8 the unit roundoff of bf16 (8 significant bits: half an ulp is 2^-8 of a
// value at the bottom of its binade, 2^-9 at the top), p~_j = p_j (1 + e_j), |e_j| <= u
// (plus a few fp32 ulp of exp; for p_j < 2^-126, subnormal, an absolute error below 2^-134), so
// |log p~_j - log p_j| <= u (1 + u) and, per element, before d_z's own bf16 rounding,
//   |d_z~_j - d_z_j| <= u (1 + u) p_j (|d_logprob| + |d_entropy| (|log p_j + H| + 1)) / temperature
// i.e. at most u of the magnitude of the p-terms (not of d_z_j, which may cancel). With d_z's bf16
// storage (another u of |d_z_j|), d_h and d_w are within about 2u of sum_j b_j |w_j| (resp.
// sum_t b_t |h_t|), b_j = (|d_logprob| (1[j==target] + p_j) + |d_entropy| p_j (|log p_j + H| + 1))
// / temperature, of the fp32 CPU op (tests/cuda/test_lm_head.cpp checks it, kLmHeadGradKeptProbs).
//
// Targets: a device array [T] of int32 (may be null: no targets, logprob = 0 and no logprob
// gradient). The caller checks ids against V on the host (the data pipeline does); an id >= V is
// treated like a negative one here (logprob 0, no gradient) instead of reading out of bounds.
// Shapes: T >= 0, C >= 1, V >= 1, temperature > 0; T == 0 is a no-op.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/cuda/ops_cuda.h"

namespace verl::ops::cuda {

// Scratch bytes for one call: the forward needs chunk x V fp32 logits; the backward also a
// chunk x V bf16 d_z (plus alignment padding). `chunk` is normalised as in the ops.
size_t lm_head_forward_scratch_bytes(int64_t T, int64_t V, int64_t chunk);
size_t lm_head_backward_scratch_bytes(int64_t T, int64_t V, int64_t chunk);
// Kept-probabilities mode: the caller's probs buffer holds T x V bf16 (lm_head_probs_bytes); the
// forward's scratch is lm_head_forward_scratch_bytes; the backward's only the chunk x V bf16 d_z.
size_t lm_head_probs_bytes(int64_t T, int64_t V);
size_t lm_head_backward_from_probs_scratch_bytes(int64_t T, int64_t V, int64_t chunk);

void lm_head_forward(const CudaContext& ctx, float* logprob, float* entropy, float* lse,
                     const bf16* h, const bf16* w, const int32_t* targets, int64_t T, int64_t C,
                     int64_t V, float temperature, int64_t chunk, void* scratch,
                     size_t scratch_bytes);
void lm_head_forward(const CudaContext& ctx, DeviceArena& arena, float* logprob, float* entropy,
                     float* lse, const bf16* h, const bf16* w, const int32_t* targets, int64_t T,
                     int64_t C, int64_t V, float temperature, int64_t chunk);

// lse is required; entropy is required when d_entropy is given (both as saved by the forward).
void lm_head_backward(const CudaContext& ctx, bf16* d_h, float* d_w, const float* d_logprob,
                      const float* d_entropy, const bf16* h, const bf16* w, const int32_t* targets,
                      const float* lse, const float* entropy, int64_t T, int64_t C, int64_t V,
                      float temperature, int64_t chunk, void* scratch, size_t scratch_bytes);
void lm_head_backward(const CudaContext& ctx, DeviceArena& arena, bf16* d_h, float* d_w,
                      const float* d_logprob, const float* d_entropy, const bf16* h, const bf16* w,
                      const int32_t* targets, const float* lse, const float* entropy, int64_t T,
                      int64_t C, int64_t V, float temperature, int64_t chunk);

// The forward that also keeps p (bf16 [T,V], row stride V, overwritten) for the backward below.
void lm_head_forward_keep_probs(const CudaContext& ctx, float* logprob, float* entropy, float* lse,
                                bf16* probs, const bf16* h, const bf16* w, const int32_t* targets,
                                int64_t T, int64_t C, int64_t V, float temperature, int64_t chunk,
                                void* scratch, size_t scratch_bytes);
void lm_head_forward_keep_probs(const CudaContext& ctx, DeviceArena& arena, float* logprob,
                                float* entropy, float* lse, bf16* probs, const bf16* h,
                                const bf16* w, const int32_t* targets, int64_t T, int64_t C,
                                int64_t V, float temperature, int64_t chunk);

// The backward from the kept p (as written by lm_head_forward_keep_probs for the same h, w, targets
// and temperature; it is only read, so the backward may run more than once). entropy is required
// when d_entropy is given; lse is not needed. Same accumulation conventions as lm_head_backward.
void lm_head_backward_from_probs(const CudaContext& ctx, bf16* d_h, float* d_w,
                                 const float* d_logprob, const float* d_entropy, const bf16* probs,
                                 const bf16* h, const bf16* w, const int32_t* targets,
                                 const float* entropy, int64_t T, int64_t C, int64_t V,
                                 float temperature, int64_t chunk, void* scratch,
                                 size_t scratch_bytes);
void lm_head_backward_from_probs(const CudaContext& ctx, DeviceArena& arena, bf16* d_h, float* d_w,
                                 const float* d_logprob, const float* d_entropy, const bf16* probs,
                                 const bf16* h, const bf16* w, const int32_t* targets,
                                 const float* entropy, int64_t T, int64_t C, int64_t V,
                                 float temperature, int64_t chunk);

}  // namespace verl::ops::cuda
