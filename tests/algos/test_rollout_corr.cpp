// Rollout correction (src/trainer/rollout_corr.h) on one hand-made batch of two responses (3 and 2
// tokens). lr = old - rollout = [[0.2, 0, -1], [0, -1]]; the expected values are verl's
// rollout_corr_helper.compute_rollout_correction_and_rejection_mask on the same float64 inputs
// (ours are float32, hence the 1e-6 tolerance). Hand checks: token weights exp(lr) truncated at
// 1.2 -> [1.2, 1, e^-1], [1, e^-1]; sequence weights exp(-0.8), exp(-1) normalised by their
// mean over the two sequences; token_k1 keeps -lr within [log 0.5, log 1.5], which rejects the
// tokens with lr = -1.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "trainer/rollout_corr.h"

namespace verl::trainer {
namespace {

const std::vector<float> kOld = {-1.0f, -0.5f, -2.0f, -0.3f, -1.2f, 0.0f};
const std::vector<float> kRollout = {-1.2f, -0.5f, -1.0f, -0.3f, -0.2f, 0.0f};
const std::vector<float> kMask = {1, 1, 1, 1, 1, 0};
constexpr Shape kShape{2, 3};

RolloutCorrectionConfig config(std::optional<std::string> is, double thr, bool norm,
                               std::optional<std::string> rs, std::optional<std::string> rs_thr) {
  return parse_rollout_correction(is, thr, norm, rs, rs_thr, false, "ppo_clip");
}

void expect_metrics(const std::map<std::string, double>& got,
                    const std::vector<std::pair<std::string, double>>& want) {
  for (const auto& [k, v] : want) {
    auto it = got.find("rollout_corr/" + k);
    ASSERT_NE(it, got.end()) << k;
    EXPECT_NEAR(it->second, v, 1e-6 + 1e-6 * std::fabs(v)) << k;
  }
}

// verl's compute_offpolicy_metrics for this batch (every mode reports them).
const std::vector<std::pair<std::string, double>> kOffPolicy = {
    {"chi2_seq", -0.831384099384366},      {"chi2_token", -0.24750094868209893},
    {"k3_kl", 0.15143232779774626},        {"kl", 0.35999999928000004},
    {"log_ppl_abs_diff", 0.3833333316388}, {"log_ppl_diff", 0.38333333163888883},
    {"log_ppl_diff_max", 0.4999999975},    {"log_ppl_diff_min", 0.26666666577777765},
    {"ppl_ratio", 1.4771632187413695},     {"rollout_log_ppl", 0.574999997875},
    {"rollout_ppl", 1.8718142594304252},   {"training_log_ppl", 0.9583333295138889},
    {"training_ppl", 2.6641352696696057},
};

TEST(RolloutCorrection, TokenWeightsTruncated) {
  const RolloutCorrectionOutput o = compute_rollout_correction(kShape, kOld, kRollout, kMask,
                                                               config("token", 1.2, false, {}, {}));
  const std::vector<double> want = {1.2, 1.0, std::exp(-1.0), 1.0, std::exp(-1.0), 0.0};
  ASSERT_EQ(o.rollout_is_weights.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(o.rollout_is_weights[i], want[i], 1e-6) << i;
  EXPECT_EQ(o.response_mask, kMask);
  expect_metrics(o.metrics, kOffPolicy);
  expect_metrics(o.metrics, {{"rollout_is_eff_sample_size", 0.9809480163537971},
                             {"rollout_is_max", 1.2214027581601699},
                             {"rollout_is_mean", 0.7914323265177463},
                             {"rollout_is_min", 0.36787944117144233},
                             {"rollout_is_ratio_fraction_high", 0.2},
                             {"rollout_is_ratio_fraction_low", 0.4},
                             {"rollout_is_seq_fraction_high", 0.0},
                             {"rollout_is_seq_fraction_low", 0.5},
                             {"rollout_is_seq_max", 0.8630940635668904},
                             {"rollout_is_seq_max_deviation", 0.31606028283397736},
                             {"rollout_is_seq_mean", 0.7735168903664565},
                             {"rollout_is_seq_min", 0.6839397171660226},
                             {"rollout_is_seq_std", 0.12668125321909737},
                             {"rollout_is_std", 0.13564660651101976}});
}

TEST(RolloutCorrection, SequenceWeightsBatchNormalized) {
  const RolloutCorrectionOutput o = compute_rollout_correction(
      kShape, kOld, kRollout, kMask, config("sequence", 2.0, true, {}, {}));
  const double w0 = std::exp(-0.8), w1 = std::exp(-1.0), mean = (w0 + w1) / 2;
  const std::vector<double> want = {w0 / mean, w0 / mean, w0 / mean, w1 / mean, w1 / mean, 0.0};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(o.rollout_is_weights[i], want[i], 1e-6) << i;
  expect_metrics(o.metrics, {{"rollout_is_batch_norm_factor", 0.4086042009757518},
                             {"rollout_is_eff_sample_size", 1.0000000380000007},
                             {"rollout_is_max", 0.44932896411722156},
                             {"rollout_is_mean", 0.4167491541054116},
                             {"rollout_is_min", 0.36787944117144233},
                             {"rollout_is_ratio_fraction_high", 0.0},
                             {"rollout_is_ratio_fraction_low", 1.0},
                             {"rollout_is_seq_max_deviation", 0.6321205606679549},
                             {"rollout_is_seq_mean", 0.4086042009757518},
                             {"rollout_is_seq_std", 0.05759351024094151},
                             {"rollout_is_std", 2.2360679458796287e-05}});
}

TEST(RolloutCorrection, RejectionTokenAndSequence) {
  // Two options with one threshold each: token_k1 within [0.5, 1.5], seq_max_k2 at most 0.6.
  const RolloutCorrectionOutput o = compute_rollout_correction(
      kShape, kOld, kRollout, kMask, config({}, 2.0, false, "token_k1,seq_max_k2", "0.5_1.5,0.6"));
  EXPECT_TRUE(o.rollout_is_weights.empty());
  EXPECT_EQ(o.response_mask, (std::vector<float>{1, 1, 0, 1, 0, 0}));
  expect_metrics(o.metrics, kOffPolicy);
  expect_metrics(o.metrics, {{"rollout_rs_masked_fraction", 0.4},
                             {"rollout_rs_seq_masked_fraction", 1.0},
                             {"rollout_rs_seq_max_k2_masked_fraction", 0.0},
                             {"rollout_rs_seq_max_k2_max", 0.5},
                             {"rollout_rs_seq_max_k2_mean", 0.5},
                             {"rollout_rs_seq_max_k2_std", 2.2360679458796287e-05},
                             {"rollout_rs_token_k1_fraction_high", 0.4},
                             {"rollout_rs_token_k1_masked_fraction", 0.4},
                             {"rollout_rs_token_k1_max", 1.0},
                             {"rollout_rs_token_k1_mean", 0.36},
                             {"rollout_rs_token_k1_min", -0.2},
                             {"rollout_rs_token_k1_seq_fraction_high", 0.5},
                             {"rollout_rs_token_k1_seq_masked_fraction", 1.0},
                             {"rollout_rs_token_k1_seq_mean", 0.38333333163888894},
                             {"rollout_rs_token_k1_seq_std", 0.1649915811376335},
                             {"rollout_rs_token_k1_std", 0.24255175180982946}});
  // A sequence-level mean of k3 above 0.1 rejects both sequences whole.
  const RolloutCorrectionOutput s = compute_rollout_correction(
      kShape, kOld, kRollout, kMask, config({}, 2.0, false, "seq_mean_k3", "0.1"));
  EXPECT_EQ(s.response_mask, (std::vector<float>(6, 0.0f)));
  expect_metrics(s.metrics, {{"rollout_rs_seq_mean_k3_max", 0.18393971966602257},
                             {"rollout_rs_seq_mean_k3_min", 0.12976073267800164},
                             {"rollout_rs_seq_mean_k3_mean", 0.15143232717034538},
                             {"rollout_rs_seq_mean_k3_seq_std", 0.03831032909704732}});
}

// verl's January spelling (rollout_corr_helper.py before verl commit 97eac9048): rollout_rs token |
// sequence | geometric keeps the ratio exp(lr) of each token / exp(sum lr) / exp(mean lr) within
// [rollout_rs_threshold_lower, rollout_rs_threshold]; rollout_token_veto_threshold rejects a whole
// sequence holding a token with exp(lr) below it. Hand checks on lr = [[0.2, 0, -1], [0, -1]].
TEST(RolloutCorrection, JanuarySpellingRatioBandsAndVeto) {
  auto jan = [](std::optional<std::string> rs, const std::string& upper,
                std::optional<double> lower, std::optional<double> veto) {
    return parse_rollout_correction({}, 2.0, false, rs, upper, false, "ppo_clip", lower, veto);
  };
  // An asymmetric band tells the ratio from its reciprocal: [0.3, 1.1] rejects e^0.2 = 1.22 and
  // keeps e^-1 = 0.37 (the band read on -lr would do the opposite).
  RolloutCorrectionOutput o =
      compute_rollout_correction(kShape, kOld, kRollout, kMask, jan("token", "1.1", 0.3, {}));
  EXPECT_EQ(o.response_mask, (std::vector<float>{0, 1, 1, 1, 1, 0}));
  // sequence: exp(-0.8) = 0.449 kept, exp(-1) = 0.368 rejected by [0.4, 2].
  o = compute_rollout_correction(kShape, kOld, kRollout, kMask, jan("sequence", "2", 0.4, {}));
  EXPECT_EQ(o.response_mask, (std::vector<float>{1, 1, 1, 0, 0, 0}));
  // geometric: exp(-0.267) = 0.766 kept, exp(-0.5) = 0.607 rejected by [0.7, 1.5].
  o = compute_rollout_correction(kShape, kOld, kRollout, kMask, jan("geometric", "1.5", 0.7, {}));
  EXPECT_EQ(o.response_mask, (std::vector<float>{1, 1, 1, 0, 0, 0}));
  // Without a lower bound it is 1 / upper: [0.5, 2] on tokens rejects both e^-1.
  o = compute_rollout_correction(kShape, kOld, kRollout, kMask, jan("token", "2", {}, {}));
  EXPECT_EQ(o.response_mask, (std::vector<float>{1, 1, 0, 1, 0, 0}));
  // The veto at 0.5 (log 0.5 = -0.69 > -1) rejects both rows whole; at 0.3 none.
  o = compute_rollout_correction(kShape, kOld, kRollout, kMask, jan(std::nullopt, "2", {}, 0.5));
  EXPECT_EQ(o.response_mask, (std::vector<float>(6, 0.0f)));
  expect_metrics(o.metrics, {{"rollout_is_veto_fraction", 1.0},
                             {"rollout_is_catastrophic_token_fraction", 0.4}});
  expect_metrics(o.metrics, kOffPolicy);
  o = compute_rollout_correction(kShape, kOld, kRollout, kMask, jan(std::nullopt, "2", {}, 0.3));
  EXPECT_EQ(o.response_mask, kMask);
  expect_metrics(o.metrics, {{"rollout_is_veto_fraction", 0.0},
                             {"rollout_is_catastrophic_token_fraction", 0.0}});
  // With a band: a veto that catches nothing leaves the band's mask, one that does rejects the
  // rows.
  o = compute_rollout_correction(kShape, kOld, kRollout, kMask, jan("token", "1.1", 0.3, 0.3));
  EXPECT_EQ(o.response_mask, (std::vector<float>{0, 1, 1, 1, 1, 0}));
  o = compute_rollout_correction(kShape, kOld, kRollout, kMask, jan("token", "1.1", 0.3, 0.5));
  EXPECT_EQ(o.response_mask, (std::vector<float>(6, 0.0f)));
  EXPECT_TRUE(jan(std::nullopt, "2", {}, 0.5).corrects());
}

TEST(RolloutCorrection, ConfigErrorsNameTheKey) {
  auto msg = [](auto f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg([] { config("tokens", 2, false, {}, {}); }).find("rollout_correction.rollout_is"),
            std::string::npos);
  EXPECT_NE(msg([] { config({}, 2, false, "token_k4", "2"); }).find("rollout_rs"),
            std::string::npos);
  EXPECT_NE(msg([] { config({}, 2, false, "token_k1", {}); }).find("rollout_rs_threshold"),
            std::string::npos);
  EXPECT_NE(msg([] { config({}, 2, false, "token_k2", "0.5_2"); }).find("one upper bound"),
            std::string::npos);
  EXPECT_NE(msg([] {
              config({}, 2, false, "token_k1,token_k2,seq_sum_k3", "1,2");
            }).find("one threshold"),
            std::string::npos);
  auto jan = [](std::optional<std::string> rs, std::optional<double> lower,
                std::optional<double> veto) {
    parse_rollout_correction({}, 2, false, rs, "2", false, "ppo_clip", lower, veto);
  };
  EXPECT_NE(msg([&] { jan("token_k1", 0.5, {}); }).find("rollout_rs_threshold_lower goes with"),
            std::string::npos);
  EXPECT_NE(msg([&] { jan("token", 3.0, {}); }).find("rollout_rs_threshold_lower must be"),
            std::string::npos);
  EXPECT_NE(msg([&] { jan({}, {}, -1.0); }).find("rollout_token_veto_threshold"),
            std::string::npos);
  // A k1 bound alone is the upper one; the lower is its reciprocal. Duplicates are dropped.
  const RolloutCorrectionConfig c = config({}, 2, false, "token_k1, token_k1", "4");
  ASSERT_EQ(c.rollout_rs.size(), 1u);
  EXPECT_DOUBLE_EQ(c.rollout_rs[0].lower, 0.25);
  EXPECT_DOUBLE_EQ(c.rollout_rs[0].upper, 4.0);
}

}  // namespace
}  // namespace verl::trainer
