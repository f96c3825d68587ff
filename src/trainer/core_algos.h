// verl's core RL algorithms (verl/trainer/ppo/core_algos.py and the masked reductions of
// verl/utils/torch_functional.py) as plain CPU functions: advantage estimators, KL penalties and
// controllers, policy/value/entropy/KL losses with their aggregation modes, and the gradients of
// every loss with respect to its per-token inputs (our model has an explicit backward).
//
// Layout: a batch of B responses is padded to L slots; every per-token array is a row-major
// [B, L] float matrix (index b * L + t) and `response_mask` is 1 on response tokens and 0 on
// padding, exactly verl's (bs, response_length) tensors. Scalars are returned in double; the
// arithmetic runs in double and per-token outputs are stored as float.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace verl::trainer {

// [B, L] of every per-token matrix in one call.
struct Shape {
  int64_t batch = 0;   // B
  int64_t length = 0;  // L, the padded response length
  int64_t numel() const { return batch * length; }
};

// A [B, L] mask from per-response lengths: 1 for t < lengths[b], else 0.
std::vector<float> response_mask_from_lengths(std::span<const int64_t> lengths, int64_t length);

// ---------------------------------------------------------------------------------------------
// Masked reductions (verl_F.masked_sum / masked_mean / masked_var / masked_whiten).

// sum(values * mask).
double masked_sum(std::span<const float> values, std::span<const float> mask);
// sum(values * mask) / (sum(mask) + 1e-8).
double masked_mean(std::span<const float> values, std::span<const float> mask);
// masked_mean((values - masked_mean(values))^2); with `unbiased` times n / (n - 1), n = sum(mask)
// (torch.std's Bessel correction). Throws when unbiased and n is 0 or 1, as verl raises.
double masked_var(std::span<const float> values, std::span<const float> mask, bool unbiased = true);
// (values - mean) * rsqrt(var + 1e-8) with the masked mean and unbiased variance, applied to every
// element (masked ones too, as verl does); shift_mean = false adds the mean back.
std::vector<float> masked_whiten(std::span<const float> values, std::span<const float> mask,
                                 bool shift_mean = true);

// ---------------------------------------------------------------------------------------------
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

// "reinforce_plus_plus": G_t = r_t + gamma * G_{t+1}, reset to 0 after each masked slot;
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

enum class AdvantageEstimator {
  GAE,
  GRPO,
  RLOO,
  ReinforcePlusPlus,
  ReinforcePlusPlusBaseline,
  ReMax
};

// "gae" | "grpo" | "rloo" | "reinforce_plus_plus" | "reinforce_plus_plus_baseline" | "remax";
// anything else throws an Error listing these.
AdvantageEstimator parse_adv_estimator(std::string_view name);
std::string_view to_string(AdvantageEstimator e);

// Everything an estimator may need; each uses only its own inputs (checked).
struct AdvantageInputs {
  Shape shape;
  std::span<const float> token_level_rewards;  // [B, L]
  std::span<const float> response_mask;        // [B, L]
  std::span<const float> values;               // [B, L], gae
  std::span<const int64_t> index;              // [B], grpo / rloo / rf++ baseline
  std::span<const float> reward_baselines;     // [B], remax
  double gamma = 1.0, lam = 1.0;               // algorithm.gamma / algorithm.lam
  bool norm_adv_by_std_in_grpo = true;         // algorithm.norm_adv_by_std_in_grpo
};
AdvantageOutput compute_advantage(AdvantageEstimator e, const AdvantageInputs& in);

// ---------------------------------------------------------------------------------------------
// KL estimators (kl_penalty(logprob, ref_logprob, type); http://joschu.net/blog/kl-approx.html).

enum class KlEstimator {
  K1,   // "kl" / "k1": logprob - ref
  Abs,  // "abs": |logprob - ref|
  K2,   // "mse" / "k2": 0.5 * (logprob - ref)^2
  K3,   // "low_var_kl" / "k3": clamp(exp(x) - x - 1, -10, 10), x = clamp(ref - logprob, -20, 20)
};

struct KlType {
  KlEstimator estimator = KlEstimator::K3;
  // The "+" suffix (e.g. "k3+"): the value is the estimator's, the gradient is k2's
  // (logprob - ref), verl's straight-through trick for an unbiased KL gradient.
  bool straight_through = false;
};

// Accepts kl, k1, abs, mse, k2, low_var_kl, k3, each optionally with "+"; else throws.
KlType parse_kl_type(std::string_view name);
std::string to_string(KlType t);

