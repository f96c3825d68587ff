// verl's core RL algorithms on the CPU: advantage estimators, KL estimators and controllers, loss
// aggregation, policy/value/entropy/KL losses and their per-token gradients. Formulas follow
// verl/trainer/ppo/core_algos.py and verl/utils/torch_functional.py; see core_algos.h.
#include "trainer/core_algos.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"

namespace verl::trainer {
namespace {

void check_size(std::span<const float> x, int64_t n, const char* what, const char* fn) {
  VERL_CHECK(static_cast<int64_t>(x.size()) == n, "{}: {} has {} elements, expected {}", fn, what,
             x.size(), n);
}

void check_shape(Shape s, const char* fn) {
  VERL_CHECK(s.batch >= 0 && s.length >= 0, "{}: invalid shape [{}, {}]", fn, s.batch, s.length);
}

// torch.clamp passes the gradient where lo <= x <= hi (inclusive).
double clamp(double x, double lo, double hi) {
  return std::min(std::max(x, lo), hi);
}
double clamp_grad(double x, double lo, double hi) {
  return (x >= lo && x <= hi) ? 1.0 : 0.0;
}

// Gradient of torch.maximum(a, b) / torch.minimum(a, b): the larger (smaller) side takes it all,
// a tie splits it in halves.
double max_grad(double a, double b, double da, double db) {
  if (a > b) return da;
  if (a < b) return db;
  return 0.5 * (da + db);
}
double min_grad(double a, double b, double da, double db) {
  if (a < b) return da;
  if (a > b) return db;
  return 0.5 * (da + db);
}

// Groups of response indices by prompt uid, in order of first appearance.
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

}  // namespace

std::vector<float> response_mask_from_lengths(std::span<const int64_t> lengths, int64_t length) {
  std::vector<float> mask(lengths.size() * length, 0.0f);
  for (size_t b = 0; b < lengths.size(); ++b) {
    VERL_CHECK(lengths[b] >= 0 && lengths[b] <= length,
               "response_mask_from_lengths: lengths[{}] = {} is outside [0, {}]", b, lengths[b],
               length);
    std::fill_n(mask.begin() + b * length, lengths[b], 1.0f);
  }
  return mask;
}

// ---------------------------------------------------------------------------------------------
// Masked reductions.

double masked_sum(std::span<const float> values, std::span<const float> mask) {
  check_size(mask, values.size(), "mask", "masked_sum");
  double s = 0;
  for (size_t i = 0; i < values.size(); ++i)
    if (mask[i] != 0) s += static_cast<double>(values[i]) * mask[i];
  return s;
}

double masked_mean(std::span<const float> values, std::span<const float> mask) {
  double n = 0;
  for (float m : mask) n += m;
  return masked_sum(values, mask) / (n + 1e-8);
}

namespace {
// masked_var over doubles, shared by masked_var and masked_whiten.
double masked_var_impl(std::span<const float> values, std::span<const float> mask, double mean,
                       bool unbiased, const char* fn) {
  double n = 0, ss = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    n += mask[i];
    if (mask[i] != 0) {
      double c = values[i] - mean;
      ss += c * c * mask[i];
    }
  }
  double var = ss / (n + 1e-8);
  if (unbiased) {
    // verl raises here: a Bessel correction needs at least two masked elements.
    VERL_CHECK(n != 0, "{}: the mask is all zeros (no response token to take a variance over)", fn);
    VERL_CHECK(n != 1,
               "{}: the mask selects one token, so the unbiased variance divides by zero; use a "
               "larger batch",
               fn);
    var *= n / (n - 1);
  }
  return var;
}
}  // namespace

double masked_var(std::span<const float> values, std::span<const float> mask, bool unbiased) {
  check_size(mask, values.size(), "mask", "masked_var");
  return masked_var_impl(values, mask, masked_mean(values, mask), unbiased, "masked_var");
}

