// Rewards of the generated rows (verl's reward_model.reward_manager): the rule scorers by
// data_source, a user's reward command, or the reward model, and what the manager makes of a
// score (naive: the score; dapo: plus the overlong-buffer penalty). Managers are registered by
// name; scoring streams beside generation when trainer.actor_reward_parallel allows.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/device.h"
#include "metrics/metrics.h"
#include "trainer/experience.h"
#include "trainer/ppo_config.h"
#include "trainer/reward_model.h"
#include "trainer/row_stream.h"

namespace verl::tokenizer {
class Tokenizer;
}
namespace verl::reward {
class CommandRewardFn;
}

namespace verl::trainer {

class RewardManager {
 public:
  // The manager reward_model.reward_manager names (an Error lists the registered ones), with the
  // run's scorer: the reward model when enabled (on `device`), else the command, else the rules.
  static std::unique_ptr<RewardManager> create(const PpoConfig& cfg, Device device,
                                               const tokenizer::Tokenizer& tok);
  using Factory = std::function<std::unique_ptr<RewardManager>(const PpoConfig&, Device,
                                                               const tokenizer::Tokenizer&)>;
  // Adds a manager under `name` (verl's naive and dapo are built in).
  static void register_manager(const std::string& name, Factory factory);

  RewardManager(const PpoConfig& cfg, Device device, const tokenizer::Tokenizer& tok);
  virtual ~RewardManager();

  // A scorer's result for row b: records its acc and score and returns the reward.
  virtual float reward(Experience& exp, int64_t b, double score, double acc) const;
  // reward_extra/* metrics of the step (verl's reward_extra_info): the numbers a reward command
  // or Python reward returned beside the score, and its failed rows (reward/failed_rows).
  virtual void add_extra_metrics(const Experience& exp, metrics::Metrics& m) const;
  // What a reward command or Python reward receives as a row's extra_info: the sample's own by
  // default (the gdpo manager adds the run's experiment_name).
  virtual nlohmann::json extra_info(const data::Sample& s) const { return s.extra_info; }

  // Whether rows are scored as they finish (trainer.actor_reward_parallel; a command scores the
  // whole batch, and an offloaded reward model would upload its weights for every forward).
  bool streams() const;
  // The streaming scorer of `exp`'s rows (timing_s/reward is its busy span), or null when scoring
  // waits for the batch (score()).
  std::unique_ptr<RowObserver> stream(Experience& exp, metrics::StageTimer& timer);
  // Every row of `exp` at once, timed as the reward stage; `step` names the step in warnings.
  void score(Experience& exp, metrics::StageTimer& timer, int64_t step);

 private:
  friend class StreamingScorer;
  // The rule scorer's reward (by data_source) of row b's decoded response.
  float rule_score(Experience& exp, int64_t b) const;
  void score_all(Experience& exp, int64_t step);
  // reward_model.enable: rows `rows` scored by the reward model (verl's rm_scores, which its
  // reward managers return as the reward in place of the rule scores).
  void score_with_reward_model(Experience& exp, const std::vector<int64_t>& rows);

 protected:
  const PpoConfig& cfg_;

 private:
  const tokenizer::Tokenizer& tok_;
  std::unique_ptr<reward::CommandRewardFn> command_;
  int64_t failed_rows_ = 0;  // the last batch's rows the command or Python reward failed
  std::unique_ptr<RewardModel> reward_model_;
  // The reward model's own tokenizer when reward_model.model.input_tokenizer is set and the
  // model directory has one: prompt and response are re-rendered with its chat template.
  std::unique_ptr<tokenizer::Tokenizer> rm_tok_;
};

}  // namespace verl::trainer