double kl_penalty(double logprob, double ref_logprob, KlType t);
// d kl_penalty / d logprob (ref_logprob is a constant), with torch's subgradients at clamp
// boundaries (inclusive) and abs(0) -> 0.
double kl_penalty_grad(double logprob, double ref_logprob, KlType t);
std::vector<float> kl_penalty(std::span<const float> logprob, std::span<const float> ref_logprob,
                              KlType t);

// ---------------------------------------------------------------------------------------------
// KL controllers (algorithm.kl_ctrl.type: fixed | adaptive).

class KlController {
 public:
  static KlController fixed(double kl_coef);
  // Ziegler et al. 2019: error = clip(current_kl / target_kl - 1, -0.2, 0.2);
  // value *= 1 + error * n_steps / horizon.
  static KlController adaptive(double init_kl_coef, double target_kl, double horizon);
  // From the config keys type ("fixed" | "adaptive"), kl_coef, target_kl, horizon.
  static KlController from_config(std::string_view type, double kl_coef, double target_kl,
                                  double horizon);

  double value() const { return value_; }
  bool is_adaptive() const { return adaptive_; }
  void update(double current_kl, int64_t n_steps);

 private:
  double value_ = 0, target_ = 0, horizon_ = 0;
  bool adaptive_ = false;
};

// algorithm.use_kl_in_reward: token_level_rewards = scores - beta * kl(old_log_probs, ref) * mask,
// with beta = ctrl.value() before the update; current_kl = mean over responses of the per-response
// masked mean KL; then ctrl.update(current_kl, B). Metrics: actor/reward_kl_penalty = current_kl,
// actor/reward_kl_penalty_coeff = beta.
struct KlInRewardOutput {
  std::vector<float> token_level_rewards;  // [B, L]
  double current_kl = 0;
  double beta = 0;
};
KlInRewardOutput apply_kl_penalty(Shape s, std::span<const float> token_level_scores,
                                  std::span<const float> old_log_probs,
                                  std::span<const float> ref_log_prob,
                                  std::span<const float> response_mask, KlController& ctrl,
                                  KlType type);

// ---------------------------------------------------------------------------------------------
// Loss aggregation (actor.loss_agg_mode / critic.loss_agg_mode).

enum class LossAggMode { TokenMean, SeqMeanTokenSum, SeqMeanTokenMean, SeqMeanTokenSumNorm };
// "token-mean" | "seq-mean-token-sum" | "seq-mean-token-mean" | "seq-mean-token-sum-norm".
LossAggMode parse_loss_agg_mode(std::string_view name);
std::string_view to_string(LossAggMode m);

// Global normalisers for data-parallel training (verl's global_batch_info). Each rank aggregates
// its own micro-batch but divides by counts over the whole global mini-batch and multiplies by
// dp_size, so that the all-reduce MEAN of the ranks' gradients equals the gradient of the global
// loss. Left empty, a count defaults to the local one (what verl does at dp_size 1; with
// dp_size > 1 verl requires them, and so do we).
struct AggNorm {
  int64_t dp_size = 1;
  std::optional<double> batch_num_tokens;   // token-mean: mask tokens over the global batch
  std::optional<double> global_batch_size;  // seq-mean-*: non-empty responses, global batch
  std::optional<double> loss_scale_factor;  // seq-mean-token-sum-norm: default L
};

// The aggregation is linear in the loss matrix: loss = sum_t w_t * loss_mat_t. These are the w_t
// ([B, L]), which are also d loss / d loss_mat_t:
//   token-mean:              mask_t / N_tokens * dp
//   seq-mean-token-sum:      mask_t * [len_b > 0] / N_seqs * dp
//   seq-mean-token-mean:     mask_t / (len_b + 1e-8) * [len_b > 0] / N_seqs * dp
//   seq-mean-token-sum-norm: mask_t * [len_b > 0] / N_seqs * dp / loss_scale_factor
// A normaliser of 0 (nothing to average) gives zero weights (verl would produce 0/0).
std::vector<float> agg_loss_weights(Shape s, std::span<const float> loss_mask, LossAggMode mode,
                                    const AggNorm& norm = {});
double agg_loss(Shape s, std::span<const float> loss_mat, std::span<const float> loss_mask,
                LossAggMode mode, const AggNorm& norm = {});

// A scalar loss and its gradient with respect to one per-token input.
struct LossAndGrad {
  double loss = 0;
  std::vector<float> grad;  // [B, L]
};

// ---------------------------------------------------------------------------------------------
// Policy loss (actor.policy_loss.loss_mode = "vanilla"): PPO clip with clip-higher and dual-clip.

