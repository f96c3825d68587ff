#include "trainer/reward_model.h"

#include <fmt/format.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/batch.h"

namespace verl::trainer {

void require_reward_model(const model::ModelConfig& cfg, const std::string& dir) {
  VERL_CHECK(cfg.head == model::HeadKind::SequenceClassification,
             "{}/config.json: a reward model must be a ...ForSequenceClassification model, got {}",
             dir, cfg.architecture);
  VERL_CHECK(cfg.num_labels == 1,
             "{}/config.json: a reward model gives one score, but num_labels is {} (id2label)", dir,
             cfg.num_labels);
}

RewardModel::RewardModel(Device device, model::Weights weights, const std::string& dir,
                         int64_t max_tokens, int64_t max_seqs, bool offload,
                         std::vector<model::QuantizedLayer> quantized)
    : dir_(dir), max_tokens_(max_tokens), max_seqs_(max_seqs), offload_(offload) {
  require_reward_model(weights.config, dir);
  VERL_CHECK(
      max_tokens > 0 && max_seqs > 0,
      "reward model {}: the token budget ({}) and sequences per forward ({}) must be positive", dir,
      max_tokens, max_seqs);
  params_ = weights.layout.total;
  PolicyOptions po;
  po.trainable = false;
  po.max_tokens = max_tokens;
  po.max_seqs = max_seqs;
  po.offload.params = offload ? 1.0 : 0.0;
  if (device == Device::Cuda && !quantized.empty())
    po.quantized = std::make_shared<const std::vector<model::QuantizedLayer>>(std::move(quantized));
  policy_ = make_policy(device, std::move(weights), po);
}

std::vector<float> RewardModel::score(const std::vector<std::vector<int32_t>>& seqs,
                                      const std::vector<std::string>* where) {
  const int64_t vocab = config().vocab_size;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const std::string name =
        where != nullptr ? (*where)[i] : fmt::format("reward model input {}", i);
    VERL_CHECK(!seqs[i].empty(), "{}: no tokens to score", name);
    VERL_CHECK(
        static_cast<int64_t>(seqs[i].size()) <= max_tokens_,
        "{}: {} tokens, more than the {} a forward of reward model {} takes (--max-batch-tokens / "
        "reward_model.forward_max_token_len_per_gpu)",
        name, seqs[i].size(), max_tokens_, dir_);
    for (size_t t = 0; t < seqs[i].size(); ++t)
      VERL_CHECK(seqs[i][t] >= 0 && seqs[i][t] < vocab,
                 "{}: token {} is id {}, outside {}'s vocabulary [0, {})", name, t, seqs[i][t],
                 dir_, vocab);
  }
  policy_->wake();  // offloaded weights come up for this call
  std::vector<float> scores;
  scores.reserve(seqs.size());
  std::vector<std::vector<int32_t>> group;
  int64_t tokens = 0;
  std::vector<float> values;
  auto flush = [&] {
    if (group.empty()) return;
    const model::PackedBatch batch = model::PackedBatch::from_sequences(group);
    policy_->forward_values(batch, values);
    for (int64_t s = 0; s < batch.num_seqs(); ++s)
      scores.push_back(values[static_cast<size_t>(batch.cu_seqlens[s + 1] - 1)]);
    group.clear();
    tokens = 0;
  };
  for (const std::vector<int32_t>& s : seqs) {
    const auto n = static_cast<int64_t>(s.size());
    if (tokens + n > max_tokens_ || static_cast<int64_t>(group.size()) == max_seqs_) flush();
    group.push_back(s);
    tokens += n;
  }
  flush();
  policy_->release_activations();
  policy_->sleep();
  return scores;
}

}  // namespace verl::trainer
