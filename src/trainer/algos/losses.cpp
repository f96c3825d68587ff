// verl's policy, value, entropy and KL losses on the CPU with their per-token gradients; formulas
// follow verl/trainer/ppo/core_algos.py (compute_policy_loss_*, compute_value_loss) and
// verl/workers/actor/dp_actor.py (how the actor adds the entropy and KL terms); see losses.h.
#include "trainer/algos/losses.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "trainer/algos/internal.h"

namespace verl::trainer {

using detail::check_matrices;
using detail::check_size;
using detail::clamp;
using detail::clamp_grad;
using detail::max_grad;
using detail::min_grad;

namespace {
void check_policy_inputs(const PolicyLossInputs& in, const char* fn) {
  check_matrices(in.shape, fn,
                 {{"old_log_prob", in.old_log_prob},
                  {"log_prob", in.log_prob},
                  {"advantages", in.advantages},
                  {"response_mask", in.response_mask}});
  if (!in.rollout_is_weights.empty())
    check_size(in.rollout_is_weights, in.shape.numel(), "rollout_is_weights", fn);
}

// Token i's rollout importance weight (1 without weights).
double is_weight(const PolicyLossInputs& in, int64_t i) {
  return in.rollout_is_weights.empty() ? 1.0 : static_cast<double>(in.rollout_is_weights[i]);
}

// x = logp - old of token i, the log of the importance ratio.
double log_ratio(const PolicyLossInputs& in, int64_t i) {
  return static_cast<double>(in.log_prob[i]) - in.old_log_prob[i];
}

// The metrics' normaliser: masked_mean divides by sum(mask) + 1e-8.
double mask_count(std::span<const float> mask) {
  double n = 0;
  for (float m : mask) n += m;
  return n + 1e-8;
}

// The registry (verl's register_policy_loss / get_policy_loss_fn).
struct LossModeName {
  PolicyLossMode value;
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
  return detail::entry_named(kLossModes, name, "actor.policy_loss.loss_mode", "loss").value;
}

std::string_view to_string(PolicyLossMode m) {
  return detail::name_of(kLossModes, m);
}

PolicyLossOutput compute_policy_loss(const PolicyLossInputs& in, const PolicyLossConfig& cfg) {
  const LossModeName* x = detail::entry_of(kLossModes, cfg.loss_mode);
  VERL_CHECK(x != nullptr, "compute_policy_loss: unknown loss mode {}",
             static_cast<int>(cfg.loss_mode));
  return x->fn(in, cfg);
}

PolicyLossOutput compute_policy_loss_vanilla(const PolicyLossInputs& in,
                                             const PolicyLossConfig& cfg) {
  const Shape s = in.shape;
  check_policy_inputs(in, "compute_policy_loss_vanilla");
  VERL_CHECK(cfg.clip_ratio_c > 1.0,
             "actor.clip_ratio_c (the dual-clip lower bound) must be > 1.0, got {}",
             cfg.clip_ratio_c);
  const double lo = 1.0 - cfg.clip_ratio_low.value_or(cfg.clip_ratio);
  const double hi = 1.0 + cfg.clip_ratio_high.value_or(cfg.clip_ratio);
  const double c = cfg.clip_ratio_c;

  std::vector<float> w = agg_loss_weights(s, in.response_mask, cfg.loss_agg_mode, cfg.norm);
  PolicyLossOutput out;
  out.d_log_prob.assign(s.numel(), 0.0f);
  double loss = 0, clipped = 0, kl = 0, clipped_lower = 0, n = 0;
  for (int64_t i = 0; i < s.numel(); ++i) {
    const double m = in.response_mask[i];
    if (m == 0) continue;
    const double a = in.advantages[i];
    const double x = log_ratio(in, i);
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
    if (!in.rollout_is_weights.empty()) {
      l *= in.rollout_is_weights[i];
      d_l *= in.rollout_is_weights[i];
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

PolicyLossOutput compute_policy_loss_gpg(const PolicyLossInputs& in, const PolicyLossConfig& cfg) {
  const Shape s = in.shape;
  check_policy_inputs(in, "compute_policy_loss_gpg");
  std::vector<float> w = agg_loss_weights(s, in.response_mask, cfg.loss_agg_mode, cfg.norm);
  PolicyLossOutput out;
  out.d_log_prob.assign(s.numel(), 0.0f);
  for (int64_t i = 0; i < s.numel(); ++i) {
    if (w[i] == 0) continue;
    const double d_l = -static_cast<double>(in.advantages[i]) * is_weight(in, i);
    out.pg_loss += w[i] * d_l * in.log_prob[i];  // l = -A logp is linear in logp
    out.d_log_prob[i] = static_cast<float>(w[i] * d_l);
  }
  return out;
}

PolicyLossOutput compute_policy_loss_gspo(const PolicyLossInputs& in, const PolicyLossConfig& cfg) {
  const Shape s = in.shape;
  check_policy_inputs(in, "compute_policy_loss_gspo");
  const double lo = 1.0 - cfg.clip_ratio_low.value_or(cfg.clip_ratio);
  const double hi = 1.0 + cfg.clip_ratio_high.value_or(cfg.clip_ratio);
  // verl aggregates GSPO per sequence whatever actor.loss_agg_mode says.
  std::vector<float> w =
      agg_loss_weights(s, in.response_mask, LossAggMode::SeqMeanTokenMean, cfg.norm);
  PolicyLossOutput out;
  out.d_log_prob.assign(s.numel(), 0.0f);
  double clipped = 0, kl = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    double sum_x = 0, len = 0;
    for (int64_t t = 0; t < s.length; ++t) {
      const int64_t i = b * s.length + t;
      if (in.response_mask[i] == 0) continue;
      sum_x += log_ratio(in, i) * in.response_mask[i];
      len += in.response_mask[i];
    }
    // log s_b, clamped at 10; the same value on every token of the sequence. Through
    // logp - sg(logp) each token's gradient is its own ratio (where the clamp passes it).
    const double log_s = sum_x / std::max(len, 1.0);
    const double ratio = std::exp(std::min(log_s, 10.0));
    const double d_ratio = log_s <= 10.0 ? ratio : 0.0;
    for (int64_t t = 0; t < s.length; ++t) {
      const int64_t i = b * s.length + t;
      const double m = in.response_mask[i];
      if (m == 0) continue;
      const double a = in.advantages[i];
      const double l1 = -a * ratio, d_l1 = -a * d_ratio;
      const double l2 = -a * clamp(ratio, lo, hi), d_l2 = -a * d_ratio * clamp_grad(ratio, lo, hi);
      const double iw = is_weight(in, i);
      out.pg_loss += w[i] * std::max(l1, l2) * iw;
      out.d_log_prob[i] = static_cast<float>(w[i] * max_grad(l1, l2, d_l1, d_l2) * iw);
      clipped += (l2 > l1) * m;
      kl += -log_ratio(in, i) * m;
    }
  }
  const double n = mask_count(in.response_mask);
  out.pg_clipfrac = clipped / n;
  out.ppo_kl = kl / n;
  return out;
}

PolicyLossOutput compute_policy_loss_sapo(const PolicyLossInputs& in, const PolicyLossConfig& cfg) {
  const Shape s = in.shape;
  check_policy_inputs(in, "compute_policy_loss_sapo");
  VERL_CHECK(cfg.tau_pos > 0 && cfg.tau_neg > 0,
             "actor.tau_pos ({}) and actor.tau_neg ({}) must be > 0 for the sapo loss", cfg.tau_pos,
             cfg.tau_neg);
  std::vector<float> w =
      agg_loss_weights(s, in.response_mask, LossAggMode::SeqMeanTokenMean, cfg.norm);
  PolicyLossOutput out;
  out.d_log_prob.assign(s.numel(), 0.0f);
  double kl = 0;
  for (int64_t i = 0; i < s.numel(); ++i) {
    const double m = in.response_mask[i];
    if (m == 0) continue;
    const double a = in.advantages[i];
    const double x = log_ratio(in, i);
    const double neg_kl = clamp(x, -20.0, 20.0);
    const double ratio = std::exp(neg_kl);
    const double d_ratio = ratio * clamp_grad(x, -20.0, 20.0);
    const double tau = a > 0 ? cfg.tau_pos : cfg.tau_neg;
    // gate(r) = sigmoid(tau (r - 1)) * 4 / tau: slope 1 at r = 1, fading smoothly away from it.
    const double sig = 1.0 / (1.0 + std::exp(-tau * (ratio - 1.0)));
    const double gate = sig * 4.0 / tau, d_gate = 4.0 * sig * (1.0 - sig) * d_ratio;
    const double iw = is_weight(in, i);
    out.pg_loss += w[i] * -gate * a * iw;
    out.d_log_prob[i] = static_cast<float>(w[i] * -d_gate * a * iw);
    kl += -neg_kl * m;
  }
  out.ppo_kl = kl / mask_count(in.response_mask);
  return out;
}

PolicyLossOutput compute_policy_loss_cispo(const PolicyLossInputs& in,
                                           const PolicyLossConfig& cfg) {
  const Shape s = in.shape;
  check_policy_inputs(in, "compute_policy_loss_cispo");
  const double lo = 1.0 - cfg.clip_ratio_low.value_or(cfg.clip_ratio);
  const double hi = 1.0 + cfg.clip_ratio_high.value_or(cfg.clip_ratio);
  std::vector<float> w = agg_loss_weights(s, in.response_mask, cfg.loss_agg_mode, cfg.norm);
  PolicyLossOutput out;
  out.d_log_prob.assign(s.numel(), 0.0f);
  double clipped = 0, kl = 0;
  for (int64_t i = 0; i < s.numel(); ++i) {
    const double m = in.response_mask[i];
    if (m == 0) continue;
    const double a = in.advantages[i];
    const double neg_kl = clamp(log_ratio(in, i), -20.0, 20.0);
    const double ratio = std::exp(neg_kl);
    const double weight = clamp(ratio, lo, hi);  // detached: no gradient through the ratio
    const double d_l = -weight * a * is_weight(in, i);
    out.pg_loss += w[i] * d_l * in.log_prob[i];
    out.d_log_prob[i] = static_cast<float>(w[i] * d_l);
    clipped += (weight != ratio) * m;
    kl += -neg_kl * m;
  }
  const double n = mask_count(in.response_mask);
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

PolicyLossOutput compute_policy_loss_clip_cov(const PolicyLossInputs& in,
                                              const PolicyLossConfig& cfg) {
  const Shape s = in.shape;
  check_policy_inputs(in, "compute_policy_loss_clip_cov");
  VERL_CHECK(cfg.clip_cov_ratio > 0, "actor.policy_loss.clip_cov_ratio must be > 0, got {}",
             cfg.clip_cov_ratio);
  const double lo = 1.0 - cfg.clip_ratio_low.value_or(cfg.clip_ratio);
  const double hi = 1.0 + cfg.clip_ratio_high.value_or(cfg.clip_ratio);
  const double mean_a = masked_mean(in.advantages, in.response_mask);
  const double mean_lp = masked_mean(in.log_prob, in.response_mask);
  // Per-token PPO clip terms, and the tokens eligible for a covariance cut: unclipped response
  // tokens whose covariance lies strictly inside (lb, ub).
  std::vector<double> cov(s.numel(), 0.0), loss(s.numel(), 0.0), d_loss(s.numel(), 0.0);
  std::vector<int64_t> candidates;
  double n_tokens = 0;
  for (float m : in.response_mask) n_tokens += m;
  for (int64_t i = 0; i < s.numel(); ++i) {
    if (in.response_mask[i] == 0) continue;
    const double a = in.advantages[i];
    const double ratio = std::exp(log_ratio(in, i));
    const double l1 = -a * ratio, d_l1 = -a * ratio;
    const double l2 = -a * clamp(ratio, lo, hi), d_l2 = -a * ratio * clamp_grad(ratio, lo, hi);
    loss[i] = std::max(l1, l2);
    d_loss[i] = max_grad(l1, l2, d_l1, d_l2);
    cov[i] = (a - mean_a) * (static_cast<double>(in.log_prob[i]) - mean_lp);
    const bool clipped = l2 > l1;
    if (!clipped && cov[i] > cfg.clip_cov_lb && cov[i] < cfg.clip_cov_ub) candidates.push_back(i);
  }
  const int64_t clip_num =
      std::max<int64_t>(static_cast<int64_t>(cfg.clip_cov_ratio * n_tokens), 1);
  std::vector<char> cut(s.numel(), 0);
  for (int64_t i : top_k_by(std::move(candidates), cov, clip_num)) cut[i] = 1;

  std::vector<float> w = agg_loss_weights(s, in.response_mask, cfg.loss_agg_mode, cfg.norm);
  PolicyLossOutput out;
  out.d_log_prob.assign(s.numel(), 0.0f);
  double n_cut = 0, kl = 0;
  for (int64_t i = 0; i < s.numel(); ++i) {
    const double m = in.response_mask[i];
    if (m == 0) continue;
    kl += -log_ratio(in, i) * m;
    if (cut[i]) {
      n_cut += m;
      continue;
    }
    const double iw = is_weight(in, i);
    out.pg_loss += w[i] * loss[i] * iw;
    out.d_log_prob[i] = static_cast<float>(w[i] * d_loss[i] * iw);
  }
  const double n = mask_count(in.response_mask);
  out.pg_clipfrac = n_cut / n;
  out.ppo_kl = kl / n;
  return out;
}

PolicyLossOutput compute_policy_loss_kl_cov(const PolicyLossInputs& in,
                                            const PolicyLossConfig& cfg) {
  const Shape s = in.shape;
  check_policy_inputs(in, "compute_policy_loss_kl_cov");
  VERL_CHECK(cfg.kl_cov_ratio > 0, "actor.policy_loss.kl_cov_ratio must be > 0, got {}",
             cfg.kl_cov_ratio);
  // Plain means over the response tokens (verl's all_valid_*.mean()).
  std::vector<int64_t> valid;
  double sum_a = 0, sum_lp = 0;
  for (int64_t i = 0; i < s.numel(); ++i) {
    if (in.response_mask[i] <= 0) continue;
    valid.push_back(i);
    sum_a += in.advantages[i];
    sum_lp += in.log_prob[i];
  }
  std::vector<char> penalised(s.numel(), 0);
  if (!valid.empty()) {
    const double n = static_cast<double>(valid.size());
    std::vector<double> cov(s.numel(), 0.0);
    for (int64_t i : valid) cov[i] = (in.advantages[i] - sum_a / n) * (in.log_prob[i] - sum_lp / n);
    const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(n * cfg.kl_cov_ratio));
    for (int64_t i : top_k_by(valid, cov, k)) penalised[i] = 1;
  }
  std::vector<float> w = agg_loss_weights(s, in.response_mask, cfg.loss_agg_mode, cfg.norm);
  PolicyLossOutput out;
  out.d_log_prob.assign(s.numel(), 0.0f);
  double abs_kl = 0;
  for (int64_t i = 0; i < s.numel(); ++i) {
    const double m = in.response_mask[i];
    if (m == 0) continue;
    const double a = in.advantages[i];
    const double x = log_ratio(in, i);
    const double ratio = std::exp(x);
    double l = -a * ratio, d_l = -a * ratio;
    if (penalised[i]) {
      l += cfg.ppo_kl_coef * std::abs(x);
      d_l += cfg.ppo_kl_coef * (x > 0 ? 1.0 : (x < 0 ? -1.0 : 0.0));
    }
    const double iw = is_weight(in, i);
    out.pg_loss += w[i] * l * iw;
    out.d_log_prob[i] = static_cast<float>(w[i] * d_l * iw);
    abs_kl += std::abs(x) * m;
  }
  out.ppo_kl = abs_kl / mask_count(in.response_mask);
  return out;
}

PolicyLossOutput compute_policy_loss_geo_mean(const PolicyLossInputs& in,
                                              const PolicyLossConfig& cfg) {
  const Shape s = in.shape;
  const char* fn = "compute_policy_loss_geo_mean";
  check_policy_inputs(in, fn);
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
      const double m = in.response_mask[i];
      d_xm[t] = 0;
      if (m == 0) continue;
      const double a = in.advantages[i];
      const double x = log_ratio(in, i);
      const double sg = a > 0 ? 1.0 : (a < 0 ? -1.0 : 0.0);
      // Token-level clip in log space, on the side the advantage pushes (PPO's pessimism).
      const double xc = clamp(x, -lo, hi);
      const double u = sg * x, v = sg * xc;
      sum_xm += sg * std::min(u, v) * m;
      d_xm[t] = sg * min_grad(u, v, sg, sg * clamp_grad(x, -lo, hi)) * m;
      sum_a += a * m;
      len += m;
      if (!in.rollout_is_weights.empty())
        sum_log_iw += std::log(in.rollout_is_weights[i] + 1e-10) * m;
      clip_hi += (x != xc && a > 0) * m;
      clip_lo += (x != xc && a < 0) * m;
      kl += -x * m;
    }
    const double ratio = std::exp(sum_xm / (len + 1e-8));
    const double adv = sum_a / (len + 1e-8);
    const double seq_iw = in.rollout_is_weights.empty() ? 1.0 : std::exp(sum_log_iw / (len + 1e-8));
    out.pg_loss += scale * -adv * ratio * seq_iw;
    // d l_b / d logp_t = -A_b * ratio_b * d x'_t / (len_b + 1e-8).
    const double d_row = scale * -adv * ratio * seq_iw / (len + 1e-8);
    for (int64_t t = 0; t < s.length; ++t)
      if (d_xm[t] != 0) out.d_log_prob[b * s.length + t] = static_cast<float>(d_row * d_xm[t]);
  }
  const double n = mask_count(in.response_mask);
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
  out.loss = detail::weighted_sum(out.grad, entropy);
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

ActorLossOutput compute_actor_loss(const PolicyLossInputs& in, std::span<const float> entropy,
                                   std::span<const float> ref_log_prob,
                                   const ActorLossConfig& cfg) {
  const Shape s = in.shape;
  ActorLossOutput out;
  PolicyLossOutput pg = compute_policy_loss(in, cfg.policy);
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
    LossAndGrad ent = compute_entropy_loss(s, entropy, in.response_mask, mode, cfg.policy.norm);
    out.entropy_loss = ent.loss;
    out.policy_loss -= cfg.entropy_coeff * ent.loss;
    for (int64_t i = 0; i < s.numel(); ++i)
      out.d_entropy[i] = static_cast<float>(-cfg.entropy_coeff * ent.grad[i]);
  }
  if (cfg.use_kl_loss) {
    VERL_CHECK(!ref_log_prob.empty(), "compute_actor_loss: use_kl_loss needs ref_log_prob");
    LossAndGrad kl = compute_kl_loss(s, in.log_prob, ref_log_prob, in.response_mask,
                                     cfg.kl_loss_type, mode, cfg.policy.norm);
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
  check_matrices(s, fn,
                 {{"vpreds", vpreds},
                  {"returns", returns},
                  {"values", values},
                  {"response_mask", response_mask}});
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
