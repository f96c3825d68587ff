// Rollout correction (algorithm.rollout_correction.*, verl/trainer/ppo/rollout_corr_helper.py):
// importance weights between the policy that trained and the one that sampled (the rollout's own
// log-probs), truncated at a threshold; rejection sampling that masks tokens or whole sequences
// whose divergence passes a bound; and verl's off-policy diagnostics, all as rollout_corr/*.
// Notation per token: lr = log pi_train - log pi_rollout ([B, L]), masked by the response mask.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "trainer/core_algos.h"

namespace verl::trainer {

// One rejection criterion of rollout_rs ("token_k1", "seq_mean_k3", ...). k1 options keep
// -lr (or its sequence sum / mean) within [log lower, log upper]; k2 / k3 keep the divergence
// (0.5 lr^2, exp(lr) - 1 - lr; per token, or a sequence's sum / mean / max) at most upper.
struct RolloutRsOption {
  std::string name;
  double lower = 0, upper = 0;  // lower only for k1
};

struct RolloutCorrectionConfig {
  std::optional<std::string> rollout_is;  // "token" | "sequence"; nullopt: no weights
  double rollout_is_threshold = 2.0;
  bool rollout_is_batch_normalize = false;
  std::vector<RolloutRsOption> rollout_rs;  // empty: no rejection
  bool bypass_mode = false;                 // old_log_prob := the rollout's log-probs
  std::string loss_type = "ppo_clip";       // bypass mode's loss: ppo_clip | reinforce
  // verl's January rollout_token_veto_threshold: a sequence holding any response token whose
  // ratio pi_train / pi_rollout is below it is rejected whole, after rollout_rs.
  std::optional<double> token_veto_threshold;
  // Weights, rejection or a veto asked for (without them verl still reports the diagnostics).
  bool corrects() const {
    return rollout_is.has_value() || !rollout_rs.empty() || token_veto_threshold.has_value();
  }
};

// Parses the keys as verl does: rollout_rs is a comma list (duplicates dropped) of token_k1..3,
// seq_sum_k1..3, seq_mean_k1..3, seq_max_k2..3; rollout_rs_threshold one spec shared by all or one
// per option, "lower_upper" or a number for k1 (lower = 1 / upper), a number for k2 / k3. Errors
// name the algorithm.rollout_correction.* key.
// verl's January 2026 spelling (rollout_corr_helper.py before verl commit 97eac9048) is read too:
// rollout_rs token | sequence | geometric kept the ratio exp(lr) of each token, of the sequence's
// sum or of its mean within [rollout_rs_threshold_lower (default 1 / upper), rollout_rs_threshold];
// as -lr is k1, that is token_k1 / seq_sum_k1 / seq_mean_k1 within [1 / upper, 1 / lower]. And
// rollout_token_veto_threshold (token_veto_threshold above).
RolloutCorrectionConfig parse_rollout_correction(
    const std::optional<std::string>& rollout_is, double rollout_is_threshold,
    bool rollout_is_batch_normalize, const std::optional<std::string>& rollout_rs,
    const std::optional<std::string>& rollout_rs_threshold, bool bypass_mode,
    const std::string& loss_type, std::optional<double> rollout_rs_threshold_lower = std::nullopt,
    std::optional<double> rollout_token_veto_threshold = std::nullopt);

struct RolloutCorrectionOutput {
  std::vector<float>
      rollout_is_weights;  // [B, L], truncated (zero off the mask); empty without rollout_is
  std::vector<float> response_mask;       // [B, L], rejected tokens zeroed
  std::map<std::string, double> metrics;  // rollout_corr/<verl's name>
};

// verl's compute_rollout_correction_and_rejection_mask with old_log_prob the training policy's:
// token IS weights exp(clamp(lr, +-20)), sequence ones exp(clamp(sum_t lr, +-20)) on every token
// of the row, metrics taken before truncation at rollout_is_threshold, then (batch_normalize)
// divided by their mean; rejection per option (all must pass); the veto (rollout_corr/
// rollout_is_veto_fraction, rollout_is_catastrophic_token_fraction); and the off-policy metrics
// (kl, k3_kl, ppl, log_ppl_diff, chi2). At least one response token is required.
RolloutCorrectionOutput compute_rollout_correction(Shape s, std::span<const float> old_log_prob,
                                                   std::span<const float> rollout_log_prob,
                                                   std::span<const float> response_mask,
                                                   const RolloutCorrectionConfig& cfg);

}  // namespace verl::trainer
