// verl's advantage estimators on the CPU and their registry; formulas follow
// verl/trainer/ppo/core_algos.py (compute_gae_advantage_return, compute_grpo_outcome_advantage,
// ...); see advantages.h.
#include "trainer/algos/advantages.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "core/error.h"
#include "trainer/algos/internal.h"

namespace verl::trainer {

using detail::check_matrices;
using detail::check_size;

namespace {
// Groups of response indices by prompt uid; each group's rows in batch order.
std::map<int64_t, std::vector<int64_t>> group_by_index(std::span<const int64_t> index) {
  std::map<int64_t, std::vector<int64_t>> groups;
  for (size_t i = 0; i < index.size(); ++i) groups[index[i]].push_back(static_cast<int64_t>(i));
  return groups;
}

// score_b = sum over all L slots of the token-level rewards (verl: token_level_rewards.sum(-1)).
std::vector<double> outcome_scores(Shape s, std::span<const float> r) {
  std::vector<double> scores(s.batch, 0.0);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t t = 0; t < s.length; ++t) scores[b] += r[b * s.length + t];
  return scores;
}

// Broadcast one scalar per response over its tokens, times the mask.
std::vector<float> broadcast_masked(Shape s, const std::vector<double>& per_seq,
                                    std::span<const float> mask) {
  std::vector<float> out(s.numel());
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t t = 0; t < s.length; ++t)
      out[b * s.length + t] = static_cast<float>(per_seq[b] * mask[b * s.length + t]);
  return out;
}

// The checks of an outcome estimator with groups.
void check_outcome_inputs(Shape s, std::span<const float> token_level_rewards,
                          std::span<const float> response_mask, std::span<const int64_t> index,
                          const char* fn) {
  check_matrices(s, fn,
                 {{"token_level_rewards", token_level_rewards}, {"response_mask", response_mask}});
  VERL_CHECK(static_cast<int64_t>(index.size()) == s.batch, "{}: index has {} entries, expected {}",
             fn, index.size(), s.batch);
}

// verl's rloo and rloo_vectorized: score * n/(n-1) - mean * n/(n-1) for groups of n > 1; a group
// of one keeps its score (rloo) or gets 0 (rloo_vectorized).
AdvantageOutput rloo_impl(Shape s, std::span<const float> token_level_rewards,
                          std::span<const float> response_mask, std::span<const int64_t> index,
                          bool singleton_keeps_score, const char* fn) {
  check_outcome_inputs(s, token_level_rewards, response_mask, index, fn);
  std::vector<double> scores = outcome_scores(s, token_level_rewards);
  std::vector<double> adv(s.batch, 0.0);
  for (const auto& [uid, rows] : group_by_index(index)) {
    if (rows.size() < 2) {
      if (singleton_keeps_score) adv[rows[0]] = scores[rows[0]];
      continue;
    }
    const double n = static_cast<double>(rows.size());
    double mean = 0;
    for (int64_t r : rows) mean += scores[r];
    mean /= n;
    // score * n/(n-1) - mean * n/(n-1) = score - mean of the other n-1 responses, times n/(n-1).
    for (int64_t r : rows) adv[r] = scores[r] * n / (n - 1) - mean * n / (n - 1);
  }
  AdvantageOutput out;
  out.advantages = broadcast_masked(s, adv, response_mask);
  out.returns = out.advantages;
  return out;
}

}  // namespace

AdvantageOutput compute_gae_advantage_return(Shape s, std::span<const float> token_level_rewards,
                                             std::span<const float> values,
                                             std::span<const float> response_mask, double gamma,
                                             double lam) {
  const char* fn = "gae";
  check_matrices(s, fn,
                 {{"token_level_rewards", token_level_rewards},
                  {"values", values},
                  {"response_mask", response_mask}});
  AdvantageOutput out;
  std::vector<float> adv(s.numel());
  out.returns.resize(s.numel());
  for (int64_t b = 0; b < s.batch; ++b) {
    double next_value = 0, last_gae = 0;
    for (int64_t t = s.length - 1; t >= 0; --t) {
      const int64_t i = b * s.length + t;
      const double m = response_mask[i], v = values[i];
      double delta = token_level_rewards[i] + gamma * next_value - v;
      double gae = delta + gamma * lam * last_gae;
      // Masked slots (observation tokens, padding) carry V and A through unchanged.
      next_value = v * m + (1 - m) * next_value;
      last_gae = gae * m + (1 - m) * last_gae;
      adv[i] = static_cast<float>(last_gae);
      out.returns[i] = static_cast<float>(last_gae + v);
    }
  }
  out.advantages = masked_whiten(adv, response_mask);
  return out;
}

