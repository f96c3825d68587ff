// The CUDA policy: model::cuda::CudaTransformer computing over an optim::cuda::CudaTrainState
// behind PolicyModel. Gradients accumulate on the device over micro-batches and the optimizer
// runs there; the host keeps a copy of the weights for the CPU rollout engine and checkpoints,
// downloaded only when a step made it stale. A quantised forward-only model (PolicyOptions::
// quantized) keeps its layers' linear matrices quantised on the device and the rest in the bf16
// state. With LoRA (PolicyOptions::lora) the base is a forward-only bf16 state and the adapters
// are the training state. Compiled to nothing without VERL_HAVE_CUDA (policy_model.cpp then has
// the stub).
#ifdef VERL_HAVE_CUDA

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/cuda/lora.h"
#include "model/cuda/quantized_linears.h"
#include "model/cuda/transformer.h"
#include "ops/cuda/device.h"
#include "optim/cuda/train_state.h"
#include "optim/strategy.h"
#include "rollout/cuda/model_runner.h"
#include "trainer/policy_model.h"

namespace verl::trainer {
namespace {

// What the bf16 state of a quantised model holds: every parameter but the layers' linear
// matrices, which keep their entries (names, shapes) with no elements, so the layout's offsets
// pack the rest.
model::Weights without_linear_matrices(const model::Weights& w) {
  model::Weights rest;
  rest.config = w.config;
  rest.layout = w.layout;
  std::vector<bool> dropped(w.layout.params.size(), false);
  for (const model::LayerParams& lp : w.layout.layers)
    for (int i : {lp.wqkv, lp.wo, lp.wgu, lp.wdown})
      if (i >= 0) dropped[static_cast<size_t>(i)] = true;
  int64_t at = 0;
  for (size_t i = 0; i < rest.layout.params.size(); ++i) {
    model::ParamInfo& p = rest.layout.params[i];
    if (dropped[i]) p.numel = 0;
    p.offset = at;
    at += p.numel;
  }
  rest.layout.total = at;
  rest.data.resize(static_cast<size_t>(at));
  for (size_t i = 0; i < rest.layout.params.size(); ++i) {
    const model::ParamInfo& p = rest.layout.params[i];
    std::copy_n(w.param(static_cast<int>(i)), p.numel, rest.data.begin() + p.offset);
  }
  return rest;
}

// The GPU rollout over bf16 weights `w` (flat in `layout` order) on ctx's stream: the scheduler's
// blocks, capped by gpu_memory_utilization of the device (vLLM's rule: what is in use now, the
// trainer's state included, counts against the share; kv_sizing.h).
std::unique_ptr<rollout::StepRunner> rollout_runner(
    const ops::cuda::CudaContext& ctx, const model::ModelConfig& cfg,
    const model::ParamLayout& layout, const ops::cuda::bf16* w,
    const rollout::SchedulerConfig& sched, const RolloutRunnerOptions& opts, Numerics numerics,
    const model::cuda::CudaLora* lora) {
  rollout::cuda::CudaRunnerOptions ro;
  ro.kv_blocks = sched.num_blocks;
  ro.gpu_memory_utilization = opts.gpu_memory_utilization;
  ro.enforce_eager = opts.enforce_eager;
  ro.numerics = numerics;
  ro.lora = lora;
  return std::make_unique<rollout::cuda::CudaModelRunner>(ctx, cfg, layout, w, sched, ro);
}

class CudaPolicy final : public PolicyModel {
 public:
  CudaPolicy(model::Weights w, const PolicyOptions& opts)
      : PolicyModel(opts.optim), host_(std::move(w)), numerics_(opts.numerics) {
    VERL_CHECK(opts.max_tokens > 0 && opts.max_seqs > 0,
               "internal: the CUDA policy needs its micro-batch plan (max_tokens {}, max_seqs {})",
               opts.max_tokens, opts.max_seqs);
    model::ParamLayout layout = host_.layout;  // of the bf16 weights the model reads
    if (opts.quantized != nullptr) {
      VERL_CHECK(opts.lora == nullptr,
                 "LoRA adapters over quantised linear layers are not supported on the GPU; the "
                 "adapted model keeps its base in bf16");
      VERL_CHECK(!opts.trainable &&
                     static_cast<int64_t>(opts.quantized->size()) == host_.config.num_hidden_layers,
                 "internal: quantised linear layers ({} for {} layers) are for forward-only models",
                 opts.quantized->size(), host_.config.num_hidden_layers);
      // Both halves sleep with param_offload: the quantised set's image and the bf16 rest stay in
      // pinned host memory between passes.
      quant_ =
          std::make_unique<model::cuda::QuantizedLinears>(*opts.quantized, opts.offload.params > 0);
      const model::Weights rest = without_linear_matrices(host_);
      layout = rest.layout;
      state_ =
          std::make_unique<optim::cuda::CudaTrainState>(session_.ctx(), rest, false, opts.offload);
    } else if (opts.lora != nullptr) {
      const model::LoraWeights& lw = *opts.lora;
      const model::ModelConfig &c = host_.config, &lc = lw.base;
      VERL_CHECK(c.num_hidden_layers == lc.num_hidden_layers && c.hidden_size == lc.hidden_size &&
                     c.intermediate_size == lc.intermediate_size && c.q_dim() == lc.q_dim() &&
                     c.kv_dim() == lc.kv_dim(),
                 "the LoRA adapter was made for a model of {} layers, hidden {}, intermediate {}; "
                 "the base model has {}, {}, {}",
                 lc.num_hidden_layers, lc.hidden_size, lc.intermediate_size, c.num_hidden_layers,
                 c.hidden_size, c.intermediate_size);
      // The frozen base in bf16 alone (a reference policy's state: no fp32 master, gradients or
      // moments), the adapters as the training state (fp32 master, gradients, moments and the
      // bf16 copy the model reads). The offload config goes to the state that has one: the
      // adapters' optimizer state when training, else the base's weights (param_offload).
      base_ = std::make_unique<optim::cuda::CudaTrainState>(
          session_.ctx(), host_, false, opts.trainable ? optim::OffloadConfig{} : opts.offload);
      state_ = std::make_unique<optim::cuda::CudaTrainState>(
          session_.ctx(), lw.layout, lw.data, opts.trainable,
          opts.trainable ? opts.offload : optim::OffloadConfig{});
      lora_host_ = lw;
      lora_ = std::make_unique<model::cuda::CudaLora>(lw);
      base_->wake();
    } else {
      state_ = std::make_unique<optim::cuda::CudaTrainState>(session_.ctx(), host_, opts.trainable,
                                                             opts.offload);
    }
    state_->wake();  // a sleeping state is planned with its weights present
    if (lora_) {
      lora_->set_weights(state_->weights_bf16());
      lora_->set_grads(opts.trainable ? state_->grads() : nullptr);
    }
    model::cuda::CudaTransformerOptions co;
    co.max_tokens = opts.max_tokens;
    co.max_seqs = opts.max_seqs;
    co.lm_head_chunk = opts.lm_head_chunk;
    co.trainable = opts.trainable;
    co.recompute = opts.trainable && opts.recompute;
    co.numerics = opts.numerics;
    co.quantized = quant_.get();
    co.lora = lora_.get();
    // With LoRA the base's gradients are never formed (a frozen base, no weight-gradient GEMMs).
    tf_ = std::make_unique<model::cuda::CudaTransformer>(
        session_.ctx(), host_.config, layout, base_weights(),
        opts.trainable && !lora_ ? state_->grads() : nullptr, co);
    strategy_ = std::make_unique<optim::AllReduceAtStep>(*state_);
    if (opts.trainable) {  // data parallelism reduces each finished range while backward goes on
      tf_->set_grad_ready_hook(
          [this](const model::cuda::GradRange& r) { strategy_->grads_ready(r.begin, r.end); });
    }
    // The device state (or its pinned host part) is the weights now: no host copy until weights()
    // is asked for one (checkpoints, a CPU rollout), which a 7B model's host memory cannot spare
    // beside an offloaded state.
    std::vector<float>().swap(host_.data);
    host_steps_ = -1;
    sleep();
  }
  CudaPolicy(const CudaPolicy&) = delete;
  CudaPolicy& operator=(const CudaPolicy&) = delete;

