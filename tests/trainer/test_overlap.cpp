// The seed's stage-overlap switches on the CPU (docs/overlap.md): trainer.token_level_pipeline
// (the old log-prob, reference and value passes on finished samples while generation goes on)
// and trainer.critic_actor_overlap (the critic's update beside the actor's) change when work runs,
// not what it computes: the same run's metrics and weights with each switch off and on. And the
// synthetic long-tailed workload (rollout.length_dist) the overlap is measured on.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "config/config.h"
#include "demo_reward_model.h"
#include "trainer/ppo_trainer.h"

namespace verl::trainer {
namespace {

namespace fs = std::filesystem;
const std::string kRoot = VERL_SOURCE_DIR;

// PPO with a critic, the reference policy (KL loss) and two mini-batches (so old_log_prob runs),
// responses of long-tailed lengths, a rollout of few sequences at a time and small forward
// micro-batches, so that several fill while the rollout still runs.
config::Config overlap_config(const std::string& out, std::vector<std::string> extra) {
  std::vector<std::string> o = {
      "actor_rollout_ref.model.path=" + kRoot + "/assets/demo/model",
      "critic.model.path=" + kRoot + "/assets/demo/model",
      "data.train_files=[" + kRoot + "/assets/demo/train.jsonl]",
      "data.val_files=null",
      "data.train_batch_size=4",
      "actor_rollout_ref.rollout.n=4",
      "actor_rollout_ref.actor.ppo_mini_batch_size=2",
      "critic.ppo_mini_batch_size=2",
      "algorithm.adv_estimator=gae",
      "actor_rollout_ref.actor.use_kl_loss=true",
      "actor_rollout_ref.rollout.ignore_eos=true",
      "actor_rollout_ref.rollout.response_length=400",
      "actor_rollout_ref.rollout.length_dist.type=lognormal",
      "actor_rollout_ref.rollout.length_dist.mean=24",
      "actor_rollout_ref.rollout.length_dist.sigma=1.2",
      // Four sequences decode at a time: the rollout runs in waves, so the first samples finish
      // long before the last ones start.
      "actor_rollout_ref.rollout.max_num_seqs=4",
      "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=448",
      "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=448",
      "critic.forward_max_token_len_per_gpu=448",
      "trainer.total_training_steps=2",
      "trainer.val_before_train=false",
      "trainer.test_freq=-1",
      "trainer.save_freq=-1",
      "trainer.logger=[jsonl]",
      "trainer.default_local_dir=" + out,
  };
  o.insert(o.end(), extra.begin(), extra.end());
  return test::demo_config(o);
}

struct RunResult {
  std::vector<nlohmann::json> steps;
  std::vector<float> weights;
};

// This process's scratch directory (test_util.h): each run writes a subdirectory of its own.
const test::TempDir& scratch() {
  static const test::TempDir dir("test_overlap");
  return dir;
}

RunResult run(const std::string& name, std::vector<std::string> extra) {
  const std::string out = (scratch() / name).string();
  fs::remove_all(out);
  RunResult r;
  {
    PpoTrainer t(overlap_config(out, std::move(extra)));
    t.fit();
    r.weights = t.actor().data;
  }
  std::ifstream f(out + "/metrics.jsonl");
  for (std::string line; std::getline(f, line);) r.steps.push_back(nlohmann::json::parse(line));
  return r;
}

// The metrics a changed pass or update would move.
const char* const kCompared[] = {
    "actor/pg_loss",          "actor/kl_loss",       "actor/grad_norm",   "actor/ppo_kl",
    "actor/entropy",          "critic/vf_loss",      "critic/grad_norm",  "critic/values/mean",
    "critic/advantages/mean", "critic/returns/mean", "critic/score/mean", "response_length/mean"};

// `exact`: bit for bit. Otherwise within float tolerance: the CPU model's sums depend in their last
// bits on which sequences share a micro-batch (measured: 3e-7 relative on the gradient norm,
// 1e-4 on the tiny KL loss), and AdamW turns a tiny gradient's flipped sign into a step of 2 lr.
void expect_same_run(const RunResult& a, const RunResult& b, bool exact, double lr = 0) {
  ASSERT_EQ(a.steps.size(), 2u);
  ASSERT_EQ(b.steps.size(), 2u);
  for (size_t i = 0; i < a.steps.size(); ++i) {
    for (const char* k : kCompared) {
      ASSERT_TRUE(a.steps[i].contains(k) && b.steps[i].contains(k)) << k;
      const double x = a.steps[i][k].get<double>(), y = b.steps[i][k].get<double>();
      if (exact) {
        EXPECT_EQ(x, y) << k << " at step " << i + 1;
      } else {
        EXPECT_NEAR(x, y, 1e-3 * std::fabs(x) + 1e-6) << k << " at step " << i + 1;
      }
    }
  }
  ASSERT_EQ(a.weights.size(), b.weights.size());
  if (exact) {
    EXPECT_TRUE(a.weights == b.weights) << "the actor's weights differ";
    return;
  }
  double worst = 0;
  size_t apart = 0;
  for (size_t i = 0; i < a.weights.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a.weights[i]) - b.weights[i]);
    worst = std::max(worst, d);
    apart += d > 0.5 * lr ? 1 : 0;
  }
  std::printf("weights after 2 steps: max |diff| %.3g (lr %.3g), %zu of %zu apart by > lr/2\n",
              worst, lr, apart, a.weights.size());
  EXPECT_LE(worst, 4 * lr);
  EXPECT_LE(static_cast<double>(apart), 0.01 * static_cast<double>(a.weights.size()));
}

