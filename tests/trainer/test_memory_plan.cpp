// The per-phase GPU memory plan (trainer/memory_plan.h) against the peaks measured on an H200 by
// `verl bench grpo-step` (perf/device_memory_peak_gib/<phase>, docs/benchmarks.md and the raw JSON
// in docs/results/): each phase within 15%, and the configurations that ran fit while the two that
// did not run are refused. Model shapes from tests/fixtures/configs (config.json files, no
// weights).
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/file.h"
#include "model/config.h"
#include "trainer/memory_plan.h"
#include "trainer/ppo_config.h"
#include "trainer/run_plan.h"

using namespace verl;

namespace {

const std::string kRoot = VERL_SOURCE_DIR;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kH200 = 143771.0 * 1024 * 1024;  // nvidia-smi's 143771 MiB (docs/benchmarks.md)
constexpr double kTolerance = 0.15;

model::ModelConfig shape(const std::string& name) {
  const std::string path = kRoot + "/tests/fixtures/configs/" + name + ".json";
  return model::parse_model_config(read_file(path, "model config"), path);
}

// The policy's shape as a one-label sequence-classification reward model (the benchmarks' RM).
model::ModelConfig reward_model_of(const std::string& name) {
  model::ModelConfig c = shape(name);
  c.head = model::HeadKind::SequenceClassification;
  c.num_labels = 1;
  return c;
}

struct Measured {
  std::string source;  // where the figures are
  std::string shape;
  std::vector<std::string> overrides;  // on configs/examples/grpo_qwen2_5_0_5b_h200.yaml
  std::map<std::string, double> peak_gib;
  bool reward_model = false;
};

trainer::MemoryPlan plan_of(const Measured& m) {
  const config::Config cfg =
      config::load_config(kRoot + "/configs/examples/grpo_qwen2_5_0_5b_h200.yaml", m.overrides);
  std::optional<model::ModelConfig> rm;
  if (m.reward_model) rm = reward_model_of(m.shape);
  // The trainer's own typed config and run plan, one rank.
  const trainer::PpoConfig pc = trainer::PpoConfig::read(cfg, 1, false);
  trainer::RunPlan run = trainer::RunPlan::from(pc);
  return run.estimate_memory(pc, shape(m.shape), std::nullopt, rm, kH200);
}

double phase_gib(const trainer::MemoryPlan& plan, const std::string& phase) {
  for (const trainer::PhaseMemory& p : plan.phases)
    if (p.phase == phase) return p.bytes / kGiB;
  ADD_FAILURE() << "the plan has no phase " << phase;
  return 0;
}

const std::string kLongTail =
    "actor_rollout_ref.rollout.response_length=1024";  // with data.max_response_length=1024

const std::vector<Measured> kMeasured = {
    {"docs/benchmarks.md, issue-25 table at 0.5B, 2026-12-05 "
     "(docs/results/speed_h200_2026-12-05/grpo_s05.json)",
     "qwen2.5-0.5b",
     {},
     {{"gen", 28.52}, {"ref", 26.07}, {"update_actor", 26.07}, {"optimizer", 26.07}}},
    {"docs/benchmarks.md, one trainer path, 2026-12-02 (gen / after it, with recomputation)",
     "qwen2.5-0.5b",
     {"actor_rollout_ref.model.enable_gradient_checkpointing=true"},
     {{"gen", 21.7}, {"update_actor", 19.2}}},
    {"docs/benchmarks.md, issue-25 table at 1.5B, 2026-12-05 "
     "(docs/results/speed_h200_2026-12-05/grpo_s15.json)",
     "qwen2.5-1.5b",
     {},
     {{"gen", 59.21}, {"ref", 54.44}, {"update_actor", 54.44}, {"optimizer", 54.44}}},
    {"docs/benchmarks.md, offload by ratio, 2026-12-04, 1.5B ratio 0.3 "
     "(docs/results/offload_h200_2026-12-04/)",
     "qwen2.5-1.5b",
     {"actor_rollout_ref.actor_offload_ratio=0.3"},
     {{"gen", 54.26}, {"ref", 49.49}, {"update_actor", 49.49}, {"optimizer", 49.49}}},
    {"docs/benchmarks.md, offload by ratio, 2026-12-04, 1.5B ratio 1.0",
     "qwen2.5-1.5b",
     {"actor_rollout_ref.actor_offload_ratio=1.0"},
     {{"gen", 42.20}, {"ref", 37.43}, {"update_actor", 37.43}, {"optimizer", 37.43}}},
    {"docs/benchmarks.md, offload by ratio, 2026-12-04, 7B ratio 0.3 + ref param_offload",
     "qwen2.5-7b",
     {"actor_rollout_ref.actor_offload_ratio=0.3",
      "actor_rollout_ref.model.enable_gradient_checkpointing=true",
      "actor_rollout_ref.rollout.gpu_memory_utilization=0.95",
      "actor_rollout_ref.ref.fsdp_config.param_offload=true"},
     {{"gen", 125.68}, {"ref", 130.82}, {"update_actor", 116.63}, {"optimizer", 116.63}}},
    {"docs/benchmarks.md, offload by ratio, 2026-12-04, 7B ratio 1.0",
     "qwen2.5-7b",
     {"actor_rollout_ref.actor_offload_ratio=1.0",
      "actor_rollout_ref.model.enable_gradient_checkpointing=true",
      "actor_rollout_ref.rollout.gpu_memory_utilization=0.95"},
     {{"gen", 80.37}, {"ref", 71.33}, {"update_actor", 71.33}, {"optimizer", 71.33}}},
    {"docs/benchmarks.md, stage overlap, 2026-12-04, 0.5B PPO "
     "(docs/results/overlap_h200_2026-12-04/bench_overlap_ppo_qwen2.5-0.5b.jsonl)",
     "qwen2.5-0.5b",
     {"data.max_response_length=1024", kLongTail, "algorithm.adv_estimator=gae",
      "critic.ppo_max_token_len_per_gpu=8192", "critic.model.enable_gradient_checkpointing=false"},
     {{"gen", 46.81},
      {"ref", 42.11},
      {"values", 42.11},
      {"update_critic", 42.11},
      {"update_actor", 42.11}}},
    {"docs/benchmarks.md, stage overlap, 2026-12-04, 1.5B PPO at gpu_memory_utilization=0.8 "
     "(bench_overlap_ppo_qwen2.5-1.5b.jsonl)",
     "qwen2.5-1.5b",
     {"data.max_response_length=1024", kLongTail, "algorithm.adv_estimator=gae",
      "critic.ppo_max_token_len_per_gpu=8192", "critic.model.enable_gradient_checkpointing=false",
      "actor_rollout_ref.rollout.gpu_memory_utilization=0.8"},
     {{"gen", 106.58}, {"ref", 96.57}, {"update_critic", 96.57}, {"update_actor", 96.57}}},
    {"docs/benchmarks.md, stage overlap, 2026-12-04, 0.5B with a reward model "
     "(bench_overlap_rm_qwen2.5-0.5b.jsonl)",
     "qwen2.5-0.5b",
     {"data.max_response_length=1024", kLongTail, "reward_model.enable=true",
      "reward_model.model.input_tokenizer=null"},
     {{"gen", 33.14}, {"ref", 28.44}, {"update_actor", 28.44}},
     true},
    {"docs/benchmarks.md, stage overlap, 2026-12-04, 1.5B GRPO, long tail "
     "(bench_overlap_qwen2.5-1.5b.jsonl)",
     "qwen2.5-1.5b",
     {"data.max_response_length=1024", kLongTail},
     {{"gen", 64.39}, {"ref", 54.38}, {"update_actor", 54.38}}},
};

}  // namespace

