// The actor's, the reference policy's and the critic's model behind one interface, so the
// trainer's log-prob passes and updates run on the CPU model (model::Transformer, fp32) or on the
// GPU (model::cuda::CudaTransformer, bf16 compute), as trainer.device picks. A policy is three
// parts that live apart: the model (forward/backward over weights and gradients it is handed), the
// flat training state (optim/train_state.h: master weights, gradients, moments; on the GPU also
// the bf16 copy) with the parallel strategy composed onto it (optim/strategy.h: data parallelism,
// ZeRO, LightweightSync), and the one optimizer over both (optim::AdamW). The rollout engine and
// checkpoints read host copies of the weights.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/numerics.h"
#include "dist/communicator.h"
#include "model/batch.h"
#include "model/lora.h"
#include "model/quantize.h"
#include "model/weights.h"
#include "optim/adamw.h"
#include "optim/strategy.h"
#include "optim/train_state.h"
#include "rollout/scheduler.h"
#include "rollout/step_runner.h"

namespace verl::trainer {

using optim::AdamWConfig;
using optim::AdamWState;

// The GPU rollout's memory (actor_rollout_ref.rollout.*); its KV block count is the scheduler
// config's num_blocks (rollout/kv_sizing.h), capped by gpu_memory_utilization.
struct RolloutRunnerOptions {
  double gpu_memory_utilization = 0.5;  // share of the device the rollout may hold in total
  bool enforce_eager = false;           // no CUDA graphs
};

struct PolicyOptions {
  // false: forward only (the reference policy): no gradients and no optimizer; on CUDA only the
  // bf16 weights are kept.
  bool trainable = true;
  AdamWConfig optim;  // trainable only
  // CUDA: the device model is planned once for micro-batches of at most max_tokens tokens and
  // max_seqs sequences (the trainer derives them from its config). The CPU model grows its buffers.
  int64_t max_tokens = 0, max_seqs = 0;
  int64_t lm_head_chunk = 4096;  // CUDA: token rows of fp32 logits alive at once in the LM head
  // Activation recomputation in backward (actor_rollout_ref.model.enable_gradient_checkpointing).
  // CUDA only; the CPU model keeps every activation, so there it changes nothing.
  bool recompute = false;
  // CUDA: the kernels' numerics (core/numerics.h), the same for the actor and its rollout so that
  // their log-probs agree as the mode promises. The CPU model is batch-invariant already (one
  // fp32 path for every batch).
  Numerics numerics = Numerics::Fast;
  // CUDA: the share of the training state in pinned host memory (optim::OffloadConfig); for a
  // forward-only model, params > 0 keeps its bf16 weights on the host between wake() and sleep().
  // The CPU model ignores it (its state is in host memory).
  optim::OffloadConfig offload;
  // Forward-only CUDA models (a quantised reference policy or reward model): the layers' linear
  // matrices as model::quantize_linear_weights handed them back, kept on the device in that form
  // (model/cuda/quantized_linears.h) instead of bf16, which is the memory saving; the weights
  // passed beside them give the rest. The CPU model ignores it (its weights already hold the
  // dequantised values). Shared so that copies of the options stay cheap; the policy holds it
  // only while it uploads.
  std::shared_ptr<const std::vector<model::QuantizedLayer>> quantized;
  // LoRA (model/lora.h): the adapters this model applies, starting from these values. A trainable
  // model then trains the adapters only: state() is over lora->layout (fp32 master weights,
  // gradients and AdamW moments of the adapters) and the base weights handed to make_policy are
  // frozen (on CUDA kept in bf16 only: no fp32 master, gradients or moments). null: no adapters.
  std::shared_ptr<const model::LoraWeights> lora;
};

class PolicyModel {
 public:
  virtual ~PolicyModel() = default;
  virtual Device device() const = 0;
  bool trainable() { return state().trainable(); }
  // The model's config (never downloads anything).
  virtual const model::ModelConfig& config() const = 0;

