// Rollout correction: IS weights, rejection masks and off-policy metrics, in double precision over
// [B, L] matrices, as verl/trainer/ppo/rollout_corr_helper.py. masked_mean is verl_F's
// sum(x m) / (sum(m) + 1e-8); per-row means divide by the row's length + 1e-8; torch's std() over
// sequences is the unbiased one.
#include "trainer/rollout_corr.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "core/error.h"

namespace verl::trainer {
namespace {

constexpr double kSafetyBound = 20.0;  // verl's SAFETY_BOUND: exp(+-20)

double clamp_lr(double x) {
  return std::clamp(x, -kSafetyBound, kSafetyBound);
}

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t p = s.find(',', start);
    std::string part =
        trim(s.substr(start, p == std::string::npos ? std::string::npos : p - start));
    if (!part.empty()) out.push_back(std::move(part));
    if (p == std::string::npos) break;
    start = p + 1;
  }
  return out;
}

double parse_positive(const std::string& text, const std::string& option) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (...) {
    used = 0;
  }
  VERL_CHECK(
      used == text.size() && !text.empty(),
      "algorithm.rollout_correction.rollout_rs_threshold: '{}' for option {} is not a number", text,
      option);
  VERL_CHECK(
      v > 0,
      "algorithm.rollout_correction.rollout_rs_threshold: the bound of {} must be positive, got {}",
      option, text);
  return v;
}

// A [B, L] view with the masked reductions verl_F provides.
struct Masked {
  Shape s;
  std::span<const float> mask;
  double count() const {
    double n = 0;
    for (float m : mask) n += m;
    return n;
  }
  template <class F>
  double mean(F x) const {  // masked_mean over every token
    double sum = 0, n = 0;
    for (int64_t i = 0; i < s.numel(); ++i) {
      if (mask[i] == 0) continue;
      sum += x(i) * mask[i];
      n += mask[i];
    }
    return sum / (n + 1e-8);
  }
  template <class F>
  double row_sum(int64_t b, F x) const {
    double sum = 0;
    for (int64_t j = 0; j < s.length; ++j)
      if (mask[b * s.length + j] != 0) sum += x(b * s.length + j) * mask[b * s.length + j];
    return sum;
  }
  double row_len(int64_t b) const {
    double n = 0;
    for (int64_t j = 0; j < s.length; ++j) n += mask[b * s.length + j];
    return n;
  }
  template <class F>
  double row_mean(int64_t b, F x) const {
    return row_sum(b, x) / (row_len(b) + 1e-8);
  }
};

struct Stats {
  double mean = 0, std = 0, max = 0, min = 0;
};
// mean, unbiased std (0 for one value), max, min of `v` (non-empty).
Stats stats(const std::vector<double>& v) {
  Stats st;
  st.max = -std::numeric_limits<double>::infinity();
  st.min = std::numeric_limits<double>::infinity();
  for (double x : v) {
    st.mean += x;
    st.max = std::max(st.max, x);
    st.min = std::min(st.min, x);
  }
  st.mean /= static_cast<double>(v.size());
  if (v.size() > 1) {
    double ss = 0;
    for (double x : v) ss += (x - st.mean) * (x - st.mean);
    st.std = std::sqrt(ss / static_cast<double>(v.size() - 1));
  }
  return st;
}

double fraction(const std::vector<double>& v, auto pred) {
  double n = 0;
  for (double x : v) n += pred(x) ? 1.0 : 0.0;
  return v.empty() ? 0.0 : n / static_cast<double>(v.size());
}

