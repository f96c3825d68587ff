// Tests of verl's core algorithms (src/trainer/core_algos.*): every advantage estimator, KL type,
// controller, aggregation mode and loss against numbers worked out by hand from verl's formulas
// (the arithmetic is in the comments), and every loss gradient against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "core/error.h"
#include "trainer/core_algos.h"

namespace verl::trainer {
namespace {

using Vec = std::vector<float>;

void expect_near_vec(const Vec& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::abs(want[i]))) << "element " << i;
}

// ---------------------------------------------------------------------------------------------
// Masked reductions.

TEST(MaskedOps, MeanVarWhiten) {
  Vec v = {1, 2, 3, 4, 100}, m = {1, 1, 1, 1, 0};
  // mean = 10 / (4 + 1e-8); biased var = (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25; unbiased 5/3.
  EXPECT_NEAR(masked_sum(v, m), 10.0, 1e-12);
  EXPECT_NEAR(masked_mean(v, m), 2.5, 1e-7);
  EXPECT_NEAR(masked_var(v, m, false), 1.25, 1e-7);
  EXPECT_NEAR(masked_var(v, m, true), 5.0 / 3.0, 1e-7);
  // (x - 2.5) / sqrt(5/3 + 1e-8); the masked element is whitened too (verl does not re-mask).
  expect_near_vec(masked_whiten(v, m), {-1.1618950, -0.3872983, 0.3872983, 1.1618950, 75.523175},
                  1e-5);
  expect_near_vec(
      masked_whiten(v, m, false),
      {-1.1618950 + 2.5, -0.3872983 + 2.5, 0.3872983 + 2.5, 1.1618950 + 2.5, 75.523175 + 2.5},
      1e-5);
  // verl raises on an unbiased variance over 0 or 1 tokens.
  Vec one = {0, 0, 1, 0, 0}, none = {0, 0, 0, 0, 0};
  EXPECT_THROW(masked_var(v, one), Error);
  EXPECT_THROW(masked_whiten(v, none), Error);
  EXPECT_NEAR(masked_mean(v, none), 0.0, 1e-12);  // 0 / (0 + 1e-8)
}

TEST(MaskedOps, MaskFromLengths) {
  std::vector<int64_t> lens = {3, 0, 1};
  Vec m = response_mask_from_lengths(lens, 3);
  EXPECT_EQ(m, (Vec{1, 1, 1, 0, 0, 0, 1, 0, 0}));
  std::vector<int64_t> bad = {4};
  EXPECT_THROW(response_mask_from_lengths(bad, 3), Error);
}

// ---------------------------------------------------------------------------------------------
// Advantage estimators.

TEST(Advantages, Gae) {
  // B = 3, L = 3; gamma 0.9, lam 0.8 (gamma * lam = 0.72).
  // Row 0 (mask 111): A2 = 1 - 0.1 = 0.9; A1 = (0.9*0.1 - 0.2) + 0.72*0.9 = 0.538;
  //   A0 = (0.9*0.2 - 0.5) + 0.72*0.538 = 0.06736.
  // Row 1 (mask 110, the value 9 in the padding slot is never used): A2 = 0 (nothing yet);
  //   A1 = 1 - 0.6 = 0.4; A0 = 0.9*0.6 - 0.3 + 0.72*0.4 = 0.528.
  // Row 2 (mask 101, an observation token in the middle is skipped): A2 = 2 - 0.2 = 1.8; the
  //   masked slot carries A = 1.8 and V_next = 0.2; A0 = 0.5 + 0.9*0.2 - 0.4 + 0.72*1.8 = 1.576.
  Shape s{3, 3};
  Vec r = {0, 0, 1, 0, 1, 0, 0.5f, 0, 2}, v = {0.5f, 0.2f, 0.1f, 0.3f, 0.6f, 9, 0.4f, 7, 0.2f};
  Vec m = {1, 1, 1, 1, 1, 0, 1, 0, 1};
  AdvantageOutput out = compute_gae_advantage_return(s, r, v, m, 0.9, 0.8);
  // returns = raw A + V (on every slot).
  expect_near_vec(out.returns, {0.56736, 0.738, 1.0, 0.828, 1.0, 9.0, 1.976, 8.8, 2.0}, 1e-6);
  // Whitened over the 7 masked slots (mean and unbiased variance of the raw A there).
  expect_near_vec(out.advantages,
                  {-1.1944741, -0.4572525, 0.1097929, -0.4729167, -0.6734189, -1.2999884, 1.1686952,
                   1.5195741, 1.5195741},
                  1e-5);
}