TEST(Overlap, TokenLevelPipelineGivesTheSameRun) {
  const RunResult off = run("pipe_off", {});
  const RunResult on = run("pipe_on", {"trainer.token_level_pipeline=true"});
  expect_same_run(off, on, /*exact=*/false, 1e-4);  // configs/demo.yaml's actor lr
  // Each pass ran, and pipelined work ran while generation went on (the budget of 448 tokens fills
  // after a few finished samples, long before the longest response ends); a pass's overlap never
  // exceeds its time. Which passes got to run early depends on the threads' timing.
  double overlapped = 0;
  for (const auto& s : on.steps) {
    for (const char* stage : {"old_log_prob", "ref", "values"}) {
      const std::string t = std::string("timing_s/") + stage, o = t + "_overlap_gen";
      ASSERT_TRUE(s.contains(t) && s.contains(o)) << o;
      EXPECT_LE(s[o].get<double>(), s[t].get<double>() + 1e-9) << o;
      overlapped += s[o].get<double>();
    }
  }
  EXPECT_GT(overlapped, 0.0);
  std::printf("token pipeline, step 2: ref %.3f s of which %.3f s during gen (gen %.3f s)\n",
              on.steps[1]["timing_s/ref"].get<double>(),
              on.steps[1]["timing_s/ref_overlap_gen"].get<double>(),
              on.steps[1]["timing_s/gen"].get<double>());
}

TEST(Overlap, CriticActorOverlapGivesTheSameRun) {
  const RunResult off = run("ca_off", {});
  const RunResult on = run("ca_on", {"trainer.critic_actor_overlap=true"});
  // The two updates touch disjoint state and run the same arithmetic: bit for bit.
  expect_same_run(off, on, /*exact=*/true);
  for (const auto& s : on.steps) ASSERT_TRUE(s.contains("timing_s/update_critic_overlap_actor"));
  // Both switches together: the pipeline's tolerance.
  expect_same_run(
      off,
      run("both_on", {"trainer.critic_actor_overlap=true", "trainer.token_level_pipeline=true"}),
      /*exact=*/false, 1e-4);
}

// trainer.one_step_off_policy: step k trains on a rollout that step k-1 started from its own
// weights, so the rollout is never more than one update old: rollout/staleness is 0 at step 1 (its
// own rollout) and 1 after, rollout/weights_step is the number of updates in the rollout's weights.
// Step 1 is the plain run's; later steps are not (the rollout's log-probs then differ from the
// recomputed old ones by an update, where an on-policy rollout agrees to float precision). A
// checkpoint does not keep the started rollout: the resumed run generates that batch anew, from
// where the loader stood before it.
TEST(Overlap, OneStepOffPolicyTrainsOnRolloutsOneUpdateOld) {
  const std::vector<std::string> three = {"trainer.total_training_steps=3",
                                          "algorithm.adv_estimator=grpo", "critic.enable=false"};
  std::vector<std::string> off_cfg = three;
  off_cfg.push_back("trainer.one_step_off_policy=true");
  off_cfg.push_back("trainer.save_freq=2");
  const RunResult plain = run("osp_plain", three), off = run("osp_off", off_cfg);
  ASSERT_EQ(off.steps.size(), 3u);
  ASSERT_EQ(plain.steps.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const auto& s = off.steps[i];
    const double staleness = s["rollout/staleness"].get<double>();
    EXPECT_EQ(staleness, i == 0 ? 0.0 : 1.0) << "step " << i + 1;
    EXPECT_EQ(s["rollout/weights_step"].get<double>(), i == 0 ? 0.0 : static_cast<double>(i - 1))
        << "step " << i + 1;
    ASSERT_TRUE(s.contains(
        "timing_s/old_log_prob"));  // recomputed: the rollout is not on-policy after step 1
  }
  // Step 1 is the plain run's step; later ones learn from older samples.
  for (const char* k :
       {"actor/pg_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean"})
    EXPECT_EQ(off.steps[0][k].get<double>(), plain.steps[0][k].get<double>()) << k;
  const double own = off.steps[0]["training/rollout_probs_diff_max"].get<double>();
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_GT(off.steps[i]["training/rollout_probs_diff_max"].get<double>(),
              10 * std::max(own, 1e-6))
        << "step " << i + 1 << ": the rollout looks on-policy";
    EXPECT_LT(plain.steps[i]["training/rollout_probs_diff_max"].get<double>(), 1e-4)
        << "step " << i + 1;
  }
  // Resume from step 2's checkpoint: step 3 generates its batch itself (staleness 0), the batch
  // the uninterrupted run trained on at step 3.
  const std::string out = (scratch() / "osp_off").string();
  fs::remove_all(out + "/global_step_3");  // the last step's checkpoint: back to step 2's
  std::ofstream(out + "/latest_checkpointed_iteration.txt") << "2";
  {
    std::vector<std::string> o = off_cfg;
    o.push_back("trainer.resume_mode=auto");
    PpoTrainer t(overlap_config(out, o));
    t.fit();
    EXPECT_EQ(t.global_step(), 3);
  }
  std::ifstream f(out + "/metrics.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(f, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 3u);  // steps 1 and 2, then the resumed step 3 in place of the first one
  EXPECT_EQ(lines[2]["training/global_step"].get<double>(), 3.0);
  EXPECT_EQ(lines[2]["rollout/staleness"].get<double>(), 0.0);
  EXPECT_EQ(lines[2]["prompt_length/mean"].get<double>(),
            off.steps[2]["prompt_length/mean"].get<double>());
}

