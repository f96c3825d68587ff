// verl's KL machinery (verl/trainer/ppo/core_algos.py kl_penalty, AdaptiveKLController /
// FixedKLController, and ray_trainer.py apply_kl_penalty): the per-token estimators with their
// gradients, the coefficient controllers, and the KL penalty folded into the rewards.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "trainer/algos/aggregation.h"

namespace verl::trainer {

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

}  // namespace verl::trainer
