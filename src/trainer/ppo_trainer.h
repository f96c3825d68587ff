// The RL trainer: verl's RayPPOTrainer step dataflow on our engine, in one process. A step:
//   gen (rollout engine, n samples per prompt; completed samples stream out) -> reward (scored by a
//   worker thread while generation continues) -> old_log_prob (skipped when the update is fully
//   on-policy: then it equals the update's own forward) -> ref -> values -> adv -> update_critic ->
//   update_actor (ppo_epochs x mini-batches x token-budget micro-batches) -> metrics.
// The rollout engine runs on the actor's own weights (the hybrid engine: one copy). The actor and the
// reference policy and the critic run on trainer.device through PolicyModel, and on cuda the
// rollout too (PolicyModel::make_rollout_runner).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "data/dataloader.h"
#include "dist/communicator.h"
#include "metrics/metrics.h"
#include "model/transformer.h"
#include "optim/lr_schedule.h"
#include "trainer/checkpoint.h"
#include "trainer/core_algos.h"
#include "trainer/experience.h"
#include "trainer/policy_model.h"
#include "trainer/reward_model.h"
#include "trainer/rollout_corr.h"

namespace verl::tokenizer {
class Tokenizer;
}
namespace verl::reward {
class CommandRewardFn;
}
namespace verl::data {
class DynamicBatchSampler;
}
namespace verl::metrics {
class MultiLogger;
class GpuMonitor;
}

namespace verl::trainer {

// A model the trainer updates (the actor, the critic): its model on trainer.device (forward /
// backward, gradients and AdamW inside) and its learning-rate schedule.
struct TrainedModel {
  std::unique_ptr<PolicyModel> model;
  optim::LrSchedule schedule;
  float base_lr = 0;
};

class PpoTrainer {
 public:
  // trainer.token_level_pipeline: the forward-only passes that need nothing but a finished sample
  // (the old and the reference log-probs, the critic's values) and their results, each row's
  // response entries as the row finished.
  struct TokenPipeline {
    bool old_log_prob = false, ref = false, values = false;
    // One micro-batch's budget, which every pass's batching keys and plan allow (0: no bound).
    int64_t max_tokens = 0, max_seqs = 0;
    std::vector<std::vector<float>> old_rows, ref_rows, value_rows;  // [B]
    bool any() const { return old_log_prob || ref || values; }
  };

  explicit PpoTrainer(const config::Config& cfg);
  ~PpoTrainer();

  // The training loop: validation before training (trainer.val_before_train) and every
  // trainer.test_freq steps, logging, until total_training_steps / total_epochs.
  void fit();
  // One step on one batch of prompts; returns its metrics.
  metrics::Metrics train_step(const data::Batch& batch);
  // The training loader's next batch (what fit() feeds train_step); nullopt at the end of the
  // last epoch. For callers that drive train_step themselves (`verl bench grpo-step`). With
  // trainer.one_step_off_policy it is the batch whose rollout the last step started.
  std::optional<data::Batch> next_batch();
  // Generation with val_kwargs and scoring of the validation set: val-core/<data_source>/reward/mean@n.
  metrics::Metrics validate();

  int64_t global_step() const { return global_step_; }
  // The directory of the last checkpoint this run saved ("" when none).
  const std::string& last_checkpoint() const { return last_checkpoint_; }
  int64_t total_training_steps() const { return total_steps_; }
  // The actor's weights (on cuda: downloaded from the device when a step changed them).
  const model::Weights& actor() { return actor_.model->weights(); }
  // The actor's parameter count (no download).
  int64_t actor_params() { return actor_.model->state().numel(); }
  // Where the actor and the reference policy run (trainer.device resolved).
  Device device() const { return device_; }