AdvantageOutput compute_grpo_outcome_advantage(Shape s, std::span<const float> token_level_rewards,
                                               std::span<const float> response_mask,
                                               std::span<const int64_t> index, double epsilon,
                                               bool norm_adv_by_std_in_grpo) {
  check_outcome_inputs(s, token_level_rewards, response_mask, index, "grpo");
  std::vector<double> scores = outcome_scores(s, token_level_rewards);
  std::vector<double> adv(s.batch);
  for (const auto& [uid, rows] : group_by_index(index)) {
    double mean = 0, sd = 1;  // a group of one: mean 0, std 1 (verl)
    const double n = static_cast<double>(rows.size());
    if (rows.size() > 1) {
      mean = 0;
      for (int64_t r : rows) mean += scores[r];
      mean /= n;
      double ss = 0;
      for (int64_t r : rows) ss += (scores[r] - mean) * (scores[r] - mean);
      sd = std::sqrt(ss / (n - 1));  // torch.std is unbiased
    }
    for (int64_t r : rows)
      adv[r] = norm_adv_by_std_in_grpo ? (scores[r] - mean) / (sd + epsilon) : scores[r] - mean;
  }
  AdvantageOutput out;
  out.advantages = broadcast_masked(s, adv, response_mask);
  out.returns = out.advantages;
  return out;
}

AdvantageOutput compute_gdpo_outcome_advantage(Shape s,
                                               std::span<const std::vector<float>> components,
                                               std::span<const double> weights,
                                               std::span<const float> response_mask,
                                               std::span<const int64_t> index, double epsilon,
                                               bool norm_adv_by_std_in_grpo) {
  VERL_CHECK(!components.empty(), "gdpo: no reward components (algorithm.gdpo_reward_keys)");
  VERL_CHECK(weights.empty() || weights.size() == components.size(),
             "gdpo: {} weights (algorithm.gdpo_reward_weights) for {} reward components",
             weights.size(), components.size());
  std::vector<float> sum(static_cast<size_t>(s.numel()), 0.0f);
  if (s.length == 0) return {sum, sum};
  std::vector<float> tokens(sum.size());
  for (size_t k = 0; k < components.size(); ++k) {
    const std::vector<float>& comp = components[k];
    VERL_CHECK(static_cast<int64_t>(comp.size()) == s.batch,
               "gdpo: reward component {} has {} rows, want {}", k, comp.size(), s.batch);
    // verl places a component's score on the response's last token; grpo sums the row.
    std::fill(tokens.begin(), tokens.end(), 0.0f);
    for (int64_t b = 0; b < s.batch; ++b) tokens[static_cast<size_t>(b * s.length)] = comp[b];
    const AdvantageOutput a = compute_grpo_outcome_advantage(s, tokens, response_mask, index,
                                                             epsilon, norm_adv_by_std_in_grpo);
    const float w = weights.empty() ? 1.0f : static_cast<float>(weights[k]);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += w * a.advantages[i];
  }
  AdvantageOutput out;
  out.advantages = masked_whiten(sum, response_mask);
  for (size_t i = 0; i < sum.size(); ++i) out.advantages[i] *= response_mask[i];
  out.returns = out.advantages;
  return out;
}

AdvantageOutput compute_rloo_outcome_advantage(Shape s, std::span<const float> token_level_rewards,
                                               std::span<const float> response_mask,
                                               std::span<const int64_t> index) {
  return rloo_impl(s, token_level_rewards, response_mask, index, /*singleton_keeps_score=*/true,
                   "rloo");
}

