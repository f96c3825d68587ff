// ---- paged_attention.cu: attention over a paged KV cache, for the rollout engine (CUDA)
// ---------- The KV of every sequence lives in fixed-size blocks of a pool (PagedAttention, Kwon et
// al., SOSP 2023): per layer K and V are [num_blocks, block_size, Hkv, D] bf16, and position p of
// the sequence of item i sits in slot block_tables[i, p / block_size] * block_size + p %
// block_size. One scheduled step (src/rollout/scheduler.h, ScheduledBatch) has T new tokens in B
// items: item i owns query tokens [cu_seqlens[i], cu_seqlens[i+1]) at positions[t], and the query
// token t attends to keys 0..positions[t] of its sequence. The same math as
// ops::cpu::paged_attention_forward (the oracle):
//   s_j = scale q.k_j,  out = sum_j softmax(s)_j v_j      (query head h reads kv head h / (H/Hkv))
// with bf16 q, K, V, out and fp32 scores, softmax and sums.
//
// Two kinds of items, chosen by their number of query tokens, each with a fast kernel for the
// common shapes (D in {16, 32, 64, 128}) and a plain fp32 shared-memory kernel for any shape (the
// reference):
//   decode  (1 token): split-K over the context (FlashDecoding, Dao et al. 2023): partitions of
//           about `partition` keys (at most P per item, PagedAttentionPlan) run as separate blocks,
//           one per (kv head, item, partition), so the G = H/Hkv query heads of a group share every
//           K/V row read; each block keeps an online softmax (running max m, sum l, unnormalised
//           acc) and, when the item needs more than one partition, writes (m, l, acc) to the
//           workspace; a second kernel rescales and adds them:
//             M = max_p m_p,  out = sum_p exp(m_p - M) acc_p / sum_p exp(m_p - M) l_p.
//           The grid depends only on (B, max_context), never on the lengths in device memory, so a
//           CUDA graph captured once replays for any contexts up to max_context.
//           Fast kernel (G <= 8): tensor cores (mma.sync m16n8k16 bf16 -> fp32) with the group's
//           heads as the rows of one 16-row tile, so the G dot products of a key cost one mma
//           column; each warp streams 16 keys per step straight from the cache with 16-byte loads
//           (the mma's reduction index permuted so a lane's fragment is a contiguous piece of a
//           row), keeps an online softmax per head in exp2 units, and the 4 warps of a block are
//           merged in shared memory. P enters the P V mma as bf16 hi + lo parts, so the result
//           keeps fp32 accuracy (p to 2^-16).
//   prefill (chunks of > 1 token, chunked prefill included): one block per (64-query tile, head)
//           with an online softmax over 64-key tiles, keys limited per row by its position (causal
//           within the chunk, all of the cached prefix). Fast kernel: tensor cores (mma.sync
//           m16n8k16 bf16 -> fp32, FlashAttention-2's register layout, Dao 2023): each warp owns 16
//           query rows, S = Q K^T and O += P V per tile with P rounded to bf16 as the second
//           operand (the only rounding beyond the bf16 inputs: 2^-9 of each p v term).
// All metadata are DEVICE int32 arrays validated by the caller (the scheduler builds them).
// Constraints: D even and <= 128; G <= 64 and G * D <= 2048; block tables row-major [B, W].
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/cuda/ops_cuda.h"

