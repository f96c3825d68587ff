// verl's losses (verl/trainer/ppo/core_algos.py: the POLICY_LOSS_REGISTRY's compute_policy_loss_*,
// compute_value_loss, and the entropy and KL terms as verl's dp_actor adds them), each with its
// gradient with respect to the per-token inputs, because our model has an explicit backward.
#pragma once

#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "trainer/algos/aggregation.h"
#include "trainer/algos/kl.h"

namespace verl::trainer {

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

// The batch every policy loss reads (verl's old_log_prob, log_prob, advantages, response_mask and
// rollout_is_weights arguments).
struct PolicyLossInputs {
  Shape shape;
  std::span<const float> old_log_prob;        // [B, L], the policy before this update
  std::span<const float> log_prob;            // [B, L], the policy being trained (the gradient's)
  std::span<const float> advantages;          // [B, L]
  std::span<const float> response_mask;       // [B, L]
  std::span<const float> rollout_is_weights;  // [B, L], or empty for all 1
};

// Every mode's signature; cfg.loss_mode is not read by these.
using PolicyLossFn = PolicyLossOutput (*)(const PolicyLossInputs& in, const PolicyLossConfig& cfg);

// Dispatches on cfg.loss_mode through the registry to one of the functions below.
PolicyLossOutput compute_policy_loss(const PolicyLossInputs& in, const PolicyLossConfig& cfg);

// "vanilla" (verl compute_policy_loss_vanilla): PPO clip with clip-higher and dual-clip.
// x clamped to [-20, 20]; l1 = -A r; l2 = -A clamp(r, 1 - lo, 1 + hi); c1 = max(l1, l2); where
// A < 0: min(c1, -A * clip_ratio_c), else c1; aggregated with loss_agg_mode. Metrics are masked
// means: pg_clipfrac = [l2 > l1], ppo_kl = -x (clamped), pg_clipfrac_lower = [c1 > -A c], A < 0.
PolicyLossOutput compute_policy_loss_vanilla(const PolicyLossInputs& in,
                                             const PolicyLossConfig& cfg);

// "gpg" (verl compute_policy_loss_gpg): l = -logp * A, aggregated with loss_agg_mode. No metrics.
PolicyLossOutput compute_policy_loss_gpg(const PolicyLossInputs& in, const PolicyLossConfig& cfg);

// "gspo" (verl compute_policy_loss_gspo, https://arxiv.org/abs/2507.18071): the sequence ratio
// s_b = exp(sum_t x m / max(1, len_b)) enters every token as exp(sg(log s_b) + logp - sg(logp)),
// log clamped at 10: its value is s_b, its gradient w.r.t. logp_t is s_b (the token's own only).
// l = max(-A s, -A clamp(s, 1 - lo, 1 + hi)), always aggregated seq-mean-token-mean (as verl).
// Metrics: pg_clipfrac = [l2 > l1], ppo_kl = -x (unclamped), pg_clipfrac_lower = 0.
PolicyLossOutput compute_policy_loss_gspo(const PolicyLossInputs& in, const PolicyLossConfig& cfg);

// "sapo" (verl compute_policy_loss_sapo, https://arxiv.org/abs/2511.20347): a soft gate instead of
// the clip: l = -A * sigmoid(tau (r - 1)) * 4 / tau, tau = tau_pos where A > 0 else tau_neg, x
// clamped to [-20, 20]; always aggregated seq-mean-token-mean. Metrics: ppo_kl = -x (clamped).
PolicyLossOutput compute_policy_loss_sapo(const PolicyLossInputs& in, const PolicyLossConfig& cfg);

// "cispo" (verl compute_policy_loss_cispo, https://arxiv.org/abs/2506.13585): the clipped ratio is
// a constant weight: l = -sg(clamp(r, 1 - lo, 1 + hi)) * A * logp, so every token keeps a gradient
// (-clamp(r) A). x clamped to [-20, 20]. Metrics: pg_clipfrac = [r outside the band], ppo_kl = -x.
PolicyLossOutput compute_policy_loss_cispo(const PolicyLossInputs& in, const PolicyLossConfig& cfg);

// "clip_cov" (verl compute_policy_loss_clip_cov, https://arxiv.org/abs/2505.22617): the PPO clip
// max(l1, l2) (x unclamped, no dual clip), except that up to n = max(1, int(clip_cov_ratio *
// N_tokens)) tokens get loss and gradient 0: those, not already clipped, whose covariance
// (A - mean A)(logp - mean logp) (masked means) lies strictly inside (clip_cov_lb, clip_cov_ub).
// verl draws the n among them at random; we take the n of largest covariance (ties: the earlier
// token), so a step is reproducible. Metrics: pg_clipfrac = the share zeroed, ppo_kl = -x.
PolicyLossOutput compute_policy_loss_clip_cov(const PolicyLossInputs& in,
                                              const PolicyLossConfig& cfg);

// "kl_cov" (verl compute_policy_loss_kl_cov, same paper): l = -A r (x unclamped), plus
// ppo_kl_coef * |x| on the n = max(1, int(kl_cov_ratio * N_tokens)) tokens of largest covariance
// (A - mean A)(logp - mean logp) (plain means over the response tokens; ties: the earlier token).
// Metrics: ppo_kl = masked mean of |x|.
PolicyLossOutput compute_policy_loss_kl_cov(const PolicyLossInputs& in,
                                            const PolicyLossConfig& cfg);

// "geo_mean" (verl compute_policy_loss_geo_mean, GMPO https://arxiv.org/abs/2507.20673): per token
// x' = sgn(A) min(sgn(A) x, sgn(A) clamp(x, -lo, hi)) (x unclamped); per sequence
// ratio_b = exp(sum_t x' m / (len_b + 1e-8)), A_b = sum_t A m / (len_b + 1e-8), l_b = -A_b ratio_b,
// times the geometric mean of the rollout weights over the response. loss_agg_mode is not used:
// pg_loss = sum_b l_b / N_seqs * dp, N_seqs = norm.global_batch_size or B (verl: torch.mean over
// the rows). Metrics: pg_clipfrac = [x clamped, A > 0], pg_clipfrac_lower = [x clamped, A < 0],
// ppo_kl = -x.
PolicyLossOutput compute_policy_loss_geo_mean(const PolicyLossInputs& in,
                                              const PolicyLossConfig& cfg);

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
ActorLossOutput compute_actor_loss(const PolicyLossInputs& in, std::span<const float> entropy,
                                   std::span<const float> ref_log_prob, const ActorLossConfig& cfg);

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
