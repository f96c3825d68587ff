// The CPU model runner of the rollout engine: owns the paged KV cache, applies a step's block
// copies, and runs one scheduled step (prefill chunks and decode tokens of many sequences at once)
// through the trainer's own CPU decoder (model/cpu/decoder.h), over the same weights object the
// trainer updates, returning the logits rows the sampler needs. The decoder's rollout context is
// batch-invariant (projections, norms, RoPE, attention over the paged cache in a fixed key order),
// so a sequence's KV, logits and samples are bit-identical alone, in a batch, forked or
// re-prefilled.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "model/cpu/decoder.h"
#include "rollout/scheduler.h"

namespace verl::rollout {

// Paged fp32 KV cache: per layer, K and V of shape [num_blocks, block_size, Hkv, D]. Built from a
// tensor-parallel slice's config it holds that rank's Hkv/T heads.
class KVCache {
 public:
  KVCache(const model::ModelConfig& cfg, int32_t num_blocks, int32_t block_size);

  // The cache as the decoder's paged attention sees it, addressed by `batch`'s slots and tables.
  model::cpu::PagedKv paged(const ScheduledBatch& batch);

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
  // With `tp`, `weights` is rank tp->group->rank()'s TpSlice (model/tp.h) and `cache` holds its
  // kv heads; every rank of the group runs the same batches.
  // With `lora`, the adapters run unmerged beside the weights (the trainer's LoRA forward).
  CpuModelRunner(const model::Weights& weights, KVCache& cache,
                 const model::TpContext* tp = nullptr, const model::LoraWeights* lora = nullptr);

  // Applies the batch's block copies, writes the KV of its new tokens and fills `logits` with
  // batch.num_samples() rows of V logits (the next-token distribution of each sample's token;
  // the whole vocabulary under tensor parallelism, the same on every rank of the group).
  void run(const ScheduledBatch& batch, std::vector<float>& logits);

 private:
  model::cpu::Decoder decoder_;  // the trainer's CPU decoder, over the same weights
  std::optional<model::TpContext> tp_;
  KVCache& cache_;
  model::cpu::StepWorkspace ws_;  // grown to the largest step, then reused
};

}  // namespace verl::rollout