TEST(Advantages, Grpo) {
  // Groups: uid 7 -> rows 0, 1, 2 with scores 1, 0, 1 (a reward in a padding slot still counts:
  // verl sums the whole row); uid 3 -> row 3 alone with score 0.5; uid 5 -> rows 4, 5 tied at 2.
  Shape s{6, 2};
  Vec r = {0, 1, 0, 0, 1, 0, 0, 0.5f, 0, 2, 2, 0};
  Vec m = {1, 1, 1, 0, 1, 0, 1, 1, 1, 1, 1, 0};
  std::vector<int64_t> idx = {7, 7, 7, 3, 5, 5};
  AdvantageOutput out = compute_grpo_outcome_advantage(s, r, m, idx);
  // uid 7: mean 2/3, unbiased std sqrt((1/9 + 4/9 + 1/9) / 2) = sqrt(1/3) = 0.5773503.
  const double sd = std::sqrt(1.0 / 3.0);
  const double a_hi = (1.0 / 3.0) / (sd + 1e-6), a_lo = (-2.0 / 3.0) / (sd + 1e-6);
  // uid 3 alone: mean 0, std 1 -> 0.5 / (1 + 1e-6). uid 5: std 0 -> 0 / 1e-6 = 0.
  const double a_one = 0.5 / (1 + 1e-6);
  expect_near_vec(out.advantages, {a_hi, a_hi, a_lo, 0, a_hi, 0, a_one, a_one, 0, 0, 0, 0}, 1e-6);
  EXPECT_EQ(out.returns, out.advantages);
  EXPECT_NEAR(a_hi, 0.5773493, 1e-6);  // the numbers themselves
  EXPECT_NEAR(a_lo, -1.1546985, 1e-6);

  // Dr.GRPO (norm_adv_by_std_in_grpo = false): score - mean only.
  AdvantageOutput dr = compute_grpo_outcome_advantage(s, r, m, idx, 1e-6, false);
  expect_near_vec(dr.advantages, {1.0 / 3, 1.0 / 3, -2.0 / 3, 0, 1.0 / 3, 0, 0.5, 0.5, 0, 0, 0, 0},
                  1e-6);
}

TEST(Advantages, Rloo) {
  // uid 1: scores 1, 0, 1 -> score - mean of the others: 1 - 0.5, 0 - 1, 1 - 0.5 (= 1.5 * (s -
  // 2/3)). uid 2: alone, keeps its score 0.25.
  Shape s{4, 2};
  Vec r = {0, 1, 0, 0, 1, 0, 0.25f, 0};
  Vec m = {1, 1, 1, 1, 1, 0, 1, 1};
  std::vector<int64_t> idx = {1, 1, 1, 2};
  AdvantageOutput out = compute_rloo_outcome_advantage(s, r, m, idx);
  expect_near_vec(out.advantages, {0.5, 0.5, -1, -1, 0.5, 0, 0.25, 0.25}, 1e-6);
}

TEST(Advantages, ReinforcePlusPlus) {
  // gamma 0.5. Row 0 (mask 1110): G = [0.25, 0.5, 1, 0]. Row 1 (mask 1100): the reward 2 sits in
  // padding: G2 = 2, then reset (mask 0) so G1 = 0 + 0.5 * 0 = 0, G0 = 1. returns = G.
  Shape s{2, 4};
  Vec r = {0, 0, 1, 0, 1, 0, 2, 0};
  Vec m = {1, 1, 1, 0, 1, 1, 0, 0};
  AdvantageOutput out = compute_reinforce_plus_plus_outcome_advantage(s, r, m, 0.5);
  expect_near_vec(out.returns, {0.25, 0.5, 1, 0, 1, 0, 2, 0}, 1e-7);
  // Whitened over the 5 masked slots {0.25, 0.5, 1, 1, 0}: mean 0.55, unbiased var
  // (0.09 + 0.0025 + 0.2025 + 0.2025 + 0.3025) / 4 = 0.2, then times the mask.
  const double inv = 1 / std::sqrt(0.2 + 1e-8);
  expect_near_vec(out.advantages,
                  {-0.3 * inv, -0.05 * inv, 0.45 * inv, 0, 0.45 * inv, -0.55 * inv, 0, 0}, 1e-5);
  EXPECT_NEAR(out.advantages[0], -0.6708204, 1e-5);
}