// compute_rollout_correction_weights with compute_is_metrics (before truncation).
void is_weights(const Masked& mk, const std::vector<double>& lr, const RolloutCorrectionConfig& cfg,
                std::vector<float>& out, std::map<std::string, double>& m) {
  const Shape s = mk.s;
  const double thr = cfg.rollout_is_threshold, lo = 1.0 / thr;
  const bool seq = *cfg.rollout_is == "sequence";
  std::vector<double> w(static_cast<size_t>(s.numel()), 0.0), seq_lr;
  for (int64_t b = 0; b < s.batch; ++b) {
    const double sum = seq ? mk.row_sum(b, [&](int64_t i) { return lr[i]; }) : 0.0;
    if (seq) seq_lr.push_back(sum);
    for (int64_t j = 0; j < s.length; ++j) {
      const int64_t i = b * s.length + j;
      w[i] = std::exp(clamp_lr(seq ? sum : lr[i])) * mk.mask[i];
    }
  }
  auto W = [&](int64_t i) { return w[i]; };
  const std::string p = "rollout_is_";
  m[p + "mean"] = mk.mean(W);
  if (seq) {
    const Stats st = stats(seq_lr);
    m[p + "max"] = std::exp(std::min(st.max, kSafetyBound));
    m[p + "min"] = std::exp(st.min);
    m[p + "ratio_fraction_high"] = fraction(seq_lr, [&](double x) { return x > std::log(thr); });
    m[p + "ratio_fraction_low"] = fraction(seq_lr, [&](double x) { return x < std::log(lo); });
  } else {
    m[p + "ratio_fraction_high"] = mk.mean([&](int64_t i) { return w[i] > thr ? 1.0 : 0.0; });
    m[p + "ratio_fraction_low"] = mk.mean([&](int64_t i) { return w[i] < lo ? 1.0 : 0.0; });
    double hi = -std::numeric_limits<double>::infinity(),
           low = std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < s.numel(); ++i)
      if (mk.mask[i] != 0) {
        hi = std::max(hi, w[i]);
        low = std::min(low, w[i]);
      }
    m[p + "max"] = hi;
    m[p + "min"] = low;
  }
  // std and the effective sample size from the weights clamped to [1 / thr, thr].
  auto wc = [&](int64_t i) { return std::clamp(w[i], lo, thr); };
  const double mean_c = mk.mean(wc);
  m[p + "std"] = mk.count() > 1
                     ? std::sqrt(std::max(0.0, mk.mean([&](int64_t i) { return wc(i) * wc(i); }) -
                                                   mean_c * mean_c))
                     : 0.0;
  m[p + "eff_sample_size"] = 1.0 / mk.mean([&](int64_t i) {
    const double x = wc(i) / (mean_c + 1e-8);
    return x * x;
  });
  std::vector<double> seq_w;
  for (int64_t b = 0; b < s.batch; ++b) seq_w.push_back(mk.row_mean(b, W));
  const Stats st = stats(seq_w);
  m[p + "seq_mean"] = st.mean;
  m[p + "seq_std"] = st.std;
  m[p + "seq_max"] = st.max;
  m[p + "seq_min"] = st.min;
  double dev = 0;
  for (double x : seq_w) dev = std::max(dev, std::fabs(x - 1.0));
  m[p + "seq_max_deviation"] = dev;
  m[p + "seq_fraction_high"] = fraction(seq_w, [&](double x) { return x > thr; });
  m[p + "seq_fraction_low"] = fraction(seq_w, [&](double x) { return x < lo; });

  for (double& x : w) x = std::min(x, thr);  // truncated IS (TIS)
  if (cfg.rollout_is_batch_normalize) {
    double mean = 0;
    if (!seq) {
      mean = mk.mean(W);
    } else {
      double sum = 0, n = 0;
      for (int64_t b = 0; b < s.batch; ++b)
        if (mk.row_len(b) > 0) {
          sum += mk.row_mean(b, W);
          n += 1;
        }
      mean = sum / std::max(n, 1e-8);
    }
    if (mean > 1e-8) {
      for (double& x : w) x /= mean;
      m[p + "batch_norm_factor"] = mean;
    } else {
      m[p + "batch_norm_factor"] = 1.0;
    }
  }
  out.assign(w.begin(), w.end());
}

