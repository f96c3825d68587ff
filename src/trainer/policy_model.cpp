// The CPU policy (model::Transformer + flat fp32 gradients + AdamW: exactly the trainer's steps
// before the device seam) and the device choice. The CUDA policy is in policy_model_cuda.cpp.
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

class CpuPolicy final : public PolicyModel {
 public:
  CpuPolicy(model::Weights w, const PolicyOptions& opts) : w_(std::move(w)), tf_(w_) {
    if (opts.trainable) {
      opt_.emplace(w_.layout.total, opts.optim);
      grads_.assign(w_.data.size(), 0.0f);
    }
  }
  CpuPolicy(const CpuPolicy&) = delete;  // tf_ refers to this object's w_
  CpuPolicy& operator=(const CpuPolicy&) = delete;

  Device device() const override { return Device::Cpu; }
  const model::ModelConfig& config() const override { return w_.config; }
  bool trainable() const override { return opt_.has_value(); }

  void forward(const model::PackedBatch& batch, float temperature, std::vector<float>& logprob,
               std::vector<float>* entropy, bool for_backward = true) override {
    (void)for_backward;  // the CPU model keeps the same activations either way
    fo_.temperature = temperature;
    tf_.forward(batch, acts_, fo_);
    batch_ = batch;  // backward needs it; a copy of T ints, small beside the activations
    // The activation buffers keep the size of the largest batch seen: take the first T.
    const int64_t T = batch.num_tokens();
    logprob.assign(acts_.logprob.begin(), acts_.logprob.begin() + T);
    if (entropy) entropy->assign(acts_.entropy.begin(), acts_.entropy.begin() + T);
  }

  void backward(const float* d_logprob, const float* d_entropy) override {
    require_trainable("backward");
    tf_.backward(batch_, acts_, d_logprob, d_entropy, nullptr, grads_.data(), fo_);
  }

  void forward_values(const model::PackedBatch& batch, std::vector<float>& values) override {
    tf_.forward(batch, acts_, fo_);
    batch_ = batch;
    values.assign(acts_.values.begin(), acts_.values.begin() + batch.num_tokens());
  }

  void backward_values(const float* d_values) override {
    require_trainable("backward_values");
    tf_.backward(batch_, acts_, nullptr, nullptr, d_values, grads_.data(), fo_);
  }

  void zero_grad() override {
    require_trainable("zero_grad");
    std::fill(grads_.begin(), grads_.end(), 0.0f);
  }

  double optimizer_step(float lr, dist::Communicator& comm) override {
    require_trainable("optimizer_step");
    comm.all_reduce(grads_, dist::ReduceOp::Sum);
    return opt_->step(w_.data.data(), grads_.data(), lr);
  }

  void release_activations() override { acts_ = model::Activations{}; }

  const model::Weights& weights() override { return w_; }

  const AdamWState& optimizer_state() override {
    require_trainable("optimizer_state");
    return opt_->state();
  }

  void restore(std::vector<float> weights, AdamWState opt) override {
    VERL_CHECK(static_cast<int64_t>(weights.size()) == w_.layout.total,
               "restore: {} weights for a model of {} parameters", weights.size(), w_.layout.total);
    w_.data = std::move(weights);  // tf_ reads w_ through its reference
    if (opt_) {
      VERL_CHECK(opt.exp_avg.size() == w_.data.size() && opt.exp_avg_sq.size() == w_.data.size(),
                 "restore: optimizer moments of {} and {} floats for a model of {} parameters",
                 opt.exp_avg.size(), opt.exp_avg_sq.size(), w_.data.size());
      opt_->state() = std::move(opt);
    }
  }

 private:
  void require_trainable(const char* what) const {
    VERL_CHECK(opt_.has_value(),
               "PolicyModel::{}: this model is forward-only (the reference policy)", what);
  }

  model::Weights w_;
  model::Transformer tf_;  // holds a reference to w_
  std::optional<AdamW> opt_;
  std::vector<float> grads_;
  model::Activations acts_;
  model::ForwardOptions fo_;
  model::PackedBatch batch_;
};

}  // namespace

const char* to_string(Device d) {
  return d == Device::Cuda ? "cuda" : "cpu";
}

Device resolve_device(const std::string& value, const std::string& key) {
  if (value == "cpu") return Device::Cpu;
  if (value == "auto") return cuda_available() ? Device::Cuda : Device::Cpu;
  VERL_CHECK(value == "cuda", "{} must be cpu, cuda or auto, got '{}'", key, value);
#ifdef VERL_HAVE_CUDA
  VERL_CHECK(cuda_available(),
             "{0}=cuda but no CUDA device is visible (no driver, or CUDA_VISIBLE_DEVICES hides "
             "them); set {0}=cpu or auto",
             key);
#else
  VERL_FAIL(
      "{0}=cuda but this build has no CUDA backend (configure with -DVERL_CUDA=ON on a machine "
      "with the CUDA toolkit); set {0}=cpu or auto",
      key);
#endif
  return Device::Cuda;
}

#ifndef VERL_HAVE_CUDA
bool cuda_available() {
  return false;
}
size_t device_memory_in_use() {
  return 0;
}
namespace detail {
std::unique_ptr<PolicyModel> make_cuda_policy(model::Weights, const PolicyOptions&) {
  VERL_FAIL("trainer.device=cuda: this build has no CUDA backend (configure with -DVERL_CUDA=ON)");
}
}  // namespace detail
#endif

std::unique_ptr<PolicyModel> make_policy(Device device, model::Weights weights,
                                         const PolicyOptions& opts) {
  VERL_CHECK(weights.config.head == model::HeadKind::CausalLM ||
                 (weights.config.head == model::HeadKind::TokenClassification &&
                  weights.config.num_labels == 1),
             "a trained model must be a causal LM (actor, reference) or a one-label token "
             "classifier (critic), got {} with {} labels",
             weights.config.architecture, weights.config.num_labels);
  if (device == Device::Cuda) return detail::make_cuda_policy(std::move(weights), opts);
  return std::make_unique<CpuPolicy>(std::move(weights), opts);
}

}  // namespace verl::trainer