TEST(Advantages, ReinforcePlusPlusBaseline) {
  // uid 1: rows 0, 1 with scores 1 and 3 -> centered -1, +1; uid 2: row 2 alone, score 5 (mean 0).
  // Tiled times the mask: {-1, -1, 1, 0, 5, 5}; whitened over the 5 masked slots (mean 1.8,
  // unbiased var (7.84*2 + 0.64 + 10.24*2) / 4 = 9.2), times the mask.
  Shape s{3, 2};
  Vec r = {0, 1, 0, 3, 0, 5};
  Vec m = {1, 1, 1, 0, 1, 1};
  std::vector<int64_t> idx = {1, 1, 2};
  AdvantageOutput out = compute_reinforce_plus_plus_baseline_outcome_advantage(s, r, m, idx);
  const double inv = 1 / std::sqrt(9.2 + 1e-8);
  expect_near_vec(out.advantages, {-2.8 * inv, -2.8 * inv, -0.8 * inv, 0, 3.2 * inv, 3.2 * inv},
                  1e-5);
  EXPECT_NEAR(out.advantages[0], -0.9231327, 1e-5);
}

TEST(Advantages, Remax) {
  // returns = reverse cumsum of r * mask; A = returns - baseline * mask.
  Shape s{2, 3};
  Vec r = {0.5f, 0, 1, 0, 2, 7};  // the 7 sits in padding and is masked out
  Vec m = {1, 1, 1, 1, 1, 0};
  Vec base = {0.25f, 1.0f};
  AdvantageOutput out = compute_remax_outcome_advantage(s, r, base, m);
  expect_near_vec(out.returns, {1.5, 1, 1, 2, 2, 0}, 1e-7);
  expect_near_vec(out.advantages, {1.25, 0.75, 0.75, 1, 1, 0}, 1e-7);
}

TEST(Advantages, DispatchByName) {
  EXPECT_EQ(parse_adv_estimator("grpo"), AdvantageEstimator::GRPO);
  EXPECT_EQ(parse_adv_estimator("reinforce_plus_plus_baseline"),
            AdvantageEstimator::ReinforcePlusPlusBaseline);
  EXPECT_EQ(to_string(AdvantageEstimator::ReMax), "remax");
  try {
    parse_adv_estimator("ppo2");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'ppo2'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("rloo"), std::string::npos);
  }
  Shape s{4, 2};
  Vec r = {0, 1, 0, 0, 1, 0, 0.25f, 0}, m = {1, 1, 1, 1, 1, 0, 1, 1};
  std::vector<int64_t> idx = {1, 1, 1, 2};
  AdvantageInputs in;
  in.shape = s;
  in.token_level_rewards = r;
  in.response_mask = m;
  in.index = idx;
  AdvantageOutput a = compute_advantage(AdvantageEstimator::RLOO, in);
  EXPECT_NEAR(a.advantages[2], -1.0, 1e-6);
  // An estimator missing its inputs is an error naming what is wrong, not a crash.
  EXPECT_THROW(compute_advantage(AdvantageEstimator::GAE, in), Error);
}

// ---------------------------------------------------------------------------------------------
// KL estimators and controllers.