  Device device() const override { return Device::Cuda; }
  const model::ModelConfig& config() const override { return host_.config; }
  optim::TrainState& state() override { return *state_; }
  optim::Strategy& strategy() override { return *strategy_; }
  void set_strategy(std::unique_ptr<optim::Strategy> strategy) override {
    VERL_CHECK(&strategy->state() == state_.get(),
               "internal: a strategy over another model's state");
    strategy_ = std::move(strategy);
  }

  void forward(const model::PackedBatch& batch, float temperature, std::vector<float>& logprob,
               std::vector<float>* entropy, bool for_backward = true) override {
    tf_->forward(batch, temperature, for_backward && tf_->trainable());
    logprob = tf_->download_logprob();
    if (entropy) *entropy = tf_->download_entropy();
  }

  void backward(const float* d_logprob, const float* d_entropy) override {
    tf_->backward_host(d_logprob, d_entropy);
  }

  void forward_values(const model::PackedBatch& batch, std::vector<float>& values) override {
    tf_->forward(batch);
    values = tf_->download_values();
  }

  void backward_values(const float* d_values) override { tf_->backward_values_host(d_values); }

  void wake() override {
    state_->wake();
    if (base_) base_->wake();
    if (quant_) quant_->wake(session_.ctx().stream);
    if (lora_) lora_->set_weights(state_->weights_bf16());
    tf_->set_weights(base_weights());
  }
  void sleep() override {
    state_->sleep();
    if (base_) base_->sleep();
    if (quant_) quant_->sleep(session_.ctx().stream);
  }

