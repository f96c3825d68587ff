// What a PPO run holds and how it cuts its work, from the typed config alone: the roles present
// (actor, rollout, reference policy, critic, reward model) and each trained or forward-only
// model's micro-batch plan, which a CUDA model plans its memory for once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainer/memory_plan.h"
#include "trainer/ppo_config.h"

namespace verl::trainer {

// The largest micro-batch the trainer packs for a model.
struct MicroBatchPlan {
  int64_t max_tokens = 0, max_seqs = 0;
};

struct RunPlan {
  bool actor = true, rollout = true, ref = false, critic = false, reward_model = false;
  // The models' micro-batch plans (plan_micro_batches): the actor's covers its old_log_prob pass
  // and its update, the critic's its values and its update.
  MicroBatchPlan actor_plan, ref_plan, critic_plan;
  // How each forward-only pass cuts the step's sequences.
  ForwardBatching old_log_prob, ref_pass, values;
  // The GPU memory per phase (trainer/memory_plan.h) and what it was planned from, once
  // estimate_memory has made them: what `verl doctor --config` checks a run against (and varies
  // for its advice).
  std::optional<MemoryPlanInputs> memory_inputs;
  std::optional<MemoryPlan> memory;

  static RunPlan from(const PpoConfig& cfg);
  // Fills `memory_inputs` and `memory` for these models' config.json (the critic's and the reward
  // model's when the run has them) on a GPU of `device_memory` bytes (0: unknown).
  const MemoryPlan& estimate_memory(const PpoConfig& cfg, const model::ModelConfig& actor,
                                    const std::optional<model::ModelConfig>& critic,
                                    const std::optional<model::ModelConfig>& reward_model,
                                    double device_memory);
};

// The largest micro-batch the trainer packs for a model, from the config alone: its forward-only
// pass `fwd` over the step's data.gen_batch_size x rollout.n sequences and, for a trained model
// (`update` non-null), the update, which cuts each mini-batch by ppo_max_token_len_per_gpu under
// use_dynamic_bsz, else into ppo_micro_batch_size_per_gpu sequences; a sequence holds at most
// max_prompt_length + rollout.response_length tokens.
MicroBatchPlan plan_micro_batches(const PpoConfig& cfg, const UpdateKeys* update,
                                  const ForwardBatching& fwd);

}  // namespace verl::trainer
