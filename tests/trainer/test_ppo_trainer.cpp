// Short GRPO and PPO runs of the trainer on the bundled demo model and task: every verl metric is
// present and finite, reward scoring overlaps generation, and token-budget micro-batching gives the
// same update as fixed-size micro-batches.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "../common/test_util.h"
#include "config/config.h"
#include "trainer/ppo_trainer.h"

namespace verl::trainer {
namespace {

namespace fs = std::filesystem;
const std::string kRoot = VERL_SOURCE_DIR;

config::Config demo_config(const std::string& out, std::vector<std::string> extra) {
  std::vector<std::string> o = {
      "actor_rollout_ref.model.path=" + kRoot + "/assets/demo/model",
      "critic.model.path=" + kRoot + "/assets/demo/model",
      "data.train_files=[" + kRoot + "/assets/demo/train.jsonl]",
      "data.val_files=[" + kRoot + "/assets/demo/val.jsonl]",
      "data.val_max_samples=8",
      "data.train_batch_size=4",
      "actor_rollout_ref.actor.ppo_mini_batch_size=4",
      "actor_rollout_ref.rollout.n=4",
      "trainer.total_training_steps=2",
      "trainer.logger=[jsonl]",
      "trainer.default_local_dir=" + out,
  };
  o.insert(o.end(), extra.begin(), extra.end());
  return test::demo_config(o);
}

void expect_finite(const metrics::Metrics& m, const std::vector<std::string>& names) {
  for (const auto& n : names) {
    ASSERT_TRUE(m.contains(n)) << "missing metric " << n;
    EXPECT_TRUE(std::isfinite(m.get(n))) << n << " = " << m.get(n);
  }
}

const std::vector<std::string> kCommon = {"critic/score/mean",
                                          "critic/score/max",
                                          "critic/score/min",
                                          "critic/rewards/mean",
                                          "critic/advantages/mean",
                                          "critic/advantages/max",
                                          "critic/returns/mean",
                                          "response_length/mean",
                                          "response_length/max",
                                          "response_length/clip_ratio",
                                          "prompt_length/mean",
                                          "actor/pg_loss",
                                          "actor/entropy",
                                          "actor/pg_clipfrac",
                                          "actor/ppo_kl",
                                          "actor/grad_norm",
                                          "actor/lr",
                                          "perf/throughput",
                                          "perf/time_per_step",
                                          "perf/total_num_tokens",
                                          "training/global_step",
                                          "timing_s/gen",
                                          "timing_s/reward",
                                          "timing_s/adv",
                                          "timing_s/update_actor",
                                          "timing_s/step"};

TEST(PpoTrainer, GrpoStepsEmitVerlMetricsAndRewardOverlapsGeneration) {
  const test::TempDir scratch("test_grpo");
  const std::string out = scratch.str();
  PpoTrainer t(demo_config(out, {"actor_rollout_ref.actor.use_kl_loss=true"}));
  t.fit();
  EXPECT_EQ(t.global_step(), 2);
  // The last step's metrics, as the jsonl logger wrote them.
  std::ifstream f(out + "/metrics.jsonl");
  std::string line, last;
  while (std::getline(f, line)) last = line;
  nlohmann::json j = nlohmann::json::parse(last);
  metrics::Metrics m;
  for (auto& [k, v] : j.items())
    if (v.is_number()) m.set(k, v.get<double>());
  expect_finite(m, kCommon);
  expect_finite(m, {"actor/kl_loss", "timing_s/ref", "val-core/arith/reward/mean@1"});
  // Samples finish at different lengths: the first are scored while others still decode.
  EXPECT_GT(m.get("timing_s/reward_overlap_gen"), 0.0);
  // The rollout engine's steps: each response token comes from one, so at least the longest
  // response's count; the decode steps (one token a sequence) are most of them but not the
  // prefills. No CUDA graph counts on the CPU.
  expect_finite(m, {"rollout/engine_steps", "rollout/decode_steps", "timing_s/gen_setup"});
  EXPECT_GE(m.get("rollout/engine_steps"), m.get("response_length/max"));
  EXPECT_GT(m.get("rollout/decode_steps"), 0.0);
  EXPECT_LT(m.get("rollout/decode_steps"), m.get("rollout/engine_steps"));
  EXPECT_GE(m.get("timing_s/gen_setup"), 0.0);
  EXPECT_LT(m.get("timing_s/gen_setup"), m.get("timing_s/step"));
  EXPECT_FALSE(m.contains("rollout/graphs_captured"));
}

TEST(PpoTrainer, PpoWithCriticEmitsValueMetrics) {
  const test::TempDir scratch("test_ppo");
  const std::string out = scratch.str();
  PpoTrainer t(demo_config(out, {"algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true",
                                 "trainer.val_before_train=false"}));
  t.fit();
  std::ifstream f(out + "/metrics.jsonl");
  std::string line, last;
  while (std::getline(f, line)) last = line;
  nlohmann::json j = nlohmann::json::parse(last);
  metrics::Metrics m;
  for (auto& [k, v] : j.items())
    if (v.is_number()) m.set(k, v.get<double>());
  expect_finite(m, kCommon);
  expect_finite(
      m, {"critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm", "critic/values/mean",
          "critic/vf_explained_var", "timing_s/values", "timing_s/update_critic",
          "timing_s/old_log_prob", "actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff"});
}

// The other outcome estimators run end to end (ReMax with its greedy-baseline rollout).
TEST(PpoTrainer, OtherEstimatorsRun) {
  for (const char* est : {"remax", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"}) {
    const test::TempDir scratch(std::string("test_") + est);
    const std::string out = scratch.str();
    PpoTrainer t(demo_config(
        out, {std::string("algorithm.adv_estimator=") + est, "trainer.total_training_steps=1",
              "trainer.val_before_train=false", "data.val_files=null"}));
    metrics::Metrics m;
    t.fit();
    std::ifstream f(out + "/metrics.jsonl");
    std::string line;
    std::getline(f, line);
    nlohmann::json j = nlohmann::json::parse(line);
    for (auto& [k, v] : j.items())
      if (v.is_number()) m.set(k, v.get<double>());
    SCOPED_TRACE(est);
    expect_finite(m, kCommon);
  }
}

// Every policy loss mode (actor.policy_loss.loss_mode) and the newer estimators run a step with
// finite metrics. On policy (ratio 1) cispo's loss -sg(clip(1)) A logp is gpg's -A logp, and both
// differ from vanilla's -A: so the mode really reaches the loss.
TEST(PpoTrainer, PolicyLossModesRun) {
  const std::pair<const char*, const char*> runs[] = {{"vanilla", "gpg"},
                                                      {"gpg", "gpg"},
                                                      {"cispo", "gpg"},
                                                      {"gspo", "grpo_passk"},
                                                      {"sapo", "opo"},
                                                      {"clip_cov", "rloo_vectorized"},
                                                      {"kl_cov", "grpo_vectorized"},
                                                      {"geo_mean", "grpo"}};
  std::map<std::string, double> pg_loss;
  for (const auto& [mode, est] : runs) {
    const test::TempDir scratch(std::string("test_loss_") + mode);
    const std::string out = scratch.str();
    PpoTrainer t(demo_config(
        out, {std::string("actor_rollout_ref.actor.policy_loss.loss_mode=") + mode,
              std::string("algorithm.adv_estimator=") + est, "trainer.total_training_steps=1",
              "trainer.val_before_train=false", "data.val_files=null"}));
    t.fit();
    std::ifstream f(out + "/metrics.jsonl");
    std::string line;
    std::getline(f, line);
    nlohmann::json j = nlohmann::json::parse(line);
    metrics::Metrics m;
    for (auto& [k, v] : j.items())
      if (v.is_number()) m.set(k, v.get<double>());
    SCOPED_TRACE(mode);
    expect_finite(m, kCommon);
    pg_loss[mode] = m.get("actor/pg_loss");
  }
  EXPECT_NEAR(pg_loss["cispo"], pg_loss["gpg"], 1e-5 * std::max(1.0, std::abs(pg_loss["gpg"])));
  EXPECT_GT(std::abs(pg_loss["gpg"] - pg_loss["vanilla"]), 1e-3);
}

// Token-budget micro-batches and one-sequence micro-batches give the same updated weights.
TEST(PpoTrainer, DynamicMicroBatchingEqualsFixedMicroBatches) {
  std::vector<float> w[2];
  for (int dyn = 0; dyn < 2; ++dyn) {
    const test::TempDir scratch("test_mb" + std::to_string(dyn));
    const std::string out = scratch.str();
    PpoTrainer t(demo_config(out, {"trainer.total_training_steps=1",
                                   "trainer.val_before_train=false", "data.val_files=null",
                                   dyn ? "actor_rollout_ref.actor.use_dynamic_bsz=true"
                                       : "actor_rollout_ref.actor.use_dynamic_bsz=false",
                                   "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                                   "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100"}));
    t.fit();
    w[dyn] = t.actor().data;
  }
  ASSERT_EQ(w[0].size(), w[1].size());
  double worst = 0;
  for (size_t i = 0; i < w[0].size(); ++i)
    worst = std::max(worst, std::fabs(double(w[0][i]) - w[1][i]));
  EXPECT_LE(worst, 1e-6);
}

}  // namespace
}  // namespace verl::trainer
