// The policy's shared part (the one optimizer over the training state, checkpoint copies), the
// CPU policy (model::Transformer over a CpuTrainState: exactly the trainer's steps before the
// device seam) and the device choice. The CUDA policy is in policy_model_cuda.cpp.
#include "trainer/policy_model.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "core/error.h"
#include "model/transformer.h"

namespace verl::trainer {
namespace detail {
// policy_model_cuda.cpp, in builds with VERL_HAVE_CUDA.
std::unique_ptr<PolicyModel> make_cuda_policy(model::Weights weights, const PolicyOptions& opts);
}  // namespace detail

namespace {

void require_trainable(PolicyModel& p, const char* what) {
  VERL_CHECK(p.trainable(), "PolicyModel::{}: this model is forward-only (the reference policy)",
             what);
}

// With PolicyOptions::lora the state is the adapters' (their fp32 master weights, gradients and
// moments over LoraWeights::layout), the base weights are a frozen member the decoder reads, and
// lora_ is the decoder's adapter copy, refreshed from the state's master buffer before a pass
// whenever an update or a restore changed it.
class CpuPolicy final : public PolicyModel {
 public:
  CpuPolicy(model::Weights w, const PolicyOptions& opts)
      : PolicyModel(opts.optim),
        base_(opts.lora ? std::move(w) : model::Weights{}),
        lora_(opts.lora ? std::optional<model::LoraWeights>(*opts.lora) : std::nullopt),
        state_(opts.lora ? optim::CpuTrainState(opts.lora->layout, opts.lora->data, opts.trainable)
                         : optim::CpuTrainState(std::move(w), opts.trainable)),
        strategy_(std::make_unique<optim::AllReduceAtStep>(state_)),
        tf_(lora_ ? base_ : state_.weights(), lora_ ? &*lora_ : nullptr),
        base_tf_(lora_ ? base_ : state_.weights()) {}
  CpuPolicy(const CpuPolicy&) = delete;  // tf_ refers to state_'s weights or base_
  CpuPolicy& operator=(const CpuPolicy&) = delete;

  Device device() const override { return Device::Cpu; }
  const model::ModelConfig& config() const override { return tf_.weights().config; }
  optim::TrainState& state() override { return state_; }
  optim::Strategy& strategy() override { return *strategy_; }
  void set_strategy(std::unique_ptr<optim::Strategy> strategy) override {
    VERL_CHECK(&strategy->state() == &state_, "internal: a strategy over another model's state");
    // ZeRO-3 hands the decoder the base model's ranges through its weight source; the adapters
    // are a few MB, so their sharding stops at the moments and gradients.
    VERL_CHECK(!lora_ || strategy->zero_stage() < 3,
               "ZeRO-3 with LoRA: the adapters' master weights are not sharded; use zero_stage 1 "
               "or 2 (the adapters' moments and gradients sharded)");
    strategy_ = std::move(strategy);
  }

  void forward(const model::PackedBatch& batch, float temperature, std::vector<float>& logprob,
               std::vector<float>* entropy, bool for_backward = true) override {
    (void)for_backward;  // the CPU model keeps the same activations either way
    fo_.temperature = temperature;
    decoder().forward(batch, acts_, fo_, weight_source());
    batch_ = batch;  // backward needs it; a copy of T ints, small beside the activations
    // The activation buffers keep the size of the largest batch seen: take the first T.
    const int64_t T = batch.num_tokens();
    logprob.assign(acts_.logprob.begin(), acts_.logprob.begin() + T);
    if (entropy) entropy->assign(acts_.entropy.begin(), acts_.entropy.begin() + T);
  }

  void backward(const float* d_logprob, const float* d_entropy) override {
    require_trainable(*this, "backward");
    if (lora_) return lora_backward(d_logprob, d_entropy, nullptr);
    tf_.backward(batch_, acts_, d_logprob, d_entropy, nullptr, state_.grads(), fo_,
                 strategy_->grad_sink(), strategy_->weight_source());
  }

  void forward_values(const model::PackedBatch& batch, std::vector<float>& values) override {
    decoder().forward(batch, acts_, fo_, weight_source());
    batch_ = batch;
    if (tf_.weights().config.head == model::HeadKind::SequenceClassification) {
      // A reward model: its score stands at each sequence's last token, the rest is zero.
      values.assign(static_cast<size_t>(batch.num_tokens()), 0.0f);
      for (int64_t s = 0; s < batch.num_seqs(); ++s)
        values[static_cast<size_t>(batch.cu_seqlens[s + 1] - 1)] =
            acts_.scores[static_cast<size_t>(s)];
      return;
    }
    values.assign(acts_.values.begin(), acts_.values.begin() + batch.num_tokens());
  }

  void backward_values(const float* d_values) override {
    require_trainable(*this, "backward_values");
    if (lora_) return lora_backward(nullptr, nullptr, d_values);
    tf_.backward(batch_, acts_, nullptr, nullptr, d_values, state_.grads(), fo_,
                 strategy_->grad_sink(), strategy_->weight_source());
  }

  void release_activations() override { acts_ = model::Activations{}; }

