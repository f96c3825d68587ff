// The CPU runner's own part of a rollout step: the paged KV cache, block copies, the rows that
// sample and their logits buffer. The layer math is the CPU decoder's (model/cpu/decoder.cpp):
// the same layers as training, with batch-invariant matmuls and attention over this cache.
#include "rollout/model_runner.h"

#include <cstring>

#include "core/error.h"

namespace verl::rollout {

KVCache::KVCache(const model::ModelConfig& cfg, int32_t num_blocks, int32_t block_size)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      token_stride_(cfg.num_key_value_heads * cfg.head_dim),
      layer_stride_(static_cast<int64_t>(num_blocks) * block_size * token_stride_),
      num_layers_(cfg.num_hidden_layers) {
  VERL_CHECK(num_blocks > 0 && block_size > 0, "KV cache needs blocks: {} blocks of {} tokens",
             num_blocks, block_size);
  k_.assign(static_cast<size_t>(layer_stride_ * num_layers_), 0.0f);
  v_.assign(static_cast<size_t>(layer_stride_ * num_layers_), 0.0f);
}

void KVCache::copy_block(int32_t src, int32_t dst) {
  const int64_t n = block_size_ * token_stride_;
  for (int64_t l = 0; l < num_layers_; ++l) {
    std::memcpy(k(l) + dst * n, k(l) + src * n, n * sizeof(float));
    std::memcpy(v(l) + dst * n, v(l) + src * n, n * sizeof(float));
  }
}

model::cpu::PagedKv KVCache::paged(const ScheduledBatch& b) {
  model::cpu::PagedKv kv;
  kv.k = k_.data();
  kv.v = v_.data();
  kv.layer_stride = layer_stride_;
  kv.block_size = block_size_;
  kv.slot_mapping = b.slot_mapping.data();
  kv.block_tables = b.block_tables.data();
  kv.max_blocks_per_seq = b.max_blocks_per_seq;
  return kv;
}

CpuModelRunner::CpuModelRunner(const model::Weights& weights, KVCache& cache,
                               const model::TpContext* tp, const model::LoraWeights* lora)
    : decoder_(weights, lora), cache_(cache) {
  if (tp) tp_ = *tp;
  VERL_CHECK(weights.config.head == model::HeadKind::CausalLM,
             "the rollout needs a causal LM, got {}", weights.config.architecture);
}

void CpuModelRunner::run(const ScheduledBatch& b, std::vector<float>& logits) {
  for (const BlockCopy& cp : b.block_copies) cache_.copy_block(cp.src, cp.dst);
  const int64_t S = b.num_samples();
  const int64_t V = tp_ ? tp_->vocab_size : decoder_.weights().config.vocab_size;
  logits.resize(static_cast<size_t>(S * V));
  if (b.num_tokens() == 0) {
    VERL_CHECK(S == 0, "a step with no tokens cannot sample");
    return;
  }
  const model::cpu::Tokens tokens{b.num_tokens(), b.num_seqs(), b.input_ids.data(),
                                  b.positions.data(), b.cu_seqlens.data()};
  decoder_.forward_step(tokens, cache_.paged(b), b.sample_token_indices, logits.data(), ws_,
                        tp_ ? &*tp_ : nullptr);
}

}  // namespace verl::rollout
