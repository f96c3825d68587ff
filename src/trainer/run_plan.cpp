// RunPlan: the roles of a PPO run and their micro-batch plans, built from PpoConfig.
#include "trainer/run_plan.h"

#include <algorithm>

namespace verl::trainer {

MicroBatchPlan plan_micro_batches(const PpoConfig& cfg, const UpdateKeys* update,
                                  const ForwardBatching& fb) {
  const int64_t seq_len = cfg.data.max_prompt_length + cfg.rollout.response_length;
  const int64_t step_seqs =
      cfg.data.gen_batch_size * cfg.rollout.train.n / cfg.world;  // this rank's share
  MicroBatchPlan p;
  p.max_tokens = std::min(fb.max_tokens, step_seqs * seq_len);
  if (!fb.dynamic)
    p.max_tokens = std::max(p.max_tokens, std::min(fb.max_seqs, step_seqs) * seq_len);
  if (update)
    p.max_tokens =
        std::max(p.max_tokens, std::min(update->ppo_max_token_len_per_gpu, step_seqs * seq_len));
  if (update && !update->use_dynamic_bsz) {
    const int64_t mini = std::min(update->mini, step_seqs);
    const int64_t micro = std::min(update->micro(mini), mini);
    p.max_tokens = std::max(p.max_tokens, micro * seq_len);
  }
  p.max_seqs = std::min(step_seqs, p.max_tokens);  // a sequence has at least one token
  return p;
}

RunPlan RunPlan::from(const PpoConfig& cfg) {
  RunPlan r;
  r.ref = cfg.use_ref;
  r.critic = cfg.use_critic;
  r.reward_model = cfg.reward.model.has_value();
  r.old_log_prob = cfg.old_log_prob_batching;
  r.ref_pass = cfg.ref_batching;
  r.values = cfg.values_batching;
  r.actor_plan = plan_micro_batches(cfg, &cfg.actor, r.old_log_prob);
  if (r.ref) r.ref_plan = plan_micro_batches(cfg, nullptr, r.ref_pass);
  if (r.critic) r.critic_plan = plan_micro_batches(cfg, &cfg.critic, r.values);
  return r;
}

const MemoryPlan& RunPlan::estimate_memory(const PpoConfig& cfg, const model::ModelConfig& actor,
                                           const std::optional<model::ModelConfig>& critic,
                                           const std::optional<model::ModelConfig>& reward_model,
                                           double device_memory) {
  memory_inputs = memory_plan_inputs(cfg, *this, actor, critic, reward_model, device_memory);
  memory = plan_memory(*memory_inputs);
  return *memory;
}

}  // namespace verl::trainer
