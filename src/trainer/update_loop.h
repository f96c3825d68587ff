// What the actor's and the critic's workers share: the cut of a step's rows into micro-batches,
// the forward-only log-prob pass, and the one update loop (ppo_epochs x mini-batches x
// micro-batches with gradient accumulation, then the optimizer step, which clips; verl's
// dp_actor.update_policy and dp_critic.update_critic are this loop with another loss).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "dist/communicator.h"
#include "metrics/metrics.h"
#include "optim/lr_schedule.h"
#include "trainer/experience.h"
#include "trainer/policy_model.h"
#include "trainer/ppo_config.h"

namespace verl::data {
class DynamicBatchSampler;
}

namespace verl::trainer {

// A model the trainer updates (the actor, the critic): its model on trainer.device (forward /
// backward, gradients and AdamW inside) and its learning-rate schedule.
struct TrainedModel {
  std::unique_ptr<PolicyModel> model;
  optim::LrSchedule schedule;
  float base_lr = 0;
  float lr(int64_t step) const { return static_cast<float>(base_lr * schedule.multiplier(step)); }
};

// What every pass over the experience shares: the data-parallel communicator and
// data.dynamic_batch's sampler (null when off; it adapts its token budget as it packs).
struct PassContext {
  dist::Communicator* comm = nullptr;
  data::DynamicBatchSampler* dyn_batch = nullptr;
};

// Rows `idx` of a [B, L] matrix, as a contiguous [idx.size(), L] matrix.
std::vector<float> rows(const std::vector<float>& m, const std::vector<int64_t>& idx, int64_t L);

// A micro-batch beyond the plan (a CUDA model's max_tokens / max_seqs) is a config problem: name
// the keys.
void check_plan(const PolicyModel& policy, const model::PackedBatch& pb);

// Micro-batches of `idx` (token budget or sequence count); every data-parallel rank gets as many
// (a collective).
std::vector<std::vector<int64_t>> micro_batches(const Experience& exp,
                                                const std::vector<int64_t>& idx, bool dynamic,
                                                int64_t max_tokens, int64_t max_seqs,
                                                const PassContext& ctx);

// Log-probs (and entropies) of every response token under `policy` at the rollout temperature,
// cut as `fb` says.
void compute_log_probs(PolicyModel& policy, const Experience& exp, const ForwardBatching& fb,
                       float temperature, const PassContext& ctx, std::vector<float>& logp,
                       std::vector<float>* entropy);

// ZeRO-3's reshard for a phase that reads the whole weights (the rollout engine, checkpoints): the
// shards all-gathered in buckets of `bucket` floats (rollout.update_weights_bucket_megabytes) on
// entry (a collective: every rank enters), the whole copy dropped on exit. Other ZeRO stages hold
// the whole weights: nothing happens.
class FullWeights {
 public:
  FullWeights(PolicyModel& p, int64_t bucket);
  ~FullWeights();
  FullWeights(const FullWeights&) = delete;
  FullWeights& operator=(const FullWeights&) = delete;

 private:
  optim::Strategy& strategy_;
  bool held_;
};

// Data parallelism for a trained model (optim/strategy.h): gradients reduced in buckets during
// backward, with ZeRO stage u.zero_stage (1: this rank keeps its shard of the AdamW moments; 2:
// also only its shard of the gradients) and LightweightSync when `lightweight` is given. One rank
// has nothing to shard: a warning says the key changes nothing.
void setup_data_parallel(const UpdateKeys& u,
                         const std::optional<optim::LightweightConfig>& lightweight,
                         PolicyModel& model, dist::Communicator& comm);

struct UpdateLoopSettings {
  const char* role = "actor";    // the warning's and the metrics' name
  int64_t mini = 1, epochs = 1;  // this rank's sequences a mini-batch; ppo_epochs
  bool dynamic = false;  // use_dynamic_bsz: micro-batches by max_tokens, else micro_seqs sequences
  int64_t max_tokens = 0, micro_seqs = 1;
  // The actor's shuffle: each epoch visits the rows in an order drawn from (seed, step, epoch).
  bool shuffle = false;
  uint64_t seed = 0;
  int64_t step = 0;              // training steps done before this one
  double loss_scale_factor = 0;  // data.max_response_length (seq-mean-token-sum-norm)
  bool fault_point = false;      // tests kill the process in the middle of the actor's update
  bool track_peaks = false;      // the micro-batches' and the optimizer steps' device peaks, apart
};

struct UpdateLoopResult {
  // Mini-batches; updates applied (not kept for a later sync); of those, skipped (non-finite norm).
  int64_t updates = 0, applied = 0, skipped = 0;
  double grad_norm_sum = 0;
  size_t pass_peak = 0, optimizer_peak = 0;  // tracked device memory at its most (core/device.h)
  // `<role>/grad_norm` (the mean over applied updates) and `<role>/lr`.
  void report(metrics::Metrics& m, const char* role, float lr) const;
};

// One micro-batch's forward, loss and backward, with the mini-batch's global normalisers in
// `norm` (micro-batching then changes nothing but float reassociation). `last`: the mini-batch's
// last micro-batch, whose backward starts the gradient reduction (Strategy::prepare_backward).
using MicroStep = std::function<void(const PackedResponses& mb, const AggNorm& norm, bool last)>;

// Epochs x mini-batches x micro-batches: gradients accumulate over a mini-batch's micro-batches,
// then `model`'s optimizer step (which sums them over the ranks, clips and steps AdamW at `lr`).
// A warning names the step when some updates had a non-finite gradient norm.
UpdateLoopResult run_update_loop(const Experience& exp, PolicyModel& model, float lr,
                                 const PassContext& ctx, const UpdateLoopSettings& s,
                                 const MicroStep& micro_step);

}  // namespace verl::trainer