// compute_rollout_rejection_mask with compute_rs_metrics per option.
void rejection(const Masked& mk, const std::vector<double>& lr, const RolloutCorrectionConfig& cfg,
               std::vector<float>& new_mask, std::map<std::string, double>& m) {
  const Shape s = mk.s;
  const int64_t n = s.numel();
  std::vector<double> k[4];  // k[1], k[2], k[3] per token
  for (int e = 1; e <= 3; ++e) k[e].resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double x = clamp_lr(lr[i]);
    k[1][i] = -x;
    k[2][i] = 0.5 * x * x;
    k[3][i] = std::exp(x) - 1.0 - x;
  }
  std::vector<bool> valid(static_cast<size_t>(s.batch));
  for (int64_t b = 0; b < s.batch; ++b) valid[b] = mk.row_len(b) > 0;
  std::vector<double> combined(static_cast<size_t>(n), 1.0);
  for (const RolloutRsOption& opt : cfg.rollout_rs) {
    const int e = opt.name.back() - '0';
    const bool k1 = e == 1, token = opt.name.starts_with("token_");
    const double up = k1 ? std::log(opt.upper) : opt.upper, lo = k1 ? std::log(opt.lower) : 0.0;
    auto pass = [&](double v) { return k1 ? v >= lo && v <= up : v <= up; };
    const std::vector<double>& kt = k[e];
    std::vector<double> stat(static_cast<size_t>(n)), seq_stat;  // per token; per sequence
    std::vector<bool> keep(static_cast<size_t>(n));
    if (token) {
      for (int64_t i = 0; i < n; ++i) {
        stat[i] = kt[i];
        keep[i] = pass(kt[i]);
      }
    } else {
      for (int64_t b = 0; b < s.batch; ++b) {
        double v;
        if (opt.name.starts_with("seq_sum")) {
          v = mk.row_sum(b, [&](int64_t i) { return kt[i]; });
        } else if (opt.name.starts_with("seq_mean")) {
          v = mk.row_mean(b, [&](int64_t i) { return kt[i]; });
        } else {  // seq_max: over the row's tokens, 0 for an empty row
          v = -std::numeric_limits<double>::infinity();
          for (int64_t j = 0; j < s.length; ++j)
            if (mk.mask[b * s.length + j] != 0) v = std::max(v, kt[b * s.length + j]);
          if (std::isinf(v)) v = 0;
        }
        seq_stat.push_back(v);
        for (int64_t j = 0; j < s.length; ++j) {
          stat[b * s.length + j] = v;
          keep[b * s.length + j] = pass(v);
        }
      }
    }
    const std::string p = "rollout_rs_" + opt.name + "_";
    auto S = [&](int64_t i) { return stat[i]; };
    std::vector<double> seq_valid;  // the statistic of each non-empty sequence
    for (int64_t b = 0; b < s.batch; ++b)
      if (valid[b]) seq_valid.push_back(token ? mk.row_mean(b, S) : seq_stat[b]);
    m[p + "mean"] = mk.mean(S);
    if (!token && !seq_valid.empty()) {
      const Stats st = stats(seq_valid);
      m[p + "max"] = st.max;
      m[p + "min"] = st.min;
      m[p + "fraction_high"] = fraction(seq_valid, [&](double v) { return v > up; });
      m[p + "fraction_low"] = k1 ? fraction(seq_valid, [&](double v) { return v < lo; }) : 0.0;
    } else {
      double hi = -std::numeric_limits<double>::infinity(),
             low = std::numeric_limits<double>::infinity();
      for (int64_t i = 0; i < n; ++i)
        if (mk.mask[i] != 0) {
          hi = std::max(hi, stat[i]);
          low = std::min(low, stat[i]);
        }
      m[p + "max"] = hi;
      m[p + "min"] = low;
      m[p + "fraction_high"] = mk.mean([&](int64_t i) { return stat[i] > up ? 1.0 : 0.0; });
      m[p + "fraction_low"] =
          k1 ? mk.mean([&](int64_t i) { return stat[i] < lo ? 1.0 : 0.0; }) : 0.0;
    }
    if (mk.count() > 1) {
      auto c = [&](int64_t i) { return std::clamp(stat[i], k1 ? lo : 0.0, up); };
      const double mc = mk.mean(c);
      m[p + "std"] =
          std::sqrt(std::max(0.0, mk.mean([&](int64_t i) { return c(i) * c(i); }) - mc * mc));
    } else {
      m[p + "std"] = 0.0;
    }
    if (!seq_valid.empty()) {
      const Stats st = stats(seq_valid);
      m[p + "seq_mean"] = st.mean;
      m[p + "seq_std"] = st.std;
      m[p + "seq_max"] = st.max;
      m[p + "seq_min"] = st.min;
      double dev = 0;
      for (double v : seq_valid) dev = std::max(dev, std::fabs(v));
      m[p + "seq_max_deviation"] = dev;
      m[p + "seq_fraction_high"] = fraction(seq_valid, [&](double v) { return v > up; });
      if (k1) m[p + "seq_fraction_low"] = fraction(seq_valid, [&](double v) { return v < lo; });
    } else {
      for (const char* key : {"seq_mean", "seq_std", "seq_max", "seq_min", "seq_max_deviation",
                              "seq_fraction_high", "seq_fraction_low"})
        m[p + key] = 0.0;
    }
    // Masked fractions of this option: tokens, and valid sequences with a rejected token.
    m[p + "masked_fraction"] = mk.mean([&](int64_t i) { return keep[i] ? 0.0 : 1.0; });
    double rejected = 0, nvalid = 0;
    for (int64_t b = 0; b < s.batch; ++b) {
      if (!valid[b]) continue;
      nvalid += 1;
      bool any = false;
      for (int64_t j = 0; j < s.length; ++j)
        any = any || (!keep[b * s.length + j] && mk.mask[b * s.length + j] != 0);
      rejected += any ? 1.0 : 0.0;
    }
    m[p + "seq_masked_fraction"] = nvalid > 0 ? rejected / nvalid : 0.0;
    for (int64_t i = 0; i < n; ++i) combined[i] *= keep[i] ? 1.0 : 0.0;
  }
  m["rollout_rs_masked_fraction"] = mk.mean([&](int64_t i) { return 1.0 - combined[i]; });
  double seq_masked = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    bool any = false;
    for (int64_t j = 0; j < s.length; ++j) {
      const int64_t i = b * s.length + j;
      any = any || (mk.mask[i] != 0 && !(combined[i] > 0.5));
    }
    seq_masked += any ? 1.0 : 0.0;
  }
  m["rollout_rs_seq_masked_fraction"] =
      seq_masked / static_cast<double>(std::max<int64_t>(1, s.batch));
  new_mask.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) new_mask[i] = static_cast<float>(mk.mask[i] * combined[i]);
}

