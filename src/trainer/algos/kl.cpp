// verl's KL estimators, controllers and the KL penalty in the reward on the CPU; formulas follow
// verl/trainer/ppo/core_algos.py (kl_penalty, the KL controllers) and ray_trainer.py
// (apply_kl_penalty); see kl.h.
#include "trainer/algos/kl.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "core/error.h"
#include "trainer/algos/internal.h"

namespace verl::trainer {

using detail::check_size;
using detail::clamp;
using detail::clamp_grad;

// KL estimators.

namespace {
// The config names of each estimator; an estimator's first row is the name to_string gives.
struct KlName {
  KlEstimator value;
  std::string_view name;
};
constexpr KlName kKlNames[] = {
    {KlEstimator::K1, "k1"}, {KlEstimator::K1, "kl"},  {KlEstimator::Abs, "abs"},
    {KlEstimator::K2, "k2"}, {KlEstimator::K2, "mse"}, {KlEstimator::K3, "low_var_kl"},
    {KlEstimator::K3, "k3"},
};
}  // namespace

KlType parse_kl_type(std::string_view name) {
  KlType t;
  std::string_view base = name;
  if (!base.empty() && base.back() == '+') {
    t.straight_through = true;
    base.remove_suffix(1);
  }
  const auto* x = std::find_if(std::begin(kKlNames), std::end(kKlNames),
                               [&](const KlName& k) { return k.name == base; });
  VERL_CHECK(x != std::end(kKlNames),
             "unknown KL penalty type '{}'; known: kl, k1, abs, mse, k2, low_var_kl, k3 (a '+' "
             "suffix keeps the value and takes the k2 gradient)",
             name);
  t.estimator = x->value;
  if (t.estimator == KlEstimator::K2) t.straight_through = false;  // k2's gradient already is k2's
  return t;
}

std::string to_string(KlType t) {
  std::string s(detail::name_of(kKlNames, t.estimator));
  if (t.straight_through) s += '+';
  return s;
}

double kl_penalty(double logprob, double ref_logprob, KlType t) {
  const double d = logprob - ref_logprob;
  switch (t.estimator) {
    case KlEstimator::K1:
      return d;
    case KlEstimator::Abs:
      return std::abs(d);
    case KlEstimator::K2:
      return 0.5 * d * d;
    case KlEstimator::K3: {
      double x = clamp(ref_logprob - logprob, -20.0, 20.0);
      return clamp(std::exp(x) - x - 1.0, -10.0, 10.0);
    }
  }
  return 0;
}

double kl_penalty_grad(double logprob, double ref_logprob, KlType t) {
  const double d = logprob - ref_logprob;
  if (t.straight_through) return d;  // backward of 0.5 * d^2
  switch (t.estimator) {
    case KlEstimator::K1:
      return 1.0;
    case KlEstimator::Abs:
      return d > 0 ? 1.0 : (d < 0 ? -1.0 : 0.0);
    case KlEstimator::K2:
      return d;
    case KlEstimator::K3: {
      const double x_raw = ref_logprob - logprob;
      const double x = clamp(x_raw, -20.0, 20.0);
      const double k = std::exp(x) - x - 1.0;
      // d/d logprob = clamp'(k) * (exp(x) - 1) * clamp'(x_raw) * (-1)
      return -clamp_grad(k, -10.0, 10.0) * (std::exp(x) - 1.0) * clamp_grad(x_raw, -20.0, 20.0);
    }
  }
  return 0;
}

std::vector<float> kl_penalty(std::span<const float> logprob, std::span<const float> ref_logprob,
                              KlType t) {
  check_size(ref_logprob, logprob.size(), "ref_logprob", "kl_penalty");
  std::vector<float> out(logprob.size());
  for (size_t i = 0; i < logprob.size(); ++i)
    out[i] = static_cast<float>(kl_penalty(logprob[i], ref_logprob[i], t));
  return out;
}

// ---------------------------------------------------------------------------------------------
// KL controllers.

KlController KlController::fixed(double kl_coef) {
  KlController c;
  c.value_ = kl_coef;
  return c;
}

KlController KlController::adaptive(double init_kl_coef, double target_kl, double horizon) {
  VERL_CHECK(horizon > 0,
             "algorithm.kl_ctrl.horizon must be > 0 for the adaptive controller, got {}", horizon);
  VERL_CHECK(target_kl > 0, "algorithm.kl_ctrl.target_kl must be > 0, got {}", target_kl);
  KlController c;
  c.value_ = init_kl_coef;
  c.target_ = target_kl;
  c.horizon_ = horizon;
  c.adaptive_ = true;
  return c;
}

KlController KlController::from_config(std::string_view type, double kl_coef, double target_kl,
                                       double horizon) {
  if (type == "fixed") return fixed(kl_coef);
  if (type == "adaptive") return adaptive(kl_coef, target_kl, horizon);
  VERL_FAIL("algorithm.kl_ctrl.type: unknown controller '{}'; known: fixed, adaptive", type);
}

void KlController::update(double current_kl, int64_t n_steps) {
  if (!adaptive_) return;
  double err = clamp(current_kl / target_ - 1.0, -0.2, 0.2);
  value_ *= 1.0 + err * static_cast<double>(n_steps) / horizon_;
}

KlInRewardOutput apply_kl_penalty(Shape s, std::span<const float> token_level_scores,
                                  std::span<const float> old_log_probs,
                                  std::span<const float> ref_log_prob,
                                  std::span<const float> response_mask, KlController& ctrl,
                                  KlType type) {
  const char* fn = "apply_kl_penalty";
  detail::check_matrices(s, fn,
                         {{"token_level_scores", token_level_scores},
                          {"old_log_probs", old_log_probs},
                          {"ref_log_prob", ref_log_prob},
                          {"response_mask", response_mask}});
  KlInRewardOutput out;
  out.beta = ctrl.value();
  out.token_level_rewards.resize(s.numel());
  double sum_seq_kl = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    double kl_sum = 0, n = 0;
    for (int64_t t = 0; t < s.length; ++t) {
      const int64_t i = b * s.length + t;
      const double kld = kl_penalty(old_log_probs[i], ref_log_prob[i], type) * response_mask[i];
      out.token_level_rewards[i] = static_cast<float>(token_level_scores[i] - out.beta * kld);
      kl_sum += kld * response_mask[i];
      n += response_mask[i];
    }
    sum_seq_kl += kl_sum / (n + 1e-8);  // masked_mean over the sequence
  }
  out.current_kl = s.batch > 0 ? sum_seq_kl / static_cast<double>(s.batch) : 0.0;
  ctrl.update(out.current_kl, s.batch);
  return out;
}

}  // namespace verl::trainer
