// verl's core RL algorithms on the CPU: advantage estimators, KL estimators and controllers, loss
// aggregation, policy/value/entropy/KL losses and their per-token gradients. Formulas follow
// verl/trainer/ppo/core_algos.py and verl/utils/torch_functional.py; see core_algos.h.
#include "trainer/core_algos.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "core/error.h"

namespace verl::trainer {
namespace {

// The config names of an enum (tables of {m, name, ...} entries): the entry named `name`, else an
// Error naming `key` and listing every name; and the name of value `m` ("?" if absent).
template <class Entry, size_t N>
const Entry& entry_named(const Entry (&table)[N], std::string_view name, std::string_view key,
                         std::string_view kind) {
  for (const Entry& x : table)
    if (x.name == name) return x;
  std::string known;
  for (const Entry& x : table) known += (known.empty() ? "" : ", ") + std::string(x.name);
  VERL_FAIL("{}: unknown {} '{}'; known: {}", key, kind, name, known);
}

template <class Entry, size_t N, class Value>
std::string_view name_of(const Entry (&table)[N], Value m) {
  for (const Entry& x : table)
    if (x.m == m) return x.name;
  return "?";
}

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

// The checks of an outcome estimator with groups.
void check_outcome_inputs(Shape s, std::span<const float> token_level_rewards,
                          std::span<const float> response_mask, std::span<const int64_t> index,
                          const char* fn) {
  check_shape(s, fn);
  check_size(token_level_rewards, s.numel(), "token_level_rewards", fn);
  check_size(response_mask, s.numel(), "response_mask", fn);
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
  return rloo_impl(s, token_level_rewards, response_mask, index, /*singleton_keeps_score=*/true,
                   "rloo");
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

namespace {
struct EstimatorName {
  AdvantageEstimator m;
  std::string_view name;
};
constexpr EstimatorName kEstimators[] = {
    {AdvantageEstimator::GAE, "gae"},
    {AdvantageEstimator::GRPO, "grpo"},
    {AdvantageEstimator::RLOO, "rloo"},
    {AdvantageEstimator::ReinforcePlusPlus, "reinforce_plus_plus"},
    {AdvantageEstimator::ReinforcePlusPlusBaseline, "reinforce_plus_plus_baseline"},
    {AdvantageEstimator::ReMax, "remax"},
    {AdvantageEstimator::OPO, "opo"},
    {AdvantageEstimator::GrpoPassK, "grpo_passk"},
    {AdvantageEstimator::GPG, "gpg"},
    {AdvantageEstimator::RlooVectorized, "rloo_vectorized"},
    {AdvantageEstimator::GrpoVectorized, "grpo_vectorized"},
};
}  // namespace

AdvantageEstimator parse_adv_estimator(std::string_view name) {
  return entry_named(kEstimators, name, "algorithm.adv_estimator", "estimator").m;
}

std::string_view to_string(AdvantageEstimator e) { return name_of(kEstimators, e); }

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
    case AdvantageEstimator::OPO:
      return compute_opo_outcome_advantage(in.shape, in.token_level_rewards, in.response_mask,
                                           in.index);
    case AdvantageEstimator::GrpoPassK:
      return compute_grpo_passk_outcome_advantage(in.shape, in.token_level_rewards,
                                                  in.response_mask, in.index, 1e-6,
                                                  in.norm_adv_by_std_in_grpo);
    case AdvantageEstimator::GPG:
      return compute_gpg_outcome_advantage(in.shape, in.token_level_rewards, in.response_mask,
                                           in.index);
    case AdvantageEstimator::RlooVectorized:
      return compute_rloo_vectorized_outcome_advantage(in.shape, in.token_level_rewards,
                                                       in.response_mask, in.index);
    case AdvantageEstimator::GrpoVectorized:
      return compute_grpo_outcome_advantage(in.shape, in.token_level_rewards, in.response_mask,
                                            in.index, 1e-6, in.norm_adv_by_std_in_grpo);
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
  return entry_named(kModes, name, "loss_agg_mode", "mode").m;
}

std::string_view to_string(LossAggMode m) { return name_of(kModes, m); }

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

namespace {
void check_policy_inputs(Shape s, std::span<const float> old_log_prob,
                         std::span<const float> log_prob, std::span<const float> advantages,
                         std::span<const float> response_mask,
                         std::span<const float> rollout_is_weights, const char* fn) {
  check_shape(s, fn);
  check_size(old_log_prob, s.numel(), "old_log_prob", fn);
  check_size(log_prob, s.numel(), "log_prob", fn);
  check_size(advantages, s.numel(), "advantages", fn);
  check_size(response_mask, s.numel(), "response_mask", fn);
  if (!rollout_is_weights.empty())
    check_size(rollout_is_weights, s.numel(), "rollout_is_weights", fn);
}

double is_weight(std::span<const float> rollout_is_weights, int64_t i) {
  return rollout_is_weights.empty() ? 1.0 : static_cast<double>(rollout_is_weights[i]);
}

// The metrics' normaliser: masked_mean divides by sum(mask) + 1e-8.
double mask_count(std::span<const float> mask) {
  double n = 0;
  for (float m : mask) n += m;
  return n + 1e-8;
}

struct LossModeName {
  PolicyLossMode m;
  std::string_view name;
  PolicyLossFn fn;
};
constexpr LossModeName kLossModes[] = {
    {PolicyLossMode::Vanilla, "vanilla", compute_policy_loss_vanilla},
    {PolicyLossMode::Gpg, "gpg", compute_policy_loss_gpg},
    {PolicyLossMode::Gspo, "gspo", compute_policy_loss_gspo},
    {PolicyLossMode::Sapo, "sapo", compute_policy_loss_sapo},
    {PolicyLossMode::Cispo, "cispo", compute_policy_loss_cispo},
    {PolicyLossMode::ClipCov, "clip_cov", compute_policy_loss_clip_cov},
    {PolicyLossMode::KlCov, "kl_cov", compute_policy_loss_kl_cov},
    {PolicyLossMode::GeoMean, "geo_mean", compute_policy_loss_geo_mean},
};
}  // namespace

PolicyLossMode parse_policy_loss_mode(std::string_view name) {
  return entry_named(kLossModes, name, "actor.policy_loss.loss_mode", "loss").m;
}

std::string_view to_string(PolicyLossMode m) { return name_of(kLossModes, m); }

PolicyLossOutput compute_policy_loss(Shape s, std::span<const float> old_log_prob,
                                     std::span<const float> log_prob,
                                     std::span<const float> advantages,
                                     std::span<const float> response_mask,
                                     const PolicyLossConfig& cfg,
                                     std::span<const float> rollout_is_weights) {
  for (const auto& x : kLossModes)
    if (x.m == cfg.loss_mode)
      return x.fn(s, old_log_prob, log_prob, advantages, response_mask, cfg, rollout_is_weights);
  VERL_FAIL("compute_policy_loss: unknown loss mode {}", static_cast<int>(cfg.loss_mode));
}

PolicyLossOutput compute_policy_loss_vanilla(Shape s, std::span<const float> old_log_prob,
                                             std::span<const float> log_prob,
                                             std::span<const float> advantages,
                                             std::span<const float> response_mask,
                                             const PolicyLossConfig& cfg,
                                             std::span<const float> rollout_is_weights) {
  check_policy_inputs(s, old_log_prob, log_prob, advantages, response_mask, rollout_is_weights,
                      "compute_policy_loss_vanilla");
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

PolicyLossOutput compute_policy_loss_gpg(Shape s, std::span<const float> old_log_prob,
                                         std::span<const float> log_prob,
                                         std::span<const float> advantages,
                                         std::span<const float> response_mask,
                                         const PolicyLossConfig& cfg,
                                         std::span<const float> rollout_is_weights) {
  check_policy_inputs(s, old_log_prob, log_prob, advantages, response_mask, rollout_is_weights,
                      "compute_policy_loss_gpg");
  std::vector<float> w = agg_loss_weights(s, response_mask, cfg.loss_agg_mode, cfg.norm);
  PolicyLossOutput out;
  out.d_log_prob.assign(s.numel(), 0.0f);
  for (int64_t i = 0; i < s.numel(); ++i) {
    if (w[i] == 0) continue;
    const double d_l = -static_cast<double>(advantages[i]) * is_weight(rollout_is_weights, i);
    out.pg_loss += w[i] * d_l * log_prob[i];  // l = -A logp is linear in logp
    out.d_log_prob[i] = static_cast<float>(w[i] * d_l);
  }
  return out;
}

PolicyLossOutput compute_policy_loss_gspo(Shape s, std::span<const float> old_log_prob,
                                          std::span<const float> log_prob,
                                          std::span<const float> advantages,
                                          std::span<const float> response_mask,
                                          const PolicyLossConfig& cfg,
                                          std::span<const float> rollout_is_weights) {
  check_policy_inputs(s, old_log_prob, log_prob, advantages, response_mask, rollout_is_weights,
                      "compute_policy_loss_gspo");
  const double lo = 1.0 - cfg.clip_ratio_low.value_or(cfg.clip_ratio);
  const double hi = 1.0 + cfg.clip_ratio_high.value_or(cfg.clip_ratio);
  // verl aggregates GSPO per sequence whatever actor.loss_agg_mode says.
  std::vector<float> w =
      agg_loss_weights(s, response_mask, LossAggMode::SeqMeanTokenMean, cfg.norm);
  PolicyLossOutput out;
  out.d_log_prob.assign(s.numel(), 0.0f);
  double clipped = 0, kl = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    double sum_x = 0, len = 0;
    for (int64_t t = 0; t < s.length; ++t) {
      const int64_t i = b * s.length + t;
      if (response_mask[i] == 0) continue;
      sum_x += (static_cast<double>(log_prob[i]) - old_log_prob[i]) * response_mask[i];
      len += response_mask[i];
    }
    // log s_b, clamped at 10; the same value on every token of the sequence. Through
    // logp - sg(logp) each token's gradient is its own ratio (where the clamp passes it).
    const double log_s = sum_x / std::max(len, 1.0);
    const double ratio = std::exp(std::min(log_s, 10.0));
    const double d_ratio = log_s <= 10.0 ? ratio : 0.0;
    for (int64_t t = 0; t < s.length; ++t) {
      const int64_t i = b * s.length + t;
      const double m = response_mask[i];
      if (m == 0) continue;
      const double a = advantages[i];
      const double l1 = -a * ratio, d_l1 = -a * d_ratio;
      const double l2 = -a * clamp(ratio, lo, hi), d_l2 = -a * d_ratio * clamp_grad(ratio, lo, hi);
      const double iw = is_weight(rollout_is_weights, i);
      out.pg_loss += w[i] * std::max(l1, l2) * iw;
      out.d_log_prob[i] = static_cast<float>(w[i] * max_grad(l1, l2, d_l1, d_l2) * iw);
      clipped += (l2 > l1) * m;
      kl += -(static_cast<double>(log_prob[i]) - old_log_prob[i]) * m;
    }
  }
  const double n = mask_count(response_mask);
  out.pg_clipfrac = clipped / n;
  out.ppo_kl = kl / n;
  return out;
}

PolicyLossOutput compute_policy_loss_sapo(Shape s, std::span<const float> old_log_prob,
                                          std::span<const float> log_prob,
                                          std::span<const float> advantages,
                                          std::span<const float> response_mask,
                                          const PolicyLossConfig& cfg,
                                          std::span<const float> rollout_is_weights) {
  check_policy_inputs(s, old_log_prob, log_prob, advantages, response_mask, rollout_is_weights,
                      "compute_policy_loss_sapo");
  VERL_CHECK(cfg.tau_pos > 0 && cfg.tau_neg > 0,
             "actor.tau_pos ({}) and actor.tau_neg ({}) must be > 0 for the sapo loss", cfg.tau_pos,
             cfg.tau_neg);
  std::vector<float> w =
      agg_loss_weights(s, response_mask, LossAggMode::SeqMeanTokenMean, cfg.norm);
  PolicyLossOutput out;
  out.d_log_prob.assign(s.numel(), 0.0f);
  double kl = 0;
  for (int64_t i = 0; i < s.numel(); ++i) {
    const double m = response_mask[i];
    if (m == 0) continue;
    const double a = advantages[i];
    const double x = static_cast<double>(log_prob[i]) - old_log_prob[i];
    const double neg_kl = clamp(x, -20.0, 20.0);
    const double ratio = std::exp(neg_kl);
    const double d_ratio = ratio * clamp_grad(x, -20.0, 20.0);
    const double tau = a > 0 ? cfg.tau_pos : cfg.tau_neg;
    // gate(r) = sigmoid(tau (r - 1)) * 4 / tau: slope 1 at r = 1, fading smoothly away from it.
    const double sig = 1.0 / (1.0 + std::exp(-tau * (ratio - 1.0)));
    const double gate = sig * 4.0 / tau, d_gate = 4.0 * sig * (1.0 - sig) * d_ratio;
    const double iw = is_weight(rollout_is_weights, i);
    out.pg_loss += w[i] * -gate * a * iw;
    out.d_log_prob[i] = static_cast<float>(w[i] * -d_gate * a * iw);
    kl += -neg_kl * m;
  }
  out.ppo_kl = kl / mask_count(response_mask);
  return out;
}

PolicyLossOutput compute_policy_loss_cispo(Shape s, std::span<const float> old_log_prob,
                                           std::span<const float> log_prob,
                                           std::span<const float> advantages,
                                           std::span<const float> response_mask,
                                           const PolicyLossConfig& cfg,
                                           std::span<const float> rollout_is_weights) {
  check_policy_inputs(s, old_log_prob, log_prob, advantages, response_mask, rollout_is_weights,
                      "compute_policy_loss_cispo");
  const double lo = 1.0 - cfg.clip_ratio_low.value_or(cfg.clip_ratio);
  const double hi = 1.0 + cfg.clip_ratio_high.value_or(cfg.clip_ratio);
  std::vector<float> w = agg_loss_weights(s, response_mask, cfg.loss_agg_mode, cfg.norm);
  PolicyLossOutput out;
  out.d_log_prob.assign(s.numel(), 0.0f);
  double clipped = 0, kl = 0;
  for (int64_t i = 0; i < s.numel(); ++i) {
    const double m = response_mask[i];
    if (m == 0) continue;
    const double a = advantages[i];
    const double neg_kl = clamp(static_cast<double>(log_prob[i]) - old_log_prob[i], -20.0, 20.0);
    const double ratio = std::exp(neg_kl);
    const double weight = clamp(ratio, lo, hi);  // detached: no gradient through the ratio
    const double d_l = -weight * a * is_weight(rollout_is_weights, i);
    out.pg_loss += w[i] * d_l * log_prob[i];
    out.d_log_prob[i] = static_cast<float>(w[i] * d_l);
    clipped += (weight != ratio) * m;
    kl += -neg_kl * m;
  }
  const double n = mask_count(response_mask);
  out.pg_clipfrac = clipped / n;
  out.ppo_kl = kl / n;
  return out;
}

namespace {
// The k flat indices of the largest keys among `candidates`, ties to the smaller index; a
// deterministic stand-in for verl's torch.topk / random draw.
std::vector<int64_t> top_k_by(std::vector<int64_t> candidates, const std::vector<double>& key,
                              int64_t k) {
  k = std::min<int64_t>(k, static_cast<int64_t>(candidates.size()));
  std::partial_sort(
      candidates.begin(), candidates.begin() + k, candidates.end(),
      [&](int64_t a, int64_t b) { return key[a] > key[b] || (key[a] == key[b] && a < b); });
  candidates.resize(k);
  return candidates;
}
}  // namespace

PolicyLossOutput compute_policy_loss_clip_cov(Shape s, std::span<const float> old_log_prob,
                                              std::span<const float> log_prob,
                                              std::span<const float> advantages,
                                              std::span<const float> response_mask,
                                              const PolicyLossConfig& cfg,
                                              std::span<const float> rollout_is_weights) {
  check_policy_inputs(s, old_log_prob, log_prob, advantages, response_mask, rollout_is_weights,
                      "compute_policy_loss_clip_cov");
  VERL_CHECK(cfg.clip_cov_ratio > 0, "actor.policy_loss.clip_cov_ratio must be > 0, got {}",
             cfg.clip_cov_ratio);
  const double lo = 1.0 - cfg.clip_ratio_low.value_or(cfg.clip_ratio);
  const double hi = 1.0 + cfg.clip_ratio_high.value_or(cfg.clip_ratio);
  const double mean_a = masked_mean(advantages, response_mask);
  const double mean_lp = masked_mean(log_prob, response_mask);
  // Per-token PPO clip terms, and the tokens eligible for a covariance cut: unclipped response
  // tokens whose covariance lies strictly inside (lb, ub).
  std::vector<double> cov(s.numel(), 0.0), loss(s.numel(), 0.0), d_loss(s.numel(), 0.0);
  std::vector<int64_t> candidates;
  double n_tokens = 0;
  for (float m : response_mask) n_tokens += m;
  for (int64_t i = 0; i < s.numel(); ++i) {
    if (response_mask[i] == 0) continue;
    const double a = advantages[i];
    const double ratio = std::exp(static_cast<double>(log_prob[i]) - old_log_prob[i]);
    const double l1 = -a * ratio, d_l1 = -a * ratio;
    const double l2 = -a * clamp(ratio, lo, hi), d_l2 = -a * ratio * clamp_grad(ratio, lo, hi);
    loss[i] = std::max(l1, l2);
    d_loss[i] = max_grad(l1, l2, d_l1, d_l2);
    cov[i] = (a - mean_a) * (static_cast<double>(log_prob[i]) - mean_lp);
    const bool clipped = l2 > l1;
    if (!clipped && cov[i] > cfg.clip_cov_lb && cov[i] < cfg.clip_cov_ub) candidates.push_back(i);
  }
  const int64_t clip_num =
      std::max<int64_t>(static_cast<int64_t>(cfg.clip_cov_ratio * n_tokens), 1);
  std::vector<char> cut(s.numel(), 0);
  for (int64_t i : top_k_by(std::move(candidates), cov, clip_num)) cut[i] = 1;

  std::vector<float> w = agg_loss_weights(s, response_mask, cfg.loss_agg_mode, cfg.norm);
  PolicyLossOutput out;
  out.d_log_prob.assign(s.numel(), 0.0f);
  double n_cut = 0, kl = 0;
  for (int64_t i = 0; i < s.numel(); ++i) {
    const double m = response_mask[i];
    if (m == 0) continue;
    kl += -(static_cast<double>(log_prob[i]) - old_log_prob[i]) * m;
    if (cut[i]) {
      n_cut += m;
      continue;
    }
    const double iw = is_weight(rollout_is_weights, i);
    out.pg_loss += w[i] * loss[i] * iw;
    out.d_log_prob[i] = static_cast<float>(w[i] * d_loss[i] * iw);
  }
  const double n = mask_count(response_mask);
  out.pg_clipfrac = n_cut / n;
  out.ppo_kl = kl / n;
  return out;
}

PolicyLossOutput compute_policy_loss_kl_cov(Shape s, std::span<const float> old_log_prob,
                                            std::span<const float> log_prob,
                                            std::span<const float> advantages,
                                            std::span<const float> response_mask,
                                            const PolicyLossConfig& cfg,
                                            std::span<const float> rollout_is_weights) {
  check_policy_inputs(s, old_log_prob, log_prob, advantages, response_mask, rollout_is_weights,
                      "compute_policy_loss_kl_cov");
  VERL_CHECK(cfg.kl_cov_ratio > 0, "actor.policy_loss.kl_cov_ratio must be > 0, got {}",
             cfg.kl_cov_ratio);
  // Plain means over the response tokens (verl's all_valid_*.mean()).
  std::vector<int64_t> valid;
  double sum_a = 0, sum_lp = 0;
  for (int64_t i = 0; i < s.numel(); ++i) {
    if (response_mask[i] <= 0) continue;
    valid.push_back(i);
    sum_a += advantages[i];
    sum_lp += log_prob[i];
  }
  std::vector<char> penalised(s.numel(), 0);
  if (!valid.empty()) {
    const double n = static_cast<double>(valid.size());
    std::vector<double> cov(s.numel(), 0.0);
    for (int64_t i : valid) cov[i] = (advantages[i] - sum_a / n) * (log_prob[i] - sum_lp / n);
    const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(n * cfg.kl_cov_ratio));
    for (int64_t i : top_k_by(valid, cov, k)) penalised[i] = 1;
  }
  std::vector<float> w = agg_loss_weights(s, response_mask, cfg.loss_agg_mode, cfg.norm);
  PolicyLossOutput out;
  out.d_log_prob.assign(s.numel(), 0.0f);
  double abs_kl = 0;
  for (int64_t i = 0; i < s.numel(); ++i) {
    const double m = response_mask[i];
    if (m == 0) continue;
    const double a = advantages[i];
    const double x = static_cast<double>(log_prob[i]) - old_log_prob[i];
    const double ratio = std::exp(x);
    double l = -a * ratio, d_l = -a * ratio;
    if (penalised[i]) {
      l += cfg.ppo_kl_coef * std::abs(x);
      d_l += cfg.ppo_kl_coef * (x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0));
    }
    const double iw = is_weight(rollout_is_weights, i);
    out.pg_loss += w[i] * l * iw;
    out.d_log_prob[i] = static_cast<float>(w[i] * d_l * iw);
    abs_kl += std::abs(x) * m;
  }
  out.ppo_kl = abs_kl / mask_count(response_mask);
  return out;
}