  // The host copy is fresh while no optimizer step ran since it was downloaded. With LoRA it is
  // the frozen base as the GPU holds it (bf16 values), downloaded once.
  const model::Weights& weights() override {
    VERL_CHECK(!quant_,
               "a quantised model on the GPU keeps no full-precision copy of its linear layers "
               "(model/cuda/quantized_linears.h); its weights cannot be read back");
    optim::cuda::CudaTrainState& w = base_ ? *base_ : *state_;
    if (host_steps_ != w.steps()) {
      host_.data = w.download_weights();
      host_steps_ = w.steps();
    }
    return host_;
  }

  // The adapters' fp32 master weights (their training state), downloaded when a step (or a
  // restore) made the host copy stale.
  const model::LoraWeights* lora() override {
    if (!lora_) return nullptr;
    if (lora_steps_ != state_->steps()) {
      lora_host_.data = state_->download_weights();
      lora_steps_ = state_->steps();
    }
    return &lora_host_;
  }
  void set_adapters_enabled(bool on) override {
    VERL_CHECK(on || lora_, "internal: this model has no LoRA adapters to switch off");
    if (lora_) lora_->set_enabled(on);
  }

  std::unique_ptr<rollout::StepRunner> make_rollout_runner(
      const rollout::SchedulerConfig& sched, const RolloutRunnerOptions& opts) override {
    VERL_CHECK(
        !quant_,
        "internal: the GPU rollout runs on a trained policy's bf16 weights, not a quantised model");
    return rollout_runner(session_.ctx(), host_.config, host_.layout, base_weights(), sched, opts,
                          numerics_, lora_.get());
  }

  // The bf16 weights that the update rewrites (all of them, or with LoRA the adapters alone)
  // copied on this policy's stream (after the work already queued on it, such as the last
  // update's AdamW) into a buffer that the snapshot's own session reads. A LoRA snapshot reads the
  // frozen base in place: it must not outlive the policy.
  class Snapshot final : public RolloutSnapshot {
   public:
    Snapshot(const ops::cuda::CudaContext& from, const model::Weights& host,
             const ops::cuda::bf16* w, int64_t n, Numerics numerics,
             const ops::cuda::bf16* base = nullptr, const model::cuda::CudaLora* lora = nullptr)
        : config_(host.config),
          layout_(host.layout),
          numerics_(numerics),
          w_(static_cast<size_t>(n)),
          base_(base) {
      VERL_CUDA_CHECK(
          cudaMemcpyAsync(w_.data(), w, w_.bytes(), cudaMemcpyDeviceToDevice, from.stream));
      VERL_CUDA_CHECK(cudaStreamSynchronize(from.stream));
      if (lora != nullptr) {
        lora_ = std::make_unique<model::cuda::CudaLora>(*lora);
        lora_->set_weights(w_.data());
        lora_->set_grads(nullptr);
        lora_->set_enabled(true);
      }
    }
    std::unique_ptr<rollout::StepRunner> make_rollout_runner(
        const rollout::SchedulerConfig& sched, const RolloutRunnerOptions& opts) override {
      return rollout_runner(session_.ctx(), config_, layout_, base_ ? base_ : w_.data(), sched,
                            opts, numerics_, lora_.get());
    }

