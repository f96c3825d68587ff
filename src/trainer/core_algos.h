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
};

// "gae" | "grpo" | "rloo" | "reinforce_plus_plus" | "reinforce_plus_plus_baseline" | "remax" |
// "opo" | "grpo_passk" | "gpg" | "rloo_vectorized" | "grpo_vectorized" (verl's AdvantageEstimator
// names); anything else throws an Error listing these.
AdvantageEstimator parse_adv_estimator(std::string_view name);
std::string_view to_string(AdvantageEstimator e);

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
// Policy losses (actor.policy_loss.loss_mode), verl's POLICY_LOSS_REGISTRY. Notation per token:
// x = logp - old, r = exp(x), A the advantage, w_t the agg_loss weights, lo/hi the clip ranges
// (clip_ratio_low/high, default clip_ratio). Every mode returns the loss, d loss / d log_prob with
// torch's autograd semantics (stop-gradients included) and the metrics verl reports (0 where a
// mode reports none). rollout_is_weights, when given, multiply the per-token losses.

enum class PolicyLossMode { Vanilla, Gpg, Gspo, Sapo, Cispo, ClipCov, KlCov, GeoMean };
// "vanilla" | "gpg" | "gspo" | "sapo" | "cispo" | "clip_cov" | "kl_cov" | "geo_mean" (verl's
// registered names); anything else throws an Error listing these.
PolicyLossMode parse_policy_loss_mode(std::string_view name);
std::string_view to_string(PolicyLossMode m);

struct PolicyLossConfig {
  PolicyLossMode loss_mode = PolicyLossMode::Vanilla;  // actor.policy_loss.loss_mode
  double clip_ratio = 0.2;                             // actor.clip_ratio
  std::optional<double> clip_ratio_low;                // actor.clip_ratio_low (default clip_ratio)
  std::optional<double> clip_ratio_high;               // actor.clip_ratio_high (default clip_ratio)
  double clip_ratio_c = 3.0;                           // actor.clip_ratio_c, dual-clip bound (> 1)
  double tau_pos = 1.0;            // actor.tau_pos, sapo's gate temperature for A > 0
  double tau_neg = 1.05;           // actor.tau_neg, sapo's gate temperature for A <= 0
  double clip_cov_ratio = 0.0002;  // actor.policy_loss.clip_cov_ratio
  double clip_cov_lb = 1.0;        // actor.policy_loss.clip_cov_lb
  double clip_cov_ub = 5.0;        // actor.policy_loss.clip_cov_ub
  double kl_cov_ratio = 0.0002;    // actor.policy_loss.kl_cov_ratio
  double ppo_kl_coef = 0.1;        // actor.policy_loss.ppo_kl_coef (kl_cov)
  LossAggMode loss_agg_mode = LossAggMode::TokenMean;
  AggNorm norm;
};

struct PolicyLossOutput {
  double pg_loss = 0, pg_clipfrac = 0, ppo_kl = 0, pg_clipfrac_lower = 0;
  std::vector<float> d_log_prob;  // [B, L], d pg_loss / d log_prob
};

// Dispatches on cfg.loss_mode to one of the functions below.
PolicyLossOutput compute_policy_loss(Shape s, std::span<const float> old_log_prob,
                                     std::span<const float> log_prob,
                                     std::span<const float> advantages,
                                     std::span<const float> response_mask,
                                     const PolicyLossConfig& cfg,
                                     std::span<const float> rollout_is_weights = {});

// The signature every mode shares (cfg.loss_mode is not read by these).
using PolicyLossFn = PolicyLossOutput (*)(Shape, std::span<const float> old_log_prob,
                                          std::span<const float> log_prob,
                                          std::span<const float> advantages,
                                          std::span<const float> response_mask,
                                          const PolicyLossConfig& cfg,
                                          std::span<const float> rollout_is_weights);

// "vanilla" (verl compute_policy_loss_vanilla): PPO clip with clip-higher and dual-clip.
// x clamped to [-20, 20]; l1 = -A r; l2 = -A clamp(r, 1 - lo, 1 + hi); c1 = max(l1, l2); where
// A < 0: min(c1, -A * clip_ratio_c), else c1; aggregated with loss_agg_mode. Metrics are masked
// means: pg_clipfrac = [l2 > l1], ppo_kl = -x (clamped), pg_clipfrac_lower = [c1 > -A c], A < 0.
PolicyLossOutput compute_policy_loss_vanilla(Shape s, std::span<const float> old_log_prob,
                                             std::span<const float> log_prob,
                                             std::span<const float> advantages,
                                             std::span<const float> response_mask,
                                             const PolicyLossConfig& cfg,
                                             std::span<const float> rollout_is_weights = {});

// "gpg" (verl compute_policy_loss_gpg): l = -logp * A, aggregated with loss_agg_mode. No metrics.
PolicyLossOutput compute_policy_loss_gpg(Shape s, std::span<const float> old_log_prob,
                                         std::span<const float> log_prob,
                                         std::span<const float> advantages,
                                         std::span<const float> response_mask,
                                         const PolicyLossConfig& cfg,
                                         std::span<const float> rollout_is_weights = {});

