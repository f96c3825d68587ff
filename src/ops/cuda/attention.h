// ---- attention.cu: causal GQA attention over packed variable-length sequences (CUDA) -----------
// The same math and layout as cpu::attention_forward / cpu::attention_backward (src/ops/cpu/ops.h,
// the oracle): q[T,H,D], k[T,Hkv,D], v[T,Hkv,D] -> out[T,H,D]; query head h reads kv head
// h / (H/Hkv); sequence b owns tokens [cu_seqlens[b], cu_seqlens[b+1]) and token i of a sequence
// attends to tokens 0..i of the same sequence only.
//   s_ij = scale q_i.k_j,  lse_i = logsumexp_j s_ij,  out_i = sum_j exp(s_ij - lse_i) v_j
//
// cu_seqlens [B+1] is a DEVICE int32 array; the caller validates it on the host (cu_seqlens[0]=0,
// non-decreasing, cu_seqlens[B]=T), as the data pipeline does. Nothing here copies it back: each
// block finds its (sequence, row tile) by walking cu_seqlens (O(B) per block), over a grid of
// ceil(T/64) + B tiles, the bound on sum_b ceil(L_b/64); surplus blocks exit at once.
//
// Precision: q, k, v, out, d_out are bf16; every score, softmax statistic and sum is fp32;
// lse [T,H] is fp32; the gradients d_q, d_k, d_v are fp32 buffers (the caller rounds/adds them
// into its bf16 activation gradients), so the sums over keys / queries are never rounded to bf16.
// The products run on tensor cores (mma.sync bf16 -> fp32), so the probabilities P (for out and
// d_v) and dS (for d_q, d_k) are rounded to bf16 as operands: each term of those sums is off by at
// most 2^-8 of itself. D <= 128 (checked; padded to 32, 64 or 128 inside). FlashAttention-2 style
// (Dao 2023): no T x T matrix exists, score tiles live in registers (attention.cu has the tiling).
#pragma once

#include <cstdint>

#include "ops/cuda/device.h"
#include "ops/cuda/ops_cuda.h"

namespace verl::ops::cuda {

// Overwrites out [T,H,D] and lse [T,H] (lse may be null). One block per (query tile of one
// sequence, head); key tiles up to the causal limit stream through shared memory with an online
// softmax (running max and sum per row).
void attention_forward(const CudaContext& ctx, bf16* out, float* lse, const bf16* q, const bf16* k,
                       const bf16* v, const int32_t* cu_seqlens, int64_t B, int64_t T, int64_t H,
                       int64_t Hkv, int64_t D, float scale);

// attention_forward's rows for query tokens whose keys sit in the rollout engine's paged KV cache
// (batch-invariant rollout: a token's output must be the bits the trainer computes for it over the
// whole sequence, whatever else is in the step). Item i owns the query tokens
// [cu_seqlens[i], cu_seqlens[i+1]) at the consecutive positions p0, p0 + 1, ... (p0 =
// positions[cu_seqlens[i]]; only that entry is read) and a token at position p attends to keys
// 0..p of its sequence: key j of item i is at slot block_tables[i * W + j / block_size] *
// block_size + j % block_size of k_cache/v_cache [num_blocks * block_size, Hkv, D]. q and out are
// [T,H,D]; every array is on the device and the caller validates the metadata (each block table
// row covers the item's keys: W >= ceil((p0 + n) / block_size)); keys past an item's last query
// position are never read, so they may be unwritten. Overwrites out; no lse.
// Bitwise equal, row for row, to attention_forward over the whole sequences with the same H, Hkv,
// D and scale: every row runs attention_forward's per-tile code over the same key tiles from key 0
// with the same mma steps and the same mask, and a row does not depend on the rows beside it.
// Items of several tokens run in the training kernel with query tiles aligned to the same
// multiples of 128 positions (a chunk of n tokens costs at most ceil(n/128) + 1 of them). An item
// of one token (decode) runs, when G = H/Hkv <= 16, in a decode kernel: the G heads of one kv
// head are the rows of one 16-row tile and the kv head's keys are read once for all of them, by
// one warp per (item, kv head) for large batches or one block of four warps for small ones (else
// it takes a tile of the training kernel, one warp of four busy).
// single_token_items / multi_token_items choose the items computed: those of one query token and
// those of more; the out rows of the others are not written (a decode step passes
// multi_token_items = false to skip the training kernel's launch, whose grid is sized for the
// worst case; a caller that runs decode items elsewhere passes single_token_items = false).
// The grids depend on T, B, H, Hkv, D and the two flags only, not on the device metadata, so a
// CUDA graph may capture them.
void attention_forward_paged(const CudaContext& ctx, bf16* out, const bf16* q, const bf16* k_cache,
                             const bf16* v_cache, const int32_t* block_tables, int64_t W,
                             int64_t block_size, const int32_t* cu_seqlens,
                             const int32_t* positions, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                             int64_t D, float scale, bool single_token_items = true,
                             bool multi_token_items = true);

// From the forward's out and lse (Dao et al. 2022, alg. 4):
//   D_i = d_out_i.out_i,  p_ij = exp(s_ij - lse_i),  dp_ij = d_out_i.v_j,  ds_ij = p_ij (dp_ij -
//   D_i) d_q_i += scale sum_j ds_ij k_j,  d_k_j += scale sum_i ds_ij q_i,  d_v_j += sum_i p_ij
//   d_out_i
// d_q [T,H,D], d_k and d_v [T,Hkv,D] are fp32 and ACCUMULATED (+=); a null one is skipped.
// Uses T*H floats of ctx.workspace (D_i). No atomics (deterministic): after the D_i pass, one
// launch whose blocks are either d_k/d_v per (key tile, kv head), looping over the heads of its
// group, or d_q per (query tile, head).
void attention_backward(const CudaContext& ctx, float* d_q, float* d_k, float* d_v,
                        const bf16* d_out, const bf16* q, const bf16* k, const bf16* v,
                        const bf16* out, const float* lse, const int32_t* cu_seqlens, int64_t B,
                        int64_t T, int64_t H, int64_t Hkv, int64_t D, float scale);

}  // namespace verl::ops::cuda
