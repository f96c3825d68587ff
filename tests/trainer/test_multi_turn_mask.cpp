// Multi-turn trajectories through the actor update: tokens with loss mask 0 (a tool's turn) get no
// gradient. Changing everything the loss reads at those tokens (advantages, old, reference and
// rollout log-probs) leaves the updated weights bit for bit the same, while training on them
// changes the update, and the assistant tokens after the tool turn are still trained on.
#include <gtest/gtest.h>

#include "../common/test_util.h"
#include "dist/communicator.h"
#include "trainer/actor_worker.h"
#include "trainer/run_plan.h"
#include "trainer/step_metrics.h"

namespace verl::trainer {
namespace {

const std::string kRoot = VERL_SOURCE_DIR;

struct Case {
  std::vector<float> mask;  // [2, L]
  bool perturb_masked = false;
};

uint64_t update_digest(const Case& c, uint64_t* before = nullptr) {
  const config::Config cfg = test::demo_config({
      "actor_rollout_ref.model.path=" + kRoot + "/assets/demo/model",
      "data.train_files=[" + kRoot + "/assets/demo/train.jsonl]",
      "data.val_files=[" + kRoot + "/assets/demo/val.jsonl]",
      "data.train_batch_size=2",
      "actor_rollout_ref.rollout.n=1",
      "actor_rollout_ref.actor.ppo_mini_batch_size=2",
      "actor_rollout_ref.actor.use_kl_loss=true",
      "actor_rollout_ref.actor.entropy_coeff=0.01",
  });
  const PpoConfig pc = PpoConfig::read(cfg, 1, false);
  const RunPlan plan = RunPlan::from(pc);
  dist::SingleProcess comm;
  ActorWorker actor(pc, plan, Device::Cpu, model::Weights::load(kRoot + "/assets/demo/model"), comm,
                    10);
  if (before) *before = actor.model().state().weights_digest();
  // Two rows: a prompt, then an assistant turn, a tool turn (mask 0 in the multi-turn case) and
  // a second assistant turn.
  std::vector<data::Sample> samples(2);
  samples[0].prompt_ids = {10, 20, 30, 40, 50};
  samples[1].prompt_ids = {11, 21, 31};
  const int64_t L = 12;
  Experience exp;
  exp.B = 2;
  exp.L = L;
  exp.sample = {&samples[0], &samples[1]};
  exp.group = {0, 1};
  exp.response = {{60, 61, 62, 511, 70, 71, 72, 73, 74, 63, 64, 511},
                  {65, 66, 511, 75, 76, 77, 67, 68, 69, 80, 81, 511}};
  exp.finish_reason = {"stop", "stop"};
  exp.mask = c.mask;
  PassContext ctx{&comm, nullptr};
  actor.compute_old_log_prob(exp, ctx, exp.old_log_prob);
  exp.ref_log_prob = exp.old_log_prob;
  exp.rollout_log_prob = exp.old_log_prob;
  exp.advantages.assign(2 * L, 0.0f);
  for (int64_t i = 0; i < 2 * L; ++i) {
    exp.advantages[i] = (i % 3 == 0 ? 1.0f : -0.5f) * (i < L ? 1.0f : -1.0f);
    exp.ref_log_prob[i] -= 0.1f * static_cast<float>(i % 4);
    exp.old_log_prob[i] += 0.01f * static_cast<float>(i % 5);
  }
  exp.returns = exp.advantages;
  if (c.perturb_masked)
    for (int64_t i = 0; i < 2 * L; ++i)
      if (c.mask[i] == 0.0f) {
        exp.advantages[i] = 25.0f;
        exp.old_log_prob[i] = -9.0f;
        exp.ref_log_prob[i] = -0.01f;
        exp.rollout_log_prob[i] = -3.0f;
      }
  metrics::Metrics m;
  MemoryRecorder memory(Device::Cpu);
  actor.update(exp, m, 0, ctx, memory);
  return actor.model().state().weights_digest();
}

TEST(MultiTurnMask, ToolTokensGetNoGradientThroughTheActorUpdate) {
  const int64_t L = 12;
  std::vector<float> multi(2 * L, 1.0f);
  for (int64_t j = 4; j < 9; ++j) multi[j] = 0.0f;      // row 0: tokens 4..8 are a tool turn
  for (int64_t j = 3; j < 6; ++j) multi[L + j] = 0.0f;  // row 1: tokens 3..5
  uint64_t initial = 0;
  const uint64_t masked = update_digest({multi, false}, &initial);
  EXPECT_EQ(update_digest({multi, true}), masked);  // what the loss reads there changes nothing
  EXPECT_NE(masked, initial);                       // the assistant tokens trained
  EXPECT_NE(update_digest({std::vector<float>(2 * L, 1.0f), false}), masked);
  // Only the tool turn masked: the turn after it still trains (masking it too changes the update).
  std::vector<float> fewer = multi;
  for (int64_t j = 9; j < L; ++j) fewer[j] = 0.0f;
  EXPECT_NE(update_digest({fewer, false}), masked);
}

}  // namespace
}  // namespace verl::trainer