namespace verl::ops::cuda {

// k_cache/v_cache[slot_mapping[t], :, :] = k/v[t] for t < T (k, v [T, Hkv, D]). A negative slot is
// skipped (padding rows of a CUDA graph).
void paged_kv_write(const CudaContext& ctx, bf16* k_cache, bf16* v_cache, const bf16* k,
                    const bf16* v, const int32_t* slot_mapping, int64_t T, int64_t Hkv, int64_t D);

// The attention input of one layer from its fused projection qkv [T, (H + 2 Hkv) D] (q | k | v
// rows, bias already added), in one kernel:
//   q, k = rmsnorm_D(q; q_norm), rmsnorm_D(k; k_norm)    (Qwen3, when q_norm != nullptr; rounded
//                                                          to bf16 as the rmsnorm op does)
//   q, k = rope(q, positions), rope(k, positions)         (the rope op's math, fp32, sincosf)
//   q_out[t] = q  [T, H, D];  k_cache/v_cache[slot_mapping[t]] = k, v   (skipped when slot < 0)
// inv_freq [D/2] fp32 and positions [T] are device arrays.
void qkv_rope_paged_write(const CudaContext& ctx, bf16* q_out, bf16* k_cache, bf16* v_cache,
                          const bf16* qkv, const bf16* q_norm, const bf16* k_norm, float eps,
                          const int32_t* positions, const float* inv_freq,
                          const int32_t* slot_mapping, int64_t T, int64_t H, int64_t Hkv,
                          int64_t D);

// Copy-on-write of whole blocks: for each pair c < n (pairs [n, 2] = (src, dst), device), block dst
// of each of the `num_arrays` arrays (every layer's K and V) becomes a copy of block src. Array a
// starts at base + a * array_stride; a block is block_elems = block_size * Hkv * D elements. The
// pairs are copied concurrently: no dst may be another pair's src (the caller launches dependent
// copies one by one).
void paged_kv_copy_blocks(const CudaContext& ctx, bf16* base, int64_t num_arrays,
                          int64_t array_stride, int64_t block_elems, const int32_t* pairs,
                          int64_t n);

// What paged_attention launches for one step.
struct PagedAttentionPlan {
  int64_t max_context = 0;  // >= positions[t] + 1 of every decode item (sizes the split-K grid)
  bool decode = true;       // launch the decode kernels (items with one query token)
  bool prefill = true;      // launch the prefill kernel (items with several query tokens)
  // Split-K of the decode kernel: an item of n keys runs as min(P, ceil(n / partition)) partitions
  // of equal length rounded up to 64 keys (at most `partition` keys each unless P caps the count),
  // P = max_partitions, or ceil(max_context / partition) when that is 0 or smaller.
  int32_t partition = 512;
  int32_t max_partitions = 0;
  bool reference = false;  // only the plain fp32 kernels below (tests compare the two paths)
};

// P of the plan above: the partitions the grid has per (kv head, item).
int64_t decode_grid_partitions(int64_t max_context, int32_t partition, int32_t max_partitions);

// A max_partitions for B decode items on `sm_count` SMs: enough partitions that the grid
// (Hkv * B * P blocks) covers the GPU about two blocks per SM, at most ceil(max_context /
// partition): long contexts of a small batch split, a large batch does not (no empty blocks, no
// combine pass). Measured on the H200 at B = 256, Hkv = 2 (Qwen2.5-0.5B, contexts 256-512): one
// partition (512 blocks) gives a 1.89 ms decode step, two (the earlier four-blocks-per-SM rule)
// 2.19 ms.
int32_t decode_partitions_for(int64_t B, int64_t Hkv, int64_t max_context, int32_t partition,
                              int sm_count);

// Workspace bytes of the split-K decode for B items: B * H * P partial results of D + 2 floats
// (0 when P = 1).
size_t paged_attention_workspace_bytes(int64_t B, int64_t H, int64_t D, int64_t max_context,
                                       int32_t partition, int32_t max_partitions = 0);

// out [T, H, D] (overwritten for every token of the launched kinds) from q [T, H, D] and one
// layer's cache. block_tables [B, W], cu_seqlens [B+1], positions [T]; workspace of at least
// paged_attention_workspace_bytes(B, H, D, plan.max_context, plan.partition, plan.max_partitions)
// (may be null when no decode item needs two partitions).
void paged_attention(const CudaContext& ctx, bf16* out, const bf16* q, const bf16* k_cache,
                     const bf16* v_cache, const int32_t* block_tables, int64_t W,
                     const int32_t* cu_seqlens, const int32_t* positions, int64_t B, int64_t T,
                     int64_t H, int64_t Hkv, int64_t D, int64_t block_size, float scale,
                     const PagedAttentionPlan& plan, void* workspace, size_t workspace_bytes);

}  // namespace verl::ops::cuda