// verl's January per-token veto (rollout_corr_helper.py before 97eac9048): a row with any response
// token whose unclamped lr is below log(threshold) is rejected whole.
void token_veto(const Masked& mk, const std::vector<double>& lr, double threshold,
                std::vector<float>& new_mask, std::map<std::string, double>& m) {
  const Shape s = mk.s;
  const double log_veto = std::log(threshold);
  double vetoed = 0, catastrophic = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    bool any = false;
    for (int64_t j = 0; j < s.length; ++j) {
      const int64_t i = b * s.length + j;
      if (mk.mask[i] != 0 && lr[i] < log_veto) {
        any = true;
        catastrophic += 1;
      }
    }
    if (!any) continue;
    vetoed += 1;
    for (int64_t j = 0; j < s.length; ++j) new_mask[b * s.length + j] = 0.0f;
  }
  m["rollout_is_veto_fraction"] = vetoed / static_cast<double>(std::max<int64_t>(1, s.batch));
  m["rollout_is_catastrophic_token_fraction"] = catastrophic / mk.count();
}

// compute_offpolicy_metrics.
void offpolicy_metrics(const Masked& mk, std::span<const float> old, std::span<const float> rollout,
                       std::map<std::string, double>& m) {
  const Shape s = mk.s;
  const auto B = static_cast<double>(s.batch);
  double train_ppl = 0, train_log_ppl = 0, roll_ppl = 0, roll_log_ppl = 0, chi2_seq = 0,
         ppl_ratio = 0;
  std::vector<double> diff;
  for (int64_t b = 0; b < s.batch; ++b) {
    const double lt = mk.row_mean(b, [&](int64_t i) { return old[i]; });
    const double lro = mk.row_mean(b, [&](int64_t i) { return rollout[i]; });
    train_ppl += std::exp(-lt);
    train_log_ppl += -lt;
    roll_ppl += std::exp(-lro);
    roll_log_ppl += -lro;
    diff.push_back(lro - lt);
    ppl_ratio += std::exp(lro - lt);
    const double sum =
        mk.row_sum(b, [&](int64_t i) { return double(old[i]) - double(rollout[i]); });
    chi2_seq += std::exp(2.0 * clamp_lr(sum));
  }
  m["training_ppl"] = train_ppl / B;
  m["training_log_ppl"] = train_log_ppl / B;
  m["kl"] = mk.mean([&](int64_t i) { return double(rollout[i]) - double(old[i]); });
  m["k3_kl"] = mk.mean([&](int64_t i) {
    const double x = double(old[i]) - double(rollout[i]);
    return std::exp(x) - x - 1.0;
  });
  m["rollout_ppl"] = roll_ppl / B;
  m["rollout_log_ppl"] = roll_log_ppl / B;
  double abs_diff = 0;
  for (double d : diff) abs_diff += std::fabs(d);
  const Stats st = stats(diff);
  m["log_ppl_diff"] = st.mean;
  m["log_ppl_abs_diff"] = abs_diff / B;
  m["log_ppl_diff_max"] = st.max;
  m["log_ppl_diff_min"] = st.min;
  m["ppl_ratio"] = ppl_ratio / B;
  m["chi2_token"] = mk.mean([&](int64_t i) {
    const double r = std::exp(clamp_lr(double(old[i]) - double(rollout[i])));
    return r * r;
  }) - 1.0;
  m["chi2_seq"] = chi2_seq / B - 1.0;
}

}  // namespace