// "gspo" (verl compute_policy_loss_gspo, https://arxiv.org/abs/2507.18071): the sequence ratio
// s_b = exp(sum_t x m / max(1, len_b)) enters every token as exp(sg(log s_b) + logp - sg(logp)),
// log clamped at 10: its value is s_b, its gradient w.r.t. logp_t is s_b (the token's own only).
// l = max(-A s, -A clamp(s, 1 - lo, 1 + hi)), always aggregated seq-mean-token-mean (as verl).
// Metrics: pg_clipfrac = [l2 > l1], ppo_kl = -x (unclamped), pg_clipfrac_lower = 0.
PolicyLossOutput compute_policy_loss_gspo(Shape s, std::span<const float> old_log_prob,
                                          std::span<const float> log_prob,
                                          std::span<const float> advantages,
                                          std::span<const float> response_mask,
                                          const PolicyLossConfig& cfg,
                                          std::span<const float> rollout_is_weights = {});

// "sapo" (verl compute_policy_loss_sapo, https://arxiv.org/abs/2511.20347): a soft gate instead of
// the clip: l = -A * sigmoid(tau (r - 1)) * 4 / tau, tau = tau_pos where A > 0 else tau_neg, x
// clamped to [-20, 20]; always aggregated seq-mean-token-mean. Metrics: ppo_kl = -x (clamped).
PolicyLossOutput compute_policy_loss_sapo(Shape s, std::span<const float> old_log_prob,
                                          std::span<const float> log_prob,
                                          std::span<const float> advantages,
                                          std::span<const float> response_mask,
                                          const PolicyLossConfig& cfg,
                                          std::span<const float> rollout_is_weights = {});

// "cispo" (verl compute_policy_loss_cispo, https://arxiv.org/abs/2506.13585): the clipped ratio is
// a constant weight: l = -sg(clamp(r, 1 - lo, 1 + hi)) * A * logp, so every token keeps a gradient
// (-clamp(r) A). x clamped to [-20, 20]. Metrics: pg_clipfrac = [r outside the band], ppo_kl = -x.
PolicyLossOutput compute_policy_loss_cispo(Shape s, std::span<const float> old_log_prob,
                                           std::span<const float> log_prob,
                                           std::span<const float> advantages,
                                           std::span<const float> response_mask,
                                           const PolicyLossConfig& cfg,
                                           std::span<const float> rollout_is_weights = {});

// "clip_cov" (verl compute_policy_loss_clip_cov, https://arxiv.org/abs/2505.22617): the PPO clip
// max(l1, l2) (x unclamped, no dual clip), except that up to n = max(1, int(clip_cov_ratio *
// N_tokens)) tokens get loss and gradient 0: those, not already clipped, whose covariance
// (A - mean A)(logp - mean logp) (masked means) lies strictly inside (clip_cov_lb, clip_cov_ub).
// verl draws the n among them at random; we take the n of largest covariance (ties: the earlier
// token), so a step is reproducible. Metrics: pg_clipfrac = the share zeroed, ppo_kl = -x.
PolicyLossOutput compute_policy_loss_clip_cov(Shape s, std::span<const float> old_log_prob,
                                              std::span<const float> log_prob,
                                              std::span<const float> advantages,
                                              std::span<const float> response_mask,
                                              const PolicyLossConfig& cfg,
                                              std::span<const float> rollout_is_weights = {});

// "kl_cov" (verl compute_policy_loss_kl_cov, same paper): l = -A r (x unclamped), plus
// ppo_kl_coef * |x| on the n = max(1, int(kl_cov_ratio * N_tokens)) tokens of largest covariance
// (A - mean A)(logp - mean logp) (plain means over the response tokens; ties: the earlier token).
// Metrics: ppo_kl = masked mean of |x|.
PolicyLossOutput compute_policy_loss_kl_cov(Shape s, std::span<const float> old_log_prob,
                                            std::span<const float> log_prob,
                                            std::span<const float> advantages,
                                            std::span<const float> response_mask,
                                            const PolicyLossConfig& cfg,
                                            std::span<const float> rollout_is_weights = {});

// "geo_mean" (verl compute_policy_loss_geo_mean, GMPO https://arxiv.org/abs/2507.20673): per token
// x' = sgn(A) min(sgn(A) x, sgn(A) clamp(x, -lo, hi)) (x unclamped); per sequence
// ratio_b = exp(sum_t x' m / (len_b + 1e-8)), A_b = sum_t A m / (len_b + 1e-8), l_b = -A_b ratio_b,
// times the geometric mean of the rollout weights over the response. loss_agg_mode is not used:
// pg_loss = sum_b l_b / N_seqs * dp, N_seqs = norm.global_batch_size or B (verl: torch.mean over
// the rows). Metrics: pg_clipfrac = [x clamped, A > 0], pg_clipfrac_lower = [x clamped, A < 0],
// ppo_kl = -x.
PolicyLossOutput compute_policy_loss_geo_mean(Shape s, std::span<const float> old_log_prob,
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