TEST(Kl, EstimatorValues) {
  // logprob -1, ref -1.5: d = 0.5. k3: x = ref - logprob = -0.5, e^-0.5 + 0.5 - 1 = 0.1065307.
  EXPECT_NEAR(kl_penalty(-1.0, -1.5, parse_kl_type("kl")), 0.5, 1e-12);
  EXPECT_NEAR(kl_penalty(-1.0, -1.5, parse_kl_type("k1")), 0.5, 1e-12);
  EXPECT_NEAR(kl_penalty(-1.5, -1.0, parse_kl_type("abs")), 0.5, 1e-12);
  EXPECT_NEAR(kl_penalty(-1.0, -1.5, parse_kl_type("mse")), 0.125, 1e-12);
  EXPECT_NEAR(kl_penalty(-1.0, -1.5, parse_kl_type("k2")), 0.125, 1e-12);
  EXPECT_NEAR(kl_penalty(-1.0, -1.5, parse_kl_type("low_var_kl")), 0.1065307, 1e-7);
  EXPECT_NEAR(kl_penalty(-1.0, -1.5, parse_kl_type("k3")), 0.1065307, 1e-7);
  // k3 at x = 2: e^2 - 3 = 4.3890561; at x = 3: e^3 - 4 = 16.09 clamps to 10; x = 30 is first
  // clamped to 20, then the value to 10; x = -30 -> -20 -> e^-20 + 19 -> 10.
  EXPECT_NEAR(kl_penalty(0.0, 2.0, parse_kl_type("k3")), 4.3890561, 1e-6);
  EXPECT_EQ(kl_penalty(0.0, 3.0, parse_kl_type("k3")), 10.0);
  EXPECT_EQ(kl_penalty(-30.0, 0.0, parse_kl_type("k3")), 10.0);
  EXPECT_EQ(kl_penalty(0.0, -30.0, parse_kl_type("k3")), 10.0);
  EXPECT_EQ(kl_penalty_grad(0.0, 3.0, parse_kl_type("k3")), 0.0);  // clamped: no gradient
  // "+" keeps the value of the base estimator and takes k2's gradient d = logprob - ref.
  for (const char* name : {"k1+", "kl+", "abs+", "k3+", "low_var_kl+"}) {
    std::string base_name = name;
    base_name.pop_back();
    KlType plus = parse_kl_type(name), base = parse_kl_type(base_name);
    EXPECT_TRUE(plus.straight_through) << name;
    EXPECT_EQ(kl_penalty(-1.0, -1.5, plus), kl_penalty(-1.0, -1.5, base)) << name;
    EXPECT_NEAR(kl_penalty_grad(-1.0, -1.5, plus), 0.5, 1e-12) << name;
    EXPECT_NEAR(kl_penalty_grad(-2.0, -1.5, plus), -0.5, 1e-12) << name;
  }
  EXPECT_FALSE(parse_kl_type("k2+").straight_through);
  EXPECT_EQ(to_string(parse_kl_type("k3+")), "low_var_kl+");
  EXPECT_THROW(parse_kl_type("full"), Error);
  EXPECT_THROW(parse_kl_type("k4"), Error);
}

TEST(Kl, EstimatorGradientsByFiniteDifferences) {
  const double h = 1e-6;
  for (const char* name : {"kl", "abs", "mse", "low_var_kl"}) {
    KlType t = parse_kl_type(name);
    for (double lp : {-2.3, -1.0, -0.2}) {
      for (double ref : {-1.7, -0.6, -0.05}) {
        double fd = (kl_penalty(lp + h, ref, t) - kl_penalty(lp - h, ref, t)) / (2 * h);
        EXPECT_NEAR(kl_penalty_grad(lp, ref, t), fd, 1e-6) << name << " " << lp << " " << ref;
      }
    }
  }
}

TEST(Kl, AdaptiveController) {
  // init 0.1, target 0.05, horizon 1000.
  KlController c = KlController::adaptive(0.1, 0.05, 1000);
  // err = clip(0.08/0.05 - 1 = 0.6, +-0.2) = 0.2; *= 1 + 0.2 * 64/1000 -> 0.10128.
  c.update(0.08, 64);
  EXPECT_NEAR(c.value(), 0.10128, 1e-12);
  // err = 0.045/0.05 - 1 = -0.1; *= 1 - 0.1 * 64/1000 = 0.9936 -> 0.100631808.
  c.update(0.045, 64);
  EXPECT_NEAR(c.value(), 0.100631808, 1e-12);
  // err = -1 clipped to -0.2; *= 1 - 0.2 * 100/1000 = 0.98 -> 0.09861917184.
  c.update(0.0, 100);
  EXPECT_NEAR(c.value(), 0.09861917184, 1e-12);

  KlController f = KlController::from_config("fixed", 0.2, 0.05, 1000);
  f.update(10.0, 64);
  EXPECT_EQ(f.value(), 0.2);
  EXPECT_THROW(KlController::from_config("adaptive", 0.1, 0.05, 0), Error);
  EXPECT_THROW(KlController::from_config("pid", 0.1, 0.05, 1000), Error);
}

