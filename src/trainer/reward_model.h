// A reward model (HF LlamaForSequenceClassification / Qwen2ForSequenceClassification /
// Qwen3ForSequenceClassification, one label) scoring whole sequences: the score-head value at each
// sequence's last token, as transformers' sequence classification reads it for an unpadded
// sequence. On the CPU the fp32 model (model::Transformer); on the GPU the forward-only bf16 model
// (the reference policy's path), with its linear layers quantised on the device when it was
// quantised (model/quantize.h, ops/cuda/quant_linear.h). Sequences are packed into forwards of at
// most max_tokens tokens and max_seqs sequences.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "model/quantize.h"
#include "model/weights.h"
#include "trainer/policy_model.h"

namespace verl::trainer {

class RewardModel {
 public:
  // `dir` names the model in errors. A sequence longer than max_tokens is an error naming it.
  // `offload` (reward_model.model.fsdp_config.param_offload, GPU): the bf16 weights stay in pinned
  // host memory and come to the device for each score() call only. `quantized`: the layers' linear
  // matrices that model::quantize_linear_weights handed back for `weights` (which then hold their
  // dequantised values); the GPU keeps them quantised, the CPU ignores them.
  RewardModel(Device device, model::Weights weights, const std::string& dir, int64_t max_tokens,
              int64_t max_seqs, bool offload = false,
              std::vector<model::QuantizedLayer> quantized = {});
  // One score per sequence, in order. Every sequence is checked first (not empty, within the token
  // budget, every id inside the vocabulary); an error names it by where[i] (e.g. "file:line"), or
  // by its index without `where`.
  std::vector<float> score(const std::vector<std::vector<int32_t>>& seqs,
                           const std::vector<std::string>* where = nullptr);
  const model::ModelConfig& config() const { return policy_->config(); }
  Device device() const { return policy_->device(); }
  int64_t max_tokens() const { return max_tokens_; }
  // Whether the weights wait in host memory between score() calls (each call uploads them).
  bool offloaded() const { return offload_; }
  int64_t parameter_count() const { return params_; }
  // Device bytes the model holds (0 on the CPU): weights, quantised matrices, activations.
  size_t device_bytes() const { return policy_->device_bytes(); }

 private:
  std::unique_ptr<PolicyModel> policy_;
  std::string dir_;
  int64_t max_tokens_, max_seqs_, params_ = 0;
  bool offload_ = false;
};

// The checks a reward model's directory must pass before it is used (a one-label
// ...ForSequenceClassification); the error names the directory and what config.json says.
void require_reward_model(const model::ModelConfig& cfg, const std::string& dir);

}  // namespace verl::trainer
