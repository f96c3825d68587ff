// The RL trainer: verl's RayPPOTrainer driver on our engine. A step is one call per stage:
//   gen (RolloutWorker: n samples per prompt, streamed to the reward scorer and the token pipeline)
//   -> reward (dynamic sampling on the scores, balance) -> old_log_prob -> ref -> values (the
//   actor's and the critic's workers) -> adv (over the global batch) -> update_critic ->
//   update_actor (the shared update loop) -> metrics.
// Configuration is read once into PpoConfig; the roles and micro-batch plans are a RunPlan. The
// rollout runs on the actor's own weights (the hybrid engine: one copy); recipes (DAPO's dynamic
// sampling, ReMax, one-step-off) sit beside the driver in recipes.h.
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
#include "trainer/actor_worker.h"
#include "trainer/core_algos.h"
#include "trainer/critic_worker.h"
#include "trainer/experience.h"
#include "trainer/ppo_config.h"
#include "trainer/recipes.h"
#include "trainer/reward_manager.h"
#include "trainer/rollout_worker.h"
#include "trainer/run_plan.h"
#include "trainer/step_metrics.h"

namespace verl::tokenizer {
class Tokenizer;
}
namespace verl::data {
class DynamicBatchSampler;
}
namespace verl::metrics {
class MultiLogger;
class GpuMonitor;
}  // namespace verl::metrics

namespace verl::trainer {

class PpoTrainer {
 public:
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
  // Generation with val_kwargs and scoring of the validation set:
  // val-core/<data_source>/reward/mean@n.
  metrics::Metrics validate();

  int64_t global_step() const { return global_step_; }
  // The directory of the last checkpoint this run saved ("" when none).
  const std::string& last_checkpoint() const { return last_checkpoint_; }
  int64_t total_training_steps() const { return total_steps_; }
  // The actor's weights (on cuda: downloaded from the device when a step changed them).
  const model::Weights& actor() { return actor_->model().weights(); }
  // LoRA: the actor's adapters at their current values (null without LoRA).
  const model::LoraWeights* actor_lora() { return actor_->model().lora(); }
  // The actor's parameter count (no download).
  int64_t actor_params() { return actor_->model().state().numel(); }
  // Where the actor and the reference policy run (trainer.device resolved).
  Device device() const { return device_; }

 private:
  // The step's stages, in order.
  // gen: this rank's prompts generated and scored (or the rollout one-step-off started last step);
  // returns that rollout (null: generated here) and the updates it lags behind (`staleness`).
  std::unique_ptr<OneStepOff::Prefetch> gen(const data::Batch& batch,
                                            const std::vector<data::Sample>& local, int64_t first,
                                            Experience& exp, TokenPipeline& pipe,
                                            metrics::StageTimer& timer, metrics::Metrics& m,
                                            int64_t& staleness);
  // reward: dynamic sampling on the scores, the rollout dump, the engine's metrics, the balance
  // over ranks and data.dynamic_batch's length bounds. False when the training data ran out.
  bool reward(const data::Batch& batch, Experience& exp, metrics::StageTimer& timer,
              metrics::Metrics& m, double& exchange_bytes);
  void old_log_prob(Experience& exp, const TokenPipeline& pipe, int64_t staleness,
                    metrics::StageTimer& timer, metrics::Metrics& m);
  void ref(Experience& exp, const TokenPipeline& pipe, metrics::StageTimer& timer,
           metrics::Metrics& m);
  void values(Experience& exp, const TokenPipeline& pipe, metrics::StageTimer& timer,
              metrics::Metrics& m);
  // adv: the advantages over the global batch (with the KL penalty in the reward and ReMax's
  // baselines when configured).
  void adv(Experience& exp, const std::vector<data::Sample>& local, int64_t first,
           metrics::StageTimer& timer, metrics::Metrics& m, double& exchange_bytes);
  // update_critic and update_actor: the critic's (when warm-up allows both) beside the actor's on a
  // thread of its own with trainer.critic_actor_overlap and one process, else one after the other.
  void update(Experience& exp, metrics::StageTimer& timer, metrics::Metrics& m);
  void step_metrics(const data::Batch& batch, const Experience& exp,
                    const metrics::StageTimer& timer, const OneStepOff::Prefetch* ready,
                    metrics::Metrics& m);

  // Whether a step of `rows` samples recomputes the old log-probs with the actor: not in bypass
  // mode (the rollout's serve), else when the update is not fully on-policy (several mini-batches
  // or epochs, or a rollout `staleness` updates old), the reward carries a KL penalty, or rollout
  // correction compares the two.
  bool needs_old_log_prob(int64_t rows, int64_t staleness) const;
  // algorithm.rollout_correction in decoupled mode, on the global batch: IS weights into
  // exp.rollout_is_weights, rejections out of exp.mask, rollout_corr/* metrics.
  void apply_rollout_correction(Experience& exp, metrics::Metrics& m);
  // data.dynamic_batch: zeroes the response mask of samples outside its length bounds
  // (dynamic_batch/dropped_samples).
  void drop_by_length(Experience& exp, metrics::Metrics& m) const;
  // Restores the newest checkpoint per trainer.resume_mode (auto | disable | resume_path).
  void resume();
  // Saves global_step_N (trainer.save_freq) and prunes to trainer.max_actor_ckpt_to_keep.
  std::string save();
  PassContext pass_context() const { return {comm_.get(), dyn_batch_.get()}; }

  Device device_ = Device::Cpu;
  // Data-parallel reductions (token counts, micro-batch counts, gradients, metrics) go through
  // here: SingleProcess, or MPI when a launcher started several ranks (dist/launch.h).
  std::unique_ptr<dist::Communicator> comm_;
  const PpoConfig cfg_;  // read once; the workers hold references to it
  const RunPlan plan_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::string tokenizer_dir_, last_checkpoint_;
  // LoRA: what a checkpoint records of the run's adapters and frozen base (trainer_state.json's
  // "lora"), so that a resume into another base model or rank is refused naming both.
  nlohmann::json lora_meta_;
  std::unique_ptr<data::RLDataset> train_set_, val_set_;
  std::unique_ptr<data::DataLoader> train_loader_;
  int64_t global_step_ = 0, total_steps_ = 0;
  // data.dynamic_batch.enable: cuts every pass's micro-batches and adapts its token budget as it
  // packs, hence held by pointer (packing changes no experience).
  std::unique_ptr<data::DynamicBatchSampler> dyn_batch_;
  MemoryRecorder memory_;
  std::unique_ptr<CriticWorker> critic_;
  std::unique_ptr<ActorWorker> actor_;
  std::optional<KlController> kl_ctrl_;
  std::unique_ptr<RewardManager> reward_;
  std::unique_ptr<RolloutWorker> rollout_;
  std::unique_ptr<DynamicSampling> dynamic_sampling_;  // algorithm.filter_groups
  std::unique_ptr<OneStepOff> one_step_off_;  // trainer.one_step_off_policy; after what it uses
  bool out_of_data_ = false;  // dynamic sampling ran out of training data: fit() stops
  std::unique_ptr<metrics::MultiLogger> logger_;
  std::unique_ptr<metrics::GpuMonitor> gpu_monitor_;  // NVML sampling when a GPU is present
};

}  // namespace verl::trainer
