// Recipes beside the PPO driver (verl's recipe/ folder): DAPO's dynamic sampling
// (algorithm.filter_groups), ReMax's greedy baseline, and the one-step-off rollout
// (trainer.one_step_off_policy: the next step's generation beside this step's training).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "data/dataloader.h"
#include "metrics/metrics.h"
#include "trainer/experience.h"
#include "trainer/rollout_worker.h"

namespace verl::trainer {

// algorithm.filter_groups (DAPO's dynamic sampling): drops the groups of a step's experience whose
// metric has no spread, generates further batches until data.train_batch_size prompts are kept,
// and leaves exactly those in the experience.
class DynamicSampling {
 public:
  using NextBatch = std::function<std::optional<data::Batch>()>;
  DynamicSampling(const PpoConfig& cfg, RolloutWorker& rollout) : cfg_(cfg), rollout_(rollout) {}

  // `exp`: the generation of `batch` for training step `step`; further batches come from
  // `next_batch`. False when the training data ran out first (a warning says so).
  bool run(const data::Batch& batch, Experience& exp, metrics::StageTimer& timer,
           metrics::Metrics& m, int64_t step, const NextBatch& next_batch);
  // The kept prompts of the last run (the experience's samples point here).
  const std::vector<data::Sample>& kept_samples() const { return kept_samples_; }

 private:
  const PpoConfig& cfg_;
  RolloutWorker& rollout_;
  std::vector<data::Sample> kept_samples_;
};

// GDPO's reward components over the global batch, one [W B] column per
// algorithm.gdpo_reward_keys entry, from the numbers the reward function returned
// (Experience::reward_extra). A key no row returned is an Error listing the keys there are; a row
// that lacks it (its scoring failed) counts 0, as its score does.
std::vector<std::vector<float>> gdpo_components(const Experience& exp,
                                                const std::vector<std::string>& keys,
                                                GlobalRows& g);

// ReMax's baseline per row of `exp` over the global batch: the reward of its prompt's greedy
// response (verl generates it with do_sample=False in the gen stage). Each rank generates its own
// prompts' (`local`, from global index `first`; one sample a prompt, in prompt order); a row may
// sit on another rank after balance_batch, so the per-prompt scores are gathered first.
std::vector<float> remax_baselines(RolloutWorker& rollout, const std::vector<data::Sample>& local,
                                   int64_t first, const Experience& exp, GlobalRows& g,
                                   metrics::StageTimer& timer, int64_t step);

// trainer.one_step_off_policy: the next step's rollout, generated on a thread from a snapshot of
// the actor's weights while this step trains (docs/overlap.md).
class OneStepOff {
 public:
  struct Prefetch {
    data::Batch batch;            // the step's prompts, as next_batch() hands them out
    nlohmann::json loader_state;  // the loader before `batch` was taken: a checkpoint resumes there
    std::vector<data::Sample> local;  // this rank's share (the experience's samples point here)
    int64_t first = 0;
    int64_t weights_step = 0;  // training steps whose updates the snapshot holds
    model::Weights weights;    // the snapshot the rollout reads (CPU)
    std::unique_ptr<PolicyModel::RolloutSnapshot> snapshot;  // the GPU's, on its own stream
    Experience exp;
    metrics::StageTimer timer;
    std::exception_ptr error;
    bool handed_out = false;
    double waited_s = 0;  // what the step that took it waited for it
    std::thread thread;   // last: joined before the rest goes
    ~Prefetch() {
      if (thread.joinable()) thread.join();
    }
  };

  OneStepOff(RolloutWorker& rollout, PolicyModel& actor, data::DataLoader& loader,
             const dist::Communicator& comm)
      : rollout_(rollout), actor_(actor), loader_(loader), comm_(comm) {}
  ~OneStepOff() {
    prefetch_.reset();
  }  // waits for a rollout still running for a step that will not come

  // The prefetched batch once (its rollout is under way), else the loader's next.
  std::optional<data::Batch> next_batch();
  // Starts the rollout of the loader's next batch from the current weights; `done_steps`: the
  // training steps whose updates they hold.
  void start(int64_t done_steps);
  // The prefetched rollout of `batch` once it is done (null when `batch` is not the prefetched one,
  // whose rollout is then dropped), with the seconds spent waiting for it.
  std::unique_ptr<Prefetch> take(const data::Batch& batch);
  // Where a checkpoint's loader resumes: before a batch whose rollout was started but not handed
  // out.
  nlohmann::json loader_state() const;
  // The ready rollout's own times (it ran during the last step) and the wait for it.
  static void add_timing_metrics(const Prefetch& ready, metrics::Metrics& m);

 private:
  RolloutWorker& rollout_;
  PolicyModel& actor_;
  data::DataLoader& loader_;
  const dist::Communicator& comm_;
  std::unique_ptr<Prefetch> prefetch_;
};

}  // namespace verl::trainer