   private:
    model::ModelConfig config_;
    model::ParamLayout layout_;
    Numerics numerics_;
    ops::cuda::CudaSession session_;
    ops::cuda::DeviceBuffer<ops::cuda::bf16> w_;
    const ops::cuda::bf16* base_;                  // LoRA: the policy's frozen base
    std::unique_ptr<model::cuda::CudaLora> lora_;  // LoRA: the adapters' view over w_
  };
  std::unique_ptr<RolloutSnapshot> rollout_snapshot() override {
    VERL_CHECK(state_->weights_bf16() != nullptr && base_weights() != nullptr,
               "rollout_snapshot: the policy's weights are asleep");
    return std::make_unique<Snapshot>(session_.ctx(), host_, state_->weights_bf16(),
                                      state_->numel(), numerics_, base_ ? base_weights() : nullptr,
                                      lora_.get());
  }

  int64_t max_tokens() const override { return tf_->options().max_tokens; }
  int64_t max_seqs() const override { return tf_->options().max_seqs; }
  size_t device_bytes() const override {
    return state_->device_bytes() + (base_ ? base_->device_bytes() : 0) + tf_->device_bytes() +
           (quant_ ? quant_->device_bytes() : 0);
  }
  void synchronize() override { session_.synchronize(); }
  void set_profiling(bool on) override { tf_->set_profiling(on); }
  std::vector<std::pair<std::string, double>> take_profile() override {
    return tf_->take_profile();
  }

 protected:
  // As after construction: no host copy kept (weights() downloads one when asked).
  void on_restore(std::vector<float>& weights) override {
    (void)weights;
    if (lora_) {  // the adapters were restored; the frozen base is as it was
      lora_steps_ = -1;
      return;
    }
    std::vector<float>().swap(host_.data);
    host_steps_ = -1;
  }

 private:
  ops::cuda::CudaSession session_;  // this model's stream, cuBLASLt handle and workspace
  model::Weights host_;             // config, layout and the host copy of the weights
  int64_t host_steps_ = 0;          // state_->steps() when host_.data was filled (-1: never)
  Numerics numerics_;
  // The bf16 weights the model's base reads: the frozen base's (LoRA) or the training state's.
  const ops::cuda::bf16* base_weights() const {
    return base_ ? base_->weights_bf16() : state_->weights_bf16();
  }

  std::unique_ptr<model::cuda::QuantizedLinears> quant_;  // a quantised model's linear matrices
  // LoRA: the frozen base (forward-only bf16 state), the adapters' host copy (refreshed when
  // lora_steps_ != state_->steps()) and the device view the model and the rollout read.
  std::unique_ptr<optim::cuda::CudaTrainState> base_;
  model::LoraWeights lora_host_;
  int64_t lora_steps_ = 0;
  std::unique_ptr<model::cuda::CudaLora> lora_;
  std::unique_ptr<optim::cuda::CudaTrainState> state_;
  std::unique_ptr<optim::Strategy> strategy_;  // over state_: declared after it, destroyed before
  std::unique_ptr<model::cuda::CudaTransformer> tf_;
};

}  // namespace

namespace detail {
std::unique_ptr<PolicyModel> make_cuda_policy(model::Weights weights, const PolicyOptions& opts) {
  VERL_CHECK(cuda_available(),
             "trainer.device=cuda but no CUDA device is visible; set trainer.device=cpu or auto");
  return std::make_unique<CudaPolicy>(std::move(weights), opts);
}
}  // namespace detail

}  // namespace verl::trainer

#endif  // VERL_HAVE_CUDA
