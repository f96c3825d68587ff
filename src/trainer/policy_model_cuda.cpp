// The CUDA policy: ops::cuda::CudaTransformer behind PolicyModel. Gradients accumulate on the
// device over micro-batches and AdamW runs there; the host keeps a copy of the weights for the CPU
// rollout engine and checkpoints, downloaded only when a step made it stale. Compiled to nothing
// without VERL_HAVE_CUDA (policy_model.cpp then has the stubs).
#ifdef VERL_HAVE_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device.h"
#include "ops/cuda/rollout_cuda.h"
#include "ops/cuda/transformer_cuda.h"
#include "trainer/policy_model.h"

namespace verl::trainer {

bool cuda_available() {
  return ops::cuda::device_count() > 0;
}

size_t device_memory_in_use() {
  if (!cuda_available()) return 0;
  size_t free_bytes = 0, total_bytes = 0;
  VERL_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return total_bytes - free_bytes;
}

namespace {

class CudaPolicy final : public PolicyModel {
 public:
  CudaPolicy(model::Weights w, const PolicyOptions& opts)
      : host_(std::move(w)), optim_(opts.optim) {
    VERL_CHECK(opts.max_tokens > 0 && opts.max_seqs > 0,
               "internal: the CUDA policy needs its micro-batch plan (max_tokens {}, max_seqs {})",
               opts.max_tokens, opts.max_seqs);
    ops::cuda::CudaTransformerOptions co;
    co.max_tokens = opts.max_tokens;
    co.max_seqs = opts.max_seqs;
    co.trainable = opts.trainable;
    co.recompute = opts.trainable && opts.recompute;
    co.batch_invariant = opts.batch_invariant;
    co.unsplit_k = opts.match_trainer_numerics;
    tf_ = std::make_unique<ops::cuda::CudaTransformer>(session_.ctx(), host_, co);
    if (!opts.trainable) {
      // The reference policy is never generated from nor saved: no host copy unless asked for.
      host_.data = {};
      host_stale_ = true;
    }
  }
  CudaPolicy(const CudaPolicy&) = delete;
  CudaPolicy& operator=(const CudaPolicy&) = delete;

  Device device() const override { return Device::Cuda; }
  const model::ModelConfig& config() const override { return host_.config; }
  bool trainable() const override { return tf_->trainable(); }

  void forward(const model::PackedBatch& batch, float temperature, std::vector<float>& logprob,
               std::vector<float>* entropy, bool for_backward = true) override {
    tf_->forward(batch, temperature, for_backward && tf_->trainable());
    logprob = tf_->download_logprob();
    if (entropy) *entropy = tf_->download_entropy();
  }

  void backward(const float* d_logprob, const float* d_entropy) override {
    tf_->backward_host(d_logprob, d_entropy);
  }

  void zero_grad() override { tf_->zero_grad(); }

  void forward_values(const model::PackedBatch& batch, std::vector<float>& values) override {
    tf_->forward(batch);
    values = tf_->download_values();
  }

  void backward_values(const float* d_values) override { tf_->backward_values_host(d_values); }

  double optimizer_step(float lr, dist::Communicator& comm) override {
    if (comm.world_size() > 1) {
      // The communicator reduces host buffers, so a multi-rank run takes the gradients through the
      // host (a NCCL communicator would reduce tf_->grads() in place); one rank skips the round
      // trip.
      std::vector<float> g = tf_->download_grads();
      comm.all_reduce(g, dist::ReduceOp::Sum);
      VERL_CUDA_CHECK(cudaMemcpyAsync(tf_->grads(), g.data(), g.size() * sizeof(float),
                                      cudaMemcpyHostToDevice, tf_->ctx().stream));
    }
    const double norm = tf_->optimizer_step(lr, optim_.beta1, optim_.beta2, optim_.eps,
                                            optim_.weight_decay, optim_.grad_clip);
    host_stale_ = true;
    opt_host_ = AdamWState{};  // a checkpoint's download is out of date now; free it
    return norm;
  }

  const model::Weights& weights() override {
    if (host_stale_) {
      host_.data = tf_->download_weights();
      host_stale_ = false;
    }
    return host_;
  }

  const AdamWState& optimizer_state() override {
    VERL_CHECK(tf_->trainable(),
               "PolicyModel::optimizer_state: this model is forward-only (the reference policy)");
    tf_->download_optimizer_state(opt_host_.exp_avg, opt_host_.exp_avg_sq);
    opt_host_.step = tf_->optimizer_steps();
    return opt_host_;
  }

  void restore(std::vector<float> weights, AdamWState opt) override {
    VERL_CHECK(static_cast<int64_t>(weights.size()) == host_.layout.total,
               "restore: {} weights for a model of {} parameters", weights.size(),
               host_.layout.total);
    tf_->upload_weights(weights);
    if (tf_->trainable()) {
      tf_->upload_optimizer_state(opt.exp_avg, opt.exp_avg_sq, opt.step);
      host_.data = std::move(weights);  // equal to the fp32 master copy just uploaded
      host_stale_ = false;
    }
    opt_host_ = AdamWState{};
  }

  std::unique_ptr<rollout::StepRunner> make_rollout_runner(
      const rollout::SchedulerConfig& sched, const RolloutRunnerOptions& opts) override {
    ops::cuda::CudaRunnerOptions ro;
    // The KV the scheduler's blocks need, capped by gpu_memory_utilization of the device (vLLM's
    // rule: what is in use now, the trainer's state included, counts against the share).
    const int64_t cap = ops::cuda::kv_cache_budget_from_utilization(opts.gpu_memory_utilization);
    const int64_t needed =
        opts.kv_blocks * ops::cuda::kv_cache_bytes_per_block(host_.config, sched.block_size);
    ro.kv_cache_bytes = needed > 0 ? std::min(needed, cap) : cap;
    ro.enforce_eager = opts.enforce_eager;
    ro.batch_invariant = opts.batch_invariant;
    ro.match_trainer_numerics = opts.match_trainer_numerics;
    return std::make_unique<ops::cuda::CudaModelRunner>(session_.ctx(), host_.config,
                                                       host_.layout, tf_->weights_bf16(), sched,
                                                       ro);
  }

  int64_t max_tokens() const override { return tf_->options().max_tokens; }
  int64_t max_seqs() const override { return tf_->options().max_seqs; }
  size_t device_bytes() const override { return tf_->device_bytes(); }

 private:
  ops::cuda::CudaSession session_;  // this model's stream, cuBLASLt handle and workspace
  model::Weights host_;             // config, layout and the host copy of the weights
  bool host_stale_ = false;         // the device weights changed since host_.data was filled
  AdamWConfig optim_;
  AdamWState opt_host_;  // the last optimizer_state() download (checkpoints)
  std::unique_ptr<ops::cuda::CudaTransformer> tf_;
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