RolloutCorrectionConfig parse_rollout_correction(
    const std::optional<std::string>& rollout_is, double rollout_is_threshold,
    bool rollout_is_batch_normalize, const std::optional<std::string>& rollout_rs,
    const std::optional<std::string>& rollout_rs_threshold, bool bypass_mode,
    const std::string& loss_type, std::optional<double> rollout_rs_threshold_lower,
    std::optional<double> rollout_token_veto_threshold) {
  const std::string k = "algorithm.rollout_correction.";
  RolloutCorrectionConfig c;
  if (rollout_token_veto_threshold) {
    VERL_CHECK(std::isfinite(*rollout_token_veto_threshold) && *rollout_token_veto_threshold > 0,
               "{}rollout_token_veto_threshold must be a positive number or null, got {}", k,
               *rollout_token_veto_threshold);
    c.token_veto_threshold = rollout_token_veto_threshold;
  }
  // verl's January names: a ratio band [lower, upper] on one statistic.
  static const std::map<std::string, std::string> kJanuary = {
      {"token", "token_k1"}, {"sequence", "seq_sum_k1"}, {"geometric", "seq_mean_k1"}};
  if (rollout_rs && kJanuary.count(*rollout_rs)) {
    VERL_CHECK(rollout_rs_threshold.has_value(), "{}rollout_rs={} needs {}rollout_rs_threshold", k,
               *rollout_rs, k);
    const double upper = parse_positive(*rollout_rs_threshold, *rollout_rs);
    const double lower = rollout_rs_threshold_lower.value_or(1.0 / upper);
    VERL_CHECK(std::isfinite(lower) && lower > 0 && lower < upper,
               "{}rollout_rs_threshold_lower must be a positive number below "
               "rollout_rs_threshold ({}), got {}",
               k, upper, lower);
    RolloutCorrectionConfig rest = parse_rollout_correction(
        rollout_is, rollout_is_threshold, rollout_is_batch_normalize, std::nullopt, std::nullopt,
        bypass_mode, loss_type, std::nullopt, rollout_token_veto_threshold);
    rest.rollout_rs.push_back({kJanuary.at(*rollout_rs), 1.0 / upper, 1.0 / lower});
    return rest;
  }
  VERL_CHECK(!rollout_rs_threshold_lower,
             "{}rollout_rs_threshold_lower goes with verl's January rollout_rs names (token, "
             "sequence, geometric); with {} give the band as 'lower_upper' in "
             "{}rollout_rs_threshold",
             k, rollout_rs ? "rollout_rs=" + *rollout_rs : std::string("rollout_rs=null"), k);
  if (rollout_is) {
    VERL_CHECK(*rollout_is == "token" || *rollout_is == "sequence",
               "{}rollout_is must be token, sequence or null, got '{}'", k, *rollout_is);
    c.rollout_is = rollout_is;
  }
  VERL_CHECK(rollout_is_threshold > 0, "{}rollout_is_threshold must be positive, got {}", k,
             rollout_is_threshold);
  c.rollout_is_threshold = rollout_is_threshold;
  c.rollout_is_batch_normalize = rollout_is_batch_normalize;
  if (rollout_rs) {
    static const std::set<std::string> kOptions = {
        "token_k1",    "token_k2",    "token_k3",    "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
        "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3"};
    std::vector<std::string> names;
    for (const std::string& o : split_list(*rollout_rs)) {
      VERL_CHECK(kOptions.count(o),
                 "{}rollout_rs: '{}' is not one of token_k1|token_k2|token_k3|seq_sum_k1|"
                 "seq_sum_k2|seq_sum_k3|seq_mean_k1|seq_mean_k2|seq_mean_k3|seq_max_k2|seq_max_k3",
                 k, o);
      if (std::find(names.begin(), names.end(), o) == names.end()) names.push_back(o);
    }
    VERL_CHECK(!names.empty(), "{}rollout_rs='{}' names no option", k, *rollout_rs);
    VERL_CHECK(rollout_rs_threshold.has_value(), "{}rollout_rs={} needs {}rollout_rs_threshold", k,
               *rollout_rs, k);
    std::vector<std::string> specs = split_list(*rollout_rs_threshold);
    VERL_CHECK(specs.size() == 1 || specs.size() == names.size(),
               "{}rollout_rs_threshold='{}': give one threshold shared by all options or one for "
               "each of the {}",
               k, *rollout_rs_threshold, names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string& spec = specs.size() == 1 ? specs[0] : specs[i];
      RolloutRsOption opt;
      opt.name = names[i];
      const size_t us = spec.find('_');
      if (opt.name.back() == '1') {
        opt.upper = parse_positive(us == std::string::npos ? spec : spec.substr(us + 1), opt.name);
        opt.lower = us == std::string::npos ? 1.0 / opt.upper
                                            : parse_positive(spec.substr(0, us), opt.name);
      } else {
        VERL_CHECK(us == std::string::npos,
                   "{}rollout_rs_threshold: option {} takes one upper bound, not '{}'", k, opt.name,
                   spec);
        opt.upper = parse_positive(spec, opt.name);
      }
      c.rollout_rs.push_back(opt);
    }
  }
  c.bypass_mode = bypass_mode;
  VERL_CHECK(loss_type == "ppo_clip" || loss_type == "reinforce",
             "{}loss_type must be ppo_clip or reinforce, got '{}'", k, loss_type);
  c.loss_type = loss_type;
  return c;
}