TEST(MemoryPlan, EveryPhaseWithin15PercentOfTheMeasuredPeak) {
  for (const Measured& m : kMeasured) {
    SCOPED_TRACE(m.source);
    const trainer::MemoryPlan plan = plan_of(m);
    for (const auto& [phase, measured] : m.peak_gib) {
      const double estimate = phase_gib(plan, phase);
      EXPECT_NEAR(estimate, measured, kTolerance * measured)
          << phase << ": estimate " << estimate << " GiB";
      std::printf("%-13s measured %7.2f GiB, estimate %7.2f GiB (%+.1f%%)  %s\n", phase.c_str(),
                  measured, estimate, 100.0 * (estimate / measured - 1.0), m.source.c_str());
    }
  }
}

TEST(MemoryPlan, ConfigurationsThatRanFit) {
  for (const Measured& m : kMeasured) {
    SCOPED_TRACE(m.source);
    const trainer::MemoryPlan plan = plan_of(m);
    EXPECT_LE(plan.peak().bytes, kH200);
    ASSERT_TRUE(plan.kv_budget.has_value());
    EXPECT_GE(*plan.kv_budget, plan.kv_block_bytes);
    // Each ran with the KV cache holding every sequence of the step (no waves).
    EXPECT_EQ(plan.kv_blocks, plan.kv_blocks_wanted);
  }
}