TEST(Kl, ApplyKlPenaltyInReward) {
  // k1, beta 0.5. Row 0 (mask 11): kl = {0.2, -0.4}; row 1 (mask 10): kl = {0.6, masked}.
  // rewards = scores - 0.5 * kl * mask; current_kl = mean(mean(0.2, -0.4), 0.6) = (-0.1 + 0.6)/2.
  Shape s{2, 2};
  Vec scores = {0, 1, 2, 0}, old_lp = {-1.0f, -2.0f, -0.5f, -3.0f}, ref = {-1.2f, -1.6f, -1.1f, 0};
  Vec m = {1, 1, 1, 0};
  KlController c = KlController::adaptive(0.5, 0.25, 100);
  KlInRewardOutput out = apply_kl_penalty(s, scores, old_lp, ref, m, c, parse_kl_type("kl"));
  expect_near_vec(out.token_level_rewards, {-0.1, 1.2, 1.7, 0}, 1e-6);
  EXPECT_NEAR(out.beta, 0.5, 1e-12);
  EXPECT_NEAR(out.current_kl, 0.25, 1e-6);
  // The controller was updated with n_steps = B = 2 and current_kl = target -> error 0.
  EXPECT_NEAR(c.value(), 0.5, 1e-6);
}

// ---------------------------------------------------------------------------------------------
// Aggregation.

TEST(AggLoss, Modes) {
  // B = 3, L = 4, lengths 4, 2, 0 (a fully masked response is excluded from the seq count).
  Shape s{3, 4};
  Vec loss = {1, 2, 3, 4, 10, 20, 99, 99, 5, 5, 5, 5};
  Vec m = {1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0};
  // token-mean: (1+2+3+4+10+20) / 6 = 40/6.
  EXPECT_NEAR(agg_loss(s, loss, m, LossAggMode::TokenMean), 40.0 / 6, 1e-6);
  // seq-mean-token-sum: (10 + 30) / 2.
  EXPECT_NEAR(agg_loss(s, loss, m, LossAggMode::SeqMeanTokenSum), 20.0, 1e-6);
  // seq-mean-token-mean: (10/4 + 30/2) / 2 = 8.75.
  EXPECT_NEAR(agg_loss(s, loss, m, LossAggMode::SeqMeanTokenMean), 8.75, 1e-6);
  // seq-mean-token-sum-norm: (10 + 30) / 2 / L(4) = 5.
  EXPECT_NEAR(agg_loss(s, loss, m, LossAggMode::SeqMeanTokenSumNorm), 5.0, 1e-6);
  AggNorm fixed_scale;
  fixed_scale.loss_scale_factor = 8;
  EXPECT_NEAR(agg_loss(s, loss, m, LossAggMode::SeqMeanTokenSumNorm, fixed_scale), 2.5, 1e-6);

  // Global normalisers: rank of dp 2 with 15 tokens / 5 sequences in the global batch.
  AggNorm g;
  g.dp_size = 2;
  g.batch_num_tokens = 15;
  g.global_batch_size = 5;
  EXPECT_NEAR(agg_loss(s, loss, m, LossAggMode::TokenMean, g), 40.0 / 15 * 2, 1e-6);
  EXPECT_NEAR(agg_loss(s, loss, m, LossAggMode::SeqMeanTokenSum, g), 40.0 / 5 * 2, 1e-6);
  EXPECT_NEAR(agg_loss(s, loss, m, LossAggMode::SeqMeanTokenMean, g), 17.5 / 5 * 2, 1e-6);
  EXPECT_NEAR(agg_loss(s, loss, m, LossAggMode::SeqMeanTokenSumNorm, g), 40.0 / 5 * 2 / 4, 1e-6);
  // dp > 1 without the global counts is an error (as verl raises).
  AggNorm bad;
  bad.dp_size = 2;
  EXPECT_THROW(agg_loss(s, loss, m, LossAggMode::TokenMean, bad), Error);
  EXPECT_THROW(agg_loss(s, loss, m, LossAggMode::SeqMeanTokenMean, bad), Error);
  // Nothing to average: 0, not NaN.
  Vec none(12, 0.0f);
  EXPECT_EQ(agg_loss(s, loss, none, LossAggMode::TokenMean), 0.0);
  EXPECT_EQ(agg_loss(s, loss, none, LossAggMode::SeqMeanTokenMean), 0.0);
  EXPECT_EQ(parse_loss_agg_mode("seq-mean-token-sum-norm"), LossAggMode::SeqMeanTokenSumNorm);
  EXPECT_THROW(parse_loss_agg_mode("token-sum"), Error);
}

// ---------------------------------------------------------------------------------------------
// Policy loss.

