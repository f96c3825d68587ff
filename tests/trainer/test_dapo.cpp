// DAPO in the trainer on the bundled demo model and task: configs/examples/dapo_demo.yaml trains
// (dynamic sampling, the dapo reward manager with its overlong buffer, clip-higher), the overlong
// penalty is verl's linear ramp, filter_groups keeps one-sample groups and stops with an error
// naming max_num_gen_batches when no group has any spread, and rollout correction (decoupled and
// bypass) runs and reports rollout_corr/* metrics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "../common/test_util.h"
#include "config/config.h"
#include "core/error.h"
#include "trainer/ppo_trainer.h"

namespace verl::trainer {
namespace {

namespace fs = std::filesystem;
const std::string kRoot = VERL_SOURCE_DIR;

// dapo_demo.yaml cut down to a few seconds a step: 4 prompts x 4 samples.
config::Config dapo_config(const std::string& out, std::vector<std::string> extra) {
  std::vector<std::string> o = {
      "actor_rollout_ref.model.path=" + kRoot + "/assets/demo/model",
      "data.train_files=[" + kRoot + "/assets/demo/train.jsonl]",
      "data.val_files=null",
      "data.train_batch_size=4",
      "data.gen_batch_size=4",
      "actor_rollout_ref.actor.ppo_mini_batch_size=4",
      "actor_rollout_ref.rollout.n=4",
      "algorithm.filter_groups.max_num_gen_batches=30",
      "trainer.total_training_steps=2",
      "trainer.val_before_train=false",
      "trainer.test_freq=-1",
      "trainer.save_freq=-1",
      "trainer.logger=[jsonl]",
      "trainer.default_local_dir=" + out,
  };
  o.insert(o.end(), extra.begin(), extra.end());
  return config::load_config(kRoot + "/configs/examples/dapo_demo.yaml", o);
}

// This process's scratch directory (test_util.h): each run writes a subdirectory of its own.
const test::TempDir& scratch() {
  static const test::TempDir dir("test_dapo");
  return dir;
}

std::string fresh_dir(const std::string& name) {
  const std::string out = (scratch() / name).string();
  fs::remove_all(out);
  return out;
}

// The last step's metrics, as the jsonl logger wrote them.
nlohmann::json last_metrics(const std::string& out) {
  std::ifstream f(out + "/metrics.jsonl");
  std::string line, last;
  while (std::getline(f, line)) last = line;
  return nlohmann::json::parse(last);
}

std::string error_of(const config::Config& cfg) {
  try {
    PpoTrainer t(cfg);
    t.fit();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Dapo, DemoConfigTrainsWithDynamicSampling) {
  const std::string out = fresh_dir("demo");
  PpoTrainer t(dapo_config(out, {}));
  t.fit();
  EXPECT_EQ(t.global_step(), 2);
  const nlohmann::json m = last_metrics(out);
  for (const char* k :
       {"train/num_gen_batches", "reward_extra/acc/mean", "reward_extra/overlong_reward/mean",
        "reward_extra/overlong/mean", "actor/pg_loss", "actor/pg_clipfrac", "critic/score/mean"}) {
    ASSERT_TRUE(m.contains(k)) << k;
    EXPECT_TRUE(std::isfinite(m[k].get<double>())) << k;
  }
  EXPECT_GE(m["train/num_gen_batches"].get<double>(), 1.0);
  // Every kept group has right and wrong answers: the accuracy is strictly inside (0, 1).
  EXPECT_GT(m["reward_extra/acc/mean"].get<double>(), 0.0);
  EXPECT_LT(m["reward_extra/acc/mean"].get<double>(), 1.0);
  // The reward is the scorer's score (arith: acc) plus the overlong penalty, row by row.
  EXPECT_NEAR(m["critic/score/mean"].get<double>(),
              m["reward_extra/acc/mean"].get<double>() +
                  m["reward_extra/overlong_reward/mean"].get<double>(),
              1e-5);
}

TEST(Dapo, OverlongPenaltyIsVerlsLinearRamp) {
  // len = max_response_length (24): every response of l tokens gets -(l - 0) / 24 * 0.5.
  const std::string out = fresh_dir("overlong");
  PpoTrainer t(dapo_config(
      out, {"algorithm.filter_groups.enable=false", "reward_model.overlong_buffer.len=24",
            "reward_model.overlong_buffer.penalty_factor=0.5", "trainer.total_training_steps=1"}));
  t.fit();
  const nlohmann::json m = last_metrics(out);
  EXPECT_NEAR(m["reward_extra/overlong_reward/mean"].get<double>(),
              -0.5 * m["response_length/mean"].get<double>() / 24.0, 1e-6);
  EXPECT_EQ(m["reward_extra/overlong/mean"].get<double>(), 1.0);
  EXPECT_FALSE(m.contains("train/num_gen_batches"));
}

TEST(Dapo, NewerVerlSpellingWithMaxRespLen) {
  // verl's reward.reward_kwargs.overlong_buffer_cfg.* and max_resp_len: the penalty counts from
  // max_resp_len 40 with len 24, so a response of l <= 24 tokens gets -(l - 16) / 24 * 0.5 when
  // l > 16, else 0 (the demo's responses are at most data.max_response_length = 24 tokens).
  const std::string out = fresh_dir("overlong_kwargs");
  PpoTrainer t(
      dapo_config(out, {"algorithm.filter_groups.enable=false",
                        "reward.reward_kwargs.overlong_buffer_cfg.enable=true",
                        "reward.reward_kwargs.overlong_buffer_cfg.len=24",
                        "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
                        "reward.reward_kwargs.overlong_buffer_cfg.log=true",
                        "reward.reward_kwargs.max_resp_len=40", "trainer.total_training_steps=1"}));
  t.fit();
  const nlohmann::json m = last_metrics(out);
  const double worst = m["reward_extra/overlong_reward/min"].get<double>();
  EXPECT_NEAR(worst, std::min(-(m["response_length/max"].get<double>() - 16) / 24 * 0.5, 0.0),
              1e-6);
  EXPECT_GE(worst, -(24.0 - 16) / 24 * 0.5 - 1e-6);
}

TEST(Dapo, FilterGroupsKeepsOneSampleGroups) {
  // Greedy decoding, one sample a prompt: a group of one is kept whatever its score (verl's
  // `std > 0 or len == 1`), so one generation batch fills the step.
  const std::string out = fresh_dir("singletons");
  PpoTrainer t(dapo_config(
      out, {"actor_rollout_ref.rollout.n=1", "actor_rollout_ref.rollout.do_sample=false",
            "trainer.total_training_steps=1"}));
  t.fit();
  EXPECT_EQ(t.global_step(), 1);
  EXPECT_EQ(last_metrics(out)["train/num_gen_batches"].get<double>(), 1.0);
}

TEST(Dapo, FilterGroupsStopsAfterMaxNumGenBatches) {
  // Greedy decoding makes a prompt's 4 samples identical: no group is ever kept.
  const std::string msg = error_of(
      dapo_config(fresh_dir("max_gen"), {"actor_rollout_ref.rollout.do_sample=false",
                                         "algorithm.filter_groups.max_num_gen_batches=2"}));
  EXPECT_NE(msg.find("algorithm.filter_groups.max_num_gen_batches=2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("2 generation batches kept 0"), std::string::npos) << msg;
}

TEST(Dapo, ConfigErrorsNameTheKeys) {
  EXPECT_NE(error_of(dapo_config(fresh_dir("err1"), {"algorithm.filter_groups.metric=null"}))
                .find("algorithm.filter_groups.metric"),
            std::string::npos);
  EXPECT_NE(error_of(dapo_config(fresh_dir("err2"), {"reward_model.reward_manager=naive"}))
                .find("reward_model.reward_manager=dapo"),
            std::string::npos);
  EXPECT_NE(error_of(dapo_config(fresh_dir("err3"), {"reward_model.overlong_buffer.len=0"}))
                .find("reward_model.overlong_buffer.len=0"),
            std::string::npos);
  EXPECT_NE(
      error_of(dapo_config(fresh_dir("err4"), {"algorithm.rollout_correction.loss_type=reinforce"}))
          .find("bypass_mode=true"),
      std::string::npos);
}

TEST(Dapo, RolloutCorrectionDecoupledAndBypass) {
  // Decoupled: old_log_prob is recomputed (even on policy) and compared with the rollout's.
  {
    const std::string out = fresh_dir("rc_decoupled");
    PpoTrainer t(
        dapo_config(out, {"algorithm.filter_groups.enable=false", "trainer.total_training_steps=1",
                          "algorithm.rollout_correction.rollout_is=token",
                          "algorithm.rollout_correction.rollout_rs=token_k1",
                          "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0"}));
    t.fit();
    const nlohmann::json m = last_metrics(out);
    ASSERT_TRUE(m.contains("timing_s/old_log_prob"));
    // The CPU rollout and the trainer are both fp32: the weights are 1 to float precision and
    // nothing is rejected.
    EXPECT_NEAR(m["rollout_corr/rollout_is_mean"].get<double>(), 1.0, 1e-3);
    EXPECT_NEAR(m["rollout_corr/kl"].get<double>(), 0.0, 1e-3);
    EXPECT_EQ(m["rollout_corr/rollout_rs_masked_fraction"].get<double>(), 0.0);
  }
  // Bypass with REINFORCE: no old_log_prob pass; the metrics come from the update's micro-batches.
  {
    const std::string out = fresh_dir("rc_bypass");
    PpoTrainer t(
        dapo_config(out, {"algorithm.filter_groups.enable=false", "trainer.total_training_steps=1",
                          "algorithm.rollout_correction.bypass_mode=true",
                          "algorithm.rollout_correction.loss_type=reinforce",
                          "algorithm.rollout_correction.rollout_is=sequence"}));
    t.fit();
    const nlohmann::json m = last_metrics(out);
    EXPECT_FALSE(m.contains("timing_s/old_log_prob"));
    EXPECT_NEAR(m["rollout_corr/rollout_is_mean"].get<double>(), 1.0, 1e-3);
    EXPECT_TRUE(std::isfinite(m["actor/pg_loss"].get<double>()));
  }
}

}  // namespace
}  // namespace verl::trainer