// The 7B rows of docs/benchmarks.md (2026-12-04) that did not run: resident, the state and the
// reference do not fit; at ratio 0.3 with the reference resident, 130.8 GiB in use leaves the KV
// cache nothing under gpu_memory_utilization=0.92.
TEST(MemoryPlan, ConfigurationsThatDidNotRunAreRefused) {
  Measured resident{"7B ratio 0",
                    "qwen2.5-7b",
                    {"actor_rollout_ref.model.enable_gradient_checkpointing=true",
                     "actor_rollout_ref.rollout.gpu_memory_utilization=0.95"},
                    {}};
  EXPECT_GT(plan_of(resident).peak().bytes, kH200);

  Measured ref_resident{"7B ratio 0.3, reference resident",
                        "qwen2.5-7b",
                        {"actor_rollout_ref.actor_offload_ratio=0.3",
                         "actor_rollout_ref.model.enable_gradient_checkpointing=true",
                         "actor_rollout_ref.rollout.gpu_memory_utilization=0.92"},
                        {}};
  const trainer::MemoryPlan plan = plan_of(ref_resident);
  EXPECT_NEAR(plan.resident / kGiB, 130.8,
              kTolerance * 130.8);  // "130.8 GiB in use after construction"
  ASSERT_TRUE(plan.kv_budget.has_value());
  EXPECT_LT(*plan.kv_budget, plan.kv_block_bytes);
}

// The pinned host memory of the offloaded states: perf/host_pinned_gib of the same runs.
TEST(MemoryPlan, PinnedHostMemoryOfTheOffloadedStates) {
  EXPECT_NEAR(plan_of(kMeasured[3]).host_pinned() / kGiB, 5.18, kTolerance * 5.18);    // 1.5B, 0.3
  EXPECT_NEAR(plan_of(kMeasured[4]).host_pinned() / kGiB, 17.25, kTolerance * 17.25);  // 1.5B, 1.0
  EXPECT_NEAR(plan_of(kMeasured[5]).host_pinned() / kGiB, 39.72,
              kTolerance * 39.72);  // 7B, 0.3 + ref
  EXPECT_NEAR(plan_of(kMeasured[6]).host_pinned() / kGiB, 85.11, kTolerance * 85.11);  // 7B, 1.0
}

// Recomputation keeps one layer's activations instead of every layer's: the arena shrinks by
// (L - 1) layers' worth, and a forward-only model keeps no backward buffers.
TEST(MemoryPlan, ArenaFollowsRecomputationAndTraining) {
  const model::ModelConfig c = shape("qwen2.5-0.5b");
  const double kept = trainer::transformer_arena_bytes(c, 8192, 256, true, false, false);
  const double recomputed = trainer::transformer_arena_bytes(c, 8192, 256, true, true, false);
  const double forward = trainer::transformer_arena_bytes(c, 8192, 256, false, false, false);
  EXPECT_GT(kept, recomputed);
  EXPECT_GT(recomputed, forward);
  // docs/benchmarks.md (2026-12-02): recomputation held 6.8 GiB less at the 0.5B shape.
  EXPECT_NEAR((kept - recomputed) / kGiB, 6.8, kTolerance * 6.8);
}

