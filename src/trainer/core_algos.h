// verl's core RL algorithms (verl/trainer/ppo/core_algos.py), one header for callers: the
// advantage estimators, KL estimators and controllers, the masked reductions and loss aggregation,
// and the losses with their gradients live in src/trainer/algos/ (docs/algorithms.md).
#pragma once

#include <span>

#include "trainer/algos/advantages.h"
#include "trainer/algos/aggregation.h"
#include "trainer/algos/kl.h"
#include "trainer/algos/losses.h"

namespace verl::trainer {

// The loss calls with one argument per tensor, as before PolicyLossInputs.
inline PolicyLossOutput compute_policy_loss(Shape s, std::span<const float> old_log_prob,
                                            std::span<const float> log_prob,
                                            std::span<const float> advantages,
                                            std::span<const float> response_mask,
                                            const PolicyLossConfig& cfg,
                                            std::span<const float> rollout_is_weights = {}) {
  return compute_policy_loss(
      {s, old_log_prob, log_prob, advantages, response_mask, rollout_is_weights}, cfg);
}

inline ActorLossOutput compute_actor_loss(
    Shape s, std::span<const float> old_log_prob, std::span<const float> log_prob,
    std::span<const float> advantages, std::span<const float> response_mask,
    std::span<const float> entropy, std::span<const float> ref_log_prob, const ActorLossConfig& cfg,
    std::span<const float> rollout_is_weights = {}) {
  return compute_actor_loss(
      {s, old_log_prob, log_prob, advantages, response_mask, rollout_is_weights}, entropy,
      ref_log_prob, cfg);
}

}  // namespace verl::trainer