TEST(PolicyLoss, HandComputedTokens) {
  // clip_ratio_low 0.2, clip_ratio_high 0.28 (clip range [0.8, 1.28]), clip_ratio_c 3.
  // (x = logp - old, A) -> per-token loss:
  //  (0.1, 1):   r = 1.1051709 in range -> -1.1051709
  //  (0.5, 2):   r = 1.6487213 -> l1 = -3.2974, l2 = -2 * 1.28 = -2.56 -> max -2.56 (clipped)
  //  (-0.5, -1): r = 0.6065307 -> l1 = 0.6065, l2 = 0.8 -> 0.8 (clipped); dual bound 3 not hit
  //  (1.5, -0.5): r = 4.4816891 -> l1 = 2.2408, l2 = 0.64 -> 2.2408 > 1.5 = 0.5*3 -> dual-clip 1.5
  //  (0.2, -1):  r = 1.2214028 in range -> 1.2214028
  //  (25, 1):    x clamped to 20 -> l1 = -e^20, l2 = -1.28 -> -1.28 (clipped)
  // Row 0 holds the first four, row 1 the last two and two padding slots (NaN: must not leak).
  Shape s{2, 4};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Vec old_lp = {-1, -1, -1, -2, -1, -30, 0, 0};
  Vec lp = {-0.9f, -0.5f, -1.5f, -0.5f, -0.8f, -5, nan, nan};
  Vec adv = {1, 2, -1, -0.5f, -1, 1, nan, nan};
  Vec m = {1, 1, 1, 1, 1, 1, 0, 0};
  PolicyLossConfig cfg;
  cfg.clip_ratio_low = 0.2;
  cfg.clip_ratio_high = 0.28;
  PolicyLossOutput out = compute_policy_loss(s, old_lp, lp, adv, m, cfg);
  const double l[6] = {-1.1051709, -2.56, 0.8, 1.5, 1.2214028, -1.28};
  EXPECT_NEAR(out.pg_loss, (l[0] + l[1] + l[2] + l[3] + l[4] + l[5]) / 6, 1e-5);
  EXPECT_NEAR(out.pg_loss, -0.2372947, 1e-5);
  EXPECT_NEAR(out.pg_clipfrac, 3.0 / 6, 1e-6);        // tokens 1, 2, 5
  EXPECT_NEAR(out.pg_clipfrac_lower, 1.0 / 6, 1e-6);  // token 3
  EXPECT_NEAR(out.ppo_kl, -(0.1 + 0.5 - 0.5 + 1.5 + 0.2 + 20) / 6, 1e-5);
  // Gradients: only unclipped tokens move: d(-A r)/dx = -A r, times 1/6.
  expect_near_vec(out.d_log_prob, {-1.1051709 / 6, 0, 0, 0, 1.2214028 / 6, 0, 0, 0}, 1e-5);

  cfg.loss_agg_mode = LossAggMode::SeqMeanTokenMean;
  out = compute_policy_loss(s, old_lp, lp, adv, m, cfg);
  EXPECT_NEAR(out.pg_loss, ((l[0] + l[1] + l[2] + l[3]) / 4 + (l[4] + l[5]) / 2) / 2, 1e-5);
  cfg.loss_agg_mode = LossAggMode::SeqMeanTokenSumNorm;
  out = compute_policy_loss(s, old_lp, lp, adv, m, cfg);
  EXPECT_NEAR(out.pg_loss, -0.1779710, 1e-5);

  // Symmetric clip_ratio alone (0.2 both sides): token 1 now clips at 1.2 -> -2.4.
  PolicyLossConfig sym;
  out = compute_policy_loss(s, old_lp, lp, adv, m, sym);
  EXPECT_NEAR(out.pg_loss, (l[0] - 2.4 + l[2] + l[3] + l[4] - 1.2) / 6, 1e-5);
  PolicyLossConfig bad;
  bad.clip_ratio_c = 1.0;
  EXPECT_THROW(compute_policy_loss(s, old_lp, lp, adv, m, bad), Error);

  // Rollout importance weights scale the per-token losses.
  Vec isw = {2, 1, 1, 1, 1, 1, 1, 1};
  out = compute_policy_loss(s, old_lp, lp, adv, m, sym, isw);
  EXPECT_NEAR(out.pg_loss, (2 * l[0] - 2.4 + l[2] + l[3] + l[4] - 1.2) / 6, 1e-5);
}