  // Runs the model over `batch` with logits divided by `temperature`: logprob[t] of token t+1 and,
  // when `entropy` is given, the entropy of that distribution ([T] each, host). A trainable model
  // keeps the activations for backward() unless for_backward is false (a log-prob pass: the CUDA
  // model then skips what only backward reads).
  virtual void forward(const model::PackedBatch& batch, float temperature,
                       std::vector<float>& logprob, std::vector<float>* entropy,
                       bool for_backward = true) = 0;
  // Accumulates into the gradients d/dθ sum_t d_logprob[t] logprob[t] + d_entropy[t] entropy[t] for
  // the last forward's batch (host arrays [T]; null counts as zero). Micro-batches accumulate.
  virtual void backward(const float* d_logprob, const float* d_entropy) = 0;
  void zero_grad();
  // Token-classification models (the critic): values [T] (num_labels 1) of the batch, keeping the
  // activations; backward_values accumulates the gradient of sum_t d_values[t] values[t]. A
  // sequence classifier (a reward model, forward only) gives its score at each sequence's last
  // token (on the GPU every token has the head's value; read the last ones).
  virtual void forward_values(const model::PackedBatch& batch, std::vector<float>& values) = 0;
  virtual void backward_values(const float* d_values) = 0;
  // The one optimizer over state(): sums the gradients over `comm`'s ranks, clips them to
  // optim.grad_clip and applies one AdamW step with learning rate `lr`. Returns the global
  // gradient norm before clipping; a non-finite norm skips the update (as verl does).
  double optimizer_step(float lr, dist::Communicator& comm);
  // The flat training state this model computes with.
  virtual optim::TrainState& state() = 0;
  // The parallel strategy over state() (AllReduceAtStep until set_strategy gives another): the
  // model's gradient sink and weight source, the step's reduction, ZeRO-3's reshard, the carry.
  virtual optim::Strategy& strategy() = 0;
  virtual void set_strategy(std::unique_ptr<optim::Strategy> strategy) = 0;
  // Frees what forward() kept for backward, between phases (the CUDA arena is planned once and
  // stays).
  virtual void release_activations() {}
  // A forward-only CUDA model with offloaded weights (PolicyOptions::offload.params, the
  // reference policy's param_offload) brings them to the device for a pass and frees them after;
  // else nothing.
  virtual void wake() {}
  virtual void sleep() {}

  // Host copy of the weights for the rollout engine and checkpoints. On CUDA an optimizer step
  // makes it stale and the next call downloads the fp32 master weights once. With LoRA these are
  // the frozen base weights (lora() holds the adapters).
  virtual const model::Weights& weights() = 0;
  // LoRA: host copy of the adapters at their current values (on CUDA downloaded when a step made
  // it stale), for checkpoints, export and the CPU rollout; null without adapters.
  virtual const model::LoraWeights* lora() { return nullptr; }
  // LoRA: false runs the base model alone until switched back (the reference policy inside the
  // actor, verl's ref_in_actor: no second copy of the weights); log-prob passes only, backward
  // refuses. A model without adapters accepts only true.
  virtual void set_adapters_enabled(bool on) {
    VERL_CHECK(on, "internal: this model has no LoRA adapters to switch off");
  }
  // AdamW state for checkpoints (trainable only; on CUDA downloaded by each call).
  const AdamWState& optimizer_state();
  // Resume: replaces the weights (layout order) and, for a trainable model, the AdamW state.
  void restore(std::vector<float> weights, AdamWState opt);

  // A rollout step runner over this model's own device weights (the hybrid engine: the rollout
  // reads the bf16 copy the optimizer writes, no copy), with a KV cache of its own that is freed
  // when the runner is destroyed. nullptr: the rollout engine runs on the CPU from weights().
  virtual std::unique_ptr<rollout::StepRunner> make_rollout_runner(
      const rollout::SchedulerConfig& sched, const RolloutRunnerOptions& opts) {
    (void)sched;
    (void)opts;
    return nullptr;
  }

  // A frozen copy of the weights the rollout reads, for a rollout that runs beside training
  // (trainer.one_step_off_policy): the CUDA policy copies its bf16 weights on the device and gives
  // the copy a stream, cuBLASLt handle and workspace of its own, so the next step's generation
  // runs on the GPU while this step's update rewrites the originals. nullptr: the caller snapshots
  // weights() on the host (the CPU rollout).
  class RolloutSnapshot {
   public:
    virtual ~RolloutSnapshot() = default;
    virtual std::unique_ptr<rollout::StepRunner> make_rollout_runner(
        const rollout::SchedulerConfig& sched, const RolloutRunnerOptions& opts) = 0;
  };
  virtual std::unique_ptr<RolloutSnapshot> rollout_snapshot() { return nullptr; }

  // The plan's limits (0: none) and the device memory this model holds (0 on CPU).
  virtual int64_t max_tokens() const { return 0; }
  virtual int64_t max_seqs() const { return 0; }
  virtual size_t device_bytes() const { return 0; }

  // Waits for the device work this model enqueued (a no-op on the CPU): benchmarks end a step here.
  virtual void synchronize() {}
  // Profiling hook for benchmarks (CUDA): GPU ms per op family since the last take_profile().
  virtual void set_profiling(bool on) { (void)on; }
  virtual std::vector<std::pair<std::string, double>> take_profile() { return {}; }

 protected:
  explicit PolicyModel(const AdamWConfig& optim) : optimizer_(optim) {}
  // After restore() replaced the state's contents (the CUDA policy's host copy is stale then).
  virtual void on_restore(std::vector<float>& weights) { (void)weights; }

 private:
  optim::AdamW optimizer_;
  AdamWState opt_host_;  // the last optimizer_state() download (checkpoints)
};

// The model for `device`: a causal LM (actor, reference policy), a one-label token classifier
// (critic) or, forward only, a one-label sequence classifier (reward model).
std::unique_ptr<PolicyModel> make_policy(Device device, model::Weights weights,
                                         const PolicyOptions& opts);

}  // namespace verl::trainer