AdvantageOutput compute_reinforce_plus_plus_outcome_advantage(
    Shape s, std::span<const float> token_level_rewards, std::span<const float> response_mask,
    double gamma) {
  check_matrices(s, "reinforce_plus_plus",
                 {{"token_level_rewards", token_level_rewards}, {"response_mask", response_mask}});
  AdvantageOutput out;
  out.returns.resize(s.numel());
  for (int64_t b = 0; b < s.batch; ++b) {
    double running = 0;
    for (int64_t t = s.length - 1; t >= 0; --t) {
      const int64_t i = b * s.length + t;
      const double m = response_mask[i];
      const double next = token_level_rewards[i] + gamma * running;
      // verl PR #7278: a masked slot (a tool observation inside a multi-turn response) neither
      // resets nor discounts the running return, so rewards reach the tokens before it.
      out.returns[i] = static_cast<float>(next * m);
      running = next * m + running * (1 - m);
    }
  }
  out.advantages = masked_whiten(out.returns, response_mask);
  for (int64_t i = 0; i < s.numel(); ++i) out.advantages[i] *= response_mask[i];
  return out;
}

AdvantageOutput compute_reinforce_plus_plus_baseline_outcome_advantage(
    Shape s, std::span<const float> token_level_rewards, std::span<const float> response_mask,
    std::span<const int64_t> index) {
  check_outcome_inputs(s, token_level_rewards, response_mask, index,
                       "reinforce_plus_plus_baseline");
  std::vector<double> scores = outcome_scores(s, token_level_rewards);
  std::vector<double> centered = scores;  // a group of one: mean 0
  for (const auto& [uid, rows] : group_by_index(index)) {
    if (rows.size() < 2) continue;
    double mean = 0;
    for (int64_t r : rows) mean += scores[r];
    mean /= static_cast<double>(rows.size());
    for (int64_t r : rows) centered[r] = scores[r] - mean;
  }
  std::vector<float> tiled = broadcast_masked(s, centered, response_mask);
  AdvantageOutput out;
  out.advantages = masked_whiten(tiled, response_mask);
  for (int64_t i = 0; i < s.numel(); ++i) out.advantages[i] *= response_mask[i];
  out.returns = out.advantages;
  return out;
}

AdvantageOutput compute_remax_outcome_advantage(Shape s, std::span<const float> token_level_rewards,
                                                std::span<const float> reward_baselines,
                                                std::span<const float> response_mask) {
  const char* fn = "remax";
  check_matrices(s, fn,
                 {{"token_level_rewards", token_level_rewards}, {"response_mask", response_mask}});
  check_size(reward_baselines, s.batch, "reward_baselines", fn);
  AdvantageOutput out;
  out.returns.resize(s.numel());
  out.advantages.resize(s.numel());
  for (int64_t b = 0; b < s.batch; ++b) {
    double cum = 0;
    for (int64_t t = s.length - 1; t >= 0; --t) {
      const int64_t i = b * s.length + t;
      cum += static_cast<double>(token_level_rewards[i]) * response_mask[i];
      out.returns[i] = static_cast<float>(cum);
      out.advantages[i] = static_cast<float>(cum - reward_baselines[b] * response_mask[i]);
    }
  }
  return out;
}

AdvantageOutput compute_rloo_vectorized_outcome_advantage(
    Shape s, std::span<const float> token_level_rewards, std::span<const float> response_mask,
    std::span<const int64_t> index) {
  return rloo_impl(s, token_level_rewards, response_mask, index, /*singleton_keeps_score=*/false,
                   "rloo_vectorized");
}

AdvantageOutput compute_opo_outcome_advantage(Shape s, std::span<const float> token_level_rewards,
                                              std::span<const float> response_mask,
                                              std::span<const int64_t> index) {
  check_outcome_inputs(s, token_level_rewards, response_mask, index, "opo");
  std::vector<double> scores = outcome_scores(s, token_level_rewards);
  std::vector<double> len(s.batch, 0.0);
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t t = 0; t < s.length; ++t) len[b] += response_mask[b * s.length + t];
  std::vector<double> adv = scores;  // a group of one: baseline 0
  for (const auto& [uid, rows] : group_by_index(index)) {
    if (rows.size() < 2) continue;
    // The baseline that minimises the variance of a length-weighted policy gradient.
    double num = 0, den = 0;
    for (int64_t r : rows) {
      num += len[r] * scores[r];
      den += len[r];
    }
    const double baseline = num / den;  // verl divides unguarded: 0/0 for all-empty groups
    for (int64_t r : rows) adv[r] = scores[r] - baseline;
  }
  AdvantageOutput out;
  out.advantages = broadcast_masked(s, adv, response_mask);
  out.returns = out.advantages;
  return out;
}