PolicyLossOutput compute_policy_loss_geo_mean(Shape s, std::span<const float> old_log_prob,
                                              std::span<const float> log_prob,
                                              std::span<const float> advantages,
                                              std::span<const float> response_mask,
                                              const PolicyLossConfig& cfg,
                                              std::span<const float> rollout_is_weights) {
  const char* fn = "compute_policy_loss_geo_mean";
  check_policy_inputs(s, old_log_prob, log_prob, advantages, response_mask, rollout_is_weights, fn);
  VERL_CHECK(cfg.norm.dp_size == 1 || cfg.norm.global_batch_size.has_value(),
             "{}: the global_batch_size is required when dp_size ({}) > 1", fn, cfg.norm.dp_size);
  const double lo = cfg.clip_ratio_low.value_or(cfg.clip_ratio);
  const double hi = cfg.clip_ratio_high.value_or(cfg.clip_ratio);
  const double n_seqs = cfg.norm.global_batch_size.value_or(static_cast<double>(s.batch));
  const double scale = n_seqs > 0 ? static_cast<double>(cfg.norm.dp_size) / n_seqs : 0.0;
  PolicyLossOutput out;
  out.d_log_prob.assign(s.numel(), 0.0f);
  std::vector<double> d_xm(s.length);  // d x'_t / d x_t of the current row
  double clip_hi = 0, clip_lo = 0, kl = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    double len = 0, sum_xm = 0, sum_a = 0, sum_log_iw = 0;
    for (int64_t t = 0; t < s.length; ++t) {
      const int64_t i = b * s.length + t;
      const double m = response_mask[i];
      d_xm[t] = 0;
      if (m == 0) continue;
      const double a = advantages[i];
      const double x = static_cast<double>(log_prob[i]) - old_log_prob[i];
      const double sg = a > 0 ? 1.0 : (a < 0 ? -1.0 : 0.0);
      // Token-level clip in log space, on the side the advantage pushes (PPO's pessimism).
      const double xc = clamp(x, -lo, hi);
      const double u = sg * x, v = sg * xc;
      sum_xm += sg * std::min(u, v) * m;
      d_xm[t] = sg * min_grad(u, v, sg, sg * clamp_grad(x, -lo, hi)) * m;
      sum_a += a * m;
      len += m;
      if (!rollout_is_weights.empty()) sum_log_iw += std::log(rollout_is_weights[i] + 1e-10) * m;
      clip_hi += (x != xc && a > 0) * m;
      clip_lo += (x != xc && a < 0) * m;
      kl += -x * m;
    }
    const double ratio = std::exp(sum_xm / (len + 1e-8));
    const double adv = sum_a / (len + 1e-8);
    const double seq_iw = rollout_is_weights.empty() ? 1.0 : std::exp(sum_log_iw / (len + 1e-8));
    out.pg_loss += scale * -adv * ratio * seq_iw;
    // d l_b / d logp_t = -A_b * ratio_b * d x'_t / (len_b + 1e-8).
    const double d_row = scale * -adv * ratio * seq_iw / (len + 1e-8);
    for (int64_t t = 0; t < s.length; ++t)
      if (d_xm[t] != 0) out.d_log_prob[b * s.length + t] = static_cast<float>(d_row * d_xm[t]);
  }
  const double n = mask_count(response_mask);
  out.pg_clipfrac = clip_hi / n;
  out.pg_clipfrac_lower = clip_lo / n;
  out.ppo_kl = kl / n;
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