 private:
  // Restores the newest checkpoint per trainer.resume_mode (auto | disable | resume_path).
  void resume();
  // Saves global_step_N (trainer.save_freq) and prunes to trainer.max_actor_ckpt_to_keep.
  std::string save();
  // Samples the batch's responses (validation: with rollout.val_kwargs; greedy: one greedy
  // response per prompt, ReMax's baseline) and scores them.
  // `first_index`: the global index of samples[0] in the step's batch (the sampling seeds' key).
  struct GenOptions {
    bool validation = false;
    bool greedy = false;  // one greedy response per prompt (ReMax's baseline)
    // trainer.token_level_pipeline: the forward-only passes it names run on micro-batches of
    // finished samples while the rest still decode, their results left in it per row.
    TokenPipeline* pipe = nullptr;
    // The rollout's weights (one-step-off's snapshot; null: the actor's own) and the training step
    // the samples are for (0: the next one, global_step_ + 1): the sampling seeds' key.
    const model::Weights* weights = nullptr;
    // The GPU's snapshot (PolicyModel::rollout_snapshot) in place of `weights`.
    PolicyModel::RolloutSnapshot* snapshot = nullptr;
    int64_t step = 0;
  };
  void generate(const std::vector<data::Sample>& samples, int64_t first_index, Experience& exp,
                metrics::StageTimer& timer, const GenOptions& opts);
  void score_all(Experience& exp);
  // reward_model.enable: every response scored by the reward model (verl's rm_scores, which its
  // reward managers return as the reward in place of the rule scores).
  void score_with_reward_model(Experience& exp);
  // The same for rows `rows` of the experience (their samples and responses set).
  void score_with_reward_model(Experience& exp, const std::vector<int64_t>& rows);
  // The rule scorer's reward (by data_source) of row b's decoded response, through the reward
  // manager (manager_reward).
  float rule_score(Experience& exp, int64_t b) const;
  // reward_model.reward_manager on a scorer's result: records row b's acc and score, and returns
  // the reward (dapo: plus the overlong-buffer penalty).
  float manager_reward(Experience& exp, int64_t b, double score, double acc) const;
  // algorithm.filter_groups (DAPO's dynamic sampling): drops the groups of `exp` whose metric has
  // no spread, generates further batches from the loader until data.train_batch_size prompts are
  // kept, and leaves exactly those in `exp` (its samples in kept_samples_). False when the
  // training data ran out first.
  bool filter_groups(const data::Batch& batch, Experience& exp, metrics::StageTimer& timer, metrics::Metrics& m);
  // algorithm.rollout_correction in decoupled mode, on the global batch: IS weights into
  // exp.rollout_is_weights, rejections out of exp.mask, rollout_corr/* metrics.
  void apply_rollout_correction(Experience& exp, metrics::Metrics& m);
  // reward_extra/* metrics of the dapo reward manager.
  void add_reward_extra_metrics(const Experience& exp, metrics::Metrics& m) const;
  // Log-probs (and entropies) of every response token under `policy` at the rollout temperature.
  void compute_log_probs(PolicyModel& policy, const Experience& exp, std::vector<float>& logp,
                         std::vector<float>* entropy);
  void compute_values(const Experience& exp, std::vector<float>& values);
  void update_actor(Experience& exp, metrics::Metrics& m);
  // The critic's: sums gradients over data-parallel ranks (the loss already carries dp_size), then
  // clips and steps the optimizer; returns the global gradient norm. (The actor's is
  // PolicyModel::optimizer_step.)
  // Memory at the end of `phase`: on cuda the device's in use (perf/device_memory_gib/<phase>) and
  // the phase's peak (perf/device_memory_peak_gib/<phase>: the tracked allocations' peak since the
  // phase began, or `tracked_peak` if more, plus the untracked rest); on the cpu what the models'
  // training states hold with ZeRO-3's gather buffers at their peak in the phase
  // (perf/host_state_gib/<phase>; the buffers alone: perf/host_gather_gib/<phase>).
  void record_device_memory(metrics::Metrics& m, const char* phase, size_t tracked_peak = 0) const;
  // The states' bytes and the gather buffers' peak since the last call.
  std::pair<size_t, size_t> host_state_bytes() const;
  void update_critic(Experience& exp, metrics::Metrics& m);
  // A warning naming the step when `skipped` of the role's `applied` updates had a non-finite norm.
  void warn_skipped_updates(const char* role, int64_t skipped, int64_t applied) const;
  // The two updates of a step: the critic's (when warm-up allows both) beside the actor's on a
  // thread of its own with trainer.critic_actor_overlap and one process, else one after the other.
  void run_updates(Experience& exp, metrics::Metrics& m, metrics::StageTimer& timer);
  // Whether a step of `rows` samples recomputes the old log-probs with the actor: not in bypass mode
  // (the rollout's serve), else when the update is not fully on-policy (several mini-batches or
  // epochs, or a rollout `staleness` updates old), the reward carries a KL penalty, or rollout
  // correction compares the two.
  bool needs_old_log_prob(int64_t rows, int64_t staleness) const;
  // Which passes trainer.token_level_pipeline runs during generation this step (none when off).
  TokenPipeline pipeline_plan(int64_t rows) const;
  // The token pipeline's worker: runs `pipe`'s passes on the rows in `rows` (one micro-batch).
  void run_pipelined(TokenPipeline& pipe, const Experience& exp, std::vector<int64_t> rows, metrics::StageTimer& timer);
  // Micro-batches of `idx` (token budget or sequence count); every data-parallel rank gets as many
  // (a collective).
  std::vector<std::vector<int64_t>> micro_batches(const Experience& exp, const std::vector<int64_t>& idx,
                                                  bool dynamic, int64_t max_tokens, int64_t max_seqs) const;
  void add_data_metrics(const Experience& exp, metrics::Metrics& m) const;
  // data.dynamic_batch: zeroes the response mask of samples outside its length bounds
  // (dynamic_batch/dropped_samples).
  void drop_by_length(Experience& exp, metrics::Metrics& m) const;
  // Statistics over every data-parallel rank's values (Metrics::add_stats / add_length_stats on
  // one rank).
  void add_global_stats(metrics::Metrics& m, std::string_view prefix, const std::vector<double>& x) const;
  void add_global_length_stats(metrics::Metrics& m, std::string_view prefix, const std::vector<int64_t>& len,
                               int64_t max_length) const;
  // This rank's equal share of a step's prompts and the global index of its first one.
  std::pair<std::vector<data::Sample>, int64_t> rank_share(const std::vector<data::Sample>& all) const;