AdvantageOutput compute_gpg_outcome_advantage(Shape s, std::span<const float> token_level_rewards,
                                              std::span<const float> response_mask,
                                              std::span<const int64_t> index) {
  check_outcome_inputs(s, token_level_rewards, response_mask, index, "gpg");
  std::vector<double> scores = outcome_scores(s, token_level_rewards);
  // alpha rescales by the share of responses with a non-zero reward (GPG's gradient correction).
  double nonzero = 0;
  for (double x : scores) nonzero += (x != 0);
  const double alpha = static_cast<double>(s.batch) / std::max(1.0, nonzero);
  const double f_norm = 1.0;
  std::vector<double> adv(s.batch);
  for (const auto& [uid, rows] : group_by_index(index)) {
    double mean = 0;  // a group of one: mean 0
    if (rows.size() > 1) {
      for (int64_t r : rows) mean += scores[r];
      mean /= static_cast<double>(rows.size());
    }
    for (int64_t r : rows) adv[r] = alpha * (scores[r] - mean) / f_norm;
  }
  AdvantageOutput out;
  out.advantages = broadcast_masked(s, adv, response_mask);
  out.returns = out.advantages;
  return out;
}

AdvantageOutput compute_grpo_passk_outcome_advantage(Shape s,
                                                     std::span<const float> token_level_rewards,
                                                     std::span<const float> response_mask,
                                                     std::span<const int64_t> index, double epsilon,
                                                     bool norm_adv_by_std_in_grpo) {
  check_outcome_inputs(s, token_level_rewards, response_mask, index, "grpo_passk");
  std::vector<double> scores = outcome_scores(s, token_level_rewards);
  std::vector<double> adv(s.batch, 0.0);
  for (const auto& [uid, rows] : group_by_index(index)) {
    VERL_CHECK(rows.size() >= 2,
               "grpo_passk: Pass@k needs at least 2 responses per prompt; prompt uid {} has {} "
               "(set actor_rollout_ref.rollout.n >= 2)",
               uid, rows.size());
    // The best and the second best; on a tie the earlier response is the best.
    int64_t best = rows[0];
    for (int64_t r : rows)
      if (scores[r] > scores[best]) best = r;
    double second = -std::numeric_limits<double>::infinity();
    for (int64_t r : rows)
      if (r != best) second = std::max(second, scores[r]);
    double a = scores[best] - second;
    if (norm_adv_by_std_in_grpo) {
      const double n = static_cast<double>(rows.size());
      double mean = 0, ss = 0;
      for (int64_t r : rows) mean += scores[r];
      mean /= n;
      for (int64_t r : rows) ss += (scores[r] - mean) * (scores[r] - mean);
      a /= std::sqrt(ss / (n - 1)) + epsilon;  // torch.std is unbiased
    }
    adv[best] = a;
  }
  AdvantageOutput out;
  out.advantages = broadcast_masked(s, adv, response_mask);
  out.returns = out.advantages;
  return out;
}

// ---------------------------------------------------------------------------------------------
// The registry. The adapters hand each estimator its fields of AdvantageInputs; epsilon is verl's
// default 1e-6 for the std-normalised estimators.