// ---------------------------------------------------------------------------------------------
// Finite-difference checks of every loss gradient.

// A reproducible stream of picks so the inputs stay away from the losses' kinks.
struct Picker {
  uint64_t state = 0x9E3779B97F4A7C15ull;
  double uniform() {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(state >> 11) / static_cast<double>(1ull << 53);
  }
  double pick(std::initializer_list<double> xs) {
    size_t k = static_cast<size_t>(uniform() * xs.size());
    return *(xs.begin() + std::min(k, xs.size() - 1)) + 0.02 * (uniform() - 0.5);
  }
};

// Central differences of f over each masked element of x (perturbed in float, with the exact
// step used). Compares with `grad` at tolerance atol + rtol * |fd|.
void check_grad(Vec& x, const Vec& mask, const Vec& grad, const std::function<double()>& f,
                const char* what) {
  for (size_t i = 0; i < x.size(); ++i) {
    const float x0 = x[i];
    const float xp = x0 + 1e-3f, xm = x0 - 1e-3f;
    x[i] = xp;
    double fp = f();
    x[i] = xm;
    double fm = f();
    x[i] = x0;
    double fd = (fp - fm) / (static_cast<double>(xp) - static_cast<double>(xm));
    EXPECT_NEAR(grad[i], fd, 2e-4 + 2e-3 * std::abs(fd))
        << what << " element " << i << " mask " << mask[i];
  }
}

constexpr LossAggMode kModes[] = {LossAggMode::TokenMean, LossAggMode::SeqMeanTokenSum,
                                  LossAggMode::SeqMeanTokenMean, LossAggMode::SeqMeanTokenSumNorm};

TEST(Gradients, PolicyLoss) {
  Shape s{3, 5};
  std::vector<int64_t> lens = {5, 3, 1};
  Vec m = response_mask_from_lengths(lens, 5);
  Picker p;
  Vec old_lp(s.numel()), lp(s.numel()), adv(s.numel());
  for (int64_t i = 0; i < s.numel(); ++i) {
    old_lp[i] = static_cast<float>(p.pick({-2.0, -1.0, -0.3}));
    // log-ratios away from ln 0.8, ln 1.28 and ln 3 (the kinks), some far outside the clip range.
    lp[i] = old_lp[i] + static_cast<float>(p.pick({-0.6, -0.1, 0.05, 0.15, 0.5, 1.6}));
    adv[i] = static_cast<float>(p.pick({-1.3, -0.4, 0.5, 1.1}));
  }
  for (LossAggMode mode : kModes) {
    PolicyLossConfig cfg;
    cfg.clip_ratio_high = 0.28;
    cfg.loss_agg_mode = mode;
    PolicyLossOutput out = compute_policy_loss(s, old_lp, lp, adv, m, cfg);
    check_grad(
        lp, m, out.d_log_prob,
        [&] { return compute_policy_loss(s, old_lp, lp, adv, m, cfg).pg_loss; },
        to_string(mode).data());
  }
}