std::vector<float> masked_whiten(std::span<const float> values, std::span<const float> mask,
                                 bool shift_mean) {
  check_size(mask, values.size(), "mask", "masked_whiten");
  double mean = masked_mean(values, mask);
  double var = masked_var_impl(values, mask, mean, true, "masked_whiten");
  double inv_std = 1.0 / std::sqrt(var + 1e-8);
  std::vector<float> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    double w = (values[i] - mean) * inv_std;
    if (!shift_mean) w += mean;
    out[i] = static_cast<float>(w);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Advantage estimators.

AdvantageOutput compute_gae_advantage_return(Shape s, std::span<const float> token_level_rewards,
                                             std::span<const float> values,
                                             std::span<const float> response_mask, double gamma,
                                             double lam) {
  const char* fn = "gae";
  check_shape(s, fn);
  check_size(token_level_rewards, s.numel(), "token_level_rewards", fn);
  check_size(values, s.numel(), "values", fn);
  check_size(response_mask, s.numel(), "response_mask", fn);
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
  const char* fn = "grpo";
  check_shape(s, fn);
  check_size(token_level_rewards, s.numel(), "token_level_rewards", fn);
  check_size(response_mask, s.numel(), "response_mask", fn);
  VERL_CHECK(static_cast<int64_t>(index.size()) == s.batch,
             "grpo: index has {} entries, expected {}", index.size(), s.batch);
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

AdvantageOutput compute_rloo_outcome_advantage(Shape s, std::span<const float> token_level_rewards,
                                               std::span<const float> response_mask,
                                               std::span<const int64_t> index) {
  const char* fn = "rloo";
  check_shape(s, fn);
  check_size(token_level_rewards, s.numel(), "token_level_rewards", fn);
  check_size(response_mask, s.numel(), "response_mask", fn);
  VERL_CHECK(static_cast<int64_t>(index.size()) == s.batch,
             "rloo: index has {} entries, expected {}", index.size(), s.batch);
  std::vector<double> scores = outcome_scores(s, token_level_rewards);
  std::vector<double> adv = scores;  // a group of one keeps its score
  for (const auto& [uid, rows] : group_by_index(index)) {
    if (rows.size() < 2) continue;
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

AdvantageOutput compute_reinforce_plus_plus_outcome_advantage(
    Shape s, std::span<const float> token_level_rewards, std::span<const float> response_mask,
    double gamma) {
  const char* fn = "reinforce_plus_plus";
  check_shape(s, fn);
  check_size(token_level_rewards, s.numel(), "token_level_rewards", fn);
  check_size(response_mask, s.numel(), "response_mask", fn);
  AdvantageOutput out;
  out.returns.resize(s.numel());
  for (int64_t b = 0; b < s.batch; ++b) {
    double running = 0;
    for (int64_t t = s.length - 1; t >= 0; --t) {
      const int64_t i = b * s.length + t;
      running = token_level_rewards[i] + gamma * running;
      out.returns[i] = static_cast<float>(running);
      running *= response_mask[i];  // reset after EOS
    }
  }
  out.advantages = masked_whiten(out.returns, response_mask);
  for (int64_t i = 0; i < s.numel(); ++i) out.advantages[i] *= response_mask[i];
  return out;
}

AdvantageOutput compute_reinforce_plus_plus_baseline_outcome_advantage(
    Shape s, std::span<const float> token_level_rewards, std::span<const float> response_mask,
    std::span<const int64_t> index) {
  const char* fn = "reinforce_plus_plus_baseline";
  check_shape(s, fn);
  check_size(token_level_rewards, s.numel(), "token_level_rewards", fn);
  check_size(response_mask, s.numel(), "response_mask", fn);
  VERL_CHECK(static_cast<int64_t>(index.size()) == s.batch,
             "reinforce_plus_plus_baseline: index has {} entries, expected {}", index.size(),
             s.batch);
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
  check_shape(s, fn);
  check_size(token_level_rewards, s.numel(), "token_level_rewards", fn);
  check_size(reward_baselines, s.batch, "reward_baselines", fn);
  check_size(response_mask, s.numel(), "response_mask", fn);
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

namespace {
struct EstimatorName {
  AdvantageEstimator e;
  std::string_view name;
};
constexpr EstimatorName kEstimators[] = {
    {AdvantageEstimator::GAE, "gae"},
    {AdvantageEstimator::GRPO, "grpo"},
    {AdvantageEstimator::RLOO, "rloo"},
    {AdvantageEstimator::ReinforcePlusPlus, "reinforce_plus_plus"},
    {AdvantageEstimator::ReinforcePlusPlusBaseline, "reinforce_plus_plus_baseline"},
    {AdvantageEstimator::ReMax, "remax"},
};
}  // namespace

AdvantageEstimator parse_adv_estimator(std::string_view name) {
  for (const auto& e : kEstimators)
    if (e.name == name) return e.e;
  VERL_FAIL(
      "algorithm.adv_estimator: unknown estimator '{}'; known: gae, grpo, rloo, "
      "reinforce_plus_plus, reinforce_plus_plus_baseline, remax",
      name);
}

std::string_view to_string(AdvantageEstimator e) {
  for (const auto& x : kEstimators)
    if (x.e == e) return x.name;
  return "?";
}

AdvantageOutput compute_advantage(AdvantageEstimator e, const AdvantageInputs& in) {
  switch (e) {
    case AdvantageEstimator::GAE:
      return compute_gae_advantage_return(in.shape, in.token_level_rewards, in.values,
                                          in.response_mask, in.gamma, in.lam);
    case AdvantageEstimator::GRPO:
      return compute_grpo_outcome_advantage(in.shape, in.token_level_rewards, in.response_mask,
                                            in.index, 1e-6, in.norm_adv_by_std_in_grpo);
    case AdvantageEstimator::RLOO:
      return compute_rloo_outcome_advantage(in.shape, in.token_level_rewards, in.response_mask,
                                            in.index);
    case AdvantageEstimator::ReinforcePlusPlus:
      return compute_reinforce_plus_plus_outcome_advantage(in.shape, in.token_level_rewards,
                                                           in.response_mask, in.gamma);
    case AdvantageEstimator::ReinforcePlusPlusBaseline:
      return compute_reinforce_plus_plus_baseline_outcome_advantage(
          in.shape, in.token_level_rewards, in.response_mask, in.index);
    case AdvantageEstimator::ReMax:
      return compute_remax_outcome_advantage(in.shape, in.token_level_rewards, in.reward_baselines,
                                             in.response_mask);
  }
  VERL_FAIL("compute_advantage: unknown estimator {}", static_cast<int>(e));
}

// ---------------------------------------------------------------------------------------------
// KL estimators.

KlType parse_kl_type(std::string_view name) {
  KlType t;
  std::string_view base = name;
  if (!base.empty() && base.back() == '+') {
    t.straight_through = true;
    base.remove_suffix(1);
  }
  if (base == "kl" || base == "k1") {
    t.estimator = KlEstimator::K1;
  } else if (base == "abs") {
    t.estimator = KlEstimator::Abs;
  } else if (base == "mse" || base == "k2") {
    t.estimator = KlEstimator::K2;
    t.straight_through = false;  // k2's gradient already is k2's
  } else if (base == "low_var_kl" || base == "k3") {
    t.estimator = KlEstimator::K3;
  } else {
    VERL_FAIL(
        "unknown KL penalty type '{}'; known: kl, k1, abs, mse, k2, low_var_kl, k3 (a '+' suffix "
        "keeps the value and takes the k2 gradient)",
        name);
  }
  return t;
}

std::string to_string(KlType t) {
  std::string s;
  switch (t.estimator) {
    case KlEstimator::K1:
      s = "k1";
      break;
    case KlEstimator::Abs:
      s = "abs";
      break;
    case KlEstimator::K2:
      s = "k2";
      break;
    case KlEstimator::K3:
      s = "low_var_kl";
      break;
  }
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
  check_shape(s, fn);
  check_size(token_level_scores, s.numel(), "token_level_scores", fn);
  check_size(old_log_probs, s.numel(), "old_log_probs", fn);
  check_size(ref_log_prob, s.numel(), "ref_log_prob", fn);
  check_size(response_mask, s.numel(), "response_mask", fn);
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

// ---------------------------------------------------------------------------------------------
// Loss aggregation.

namespace {
struct ModeName {
  LossAggMode m;
  std::string_view name;
};
constexpr ModeName kModes[] = {
    {LossAggMode::TokenMean, "token-mean"},
    {LossAggMode::SeqMeanTokenSum, "seq-mean-token-sum"},
    {LossAggMode::SeqMeanTokenMean, "seq-mean-token-mean"},
    {LossAggMode::SeqMeanTokenSumNorm, "seq-mean-token-sum-norm"},
};
}  // namespace

LossAggMode parse_loss_agg_mode(std::string_view name) {
  for (const auto& m : kModes)
    if (m.name == name) return m.m;
  VERL_FAIL(
      "loss_agg_mode: unknown mode '{}'; known: token-mean, seq-mean-token-sum, "
      "seq-mean-token-mean, seq-mean-token-sum-norm",
      name);
}

std::string_view to_string(LossAggMode m) {
  for (const auto& x : kModes)
    if (x.m == m) return x.name;
  return "?";
}

std::vector<float> agg_loss_weights(Shape s, std::span<const float> loss_mask, LossAggMode mode,
                                    const AggNorm& norm) {
  const char* fn = "agg_loss";
  check_shape(s, fn);
  check_size(loss_mask, s.numel(), "loss_mask", fn);
  VERL_CHECK(norm.dp_size >= 1, "agg_loss: dp_size must be >= 1, got {}", norm.dp_size);
  const double dp = static_cast<double>(norm.dp_size);
  std::vector<float> w(s.numel(), 0.0f);
  if (mode == LossAggMode::TokenMean) {
    VERL_CHECK(norm.dp_size == 1 || norm.batch_num_tokens.has_value(),
               "agg_loss token-mean: the global batch_num_tokens is required when dp_size ({}) > 1",
               norm.dp_size);
    double n_tokens = 0;
    for (float m : loss_mask) n_tokens += m;
    if (norm.batch_num_tokens) n_tokens = *norm.batch_num_tokens;
    if (n_tokens == 0) return w;
    for (int64_t i = 0; i < s.numel(); ++i) w[i] = static_cast<float>(loss_mask[i] / n_tokens * dp);
    return w;
  }
  VERL_CHECK(norm.dp_size == 1 || norm.global_batch_size.has_value(),
             "agg_loss {}: the global_batch_size is required when dp_size ({}) > 1",
             to_string(mode), norm.dp_size);
  std::vector<double> len(s.batch, 0.0);
  double n_seqs = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t t = 0; t < s.length; ++t) len[b] += loss_mask[b * s.length + t];
    if (len[b] > 0) n_seqs += 1;  // fully masked responses are excluded
  }
  if (norm.global_batch_size) n_seqs = *norm.global_batch_size;
  double scale = 1.0;
  if (mode == LossAggMode::SeqMeanTokenSumNorm) {
    scale = norm.loss_scale_factor ? *norm.loss_scale_factor : static_cast<double>(s.length);
    VERL_CHECK(scale > 0, "agg_loss seq-mean-token-sum-norm: loss_scale_factor must be > 0, got {}",
               scale);
  }
  if (n_seqs == 0) return w;
  for (int64_t b = 0; b < s.batch; ++b) {
    if (!(len[b] > 0)) continue;
    double per_token = dp / n_seqs / scale;
    if (mode == LossAggMode::SeqMeanTokenMean) per_token /= (len[b] + 1e-8);
    for (int64_t t = 0; t < s.length; ++t) {
      const int64_t i = b * s.length + t;
      w[i] = static_cast<float>(loss_mask[i] * per_token);
    }
  }
  return w;
}

namespace {
// sum_t w_t * x_t over the masked slots (masked-out slots may hold anything, even NaN).
double weighted_sum(std::span<const float> w, std::span<const float> x) {
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (w[i] != 0) s += static_cast<double>(w[i]) * x[i];
  return s;
}
}  // namespace

double agg_loss(Shape s, std::span<const float> loss_mat, std::span<const float> loss_mask,
                LossAggMode mode, const AggNorm& norm) {
  check_size(loss_mat, s.numel(), "loss_mat", "agg_loss");
  std::vector<float> w = agg_loss_weights(s, loss_mask, mode, norm);
  return weighted_sum(w, loss_mat);
}

// ---------------------------------------------------------------------------------------------
// Losses.

PolicyLossOutput compute_policy_loss(Shape s, std::span<const float> old_log_prob,
                                     std::span<const float> log_prob,
                                     std::span<const float> advantages,
                                     std::span<const float> response_mask,
                                     const PolicyLossConfig& cfg,
                                     std::span<const float> rollout_is_weights) {
  const char* fn = "compute_policy_loss";
  check_shape(s, fn);
  check_size(old_log_prob, s.numel(), "old_log_prob", fn);
  check_size(log_prob, s.numel(), "log_prob", fn);
  check_size(advantages, s.numel(), "advantages", fn);
  check_size(response_mask, s.numel(), "response_mask", fn);
  if (!rollout_is_weights.empty())
    check_size(rollout_is_weights, s.numel(), "rollout_is_weights", fn);
  VERL_CHECK(cfg.clip_ratio_c > 1.0,
             "actor.clip_ratio_c (the dual-clip lower bound) must be > 1.0, got {}",
             cfg.clip_ratio_c);
  const double lo = 1.0 - cfg.clip_ratio_low.value_or(cfg.clip_ratio);
  const double hi = 1.0 + cfg.clip_ratio_high.value_or(cfg.clip_ratio);
  const double c = cfg.clip_ratio_c;

  std::vector<float> w = agg_loss_weights(s, response_mask, cfg.loss_agg_mode, cfg.norm);
  PolicyLossOutput out;
  out.d_log_prob.assign(s.numel(), 0.0f);
  double loss = 0, clipped = 0, kl = 0, clipped_lower = 0, n = 0;
  for (int64_t i = 0; i < s.numel(); ++i) {
    const double m = response_mask[i];
    if (m == 0) continue;
    const double a = advantages[i];
    const double x = static_cast<double>(log_prob[i]) - old_log_prob[i];
    const double neg_kl = clamp(x, -20.0, 20.0);  // negative_approx_kl, clamped for stability
    const double ratio = std::exp(neg_kl);
    const double d_ratio = ratio * clamp_grad(x, -20.0, 20.0);
    const double l1 = -a * ratio, d_l1 = -a * d_ratio;
    const double l2 = -a * clamp(ratio, lo, hi), d_l2 = -a * d_ratio * clamp_grad(ratio, lo, hi);
    const double c1 = std::max(l1, l2), d_c1 = max_grad(l1, l2, d_l1, d_l2);
    const double l3 = -a * c;  // dual-clip bound, applied only where A < 0
    double l = c1, d_l = d_c1;
    if (a < 0) {
      l = std::min(l3, c1);
      d_l = min_grad(l3, c1, 0.0, d_c1);
      clipped_lower += (c1 > l3) * m;
    }
    if (!rollout_is_weights.empty()) {
      l *= rollout_is_weights[i];
      d_l *= rollout_is_weights[i];
    }
    loss += w[i] * l;
    out.d_log_prob[i] = static_cast<float>(w[i] * d_l);
    clipped += (l2 > l1) * m;
    kl += -neg_kl * m;
    n += m;
  }
  out.pg_loss = loss;
  out.pg_clipfrac = clipped / (n + 1e-8);
  out.ppo_kl = kl / (n + 1e-8);
  out.pg_clipfrac_lower = clipped_lower / (n + 1e-8);
  return out;
}

LossAndGrad compute_entropy_loss(Shape s, std::span<const float> entropy,
                                 std::span<const float> response_mask, LossAggMode mode,
                                 const AggNorm& norm) {
  check_size(entropy, s.numel(), "entropy", "compute_entropy_loss");
  LossAndGrad out;
  out.grad = agg_loss_weights(s, response_mask, mode, norm);
  out.loss = weighted_sum(out.grad, entropy);
  return out;
}

LossAndGrad compute_kl_loss(Shape s, std::span<const float> log_prob,
                            std::span<const float> ref_log_prob,
                            std::span<const float> response_mask, KlType type, LossAggMode mode,
                            const AggNorm& norm) {
  const char* fn = "compute_kl_loss";
  check_size(log_prob, s.numel(), "log_prob", fn);
  check_size(ref_log_prob, s.numel(), "ref_log_prob", fn);
  std::vector<float> w = agg_loss_weights(s, response_mask, mode, norm);
  LossAndGrad out;
  out.grad.assign(s.numel(), 0.0f);
  for (int64_t i = 0; i < s.numel(); ++i) {
    if (w[i] == 0) continue;
    out.loss += w[i] * kl_penalty(log_prob[i], ref_log_prob[i], type);
    out.grad[i] = static_cast<float>(w[i] * kl_penalty_grad(log_prob[i], ref_log_prob[i], type));
  }
  return out;
}

ActorLossOutput compute_actor_loss(Shape s, std::span<const float> old_log_prob,
                                   std::span<const float> log_prob,
                                   std::span<const float> advantages,
                                   std::span<const float> response_mask,
                                   std::span<const float> entropy,
                                   std::span<const float> ref_log_prob, const ActorLossConfig& cfg,
                                   std::span<const float> rollout_is_weights) {
  ActorLossOutput out;
  PolicyLossOutput pg = compute_policy_loss(s, old_log_prob, log_prob, advantages, response_mask,
                                            cfg.policy, rollout_is_weights);
  out.pg_loss = pg.pg_loss;
  out.pg_clipfrac = pg.pg_clipfrac;
  out.ppo_kl = pg.ppo_kl;
  out.pg_clipfrac_lower = pg.pg_clipfrac_lower;
  out.policy_loss = pg.pg_loss;
  out.d_log_prob = std::move(pg.d_log_prob);
  out.d_entropy.assign(s.numel(), 0.0f);
  const LossAggMode mode = cfg.policy.loss_agg_mode;
  if (cfg.entropy_coeff != 0) {
    VERL_CHECK(!entropy.empty(), "compute_actor_loss: entropy_coeff = {} needs the entropy",
               cfg.entropy_coeff);
    LossAndGrad ent = compute_entropy_loss(s, entropy, response_mask, mode, cfg.policy.norm);
    out.entropy_loss = ent.loss;
    out.policy_loss -= cfg.entropy_coeff * ent.loss;
    for (int64_t i = 0; i < s.numel(); ++i)
      out.d_entropy[i] = static_cast<float>(-cfg.entropy_coeff * ent.grad[i]);
  }
  if (cfg.use_kl_loss) {
    VERL_CHECK(!ref_log_prob.empty(), "compute_actor_loss: use_kl_loss needs ref_log_prob");
    LossAndGrad kl = compute_kl_loss(s, log_prob, ref_log_prob, response_mask, cfg.kl_loss_type,
                                     mode, cfg.policy.norm);
    out.kl_loss = kl.loss;
    out.policy_loss += cfg.kl_loss_coef * kl.loss;
    for (int64_t i = 0; i < s.numel(); ++i)
      out.d_log_prob[i] = static_cast<float>(out.d_log_prob[i] + cfg.kl_loss_coef * kl.grad[i]);
  }
  return out;
}

ValueLossOutput compute_value_loss(Shape s, std::span<const float> vpreds,
                                   std::span<const float> returns, std::span<const float> values,
                                   std::span<const float> response_mask, double cliprange_value,
                                   LossAggMode mode, const AggNorm& norm) {
  const char* fn = "compute_value_loss";
  check_shape(s, fn);
  check_size(vpreds, s.numel(), "vpreds", fn);
  check_size(returns, s.numel(), "returns", fn);
  check_size(values, s.numel(), "values", fn);
  check_size(response_mask, s.numel(), "response_mask", fn);
  std::vector<float> w = agg_loss_weights(s, response_mask, mode, norm);
  ValueLossOutput out;
  out.d_vpreds.assign(s.numel(), 0.0f);
  double loss = 0, clipped = 0, n = 0;
  for (int64_t i = 0; i < s.numel(); ++i) {
    const double m = response_mask[i];
    if (m == 0) continue;
    const double v = vpreds[i], r = returns[i];
    const double lo = static_cast<double>(values[i]) - cliprange_value;
    const double hi = static_cast<double>(values[i]) + cliprange_value;
    // clip_by_value(x, lo, hi) = max(min(x, hi), lo), each a binary torch op.
    const double vmin = std::min(v, hi), d_vmin = min_grad(v, hi, 1.0, 0.0);
    const double vclip = std::max(vmin, lo), d_vclip = max_grad(vmin, lo, d_vmin, 0.0);
    const double l1 = (v - r) * (v - r), d_l1 = 2 * (v - r);
    const double l2 = (vclip - r) * (vclip - r), d_l2 = 2 * (vclip - r) * d_vclip;
    const double l = std::max(l1, l2), d_l = max_grad(l1, l2, d_l1, d_l2);
    loss += w[i] * l;
    out.d_vpreds[i] = static_cast<float>(0.5 * w[i] * d_l);
    clipped += (l2 > l1) * m;
    n += m;
  }
  out.vf_loss = 0.5 * loss;
  out.vf_clipfrac = clipped / (n + 1e-8);
  return out;
}

}  // namespace verl::trainer
