// The [B, L] layout's masked reductions and verl's loss aggregation; formulas follow
// verl/utils/torch_functional.py (masked_mean, masked_var, masked_whiten) and
// verl/trainer/ppo/core_algos.py (agg_loss); see aggregation.h.
#include "trainer/algos/aggregation.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "trainer/algos/internal.h"

namespace verl::trainer {

using detail::check_size;

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
// Loss aggregation.

namespace {
struct ModeName {
  LossAggMode value;
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
  return detail::entry_named(kModes, name, "loss_agg_mode", "mode").value;
}

std::string_view to_string(LossAggMode m) {
  return detail::name_of(kModes, m);
}

std::vector<float> agg_loss_weights(Shape s, std::span<const float> loss_mask, LossAggMode mode,
                                    const AggNorm& norm) {
  const char* fn = "agg_loss";
  detail::check_matrices(s, fn, {{"loss_mask", loss_mask}});
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

double agg_loss(Shape s, std::span<const float> loss_mat, std::span<const float> loss_mask,
                LossAggMode mode, const AggNorm& norm) {
  check_size(loss_mat, s.numel(), "loss_mat", "agg_loss");
  std::vector<float> w = agg_loss_weights(s, loss_mask, mode, norm);
  return detail::weighted_sum(w, loss_mat);
}

}  // namespace verl::trainer
