// The CUDA policy: model::cuda::CudaTransformer computing over an optim::cuda::CudaTrainState
// behind PolicyModel. Gradients accumulate on the device over micro-batches and the optimizer
// runs there; the host keeps a copy of the weights for the CPU rollout engine and checkpoints,
// downloaded only when a step made it stale. A quantised forward-only model (PolicyOptions::
// quantized) keeps its layers' linear matrices quantised on the device and the rest in the bf16
// state. Compiled to nothing without VERL_HAVE_CUDA (policy_model.cpp then has the stub).
#ifdef VERL_HAVE_CUDA

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "core/error.h"
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
    const rollout::SchedulerConfig& sched, const RolloutRunnerOptions& opts, Numerics numerics) {
  rollout::cuda::CudaRunnerOptions ro;
  ro.kv_blocks = sched.num_blocks;
  ro.gpu_memory_utilization = opts.gpu_memory_utilization;
  ro.enforce_eager = opts.enforce_eager;
  ro.numerics = numerics;
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
    } else {
      state_ = std::make_unique<optim::cuda::CudaTrainState>(session_.ctx(), host_, opts.trainable,
                                                             opts.offload);
    }
    state_->wake();  // a sleeping state is planned with its weights present
    model::cuda::CudaTransformerOptions co;
    co.max_tokens = opts.max_tokens;
    co.max_seqs = opts.max_seqs;
    co.lm_head_chunk = opts.lm_head_chunk;
    co.trainable = opts.trainable;
    co.recompute = opts.trainable && opts.recompute;
    co.numerics = opts.numerics;
    co.quantized = quant_.get();
    tf_ = std::make_unique<model::cuda::CudaTransformer>(
        session_.ctx(), host_.config, layout, state_->weights_bf16(),
        opts.trainable ? state_->grads() : nullptr, co);
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
    if (quant_) quant_->wake(session_.ctx().stream);
    tf_->set_weights(state_->weights_bf16());
  }
  void sleep() override {
    state_->sleep();
    if (quant_) quant_->sleep(session_.ctx().stream);
  }

  // The host copy is fresh while no optimizer step ran since it was downloaded.
  const model::Weights& weights() override {
    VERL_CHECK(!quant_,
               "a quantised model on the GPU keeps no full-precision copy of its linear layers "
               "(model/cuda/quantized_linears.h); its weights cannot be read back");
    if (host_steps_ != state_->steps()) {
      host_.data = state_->download_weights();
      host_steps_ = state_->steps();
    }
    return host_;
  }

  std::unique_ptr<rollout::StepRunner> make_rollout_runner(
      const rollout::SchedulerConfig& sched, const RolloutRunnerOptions& opts) override {
    VERL_CHECK(
        !quant_,
        "internal: the GPU rollout runs on a trained policy's bf16 weights, not a quantised model");
    return rollout_runner(session_.ctx(), host_.config, host_.layout, state_->weights_bf16(), sched,
                          opts, numerics_);
  }

  // The bf16 weights copied on this policy's stream (after the work already queued on it, such as
  // the last update's AdamW) into a buffer that the snapshot's own session reads.
  class Snapshot final : public RolloutSnapshot {
   public:
    Snapshot(const ops::cuda::CudaContext& from, const model::Weights& host,
             const ops::cuda::bf16* w, Numerics numerics)
        : config_(host.config),
          layout_(host.layout),
          numerics_(numerics),
          w_(static_cast<size_t>(host.layout.total)) {
      VERL_CUDA_CHECK(
          cudaMemcpyAsync(w_.data(), w, w_.bytes(), cudaMemcpyDeviceToDevice, from.stream));
      VERL_CUDA_CHECK(cudaStreamSynchronize(from.stream));
    }
    std::unique_ptr<rollout::StepRunner> make_rollout_runner(
        const rollout::SchedulerConfig& sched, const RolloutRunnerOptions& opts) override {
      return rollout_runner(session_.ctx(), config_, layout_, w_.data(), sched, opts, numerics_);
    }

   private:
    model::ModelConfig config_;
    model::ParamLayout layout_;
    Numerics numerics_;
    ops::cuda::CudaSession session_;
    ops::cuda::DeviceBuffer<ops::cuda::bf16> w_;
  };
  std::unique_ptr<RolloutSnapshot> rollout_snapshot() override {
    VERL_CHECK(state_->weights_bf16() != nullptr,
               "rollout_snapshot: the policy's weights are asleep");
    return std::make_unique<Snapshot>(session_.ctx(), host_, state_->weights_bf16(), numerics_);
  }

  int64_t max_tokens() const override { return tf_->options().max_tokens; }
  int64_t max_seqs() const override { return tf_->options().max_seqs; }
  size_t device_bytes() const override {
    return state_->device_bytes() + tf_->device_bytes() + (quant_ ? quant_->device_bytes() : 0);
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
    std::vector<float>().swap(host_.data);
    host_steps_ = -1;
  }

 private:
  ops::cuda::CudaSession session_;  // this model's stream, cuBLASLt handle and workspace
  model::Weights host_;             // config, layout and the host copy of the weights
  int64_t host_steps_ = 0;          // state_->steps() when host_.data was filled (-1: never)
  Numerics numerics_;
  std::unique_ptr<model::cuda::QuantizedLinears> quant_;  // a quantised model's linear matrices
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
