// data.dynamic_batch in the trainer, on the demo config: the metrics of two GRPO steps and their
// ranges, the budget shrinking when the memory in use is over the threshold, every sample dropped
// by the length bounds, and, with nothing dropped and the budget equal to
// ppo_max_token_len_per_gpu at communication_sensitivity 1, the same weights and losses as
// use_dynamic_bsz.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "config/config.h"
#include "trainer/ppo_trainer.h"

namespace verl::trainer {
namespace {

namespace fs = std::filesystem;
const std::string kRoot = VERL_SOURCE_DIR;

// 4 prompts x 4 samples = 16 sequences a step, one mini-batch (on-policy: the update is the only
// packing of a step), no validation. A sequence has at most 32 + 24 = 56 tokens.
config::Config demo(const std::string& out, std::vector<std::string> extra) {
  std::vector<std::string> o = {
      "actor_rollout_ref.model.path=" + kRoot + "/assets/demo/model",
      "data.train_files=[" + kRoot + "/assets/demo/train.jsonl]",
      "data.val_files=null",
      "trainer.val_before_train=false",
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

struct RunResult {
  std::vector<nlohmann::json> steps;  // metrics.jsonl, one object a step
  std::vector<float> weights;
};

// This process's scratch directory (test_util.h): each run writes a subdirectory of its own.
const test::TempDir& scratch() {
  static const test::TempDir dir("test_dynbatch");
  return dir;
}

RunResult run(const std::string& name, const std::vector<std::string>& extra) {
  const std::string out = (scratch() / name).string();
  fs::remove_all(out);
  RunResult r;
  {
    PpoTrainer t(demo(out, extra));
    t.fit();
    r.weights = t.actor().data;
  }
  std::ifstream f(out + "/metrics.jsonl");
  for (std::string l; std::getline(f, l);) r.steps.push_back(nlohmann::json::parse(l));
  fs::remove_all(out);
  return r;
}

double get(const nlohmann::json& j, const std::string& k) {
  EXPECT_TRUE(j.contains(k)) << "missing metric " << k;
  return j.contains(k) ? j[k].get<double>() : -1.0;
}

TEST(DynamicBatchTrainer, TwoStepsLogBudgetAndUtilisation) {
  // base_batch_size 2: a budget of 2 x 56 = 112 tokens (under ppo_max_token_len_per_gpu 8192).
  const RunResult r =
      run("metrics", {"data.dynamic_batch.enable=true", "data.dynamic_batch.base_batch_size=2"});
  ASSERT_EQ(r.steps.size(), 2u);
  for (const auto& j : r.steps) {
    const double util = get(j, "perf/token_utilisation"),
                 fixed = get(j, "dynamic_batch/fixed_count_token_utilisation");
    EXPECT_GT(util, 0.5);
    EXPECT_LE(util, 1.0);
    EXPECT_GT(fixed, 0.0);
    // The same tokens in ceil(16 / 2) = 8 fixed micro-batches of 112 tokens fill less.
    EXPECT_GT(util, fixed);
    EXPECT_EQ(get(j, "dynamic_batch/token_budget"), 112.0);
    EXPECT_EQ(get(j, "dynamic_batch/dropped_samples"), 0.0);
    EXPECT_EQ(get(j, "dynamic_batch/filler_samples"), 0.0);
    // Far under 70 GiB: the budget stays at its ceiling.
    EXPECT_EQ(get(j, "dynamic_batch/shrinks"), 0.0);
    EXPECT_EQ(get(j, "dynamic_batch/grows"), 0.0);
    const double micro = get(j, "dynamic_batch/micro_batches");
    EXPECT_GE(micro, 2.0);  // 16 sequences of 20+ tokens do not fit 112 tokens in one
    EXPECT_LT(micro, 8.0);
    // tokens / (micro-batches x budget) with the tokens of the step (prompt + response).
    EXPECT_NEAR(util, get(j, "perf/total_num_tokens") / (micro * 112.0), 1e-9);
    const double spread = get(j, "dynamic_batch/micro_batch_spread");
    EXPECT_GE(spread, 0.0);
    EXPECT_LE(spread, 1.0);
    EXPECT_TRUE(std::isfinite(get(j, "actor/pg_loss")));
  }
}

TEST(DynamicBatchTrainer, BudgetShrinksToTheFloorAboveTheMemoryThreshold) {
  // A threshold of 0 GiB: the process's resident set is always above it. One packing a step:
  // step 1 halves 112 to 56 (the floor, one planned sequence), step 2 stays there.
  const RunResult r =
      run("shrink", {"data.dynamic_batch.enable=true", "data.dynamic_batch.base_batch_size=2",
                     "data.dynamic_batch.memory_threshold_gb=0"});
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_EQ(get(r.steps[0], "dynamic_batch/token_budget"), 56.0);
  EXPECT_EQ(get(r.steps[0], "dynamic_batch/shrinks"), 1.0);
  EXPECT_EQ(get(r.steps[1], "dynamic_batch/token_budget"), 56.0);
  EXPECT_EQ(get(r.steps[1], "dynamic_batch/shrinks"), 0.0);
  for (const auto& j : r.steps) {
    EXPECT_EQ(get(j, "dynamic_batch/grows"), 0.0);
    EXPECT_NEAR(get(j, "perf/token_utilisation"),
                get(j, "perf/total_num_tokens") / (get(j, "dynamic_batch/micro_batches") * 56.0),
                1e-9);
  }
}

TEST(DynamicBatchTrainer, SamplesOutsideTheBoundsAreDropped) {
  // max_sequence_length 1: every sample is dropped. Nothing reaches the loss; one filler
  // micro-batch keeps the update's shape (a zero gradient).
  const RunResult r = run(
      "drop_all", {"data.dynamic_batch.enable=true", "data.dynamic_batch.max_sequence_length=1"});
  ASSERT_EQ(r.steps.size(), 2u);
  for (const auto& j : r.steps) {
    EXPECT_EQ(get(j, "dynamic_batch/dropped_samples"), 16.0);
    EXPECT_EQ(get(j, "dynamic_batch/filler_samples"), 1.0);
    EXPECT_EQ(get(j, "dynamic_batch/micro_batches"), 1.0);
    EXPECT_EQ(get(j, "perf/token_utilisation"), 0.0);
    EXPECT_EQ(get(j, "actor/pg_loss"), 0.0);
    EXPECT_EQ(get(j, "actor/grad_norm"), 0.0);
  }
}

TEST(DynamicBatchTrainer, NothingDroppedAndCapBudgetEqualsUseDynamicBsz) {
  // ppo_max_token_len_per_gpu 100: several micro-batches a step. base_batch_size 64 x 56 tokens is
  // over it, so the budget is 100 (the threshold is never reached on the demo), nothing is
  // dropped (0..4096) and sensitivity 1 partitions exactly as rearrange_micro_batches.
  const std::vector<std::string> common = {"actor_rollout_ref.actor.use_dynamic_bsz=true",
                                           "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=100"};
  std::vector<std::string> dyn = common;
  dyn.insert(dyn.end(),
             {"data.dynamic_batch.enable=true", "data.dynamic_batch.communication_sensitivity=1"});
  const RunResult a = run("bsz", common), b = run("equiv", dyn);
  ASSERT_EQ(a.steps.size(), 2u);
  ASSERT_EQ(b.steps.size(), 2u);
  for (size_t s = 0; s < 2; ++s) {
    EXPECT_EQ(get(b.steps[s], "dynamic_batch/token_budget"), 100.0);
    EXPECT_EQ(get(b.steps[s], "dynamic_batch/dropped_samples"), 0.0);
    EXPECT_GE(get(b.steps[s], "dynamic_batch/micro_batches"), 3.0);
    for (const char* k : {"actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean"})
      EXPECT_EQ(get(a.steps[s], k), get(b.steps[s], k)) << k << " at step " << s + 1;
  }
  EXPECT_EQ(a.weights, b.weights);  // bit for bit: the same micro-batches in the same order
}

}  // namespace
}  // namespace verl::trainer