RolloutCorrectionOutput compute_rollout_correction(Shape s, std::span<const float> old_log_prob,
                                                   std::span<const float> rollout_log_prob,
                                                   std::span<const float> response_mask,
                                                   const RolloutCorrectionConfig& cfg) {
  const auto n = static_cast<size_t>(s.numel());
  VERL_CHECK(old_log_prob.size() == n && rollout_log_prob.size() == n && response_mask.size() == n,
             "compute_rollout_correction: old_log_prob ({}), rollout_log_prob ({}) and "
             "response_mask ({}) must hold "
             "[{}, {}] values",
             old_log_prob.size(), rollout_log_prob.size(), response_mask.size(), s.batch, s.length);
  const Masked mk{s, response_mask};
  VERL_CHECK(mk.count() > 0, "compute_rollout_correction: the response mask holds no token");
  std::vector<double> lr(n);
  for (size_t i = 0; i < n; ++i) lr[i] = double(old_log_prob[i]) - double(rollout_log_prob[i]);
  RolloutCorrectionOutput out;
  std::map<std::string, double> m;
  if (cfg.rollout_is) is_weights(mk, lr, cfg, out.rollout_is_weights, m);
  if (!cfg.rollout_rs.empty()) {
    rejection(mk, lr, cfg, out.response_mask, m);
  } else {
    out.response_mask.assign(response_mask.begin(), response_mask.end());
  }
  if (cfg.token_veto_threshold) token_veto(mk, lr, *cfg.token_veto_threshold, out.response_mask, m);
  offpolicy_metrics(mk, old_log_prob, rollout_log_prob, m);
  for (auto& [key, v] : m) out.metrics["rollout_corr/" + key] = v;
  return out;
}

}  // namespace verl::trainer