// ZeRO on the GPU state (optim/cuda/strategy.h), per rank at 4 data-parallel ranks: stage 1 keeps
// the moments of a quarter (rounded up) and the master weights padded to 4 quarters; stage 2 adds
// the shard's reduced gradients beside the whole buffer the backward writes; one rank shards
// nothing. The lead checks these against perf/device_memory_rank_peak_gib of
// bench/multi_gpu_cuda.sh's zero part within 15%.
TEST(MemoryPlan, ZeroStagesShardTheActorStatePerRank) {
  const std::string yaml = kRoot + "/configs/examples/grpo_qwen2_5_0_5b_h200.yaml";
  auto actor_of = [&](int world, int stage, trainer::MemoryPlan* out) {
    const config::Config cfg =
        config::load_config(yaml, {"actor_rollout_ref.actor.zero_stage=" + std::to_string(stage)});
    const trainer::PpoConfig pc = trainer::PpoConfig::read(cfg, world, world > 1);
    trainer::RunPlan run = trainer::RunPlan::from(pc);
    *out = run.estimate_memory(pc, shape("qwen2.5-0.5b"), std::nullopt, std::nullopt, kH200);
    EXPECT_EQ(run.memory_inputs->actor.dp, world);
    EXPECT_EQ(run.memory_inputs->actor.zero_stage, stage);
    return out->models[0];
  };
  trainer::MemoryPlan p0, p1, p2, one;
  const trainer::ModelMemory z0 = actor_of(4, 0, &p0), z1 = actor_of(4, 1, &p1),
                             z2 = actor_of(4, 2, &p2), alone = actor_of(1, 1, &one);
  const int64_t n = z0.params;
  ASSERT_GT(n, 400'000'000);  // Qwen2.5-0.5B: 494 M parameters
  const auto p = static_cast<double>(n), chunk = static_cast<double>((n + 3) / 4);
  const double grads = 4.0 * (p + 4096);  // CudaTrainState's padded gradient buffer
  EXPECT_EQ(z0.master, 4.0 * p);
  EXPECT_EQ(z0.moments, 8.0 * p);
  EXPECT_EQ(z0.grads, grads);
  EXPECT_EQ(z1.master, 16.0 * chunk);
  EXPECT_EQ(z1.moments, 8.0 * chunk);
  EXPECT_EQ(z1.grads, grads);
  EXPECT_EQ(z2.moments, 8.0 * chunk);
  EXPECT_EQ(z2.grads, grads + 4.0 * chunk);
  EXPECT_EQ(alone.moments, 8.0 * p);  // one rank: nothing to shard
  // Every phase of a rank holds the state: each moves by the state's difference alone
  // (ZeRO-1 saves 3/4 of the 3.7 GiB of moments, less the master's padding of 0-3 floats).
  const double saved1 = 8.0 * (p - chunk) - 4.0 * (4.0 * chunk - p);
  EXPECT_NEAR(saved1 / kGiB, 2.76, 0.01);
  for (size_t i = 0; i < p0.phases.size(); ++i) {
    SCOPED_TRACE(p0.phases[i].phase);
    EXPECT_EQ(p1.phases[i].phase, p0.phases[i].phase);
    if (p0.phases[i].phase == "gen") continue;  // the KV cache takes what the state leaves
    EXPECT_DOUBLE_EQ(p0.phases[i].bytes - p1.phases[i].bytes, saved1);
    EXPECT_DOUBLE_EQ(p2.phases[i].bytes - p1.phases[i].bytes, 4.0 * chunk);
  }
  EXPECT_EQ(p0.context, 512.0 * 1024 * 1024);
}
