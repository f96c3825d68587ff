// The CPU model runner of the rollout engine: runs one scheduled step (prefill chunks and decode
// tokens of many sequences at once) over a paged KV cache, with the same weights object the
// trainer updates, and returns the logits rows the sampler needs.
// Batch invariance: every per-token computation (projections, norms, RoPE, attention over the
// paged cache in a fixed key order) is independent of which other tokens share the step, so a
// sequence's KV, logits and samples are bit-identical alone, in a batch, forked or re-prefilled.
#pragma once

#include <cstdint>
#include <vector>

#include "model/transformer.h"
#include "rollout/scheduler.h"

namespace verl::rollout {

// Paged fp32 KV cache: per layer, K and V of shape [num_blocks, block_size, Hkv, D].
class KVCache {
 public:
  KVCache(const model::ModelConfig& cfg, int32_t num_blocks, int32_t block_size);

  float* k(int64_t layer) { return k_.data() + layer * layer_stride_; }
  float* v(int64_t layer) { return v_.data() + layer * layer_stride_; }
  void copy_block(int32_t src, int32_t dst);  // every layer's K and V
  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  int64_t token_stride() const { return token_stride_; }  // floats per slot (Hkv * D)

 private:
  int32_t num_blocks_, block_size_;
  int64_t token_stride_, layer_stride_, num_layers_;
  std::vector<float> k_, v_;
};

class CpuModelRunner {
 public:
  CpuModelRunner(const model::Weights& weights, KVCache& cache);

  // Applies the batch's block copies, writes the KV of its new tokens and fills `logits` with
  // batch.num_samples() rows of V logits (the next-token distribution of each sample's token).
  void run(const ScheduledBatch& batch, std::vector<float>& logits);

 private:
  void attention(int64_t layer, const ScheduledBatch& b, const float* q, float* out);
  const model::Weights& w_;
  KVCache& cache_;
  std::vector<float> inv_freq_;
  // Workspaces, grown to the largest step and then reused.
  std::vector<float> x_, xn_, qkv_, q_, k_, v_, att_, tmp_, gu_, act_, rstd_, rstd_h_, h_rows_;
  std::vector<std::vector<float>> scores_;  // per thread
  std::vector<int32_t> item_of_;
};

}  // namespace verl::rollout