  config::Config cfg_;
  // Data-parallel reductions (token counts, micro-batch counts, gradients, metrics) go through
  // here: SingleProcess, or MPI when a launcher started several ranks (dist/launch.h).
  std::unique_ptr<dist::Communicator> comm_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  Device device_ = Device::Cpu;
  // What checkpoints hold and what a resume restores (checkpoint.save_contents / load_contents of
  // the actor and the critic), read once when the trainer starts.
  CheckpointContents actor_save_, actor_load_, critic_save_, critic_load_;
  Numerics numerics_ = Numerics::Fast;  // the actor's and its rollout's (core/numerics.h)
  TrainedModel actor_;
  std::unique_ptr<PolicyModel> ref_;  // the frozen reference policy, forward only
  std::optional<TrainedModel> critic_;
  std::unique_ptr<data::RLDataset> train_set_, val_set_;
  std::unique_ptr<data::DataLoader> train_loader_;
  std::unique_ptr<reward::CommandRewardFn> command_reward_;
  std::unique_ptr<RewardModel> reward_model_;
  // The reward model's own tokenizer when reward_model.model.input_tokenizer is set and the
  // model directory has one: prompt and response are re-rendered with its chat template.
  std::unique_ptr<tokenizer::Tokenizer> rm_tok_;
  int64_t rm_max_length_ = 0;  // reward_model.max_length (0: none): longer inputs keep their start
  std::unique_ptr<metrics::MultiLogger> logger_;
  std::unique_ptr<metrics::GpuMonitor> gpu_monitor_;  // NVML sampling when a GPU is present
  // data.dynamic_batch.enable: cuts every pass's micro-batches (micro_batches) and adapts its token
  // budget as it packs, hence held by pointer (packing changes no experience).
  std::unique_ptr<data::DynamicBatchSampler> dyn_batch_;
  std::optional<KlController> kl_ctrl_;
  AdvantageEstimator estimator_;
  ActorLossConfig actor_loss_;
  std::vector<int32_t> eos_ids_;
  std::string tokenizer_dir_, last_checkpoint_;
  int64_t global_step_ = 0, total_steps_ = 0;
  size_t gen_device_bytes_ = 0;  // device memory in use at the end of the last generation
  std::pair<size_t, size_t> gen_state_bytes_;  // host_state_bytes() then, before ZeRO-3's whole weights go
  int64_t n_ = 1;
  int64_t reshard_bucket_ = 0;  // ZeRO-3's reshard: floats a bucket (rollout.update_weights_bucket_megabytes)
  // reward_model.reward_manager=dapo and its reward_model.overlong_buffer.*.
  bool dapo_manager_ = false;
  struct OverlongBuffer {
    bool enable = false, log = false;
    int64_t len = 0;
    double penalty_factor = 0;
  } overlong_;
  RolloutCorrectionConfig rollout_corr_;
  bool token_pipeline_ = false, critic_actor_overlap_ = false;  // the seed's switches, as they apply here
  // trainer.one_step_off_policy: the next step's rollout, generated on a thread from a snapshot of
  // the weights while this step trains (docs/overlap.md).
  struct Prefetch;
  std::unique_ptr<Prefetch> prefetch_;
  bool one_step_off_ = false;
  // Starts the rollout of the loader's next batch from the current weights (one_step_off_).
  void start_prefetch();
  // The prefetched rollout of `batch` once it is done (null when `batch` is not the prefetched one,
  // whose rollout is then dropped); `waited_s` gets the seconds spent waiting for it.
  std::unique_ptr<Prefetch> take_prefetch(const data::Batch& batch, double& waited_s);
  std::vector<data::Sample> kept_samples_;  // a filtered step's prompts (exp.sample points here)
  bool out_of_data_ = false;                // filter_groups ran out of training data: fit() stops
  float temperature_ = 1.0f;
  uint64_t seed_ = 1;
};

}  // namespace verl::trainer
