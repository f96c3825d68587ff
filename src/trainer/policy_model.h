// The actor's and the reference policy's model behind one interface, so the trainer's log-prob
// passes and updates run on the CPU model (model::Transformer, fp32) or on the GPU
// (ops::cuda::CudaTransformer: bf16 compute, fp32 master weights, gradients and AdamW moments), as
// trainer.device picks. The rollout engine and checkpoints read host copies of the weights.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "model/batch.h"
#include "model/weights.h"
#include "rollout/scheduler.h"
#include "rollout/step_runner.h"
#include "trainer/optimizer.h"

namespace verl::trainer {

enum class Device { Cpu, Cuda };
const char* to_string(Device d);

// Whether this build has the CUDA backend (VERL_HAVE_CUDA) and the driver sees a device.
bool cuda_available();
// trainer.device (or another `key`, e.g. a CLI flag): cpu | cuda | auto (cuda when
// cuda_available(), else cpu). cuda without a usable device is an error naming the key rather than
// a silent fallback.
Device resolve_device(const std::string& value, const std::string& key = "trainer.device");
// Device memory in use (cudaMemGetInfo: total - free) in bytes; 0 in a build without CUDA.
size_t device_memory_in_use();

// The GPU rollout's memory and mode (actor_rollout_ref.rollout.*).
struct RolloutRunnerOptions {
  int64_t kv_blocks = 0;                // KV blocks the scheduler needs; their bytes capped by the next
  double gpu_memory_utilization = 0.5;  // share of the device the rollout may hold in total
  bool enforce_eager = false;           // no CUDA graphs
  // The batch-invariant kernels (CudaRunnerOptions::batch_invariant): with an actor built with
  // PolicyOptions::batch_invariant, sampled tokens' log-probs equal the actor's bit for bit.
  bool batch_invariant = false;
  // CudaRunnerOptions::match_trainer_numerics: with an actor built with
  // PolicyOptions::match_trainer_numerics, log-probs within float-rounding noise of the actor's.
  bool match_trainer_numerics = false;
};

struct PolicyOptions {
  // false: forward only (the reference policy): no gradients and no optimizer; on CUDA only the
  // bf16 weights are kept.
  bool trainable = true;
  AdamWConfig optim;  // trainable only
  // CUDA: the device model is planned once for micro-batches of at most max_tokens tokens and
  // max_seqs sequences (the trainer derives them from its config). The CPU model grows its buffers.
  int64_t max_tokens = 0, max_seqs = 0;
  // Activation recomputation in backward (actor_rollout_ref.model.enable_gradient_checkpointing).
  // CUDA only; the CPU model keeps every activation, so there it changes nothing.
  bool recompute = false;
  // CUDA: forward GEMMs that never split k (actor_rollout_ref.rollout.batch_invariant; gemm.h),
  // so log-probs do not depend on the micro-batch and equal a batch-invariant rollout's. The CPU
  // model is batch-invariant already (one fp32 path for every batch).
  bool batch_invariant = false;
  // CUDA: forward GEMMs that never split k (actor_rollout_ref.rollout.match_trainer_numerics,
  // CudaContext::unsplit_k), as the matching rollout's.
  bool match_trainer_numerics = false;
};

class PolicyModel {
 public:
  virtual ~PolicyModel() = default;
  virtual Device device() const = 0;
  virtual bool trainable() const = 0;
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
  virtual void zero_grad() = 0;
  // Token-classification models (the critic): values [T] (num_labels 1) of the batch, keeping the
  // activations; backward_values accumulates the gradient of sum_t d_values[t] values[t].
  virtual void forward_values(const model::PackedBatch& batch, std::vector<float>& values) = 0;
  virtual void backward_values(const float* d_values) = 0;
  // Sums the gradients over `comm`'s ranks, clips them to optim.grad_clip and applies one AdamW
  // step with learning rate `lr`. Returns the global gradient norm before clipping; a non-finite
  // norm skips the update (as verl does).
  virtual double optimizer_step(float lr, dist::Communicator& comm) = 0;
  // Frees what forward() kept for backward, between phases (the CUDA arena is planned once and
  // stays).
  virtual void release_activations() {}

  // Host copy of the weights for the rollout engine and checkpoints. On CUDA an optimizer step
  // makes it stale and the next call downloads the fp32 master weights once.
  virtual const model::Weights& weights() = 0;
  // AdamW state for checkpoints (trainable only; on CUDA downloaded by each call).
  virtual const AdamWState& optimizer_state() = 0;
  // Resume: replaces the weights (layout order) and, for a trainable model, the AdamW state.
  virtual void restore(std::vector<float> weights, AdamWState opt) = 0;

  // A rollout step runner over this model's own device weights (the hybrid engine: the rollout
  // reads the bf16 copy the optimizer writes, no copy), with a KV cache of its own that is freed
  // when the runner is destroyed. nullptr: the rollout engine runs on the CPU from weights().
  virtual std::unique_ptr<rollout::StepRunner> make_rollout_runner(
      const rollout::SchedulerConfig& sched, const RolloutRunnerOptions& opts) {
    (void)sched;
    (void)opts;
    return nullptr;
  }

  // The plan's limits (0: none) and the device memory this model holds (0 on CPU).
  virtual int64_t max_tokens() const { return 0; }
  virtual int64_t max_seqs() const { return 0; }
  virtual size_t device_bytes() const { return 0; }
};

// The model for `device`: a causal LM (actor, reference policy) or a one-label token classifier
// (critic).
std::unique_ptr<PolicyModel> make_policy(Device device, model::Weights weights,
                                         const PolicyOptions& opts);

}  // namespace verl::trainer