namespace {
AdvantageOutput gae(const AdvantageInputs& in) {
  return compute_gae_advantage_return(in.shape, in.token_level_rewards, in.values, in.response_mask,
                                      in.gamma, in.lam);
}
// grpo and grpo_vectorized (the same formula).
AdvantageOutput grpo(const AdvantageInputs& in) {
  return compute_grpo_outcome_advantage(in.shape, in.token_level_rewards, in.response_mask,
                                        in.index, 1e-6, in.norm_adv_by_std_in_grpo);
}
AdvantageOutput rloo(const AdvantageInputs& in) {
  return compute_rloo_outcome_advantage(in.shape, in.token_level_rewards, in.response_mask,
                                        in.index);
}
AdvantageOutput reinforce_plus_plus(const AdvantageInputs& in) {
  return compute_reinforce_plus_plus_outcome_advantage(in.shape, in.token_level_rewards,
                                                       in.response_mask, in.gamma);
}
AdvantageOutput reinforce_plus_plus_baseline(const AdvantageInputs& in) {
  return compute_reinforce_plus_plus_baseline_outcome_advantage(in.shape, in.token_level_rewards,
                                                                in.response_mask, in.index);
}
AdvantageOutput remax(const AdvantageInputs& in) {
  return compute_remax_outcome_advantage(in.shape, in.token_level_rewards, in.reward_baselines,
                                         in.response_mask);
}
AdvantageOutput opo(const AdvantageInputs& in) {
  return compute_opo_outcome_advantage(in.shape, in.token_level_rewards, in.response_mask,
                                       in.index);
}
AdvantageOutput grpo_passk(const AdvantageInputs& in) {
  return compute_grpo_passk_outcome_advantage(in.shape, in.token_level_rewards, in.response_mask,
                                              in.index, 1e-6, in.norm_adv_by_std_in_grpo);
}
AdvantageOutput gpg(const AdvantageInputs& in) {
  return compute_gpg_outcome_advantage(in.shape, in.token_level_rewards, in.response_mask,
                                       in.index);
}
AdvantageOutput rloo_vectorized(const AdvantageInputs& in) {
  return compute_rloo_vectorized_outcome_advantage(in.shape, in.token_level_rewards,
                                                   in.response_mask, in.index);
}

AdvantageOutput gdpo(const AdvantageInputs& in) {
  return compute_gdpo_outcome_advantage(in.shape, in.reward_components, in.reward_weights,
                                        in.response_mask, in.index, 1e-6,
                                        in.norm_adv_by_std_in_grpo);
}

// {value, name, function, needs_critic, needs_reward_baselines}, one row per enum value.
constexpr AdvantageEstimatorInfo kEstimators[] = {
    {AdvantageEstimator::GAE, "gae", gae, true, false},
    {AdvantageEstimator::GRPO, "grpo", grpo, false, false},
    {AdvantageEstimator::RLOO, "rloo", rloo, false, false},
    {AdvantageEstimator::ReinforcePlusPlus, "reinforce_plus_plus", reinforce_plus_plus, false,
     false},
    {AdvantageEstimator::ReinforcePlusPlusBaseline, "reinforce_plus_plus_baseline",
     reinforce_plus_plus_baseline, false, false},
    {AdvantageEstimator::ReMax, "remax", remax, false, true},
    {AdvantageEstimator::OPO, "opo", opo, false, false},
    {AdvantageEstimator::GrpoPassK, "grpo_passk", grpo_passk, false, false},
    {AdvantageEstimator::GPG, "gpg", gpg, false, false},
    {AdvantageEstimator::RlooVectorized, "rloo_vectorized", rloo_vectorized, false, false},
    {AdvantageEstimator::GrpoVectorized, "grpo_vectorized", grpo, false, false},
    {AdvantageEstimator::GDPO, "gdpo", gdpo, false, false},
};
}  // namespace

std::span<const AdvantageEstimatorInfo> advantage_estimators() {
  return kEstimators;
}

const AdvantageEstimatorInfo& estimator_info(AdvantageEstimator e) {
  const AdvantageEstimatorInfo* x = detail::entry_of(kEstimators, e);
  VERL_CHECK(x != nullptr, "unknown advantage estimator {}", static_cast<int>(e));
  return *x;
}

AdvantageEstimator parse_adv_estimator(std::string_view name) {
  return detail::entry_named(kEstimators, name, "algorithm.adv_estimator", "estimator").value;
}

std::string_view to_string(AdvantageEstimator e) {
  return detail::name_of(kEstimators, e);
}

AdvantageOutput compute_advantage(AdvantageEstimator e, const AdvantageInputs& in) {
  return estimator_info(e).fn(in);
}

}  // namespace verl::trainer