  const model::Weights& weights() override { return lora_ ? base_ : state_.weights(); }

  const model::LoraWeights* lora() override {
    if (!lora_) return nullptr;
    sync_adapters();
    return &*lora_;
  }

  void set_adapters_enabled(bool on) override {
    VERL_CHECK(on || lora_, "internal: this model has no LoRA adapters to switch off");
    adapters_on_ = on;
  }

 protected:
  void on_restore(std::vector<float>& weights) override {
    (void)weights;
    synced_steps_ = -1;  // the master buffer was replaced
  }

 private:
  // The decoder of the next pass: with the adapters (their values refreshed first) or, switched
  // off, the base model alone.
  const model::Transformer& decoder() {
    if (!lora_) return tf_;
    if (!adapters_on_) return base_tf_;
    sync_adapters();
    return tf_;
  }
  // ZeRO-3's weight source reads the whole model's ranges; the frozen base is whole.
  model::WeightSource* weight_source() { return lora_ ? nullptr : strategy_->weight_source(); }

  // The state's master buffer into the decoder's adapters when an update or a restore changed it
  // (the rollout reads lora_ while generation runs: no copy then, the values are the same).
  void sync_adapters() {
    if (synced_steps_ == state_.steps()) return;
    const float* m = state_.master();
    std::copy(m, m + state_.numel(), lora_->data.begin());
    synced_steps_ = state_.steps();
  }

  // The adapters' gradients, base frozen: into the strategy's sink when it has one (data
  // parallelism reduces them; ZeRO-2 keeps only its shard), else into the whole buffer.
  void lora_backward(const float* d_logprob, const float* d_entropy, const float* d_values) {
    VERL_CHECK(adapters_on_,
               "PolicyModel::backward with the LoRA adapters switched off (the "
               "reference pass is forward only)");
    model::GradSink* sink = strategy_->grad_sink();
    const int64_t n = state_.numel();
    float* g = sink ? sink->open(0, n) : state_.grads();
    tf_.backward(batch_, acts_, d_logprob, d_entropy, d_values, nullptr, fo_, nullptr, nullptr,
                 model::LoraGrads{g, true});
    if (sink) sink->ready(0, n);
  }

  model::Weights base_;                     // LoRA: the frozen base weights (else empty)
  std::optional<model::LoraWeights> lora_;  // LoRA: the decoder's adapters
  optim::CpuTrainState state_;
  std::unique_ptr<optim::Strategy> strategy_;  // over state_: declared after it, destroyed before
  model::Transformer tf_;       // holds references to state_'s weights (or base_ and lora_)
  model::Transformer base_tf_;  // LoRA: the base model alone (the reference pass)
  model::Activations acts_;
  model::ForwardOptions fo_;
  model::PackedBatch batch_;
  bool adapters_on_ = true;
  int64_t synced_steps_ = 0;  // state_.steps() when lora_ last took the master values
};

}  // namespace

void PolicyModel::zero_grad() {
  require_trainable(*this, "zero_grad");
  state().zero_grad();
}

double PolicyModel::optimizer_step(float lr, dist::Communicator& comm) {
  require_trainable(*this, "optimizer_step");
  opt_host_ = AdamWState{};  // a checkpoint's download is out of date now; free it
  return optimizer_.step(state(), strategy(), lr, comm);
}

const AdamWState& PolicyModel::optimizer_state() {
  require_trainable(*this, "optimizer_state");
  opt_host_ = strategy().download_optimizer_state();
  return opt_host_;
}

void PolicyModel::restore(std::vector<float> weights, AdamWState opt) {
  strategy().drop_full_weights();  // ZeRO-3: a gathered whole copy would be stale
  state().upload(weights, &opt);
  opt_host_ = AdamWState{};
  on_restore(weights);
}

#ifndef VERL_HAVE_CUDA
namespace detail {
std::unique_ptr<PolicyModel> make_cuda_policy(model::Weights, const PolicyOptions&) {
  VERL_FAIL("trainer.device=cuda: this build has no CUDA backend (configure with -DVERL_CUDA=ON)");
}
}  // namespace detail
#endif

std::unique_ptr<PolicyModel> make_policy(Device device, model::Weights weights,
                                         const PolicyOptions& opts) {
  const model::HeadKind head = weights.config.head;
  VERL_CHECK(head == model::HeadKind::CausalLM ||
                 (head == model::HeadKind::TokenClassification && weights.config.num_labels == 1) ||
                 (head == model::HeadKind::SequenceClassification &&
                  weights.config.num_labels == 1 && !opts.trainable),
             "a trainer model must be a causal LM (actor, reference), a one-label token "
             "classifier (critic) or, forward only, a one-label sequence classifier (reward "
             "model); got {} with {} labels{}",
             weights.config.architecture, weights.config.num_labels,
             head == model::HeadKind::SequenceClassification && opts.trainable ? " to train" : "");
  if (device == Device::Cuda) return detail::make_cuda_policy(std::move(weights), opts);
  return std::make_unique<CpuPolicy>(std::move(weights), opts);
}

}  // namespace verl::trainer
