// verl's advantage estimators (verl/trainer/ppo/core_algos.py, compute_*_advantage*) as plain CPU
// functions over [B, L] matrices (layout in aggregation.h), and their registry: one row per
// algorithm.adv_estimator name, as verl's register_adv_est.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "trainer/algos/aggregation.h"

namespace verl::trainer {

// Advantage estimators (algorithm.adv_estimator). Each returns [B, L] advantages and returns.

struct AdvantageOutput {
  std::vector<float> advantages;  // [B, L]
  std::vector<float> returns;     // [B, L]
};

// "gae": delta_t = r_t + gamma * V_{t+1} - V_t, A_t = delta_t + gamma * lam * A_{t+1}, where the
// recursion skips masked slots (their V and A carry through); returns = A + V; then A is
// masked-whitened over the whole batch.
AdvantageOutput compute_gae_advantage_return(Shape s, std::span<const float> token_level_rewards,
                                             std::span<const float> values,
                                             std::span<const float> response_mask, double gamma,
                                             double lam);

// "grpo": score_i = sum_t r_it; per group (same `index`, the prompt uid) mean and unbiased std;
// A_i = (score_i - mean) / (std + epsilon), or score_i - mean when !norm_adv_by_std_in_grpo
// (Dr.GRPO); a group of one gets mean 0, std 1. Broadcast to tokens times the mask. returns = A.
AdvantageOutput compute_grpo_outcome_advantage(Shape s, std::span<const float> token_level_rewards,
                                               std::span<const float> response_mask,
                                               std::span<const int64_t> index,
                                               double epsilon = 1e-6,
                                               bool norm_adv_by_std_in_grpo = true);

// "rloo": A_i = n/(n-1) * (score_i - mean_group) for groups of n > 1 (the leave-one-out baseline);
// a group of one keeps its score. Broadcast times the mask. returns = A.
AdvantageOutput compute_rloo_outcome_advantage(Shape s, std::span<const float> token_level_rewards,
                                               std::span<const float> response_mask,
                                               std::span<const int64_t> index);

// "reinforce_plus_plus" (verl compute_reinforce_plus_plus_outcome_advantage, after verl PR #7278):
// on a response slot G_t = r_t + gamma * G_{t+1}; a masked slot (tool observation, padding) is
// skipped: the running return passes through it unchanged and its own G is 0.
// A = masked_whiten(G) * mask; returns = G.
AdvantageOutput compute_reinforce_plus_plus_outcome_advantage(
    Shape s, std::span<const float> token_level_rewards, std::span<const float> response_mask,
    double gamma);

// "reinforce_plus_plus_baseline": score_i - group mean (a group of one: mean 0), tiled over the
// tokens, times the mask, then masked_whiten * mask. returns = A.
AdvantageOutput compute_reinforce_plus_plus_baseline_outcome_advantage(
    Shape s, std::span<const float> token_level_rewards, std::span<const float> response_mask,
    std::span<const int64_t> index);

// "remax": returns_t = sum_{t' >= t} r_t' * mask_t'; A_t = returns_t - baseline_b * mask_t, where
// reward_baselines [B] are the rewards of the greedy responses.
AdvantageOutput compute_remax_outcome_advantage(Shape s, std::span<const float> token_level_rewards,
                                                std::span<const float> reward_baselines,
                                                std::span<const float> response_mask);

// "rloo_vectorized" (verl compute_rloo_vectorized_outcome_advantage): the rloo formula, except
// that a group of one gets 0 (verl's vectorized form multiplies by [n > 1]) instead of its score.
AdvantageOutput compute_rloo_vectorized_outcome_advantage(
    Shape s, std::span<const float> token_level_rewards, std::span<const float> response_mask,
    std::span<const int64_t> index);

// "opo" (verl compute_opo_outcome_advantage, https://arxiv.org/abs/2505.23585): A_i = score_i - b_g
// with the length-weighted group baseline b_g = sum_j len_j score_j / sum_j len_j (len = tokens of
// the response); a group of one: b = 0. Broadcast times the mask. returns = A.
AdvantageOutput compute_opo_outcome_advantage(Shape s, std::span<const float> token_level_rewards,
                                              std::span<const float> response_mask,
                                              std::span<const int64_t> index);

// "gpg" (verl compute_gpg_outcome_advantage, https://arxiv.org/abs/2504.02546):
// A_i = alpha * (score_i - mean_g) / f_norm with alpha = B / max(1, #{i : score_i != 0}) over the
// whole batch and f_norm = 1; a group of one: mean 0. Broadcast times the mask. returns = A.
AdvantageOutput compute_gpg_outcome_advantage(Shape s, std::span<const float> token_level_rewards,
                                              std::span<const float> response_mask,
                                              std::span<const int64_t> index);

// "grpo_passk" (verl compute_grpo_passk_outcome_advantage, https://arxiv.org/abs/2503.19595): only
// the best response of each group gets a non-zero advantage, r_max - r_second_max, divided by
// (unbiased std of the group + epsilon) when norm_adv_by_std_in_grpo. Ties for the best go to
// the first response (torch.topk's order on CPU). Groups of one throw, as verl raises.
AdvantageOutput compute_grpo_passk_outcome_advantage(
    Shape s, std::span<const float> token_level_rewards, std::span<const float> response_mask,
    std::span<const int64_t> index, double epsilon = 1e-6, bool norm_adv_by_std_in_grpo = true);

// "gdpo" (verl compute_gdpo_outcome_advantage, GDPO https://arxiv.org/abs/2601.05242): each reward
// component k (components[k]: one score per row, algorithm.gdpo_reward_keys) is normalised within
// its group as grpo does, A_k; A = masked_whiten(sum_k w_k A_k) * mask, with the weights
// algorithm.gdpo_reward_weights (empty: all ones) and the sum in float32 as verl's. returns = A.
AdvantageOutput compute_gdpo_outcome_advantage(
    Shape s, std::span<const std::vector<float>> components, std::span<const double> weights,
    std::span<const float> response_mask, std::span<const int64_t> index, double epsilon = 1e-6,
    bool norm_adv_by_std_in_grpo = true);

// ---------------------------------------------------------------------------------------------
// The registry (verl's register_adv_est / get_adv_estimator_fn).

enum class AdvantageEstimator {
  GAE,
  GRPO,
  RLOO,
  ReinforcePlusPlus,
  ReinforcePlusPlusBaseline,
  ReMax,
  OPO,
  GrpoPassK,
  GPG,
  RlooVectorized,
  GrpoVectorized,  // grpo's math (verl's group_mean_std form)
  GDPO,
};

// Everything an estimator may need; each uses only its own inputs (checked).
struct AdvantageInputs {
  Shape shape;
  std::span<const float> token_level_rewards;  // [B, L]
  std::span<const float> response_mask;        // [B, L]
  std::span<const float> values;               // [B, L], gae
  std::span<const int64_t> index;              // [B], every group estimator
  std::span<const float> reward_baselines;     // [B], remax
  double gamma = 1.0, lam = 1.0;               // algorithm.gamma / algorithm.lam
  // algorithm.norm_adv_by_std_in_grpo: grpo, grpo_vectorized, grpo_passk. (verl's generic
  // dispatch does not pass it to grpo_vectorized, which then always divides by the std; we pass
  // it.)
  bool norm_adv_by_std_in_grpo = true;
  // gdpo: the reward components ([B] each, in algorithm.gdpo_reward_keys order) and their weights
  // (algorithm.gdpo_reward_weights; empty: ones).
  std::span<const std::vector<float>> reward_components;
  std::span<const double> reward_weights;
};

using AdvantageFn = AdvantageOutput (*)(const AdvantageInputs& in);

// One registered estimator: what the trainer must provide for it and the function to call.
struct AdvantageEstimatorInfo {
  AdvantageEstimator value;
  std::string_view name;  // algorithm.adv_estimator
  AdvantageFn fn;
  bool needs_critic;            // reads values (a critic must run)
  bool needs_reward_baselines;  // reads the rewards of greedy responses (one more generation)
};

// Every registered estimator, one row per AdvantageEstimator value.
std::span<const AdvantageEstimatorInfo> advantage_estimators();
const AdvantageEstimatorInfo& estimator_info(AdvantageEstimator e);

// "gae" | "grpo" | "rloo" | "reinforce_plus_plus" | "reinforce_plus_plus_baseline" | "remax" |
// "opo" | "grpo_passk" | "gpg" | "rloo_vectorized" | "grpo_vectorized" | "gdpo" (verl's
// AdvantageEstimator names); anything else throws an Error listing these.
AdvantageEstimator parse_adv_estimator(std::string_view name);
std::string_view to_string(AdvantageEstimator e);

// The registered function of `e` on `in`.
AdvantageOutput compute_advantage(AdvantageEstimator e, const AdvantageInputs& in);

}  // namespace verl::trainer
