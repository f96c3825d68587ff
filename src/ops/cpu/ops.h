// CPU reference ops, fp32, row-major. Each op's forward and backward live in one file
// (src/ops/cpu/<op>.cpp); this header is the whole interface. These are the oracle that every
// optimised backend is tested against.
//
// Shapes (see docs/design.md): T tokens in a packed batch, B sequences, C hidden size,
// H query heads, Hkv key/value heads, D head dim, F MLP intermediate size, V vocabulary.
// Packed batches: sequence b owns tokens [cu_seqlens[b], cu_seqlens[b+1]); no padding.
//
// Conventions: forward outputs are overwritten. Backward outputs (d_*) are ACCUMULATED (+=),
// so callers zero them first; a null d_* pointer skips that gradient.
#pragma once

#include <cstdint>

namespace verl::ops::cpu {

// ---- linear.cpp: y = x W^T + b, HF nn.Linear layout (W is [N, K]) -------------------------------
// y[T,N] = x[T,K] @ w[N,K]^T (+ b[N] when b != nullptr). OpenBLAS sgemm.
void linear_forward(float* y, const float* x, const float* w, const float* b, int64_t T, int64_t K,
                    int64_t N);
// d_x[T,K] += d_y @ w;  d_w[N,K] += d_y^T @ x;  d_b[N] += sum_t d_y[t].
void linear_backward(float* d_x, float* d_w, float* d_b, const float* d_y, const float* x,
                     const float* w, int64_t T, int64_t K, int64_t N);

// ---- linear_invariant.cpp: the same y = x W^T + b, batch-invariant -----------------------------
// Each y[t,n] is computed by one fixed sequence of float operations (8-lane FMA partial sums over
// k, a fixed reduction tree, a scalar tail, then + b[n]) whatever T is and wherever row t sits.
// So a token's output does not depend on what else is in the batch: the rollout uses it, and a
// sequence decoded alone, in a batch, or recomputed after preemption gets bit-identical results.
void linear_forward_invariant(float* y, const float* x, const float* w, const float* b, int64_t T,
                              int64_t K, int64_t N);

// ---- embedding.cpp
// ------------------------------------------------------------------------------- out[t,:] =
// table[ids[t],:]  (table [V,C]). ids must be in [0, V); checked, naming the position.
void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t T, int64_t C,
                       int64_t V);
// d_table[ids[t],:] += d_out[t,:]
void embedding_backward(float* d_table, const float* d_out, const int32_t* ids, int64_t T,
                        int64_t C);

// ---- rmsnorm.cpp: HF LlamaRMSNorm
// ---------------------------------------------------------------- rstd[r] = 1/sqrt(mean_c x[r,c]^2
// + eps);  out[r,c] = w[c] * x[r,c] * rstd[r]. R rows of C. Also used per head for Qwen3 q/k-norm
// (R = T*H, C = D).
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t R, int64_t C,
                     float eps);
void rmsnorm_backward(float* d_x, float* d_w, const float* d_out, const float* x, const float* w,
                      const float* rstd, int64_t R, int64_t C);

// ---- rope.cpp: HF rotary embedding, "rotate_half" layout
// ------------------------------------------ For each token t, head h and i < D/2, with angle a =
// pos[t] * inv_freq[i]:
//   x'[i]       = x[i] cos a - x[i+D/2] sin a
//   x'[i+D/2]   = x[i+D/2] cos a + x[i] sin a
// In place on x[T, nh, D]. inv_freq has D/2 entries (already scaled for llama3/linear rope).
void rope_forward(float* x, const int32_t* pos, const float* inv_freq, int64_t T, int64_t nh,
                  int64_t D);
// The transpose of the rotation (angle -a), in place on d_x[T, nh, D]; overwrites, not accumulates.
void rope_backward(float* d_x, const int32_t* pos, const float* inv_freq, int64_t T, int64_t nh,
                   int64_t D);

// ---- attention.cpp: causal GQA attention over packed variable-length sequences -----------------
// q[T,H,D], k[T,Hkv,D], v[T,Hkv,D] -> out[T,H,D]; query head h reads kv head h / (H/Hkv).
// Token i of a sequence attends to tokens 0..i of the same sequence only.
// lse[T,H] (log-sum-exp of the scaled scores of each query row) is saved for the backward.
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* cu_seqlens, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                       int64_t D, float scale);
void attention_backward(float* d_q, float* d_k, float* d_v, const float* d_out, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const int32_t* cu_seqlens, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                        int64_t D, float scale);

// ---- paged_attention.cpp: the rollout's attention over a paged KV cache, forward only
// ------------ q[T,H,D] -> out[T,H,D]; k_cache, v_cache [num_blocks, block_size, Hkv, D]. Token t
// of item b (cu_seqlens, B items) attends to keys 0..positions[t] of its sequence, read through its
// row of block_tables [B, W]. Batch-invariant: a row's result does not depend on the other tokens.
void paged_attention_forward(float* out, const float* q, const float* k_cache, const float* v_cache,
                             const int32_t* block_tables, int64_t W, const int32_t* cu_seqlens,
                             const int32_t* positions, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                             int64_t D, int64_t block_size, float scale);

// ---- swiglu.cpp: HF LlamaMLP activation on the fused gate|up projection
// --------------------------- gu[T, 2F] holds gate in columns [0,F) and up in [F,2F). out[T,F] =
// silu(gate) * up.
void swiglu_forward(float* out, const float* gu, int64_t T, int64_t F);
void swiglu_backward(float* d_gu, const float* d_out, const float* gu, int64_t T, int64_t F);

// ---- lm_head.cpp: LM head fused with log-softmax, target gather and entropy
// ---------------------- z[t,:] = (h[t,:] @ w^T) / temperature  (h [T,C], w [V,C]);  p =
// softmax(z[t,:]).
//   logprob[t] = log p[targets[t]]   (0 when targets[t] < 0: no next token)
//   entropy[t] = -sum_j p_j log p_j
//   lse[t]     = logsumexp(z[t,:])  (saved for the backward)
// Tokens are processed in chunks of `chunk` rows so only chunk x V logits exist at once.
void lm_head_forward(float* logprob, float* entropy, float* lse, const float* h, const float* w,
                     const int32_t* targets, int64_t T, int64_t C, int64_t V, float temperature,
                     int64_t chunk);
// With upstream gradients d_logprob[T] and d_entropy[T] (either may be null = zero):
//   d_z[j] = d_logprob * (1[j==target] - p_j) - d_entropy * p_j * (log p_j + entropy)
//   d_h += (d_z / temperature) @ w;  d_w += (d_z / temperature)^T @ h.  Logits are recomputed.
void lm_head_backward(float* d_h, float* d_w, const float* d_logprob, const float* d_entropy,
                      const float* h, const float* w, const int32_t* targets, const float* lse,
                      const float* entropy, int64_t T, int64_t C, int64_t V, float temperature,
                      int64_t chunk);

// ---- adamw.cpp: torch.optim.AdamW, one update over a flat buffer
// ---------------------------------- g = grad * grad_scale;  p -= lr * weight_decay * p;  m = b1 m
// + (1-b1) g;  v = b2 v + (1-b2) g^2; p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) +
// eps).  step counts from 1.
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, int64_t step,
                float grad_scale);

// ---- grad_norm.cpp
// --------------------------------------------------------------------------------- Sum of squares
// in double (for a global L2 norm over several buffers / ranks).
double sum_squares(const float* x, int64_t n);

}  // namespace verl::ops::cpu