struct PolicyLossConfig {
  double clip_ratio = 0.2;                // actor.clip_ratio
  std::optional<double> clip_ratio_low;   // actor.clip_ratio_low (default clip_ratio)
  std::optional<double> clip_ratio_high;  // actor.clip_ratio_high (default clip_ratio)
  double clip_ratio_c = 3.0;              // actor.clip_ratio_c, dual-clip bound (> 1)
  LossAggMode loss_agg_mode = LossAggMode::TokenMean;
  AggNorm norm;
};

// ratio = exp(clamp(logp - old, -20, 20)); l1 = -A * ratio; l2 = -A * clamp(ratio, 1 - lo, 1 + hi);
// c1 = max(l1, l2); where A < 0: min(c1, -A * clip_ratio_c), else c1; times rollout_is_weights
// (optional); aggregated. Metrics are masked means: pg_clipfrac = [l2 > l1], ppo_kl = old - logp
// (clamped), pg_clipfrac_lower = [c1 > -A * c] where A < 0.
struct PolicyLossOutput {
  double pg_loss = 0, pg_clipfrac = 0, ppo_kl = 0, pg_clipfrac_lower = 0;
  std::vector<float> d_log_prob;  // [B, L], d pg_loss / d log_prob
};
PolicyLossOutput compute_policy_loss(Shape s, std::span<const float> old_log_prob,
                                     std::span<const float> log_prob,
                                     std::span<const float> advantages,
                                     std::span<const float> response_mask,
                                     const PolicyLossConfig& cfg,
                                     std::span<const float> rollout_is_weights = {});

// agg_loss(entropy); grad = d loss / d entropy_t (the weights).
LossAndGrad compute_entropy_loss(Shape s, std::span<const float> entropy,
                                 std::span<const float> response_mask, LossAggMode mode,
                                 const AggNorm& norm = {});

// actor.use_kl_loss: agg_loss(kl_penalty(log_prob, ref_log_prob, type)); grad = d / d log_prob.
LossAndGrad compute_kl_loss(Shape s, std::span<const float> log_prob,
                            std::span<const float> ref_log_prob,
                            std::span<const float> response_mask, KlType type, LossAggMode mode,
                            const AggNorm& norm = {});

// The actor's objective as verl's dp_actor composes it:
//   policy_loss = pg_loss - entropy_coeff * entropy_loss + kl_loss_coef * kl_loss
// (entropy only when entropy_coeff != 0, KL only when use_kl_loss). The trainer multiplies by its
// micro-batch scale (verl's loss_scale_factor) and feeds d_log_prob / d_entropy to the backward.
struct ActorLossConfig {
  PolicyLossConfig policy;
  double entropy_coeff = 0.0;                   // actor.entropy_coeff
  bool use_kl_loss = false;                     // actor.use_kl_loss
  double kl_loss_coef = 0.001;                  // actor.kl_loss_coef
  KlType kl_loss_type{KlEstimator::K3, false};  // actor.kl_loss_type (default low_var_kl)
};
struct ActorLossOutput {
  double policy_loss = 0;  // the total
  double pg_loss = 0, pg_clipfrac = 0, ppo_kl = 0, pg_clipfrac_lower = 0;
  double entropy_loss = 0;        // actor/entropy
  double kl_loss = 0;             // actor/kl_loss
  std::vector<float> d_log_prob;  // [B, L]
  std::vector<float> d_entropy;   // [B, L], zeros when entropy_coeff == 0
};
// `entropy` may be empty when entropy_coeff == 0; `ref_log_prob` when !use_kl_loss.
ActorLossOutput compute_actor_loss(Shape s, std::span<const float> old_log_prob,
                                   std::span<const float> log_prob,
                                   std::span<const float> advantages,
                                   std::span<const float> response_mask,
                                   std::span<const float> entropy,
                                   std::span<const float> ref_log_prob, const ActorLossConfig& cfg,
                                   std::span<const float> rollout_is_weights = {});

// Critic: vclip = clamp(vpreds, values - c, values + c); l = max((vpreds - R)^2, (vclip - R)^2);
// vf_loss = 0.5 * agg_loss(l); vf_clipfrac = masked_mean([(vclip - R)^2 > (vpreds - R)^2]).
struct ValueLossOutput {
  double vf_loss = 0, vf_clipfrac = 0;
  std::vector<float> d_vpreds;  // [B, L]
};
ValueLossOutput compute_value_loss(Shape s, std::span<const float> vpreds,
                                   std::span<const float> returns, std::span<const float> values,
                                   std::span<const float> response_mask, double cliprange_value,
                                   LossAggMode mode = LossAggMode::TokenMean,
                                   const AggNorm& norm = {});

}  // namespace verl::trainer