TEST(Gradients, EntropyKlValueAndActorLoss) {
  Shape s{3, 4};
  std::vector<int64_t> lens = {4, 2, 3};
  Vec m = response_mask_from_lengths(lens, 4);
  Picker p;
  Vec ent(s.numel()), lp(s.numel()), ref(s.numel()), old_lp(s.numel()), adv(s.numel());
  Vec vpred(s.numel()), values(s.numel()), returns(s.numel());
  for (int64_t i = 0; i < s.numel(); ++i) {
    ent[i] = static_cast<float>(p.pick({0.5, 1.5, 3.0}));
    ref[i] = static_cast<float>(p.pick({-2.0, -1.0, -0.4}));
    lp[i] = ref[i] + static_cast<float>(p.pick({-0.7, -0.2, 0.3, 0.9}));
    old_lp[i] = lp[i] - static_cast<float>(p.pick({-0.4, -0.05, 0.1, 0.6}));
    adv[i] = static_cast<float>(p.pick({-1.0, 0.7}));
    values[i] = static_cast<float>(p.pick({-0.5, 0.2, 1.0}));
    // cliprange 0.2: predictions inside and outside the band on both sides.
    vpred[i] = values[i] + static_cast<float>(p.pick({-0.5, -0.05, 0.03, 0.4}));
    returns[i] = values[i] + static_cast<float>(p.pick({-1.0, -0.1, 0.1, 1.0}));
  }
  for (LossAggMode mode : kModes) {
    const char* name = to_string(mode).data();
    LossAndGrad e = compute_entropy_loss(s, ent, m, mode);
    check_grad(
        ent, m, e.grad, [&] { return compute_entropy_loss(s, ent, m, mode).loss; }, name);

    for (const char* kl_name : {"kl", "abs", "mse", "low_var_kl"}) {
      KlType t = parse_kl_type(kl_name);
      LossAndGrad k = compute_kl_loss(s, lp, ref, m, t, mode);
      check_grad(
          lp, m, k.grad, [&] { return compute_kl_loss(s, lp, ref, m, t, mode).loss; }, kl_name);
    }

    ValueLossOutput v = compute_value_loss(s, vpred, returns, values, m, 0.2, mode);
    check_grad(
        vpred, m, v.d_vpreds,
        [&] { return compute_value_loss(s, vpred, returns, values, m, 0.2, mode).vf_loss; }, name);

    ActorLossConfig cfg;
    cfg.policy.loss_agg_mode = mode;
    cfg.entropy_coeff = 0.01;
    cfg.use_kl_loss = true;
    cfg.kl_loss_coef = 0.1;
    ActorLossOutput a = compute_actor_loss(s, old_lp, lp, adv, m, ent, ref, cfg);
    auto total = [&] {
      return compute_actor_loss(s, old_lp, lp, adv, m, ent, ref, cfg).policy_loss;
    };
    check_grad(lp, m, a.d_log_prob, total, name);
    check_grad(ent, m, a.d_entropy, total, name);
    EXPECT_NEAR(a.policy_loss, a.pg_loss - 0.01 * a.entropy_loss + 0.1 * a.kl_loss, 1e-9);
  }
}

TEST(Gradients, StraightThroughKlLoss) {
  // "k3+" has k3's value but k2's gradient: compare against the k2 loss's finite differences.
  Shape s{2, 3};
  Vec m = {1, 1, 1, 1, 1, 0};
  Vec lp = {-1.0f, -0.3f, -2.2f, -0.7f, -1.4f, 0}, ref = {-1.2f, -0.9f, -2.0f, -0.1f, -1.5f, 0};
  LossAndGrad plus = compute_kl_loss(s, lp, ref, m, parse_kl_type("k3+"), LossAggMode::TokenMean);
  LossAndGrad k3 = compute_kl_loss(s, lp, ref, m, parse_kl_type("k3"), LossAggMode::TokenMean);
  EXPECT_NEAR(plus.loss, k3.loss, 1e-12);
  check_grad(
      lp, m, plus.grad,
      [&] {
        return compute_kl_loss(s, lp, ref, m, parse_kl_type("k2"), LossAggMode::TokenMean).loss;
      },
      "k3+");
}

TEST(ValueLoss, HandComputed) {
  // cliprange 0.5. Token 0: v 1.0, old 0.0, R 2.0 -> vclip 0.5: l1 = 1, l2 = 2.25 -> 2.25
  // (clipped). Token 1: v 0.2, old 0.0, R 0.0 -> inside the band: l1 = l2 = 0.04. Token 2: v -1.0,
  // old 0.0, R 0.0 -> vclip -0.5: l1 = 1, l2 = 0.25 -> 1 (unclipped). Token 3 masked. vf_loss = 0.5
  // * (2.25 + 0.04 + 1) / 3; vf_clipfrac = 1/3.
  Shape s{1, 4};
  Vec v = {1.0f, 0.2f, -1.0f, 5.0f}, old = {0, 0, 0, 0}, R = {2, 0, 0, 0}, m = {1, 1, 1, 0};
  ValueLossOutput out = compute_value_loss(s, v, R, old, m, 0.5);
  EXPECT_NEAR(out.vf_loss, 0.5 * 3.29 / 3, 1e-6);
  EXPECT_NEAR(out.vf_clipfrac, 1.0 / 3, 1e-6);
  // Token 0 is clipped: no gradient. Token 1: 0.5 * 2 * 0.2 / 3 (the tie l1 == l2 splits between
  // two equal derivatives). Token 2: 0.5 * 2 * (-1) / 3.
  expect_near_vec(out.d_vpreds, {0, 0.2 / 3, -1.0 / 3, 0}, 1e-6);
}

}  // namespace
}  // namespace verl::trainer
