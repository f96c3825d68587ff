// CUDA ops: the same math as the CPU reference ops (src/ops/cpu/ops.h, the oracle they are
// tested against), on device pointers. Each op's forward and backward live in
// src/ops/cuda/<op>.cu. Shape letters as in docs/ops.md; row-major throughout.
//
// Precision (docs/cuda.md): activations and weights are stored in bf16, all arithmetic and every
// reduction is fp32, weight gradients, master weights and optimizer moments are fp32. Where a
// bf16 op has an fp32 overload it is the same kernel with fp32 storage.
//
// Conventions, as the CPU ops: forward outputs are overwritten; backward outputs d_* are
// ACCUMULATED (+=), a null d_* skips that gradient; rope_backward works in place. Every op
// enqueues on ctx.stream and returns without synchronising; ops that need scratch take it from
// ctx.workspace (so two ops sharing a workspace must share a stream). Sizes of 0 are no-ops.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "ops/cuda/device.h"

namespace verl::ops::cuda {

using bf16 = __nv_bfloat16;

// ---- linear.cu: y = x W^T + b, HF nn.Linear layout (W is [N, K]), cuBLASLt
// ----------------------- y[T,N] = x[T,K] @ w[N,K]^T (+ b[N] when b != nullptr): bf16 tensor-core
// GEMM, fp32 accumulation, one rounding to bf16 (bias added in fp32 in the epilogue). Needs ctx.lt
// and ctx.workspace.
void linear_forward(const CudaContext& ctx, bf16* y, const bf16* x, const bf16* w, const bf16* b,
                    int64_t T, int64_t K, int64_t N);
// The same plus a residual in the GEMM epilogue: y = x W^T + b + residual (residual [T,N] bf16,
// read as the GEMM's C with beta = 1; added in fp32, one rounding; residual may equal y).
void linear_forward(const CudaContext& ctx, bf16* y, const bf16* x, const bf16* w, const bf16* b,
                    const bf16* residual, int64_t T, int64_t K, int64_t N);
// d_x[T,K] += d_y @ w (bf16, accumulated in fp32 then rounded);  d_w[N,K] += d_y^T @ x (fp32);
// d_b[N] += sum_t d_y[t] (fp32, a fixed two-pass partition of the rows through ctx.workspace:
// deterministic).
// accumulate_dx = false overwrites d_x instead (d_x = d_y @ w; no memset needed before).
void linear_backward(const CudaContext& ctx, bf16* d_x, float* d_w, float* d_b, const bf16* d_y,
                     const bf16* x, const bf16* w, int64_t T, int64_t K, int64_t N,
                     bool accumulate_dx = true);

// ---- embedding.cu -------------------------------------------------------------------------------
// out[t,:] = table[ids[t],:] (table [V,C]). The caller checks ids on the host (the data pipeline
// does); an id outside [0,V) gives a zero row here instead of reading out of bounds.
void embedding_forward(const CudaContext& ctx, bf16* out, const int32_t* ids, const bf16* table,
                       int64_t T, int64_t C, int64_t V);
void embedding_forward(const CudaContext& ctx, float* out, const int32_t* ids, const float* table,
                       int64_t T, int64_t C, int64_t V);
// d_table[ids[t],:] += d_out[t,:] by fp32 atomicAdd: repeated ids add in an unspecified order, so
// the last bits may differ run to run. Ids outside [0,V) are skipped.
void embedding_backward(const CudaContext& ctx, float* d_table, const bf16* d_out,
                        const int32_t* ids, int64_t T, int64_t C, int64_t V);
void embedding_backward(const CudaContext& ctx, float* d_table, const float* d_out,
                        const int32_t* ids, int64_t T, int64_t C, int64_t V);

// ---- rmsnorm.cu: HF LlamaRMSNorm
// ------------------------------------------------------------------ rstd[r] = 1/sqrt(mean_c
// x[r,c]^2 + eps) (fp32, may be null);  out[r,c] = w[c] * x[r,c] * rstd[r].
void rmsnorm_forward(const CudaContext& ctx, bf16* out, float* rstd, const bf16* x, const bf16* w,
                     int64_t R, int64_t C, float eps);
void rmsnorm_forward(const CudaContext& ctx, float* out, float* rstd, const float* x,
                     const float* w, int64_t R, int64_t C, float eps);
// The residual add fused in: x = x + resid (bf16, in place), then out = rmsnorm(x): bitwise
// add_inplace(x, resid) followed by rmsnorm_forward (the rollout's decode step saves a launch).
void add_rmsnorm_forward(const CudaContext& ctx, bf16* out, float* rstd, bf16* x, const bf16* resid,
                         const bf16* w, int64_t R, int64_t C, float eps);
// d_x[r,c] += rstd (w g) - rstd^3/C x sum_k(w g x);  d_w[c] += sum_r g x rstd (fp32; a fixed
// two-pass column reduction through ctx.workspace, at least C floats, so it is deterministic).
// accumulate_dx = false overwrites d_x instead (d_x = 0 + update: the bits of zeroing it first,
// without the memset or the read); d_w is always accumulated.
void rmsnorm_backward(const CudaContext& ctx, bf16* d_x, float* d_w, const bf16* d_out,
                      const bf16* x, const bf16* w, const float* rstd, int64_t R, int64_t C,
                      bool accumulate_dx = true);
void rmsnorm_backward(const CudaContext& ctx, float* d_x, float* d_w, const float* d_out,
                      const float* x, const float* w, const float* rstd, int64_t R, int64_t C,
                      bool accumulate_dx = true);

// ---- rope.cu: HF rotary embedding, "rotate_half" layout
// --------------------------------------------- In place on x[T, nh, D] (D even, at most 8192): a =
// pos[t] * inv_freq[i] in fp32, i < D/2,
//   x'[i] = x[i] cos a - x[i+D/2] sin a,  x'[i+D/2] = x[i+D/2] cos a + x[i] sin a.
// pos [T] and inv_freq [D/2] are device arrays. Fused with the q|k|v split / pack: glue.h.
void rope_forward(const CudaContext& ctx, bf16* x, const int32_t* pos, const float* inv_freq,
                  int64_t T, int64_t nh, int64_t D);
void rope_forward(const CudaContext& ctx, float* x, const int32_t* pos, const float* inv_freq,
                  int64_t T, int64_t nh, int64_t D);
// The rotation by -a, in place on d_x[T, nh, D] (overwrites).
void rope_backward(const CudaContext& ctx, bf16* d_x, const int32_t* pos, const float* inv_freq,
                   int64_t T, int64_t nh, int64_t D);
void rope_backward(const CudaContext& ctx, float* d_x, const int32_t* pos, const float* inv_freq,
                   int64_t T, int64_t nh, int64_t D);

// ---- swiglu.cu: HF LlamaMLP activation on the fused gate|up projection
// ---------------------------- gu[T, 2F] = [gate | up];  out[T,F] = silu(gate) * up.
void swiglu_forward(const CudaContext& ctx, bf16* out, const bf16* gu, int64_t T, int64_t F);
void swiglu_forward(const CudaContext& ctx, float* out, const float* gu, int64_t T, int64_t F);
// s = sigmoid(gate):  d_gate += d_out up s (1 + gate (1-s));  d_up += d_out silu(gate).
// accumulate = false overwrites d_gu instead (0 + update: the bits of zeroing it first, without
// the memset or the read).
void swiglu_backward(const CudaContext& ctx, bf16* d_gu, const bf16* d_out, const bf16* gu,
                     int64_t T, int64_t F, bool accumulate = true);
void swiglu_backward(const CudaContext& ctx, float* d_gu, const float* d_out, const float* gu,
                     int64_t T, int64_t F, bool accumulate = true);

// ---- adamw.cu: torch.optim.AdamW over flat fp32 master weights
// ------------------------------------ As cpu::adamw_step (g = grad * grad_scale; decoupled decay;
// bias-corrected moments; step from 1), on fp32 param/grad/m/v. When param_bf16 != nullptr the same
// kernel writes the updated weights rounded to bf16 there: the compute copy used by forward and
// backward.
void adamw_step(const CudaContext& ctx, float* param, bf16* param_bf16, const float* grad, float* m,
                float* v, int64_t n, float lr, float beta1, float beta2, float eps,
                float weight_decay, int64_t step, float grad_scale);

// ---- grad_norm.cu
// ---------------------------------------------------------------------------------- *out = sum_i
// x[i]^2 in double (a device scalar; overwritten). Two passes with a fixed partition of x into
// blocks, so the result is the same on every run and every GPU. Uses 2 KiB of ctx.workspace.
void sum_squares(const CudaContext& ctx, double* out, const float* x, int64_t n);

}  // namespace verl::ops::cuda