// A reward model (random weights, the demo's shape) scores finished samples in forwards of its
// token budget while the rest still decode (trainer.actor_reward_parallel): the same scores as
// scoring the whole batch after generation, within the CPU model's float noise (its sums depend
// on which sequences share a forward), and timing_s/reward_overlap_gen says how much of the reward
// pass ran during generation.
TEST(Overlap, RewardModelScoresWhileGenerationRuns) {
  const fs::path rm = scratch() / "rm_model";
  test::make_demo_reward_model(rm);
  const std::vector<std::string> common = {"reward_model.enable=true",
                                           "reward_model.model.path=" + rm.string(),
                                           "reward_model.forward_max_token_len_per_gpu=448",
                                           "algorithm.adv_estimator=grpo", "critic.enable=false"};
  std::vector<std::string> on = common, off = common;
  on.push_back("trainer.actor_reward_parallel=true");
  off.push_back("trainer.actor_reward_parallel=false");
  const RunResult a = run("rm_parallel", on), b = run("rm_after", off);
  ASSERT_EQ(a.steps.size(), 2u);
  ASSERT_EQ(b.steps.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    for (const char* k :
         {"critic/score/mean", "critic/score/max", "critic/score/min", "actor/pg_loss"}) {
      const double x = a.steps[i][k].get<double>(), y = b.steps[i][k].get<double>();
      EXPECT_NEAR(x, y, 1e-5 * std::max(1.0, std::fabs(y))) << k << " at step " << i + 1;
    }
    EXPECT_GT(a.steps[i]["critic/score/max"].get<double>(),
              a.steps[i]["critic/score/min"].get<double>());
    ASSERT_TRUE(a.steps[i].contains("timing_s/reward_overlap_gen")) << "step " << i + 1;
    EXPECT_GT(a.steps[i]["timing_s/reward_overlap_gen"].get<double>(), 0.0) << "step " << i + 1;
    EXPECT_EQ(b.steps[i].value("timing_s/reward_overlap_gen", 0.0), 0.0)
        << "step " << i + 1;  // after generation
  }
  std::printf(
      "reward model during generation: step 1 score mean %.6g (after: %.6g), %.3f s of %.3f s "
      "overlapped\n",
      a.steps[0]["critic/score/mean"].get<double>(), b.steps[0]["critic/score/mean"].get<double>(),
      a.steps[0]["timing_s/reward_overlap_gen"].get<double>(),
      a.steps[0]["timing_s/reward"].get<double>());
}

TEST(Overlap, LengthDistDrawsLongTailedLengths) {
  // With ignore_eos every response is exactly its drawn length: lognormal of mean 24 capped at 400.
  const RunResult r = run("lengths", {});
  for (const auto& s : r.steps) {
    EXPECT_LE(s["response_length/max"].get<double>(), 400.0);
    EXPECT_GE(s["response_length/min"].get<double>(), 1.0);
    // 16 samples of a lognormal (mean 24, sigma 1.2): their mean within a wide band, their spread
    // long-tailed (the longest well above the mean).
    EXPECT_GT(s["response_length/mean"].get<double>(), 6.0);
    EXPECT_LT(s["response_length/mean"].get<double>(), 80.0);
    EXPECT_GT(s["response_length/max"].get<double>(),
              1.5 * s["response_length/mean"].get<double>());
  }
  // Off, the same run's responses all run to response_length (ignore_eos).
  const RunResult plain = run("lengths_off", {"actor_rollout_ref.rollout.length_dist.type=none",
                                              "actor_rollout_ref.rollout.response_length=48"});
  EXPECT_EQ(plain.steps[0]["response_length/min"].get<double>(), 48.0);
}

}  // namespace
}  // namespace verl::trainer
