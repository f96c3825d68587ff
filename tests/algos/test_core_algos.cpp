// Tests of verl's core algorithms (src/trainer/algos/): every advantage estimator, KL type,
// controller, aggregation mode and loss against numbers worked out by hand from verl's formulas
// (the arithmetic is in the comments), and every loss gradient against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "../common/test_util.h"
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
  // padding, which is skipped (verl PR #7278): G is 0 there and the running return stays 0, so
  // G1 = 0, G0 = 1. returns = G.
  Shape s{2, 4};
  Vec r = {0, 0, 1, 0, 1, 0, 2, 0};
  Vec m = {1, 1, 1, 0, 1, 1, 0, 0};
  AdvantageOutput out = compute_reinforce_plus_plus_outcome_advantage(s, r, m, 0.5);
  expect_near_vec(out.returns, {0.25, 0.5, 1, 0, 1, 0, 0, 0}, 1e-7);
  // Whitened over the 5 masked slots {0.25, 0.5, 1, 1, 0}: mean 0.55, unbiased var
  // (0.09 + 0.0025 + 0.2025 + 0.2025 + 0.3025) / 4 = 0.2, then times the mask.
  const double inv = 1 / std::sqrt(0.2 + 1e-8);
  expect_near_vec(out.advantages,
                  {-0.3 * inv, -0.05 * inv, 0.45 * inv, 0, 0.45 * inv, -0.55 * inv, 0, 0}, 1e-5);
  EXPECT_NEAR(out.advantages[0], -0.6708204, 1e-5);
}

TEST(Advantages, ReinforcePlusPlusCarriesReturnAcrossObservations) {
  // A multi-turn response: token, two observation tokens (mask 0), token; gamma 0.5.
  // t3: G = 1. t2, t1 (masked): G = 0 and the running return 1 passes through unchanged (no
  // discount, no reset, their rewards ignored). t0: G = 0 + 0.5 * 1 = 0.5.
  // (The old rule, reset after each masked slot, gave [0, 5, 0.5, 1].)
  Shape s{2, 4};
  Vec r = {0, 5, 0, 1, 1, 0, 0, 2};
  Vec m = {1, 0, 0, 1, 1, 0, 0, 1};
  AdvantageOutput out = compute_reinforce_plus_plus_outcome_advantage(s, r, m, 0.5);
  // Row 1: t3 = 2, t0 = 1 + 0.5 * 2 = 2.
  expect_near_vec(out.returns, {0.5, 0, 0, 1, 2, 0, 0, 2}, 1e-7);
  // Whitened over {0.5, 1, 2, 2}: mean 1.375, unbiased var (0.765625 + 0.140625 + 0.390625 * 2)
  // / 3 = 0.5625; then times the mask.
  const double inv = 1 / std::sqrt(0.5625 + 1e-8);
  expect_near_vec(out.advantages,
                  {-0.875 * inv, 0, 0, -0.375 * inv, 0.625 * inv, 0, 0, 0.625 * inv}, 1e-5);
}

TEST(Advantages, Opo) {
  // uid 1: rows 0, 1, 2 with lengths 3, 1, 2 and scores 1, 0, 1: the length-weighted baseline is
  // (3 * 1 + 1 * 0 + 2 * 1) / 6 = 5/6 -> A = 1/6, -5/6, 1/6. uid 2: row 3 alone, baseline 0.
  Shape s{4, 3};
  Vec r = {0, 0, 1, 0, 0, 0, 0, 1, 0, 0.5f, 0, 0};
  Vec m = {1, 1, 1, 1, 0, 0, 1, 1, 0, 1, 1, 1};
  std::vector<int64_t> idx = {1, 1, 1, 2};
  AdvantageOutput out = compute_opo_outcome_advantage(s, r, m, idx);
  const double a = 1.0 / 6, b = -5.0 / 6;
  expect_near_vec(out.advantages, {a, a, a, b, 0, 0, a, a, 0, 0.5, 0.5, 0.5}, 1e-6);
  EXPECT_EQ(out.returns, out.advantages);
}

TEST(Advantages, Gpg) {
  // Scores 1, 0, 1 (uid 1) and 0.5 (uid 2, alone: mean 0). alpha = B / #nonzero = 4 / 3.
  // uid 1 mean 2/3: A = 4/3 * (1/3), 4/3 * (-2/3), 4/3 * (1/3); uid 2: 4/3 * 0.5.
  Shape s{4, 2};
  Vec r = {0, 1, 0, 0, 1, 0, 0.5f, 0};
  Vec m = {1, 1, 1, 0, 1, 1, 1, 0};
  std::vector<int64_t> idx = {1, 1, 1, 2};
  AdvantageOutput out = compute_gpg_outcome_advantage(s, r, m, idx);
  expect_near_vec(out.advantages, {4.0 / 9, 4.0 / 9, -8.0 / 9, 0, 4.0 / 9, 4.0 / 9, 2.0 / 3, 0},
                  1e-6);
  // No reward anywhere: alpha = B / max(1, 0) and every advantage is 0.
  Vec zeros(8, 0.0f);
  AdvantageOutput z = compute_gpg_outcome_advantage(s, zeros, m, idx);
  expect_near_vec(z.advantages, std::vector<double>(8, 0.0), 1e-9);
}

TEST(Advantages, GrpoPassK) {
  // uid 1: scores 0.5, 2, 1 -> only row 1 (the best) gets 2 - 1 = 1, divided by the unbiased std
  // sqrt(((2/3)^2 + (5/6)^2 + (1/6)^2) / 2) = sqrt(7/12) = 0.7637626 (+ 1e-6).
  // uid 2: scores 1, 1 tied -> the first is the best with 1 - 1 = 0.
  Shape s{5, 2};
  Vec r = {0.5f, 0, 2, 0, 0, 1, 1, 0, 0, 1};
  Vec m = {1, 1, 1, 0, 1, 1, 1, 1, 1, 1};
  std::vector<int64_t> idx = {1, 1, 1, 2, 2};
  AdvantageOutput out = compute_grpo_passk_outcome_advantage(s, r, m, idx);
  const double a = 1.0 / (std::sqrt(7.0 / 12) + 1e-6);
  EXPECT_NEAR(a, 1.3093053, 1e-6);
  expect_near_vec(out.advantages, {0, 0, a, 0, 0, 0, 0, 0, 0, 0}, 1e-6);
  AdvantageOutput raw = compute_grpo_passk_outcome_advantage(s, r, m, idx, 1e-6, false);
  expect_near_vec(raw.advantages, {0, 0, 1, 0, 0, 0, 0, 0, 0, 0}, 1e-6);
  // Pass@k needs two samples per prompt (verl raises).
  std::vector<int64_t> lonely = {1, 1, 1, 2, 3};
  EXPECT_THROW(compute_grpo_passk_outcome_advantage(s, r, m, lonely), Error);
}

TEST(Advantages, VectorizedAliases) {
  // rloo_vectorized: rloo's numbers, but the lone response of uid 2 gets 0 (verl multiplies by
  // [n > 1]) where rloo keeps its score 0.25.
  Shape s{4, 2};
  Vec r = {0, 1, 0, 0, 1, 0, 0.25f, 0};
  Vec m = {1, 1, 1, 1, 1, 0, 1, 1};
  std::vector<int64_t> idx = {1, 1, 1, 2};
  AdvantageOutput v = compute_rloo_vectorized_outcome_advantage(s, r, m, idx);
  expect_near_vec(v.advantages, {0.5, 0.5, -1, -1, 0.5, 0, 0, 0}, 1e-6);
  // grpo_vectorized is grpo's math, with and without the std.
  AdvantageInputs in;
  in.shape = s;
  in.token_level_rewards = r;
  in.response_mask = m;
  in.index = idx;
  for (bool by_std : {true, false}) {
    in.norm_adv_by_std_in_grpo = by_std;
    EXPECT_EQ(compute_advantage(parse_adv_estimator("grpo_vectorized"), in).advantages,
              compute_advantage(AdvantageEstimator::GRPO, in).advantages);
  }
  EXPECT_EQ(compute_advantage(parse_adv_estimator("rloo_vectorized"), in).advantages, v.advantages);
  for (const char* name : {"opo", "grpo_passk", "gpg", "rloo_vectorized", "grpo_vectorized"})
    EXPECT_EQ(to_string(parse_adv_estimator(name)), name);
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

// GDPO against verl's formula restated in torch (tests/algos/reference_gdpo.py, float32): two
// reward components in groups 7 (rows 0-2) and 3 (rows 3-4), weights 1 and 0.5, all ones, and
// Dr. GRPO's unnormalised groups.
TEST(Advantages, Gdpo) {
  Shape s{5, 3};
  Vec m = {1, 1, 1, 1, 0, 0, 1, 1, 0, 1, 1, 1, 1, 0, 0};
  std::vector<int64_t> idx = {7, 7, 7, 3, 3};
  std::vector<std::vector<float>> comps = {{1.0f, 0.0f, 1.0f, 0.5f, 0.25f},
                                           {0.2f, 0.9f, 0.4f, 0.0f, 1.0f}};
  std::vector<double> w = {1.0, 0.5};
  const std::vector<double> weighted = {0.041289377957582474,
                                        0.041289377957582474,
                                        0.041289377957582474,
                                        -2.129194736480713,
                                        0,
                                        0,
                                        0.831992506980896,
                                        0.831992506980896,
                                        0,
                                        0.5893081426620483,
                                        0.5893081426620483,
                                        0.5893081426620483,
                                        -1.4265830516815186,
                                        0,
                                        0};
  const std::vector<double> ones = {-1.1493510007858276,
                                    -1.1493510007858276,
                                    -1.1493510007858276,
                                    -0.11977873742580414,
                                    0,
                                    0,
                                    1.5780099630355835,
                                    1.5780099630355835,
                                    0,
                                    0.10294564068317413,
                                    0.10294564068317413,
                                    0.10294564068317413,
                                    0.10297495126724243,
                                    0,
                                    0};
  const std::vector<double> dr_grpo = {0.5930798649787903,
                                       0.5930798649787903,
                                       0.5930798649787903,
                                       -2.096468448638916,
                                       0,
                                       0,
                                       1.0068564414978027,
                                       1.0068564414978027,
                                       0,
                                       -0.6827315092086792,
                                       -0.6827315092086792,
                                       -0.6827315092086792,
                                       0.3517102599143982,
                                       0,
                                       0};
  AdvantageOutput a = compute_gdpo_outcome_advantage(s, comps, w, m, idx);
  expect_near_vec(a.advantages, weighted, 2e-6);
  EXPECT_EQ(a.returns, a.advantages);
  expect_near_vec(compute_gdpo_outcome_advantage(s, comps, {}, m, idx).advantages, ones, 2e-6);
  expect_near_vec(compute_gdpo_outcome_advantage(s, comps, w, m, idx, 1e-6, false).advantages,
                  dr_grpo, 2e-6);
  // Through the registry, with the inputs the trainer fills.
  AdvantageInputs in{.shape = s, .response_mask = m, .index = idx};
  in.reward_components = comps;
  in.reward_weights = w;
  EXPECT_EQ(compute_advantage(parse_adv_estimator("gdpo"), in).advantages, a.advantages);
  // Weights that do not match the components are an error naming the key.
  std::vector<double> three = {1, 1, 1};
  EXPECT_NE(test::expected_error_of([&] {
              compute_gdpo_outcome_advantage(s, comps, three, m, idx);
            }).find("3 weights (algorithm.gdpo_reward_weights) for 2 reward components"),
            std::string::npos);
}

// The registry: each row's name parses back to it, only gae needs a critic and only remax the
// greedy baselines, and each row hands its estimator the AdvantageInputs fields it reads.
TEST(Advantages, RegistryRows) {
  EXPECT_EQ(advantage_estimators().size(), 12u);
  for (const AdvantageEstimatorInfo& e : advantage_estimators()) {
    EXPECT_EQ(parse_adv_estimator(e.name), e.value) << e.name;
    EXPECT_EQ(to_string(e.value), e.name);
    EXPECT_EQ(&estimator_info(e.value), &e) << e.name;
    EXPECT_EQ(e.needs_critic, e.value == AdvantageEstimator::GAE) << e.name;
    EXPECT_EQ(e.needs_reward_baselines, e.value == AdvantageEstimator::ReMax) << e.name;
  }
  Shape s{4, 2};
  Vec r = {0, 1, 0, 0, 1, 0, 0.25f, 0}, m = {1, 1, 1, 1, 1, 0, 1, 1};
  Vec v = {0.5f, -0.25f, 0.1f, 0.2f, 0.3f, 0, -0.4f, 0.6f}, base = {0.5f, 0, 1, 0.25f};
  std::vector<int64_t> idx = {1, 1, 1, 2}, pairs = {1, 1, 2, 2};
  AdvantageInputs in{.shape = s,
                     .token_level_rewards = r,
                     .response_mask = m,
                     .values = v,
                     .index = idx,
                     .reward_baselines = base,
                     .gamma = 0.9,
                     .lam = 0.8,
                     .norm_adv_by_std_in_grpo = false};
  auto same = [](const AdvantageOutput& a, const AdvantageOutput& b, const char* what) {
    EXPECT_EQ(a.advantages, b.advantages) << what;
    EXPECT_EQ(a.returns, b.returns) << what;
  };
  same(compute_advantage(AdvantageEstimator::GAE, in),
       compute_gae_advantage_return(s, r, v, m, 0.9, 0.8), "gae");
  same(compute_advantage(AdvantageEstimator::ReinforcePlusPlus, in),
       compute_reinforce_plus_plus_outcome_advantage(s, r, m, 0.9), "reinforce_plus_plus");
  same(compute_advantage(AdvantageEstimator::ReMax, in),
       compute_remax_outcome_advantage(s, r, base, m), "remax");
  same(compute_advantage(AdvantageEstimator::GRPO, in),
       compute_grpo_outcome_advantage(s, r, m, idx, 1e-6, false), "grpo");
  same(compute_advantage(AdvantageEstimator::GrpoVectorized, in),
       compute_grpo_outcome_advantage(s, r, m, idx, 1e-6, false), "grpo_vectorized");
  same(compute_advantage(AdvantageEstimator::OPO, in), compute_opo_outcome_advantage(s, r, m, idx),
       "opo");
  in.index = pairs;  // Pass@k needs two responses per prompt
  same(compute_advantage(AdvantageEstimator::GrpoPassK, in),
       compute_grpo_passk_outcome_advantage(s, r, m, pairs, 1e-6, false), "grpo_passk");
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
// Policy loss modes against torch: tests/algos/reference_policy_losses.py restates each of verl's
// compute_policy_loss_<mode> in torch (float64) on this batch and prints the loss, the metrics
// and autograd's d loss / d log_prob, pasted below. Padding slots hold NaN here (they must not
// leak); the script has finite values there.

struct TorchCase {
  Shape s{3, 4};
  Vec mask = {1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0};
  Vec old_lp, lp, adv;
  TorchCase() {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const double old[12] = {-1.0, -0.7, -2.0, -0.4, -1.2, -0.3, -1.0, -1.0, -0.8, -1.5, -0.6, -1.0};
    const double x[12] = {0.1, 0.35, -0.3, -0.05, 0.25, -0.15, 0, 0, 0.05, 0.4, -0.25, 0};
    const double a[12] = {1.0, 1.0, 1.0, 1.0, -0.5, -0.5, 0, 0, 0.8, -1.2, 0.3, 0};
    for (int i = 0; i < 12; ++i) {
      old_lp.push_back(static_cast<float>(old[i]));
      lp.push_back(mask[i] != 0 ? static_cast<float>(old[i] + x[i]) : nan);
      adv.push_back(mask[i] != 0 ? static_cast<float>(a[i]) : nan);
    }
  }
  PolicyLossConfig cfg(PolicyLossMode mode) const {
    PolicyLossConfig c;
    c.loss_mode = mode;
    c.clip_ratio_low = 0.2;
    c.clip_ratio_high = 0.28;
    return c;
  }
  PolicyLossOutput run(const PolicyLossConfig& c) const {
    return compute_policy_loss(s, old_lp, lp, adv, mask, c);
  }
};

TEST(PolicyLossModes, Gpg) {
  TorchCase t;
  PolicyLossOutput out = t.run(t.cfg(PolicyLossMode::Gpg));
  // -sum(A logp) / 9 by hand: the torch value.
  EXPECT_NEAR(out.pg_loss, 0.3150000000, 1e-6);
  expect_near_vec(out.d_log_prob,
                  {-1.0 / 9, -1.0 / 9, -1.0 / 9, -1.0 / 9, 0.5 / 9, 0.5 / 9, 0, 0, -0.8 / 9,
                   1.2 / 9, -0.3 / 9, 0},
                  1e-6);
}

TEST(PolicyLossModes, Gspo) {
  TorchCase t;
  // Aggregated seq-mean-token-mean whatever loss_agg_mode says (verl).
  PolicyLossConfig c = t.cfg(PolicyLossMode::Gspo);
  c.loss_agg_mode = LossAggMode::TokenMean;
  PolicyLossOutput out = t.run(c);
  EXPECT_NEAR(out.pg_loss, -0.1546827563, 1e-6);
  EXPECT_NEAR(out.pg_clipfrac, 0.0, 1e-9);
  EXPECT_NEAR(out.ppo_kl, -0.0444444444, 1e-6);
  // Row 0: s = exp(0.1 / 4) = 1.0253151, A = 1: each token -s / 4 / 3 = -0.0854429.
  expect_near_vec(out.d_log_prob,
                  {-0.0854429265, -0.0854429265, -0.0854429265, -0.0854429265, 0.0876059243,
                   0.0876059243, 0, 0, -0.0950168091, 0.1425252136, -0.0356313034, 0},
                  1e-6);
}

TEST(PolicyLossModes, Sapo) {
  TorchCase t;
  PolicyLossOutput out = t.run(t.cfg(PolicyLossMode::Sapo));  // tau_pos 1, tau_neg 1.05
  EXPECT_NEAR(out.pg_loss, -0.2784650034, 1e-6);
  EXPECT_NEAR(out.ppo_kl, -0.0444444444, 1e-6);
  expect_near_vec(out.d_log_prob,
                  {-0.091843374, -0.113211956, -0.0607095869, -0.0792220004, 0.1046577756,
                   0.0713434568, 0, 0, -0.0933849351, 0.1862162878, -0.0256450476, 0},
                  1e-6);
}

TEST(PolicyLossModes, Cispo) {
  TorchCase t;
  PolicyLossOutput out = t.run(t.cfg(PolicyLossMode::Cispo));
  EXPECT_NEAR(out.pg_loss, 0.2282456034, 1e-6);
  EXPECT_NEAR(out.pg_clipfrac, 5.0 / 9, 1e-6);  // ratios outside [0.8, 1.28]
  EXPECT_NEAR(out.ppo_kl, -0.0444444444, 1e-6);
  // Clipped tokens keep a gradient: token 1 (r = 1.419 > 1.28) gets -1.28 * 1 / 9 = -0.1422222.
  expect_near_vec(out.d_log_prob,
                  {-0.1227967687, -0.1422222222, -0.0888888889, -0.1056921583, 0.0711111111,
                   0.0478171098, 0, 0, -0.0934463197, 0.1706666667, -0.0266666667, 0},
                  1e-6);
}

TEST(PolicyLossModes, ClipCov) {
  TorchCase t;
  // Covariances (A - mean A)(logp - mean logp), from the script: token 1 0.3728 (but PPO-clipped),
  // 3 0.3050, 4 0.0411, 8 0.0717, 9 0.3044, others < 0.033.
  // (a) clip_cov_ratio 0.5: n = int(4.5) = 4 cuts, and exactly 4 candidates in (0.02, 5): verl's
  // random draw takes all of them too, so this is verl's result exactly.
  PolicyLossConfig c = t.cfg(PolicyLossMode::ClipCov);
  c.clip_cov_ratio = 0.5;
  c.clip_cov_lb = 0.02;
  c.clip_cov_ub = 5.0;
  PolicyLossOutput out = t.run(c);
  EXPECT_NEAR(out.pg_loss, -0.3254750428, 1e-6);
  EXPECT_NEAR(out.pg_clipfrac, 4.0 / 9, 1e-6);
  expect_near_vec(
      out.d_log_prob,
      {-0.1227967687, 0, -0.0823131356, 0, 0, 0.0478171098, 0, 0, 0, 0, -0.0259600261, 0}, 1e-6);
  // (b) ratio 0.2: n = 1 cut among the 2 candidates in (0.005, 0.2) (tokens 4 and 8): we cut the
  // larger covariance, token 8 (verl would pick one at random).
  c.clip_cov_ratio = 0.2;
  c.clip_cov_lb = 0.005;
  c.clip_cov_ub = 0.2;
  out = t.run(c);
  EXPECT_NEAR(out.pg_loss, -0.1609224961, 1e-6);
  EXPECT_NEAR(out.pg_clipfrac, 1.0 / 9, 1e-6);
  expect_near_vec(out.d_log_prob,
                  {-0.1227967687, 0, -0.0823131356, -0.1056921583, 0.0713347454, 0.0478171098, 0, 0,
                   0, 0.1989099597, -0.0259600261, 0},
                  1e-6);
  c.clip_cov_ratio = 0;
  EXPECT_THROW(t.run(c), Error);
}

TEST(PolicyLossModes, KlCov) {
  TorchCase t;
  // kl_cov_ratio 0.25: int(9 * 0.25) = 2 tokens of largest covariance (1 and 3) get
  // + 0.1 * |x|; the rest is -A r (no clip).
  PolicyLossConfig c = t.cfg(PolicyLossMode::KlCov);
  c.kl_cov_ratio = 0.25;
  c.ppo_kl_coef = 0.1;
  PolicyLossOutput out = t.run(c);
  EXPECT_NEAR(out.pg_loss, -0.2653763211, 1e-6);
  EXPECT_NEAR(out.ppo_kl, 0.2111111109, 1e-6);  // masked mean of |x|
  expect_near_vec(out.d_log_prob,
                  {-0.1227967687, -0.146563061, -0.0823131356, -0.1168032694, 0.0713347454,
                   0.0478171098, 0, 0, -0.0934463197, 0.1989099597, -0.0259600261, 0},
                  1e-6);
}

TEST(PolicyLossModes, GeoMean) {
  TorchCase t;
  PolicyLossOutput out = t.run(t.cfg(PolicyLossMode::GeoMean));
  EXPECT_NEAR(out.pg_loss, -0.1487537814, 1e-6);
  EXPECT_NEAR(out.pg_clipfrac, 3.0 / 9, 1e-6);        // x outside [-0.2, 0.28] with A > 0
  EXPECT_NEAR(out.pg_clipfrac_lower, 1.0 / 9, 1e-6);  // ... with A < 0
  EXPECT_NEAR(out.ppo_kl, -0.0444444444, 1e-6);
  // Token 1 (x = 0.35 > 0.28, A > 0) is clipped: no gradient.
  expect_near_vec(out.d_log_prob,
                  {-0.0839606825, 0, -0.0839606825, -0.0839606825, 0.0876059238, 0.0876059238, 0, 0,
                   0.0039590337, 0.0039590337, 0.0039590337, 0},
                  1e-6);
  // The normaliser is the (global) number of sequences, not loss_agg_mode's.
  PolicyLossConfig c = t.cfg(PolicyLossMode::GeoMean);
  c.norm.dp_size = 2;
  c.norm.global_batch_size = 6;
  EXPECT_NEAR(t.run(c).pg_loss, -0.1487537814 * 3 / 6 * 2, 1e-6);
}

TEST(PolicyLossModes, DispatchByName) {
  for (const char* name :
       {"vanilla", "gpg", "gspo", "sapo", "cispo", "clip_cov", "kl_cov", "geo_mean"})
    EXPECT_EQ(to_string(parse_policy_loss_mode(name)), name);
  try {
    parse_policy_loss_mode("clip-cov");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'clip-cov'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("geo_mean"), std::string::npos);
  }
  // compute_actor_loss goes through the mode: its pg_loss is the mode's.
  TorchCase t;
  ActorLossConfig a;
  a.policy = t.cfg(PolicyLossMode::Gspo);
  ActorLossOutput out = compute_actor_loss(t.s, t.old_lp, t.lp, t.adv, t.mask, {}, {}, a);
  EXPECT_NEAR(out.pg_loss, -0.1546827563, 1e-6);
  EXPECT_NEAR(out.policy_loss, out.pg_loss, 1e-12);
  EXPECT_NEAR(out.d_log_prob[0], -0.0854429265, 1e-6);
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

// Inputs for the policy-loss modes: log-ratios away from the clip kinks (ln 0.8, ln 1.28 for the
// ratio modes, -0.2 and 0.28 for geo_mean's log-space clamp) and advantages of both signs.
struct ModeInputs {
  Shape s{3, 5};
  Vec m, old_lp, lp, adv;
  ModeInputs() {
    std::vector<int64_t> lens = {5, 3, 1};
    m = response_mask_from_lengths(lens, 5);
    Picker p;
    for (int64_t i = 0; i < s.numel(); ++i) {
      old_lp.push_back(static_cast<float>(p.pick({-2.0, -1.0, -0.3})));
      lp.push_back(old_lp[i] + static_cast<float>(p.pick({-0.6, -0.1, 0.05, 0.15, 0.5, 1.6})));
      adv.push_back(static_cast<float>(p.pick({-1.3, -0.4, 0.5, 1.1})));
    }
  }
};

TEST(Gradients, PolicyLossModes) {
  ModeInputs in;
  for (PolicyLossMode mode : {PolicyLossMode::Gpg, PolicyLossMode::Sapo, PolicyLossMode::ClipCov,
                              PolicyLossMode::KlCov, PolicyLossMode::GeoMean}) {
    for (LossAggMode agg : kModes) {
      PolicyLossConfig cfg;
      cfg.loss_mode = mode;
      cfg.clip_ratio_high = 0.28;
      cfg.loss_agg_mode = agg;
      // Selections large enough to matter on 9 tokens; the covariance band is wide so that the
      // 1e-3 steps never move a token across it.
      cfg.clip_cov_ratio = 0.34;  // 3 of 9 tokens: the 3rd and 4th covariances are 0.04 apart
      cfg.clip_cov_lb = -10;
      cfg.clip_cov_ub = 10;
      cfg.kl_cov_ratio = 0.34;
      cfg.ppo_kl_coef = 0.5;
      PolicyLossOutput out = compute_policy_loss(in.s, in.old_lp, in.lp, in.adv, in.m, cfg);
      std::string what = std::string(to_string(mode)) + " " + std::string(to_string(agg));
      check_grad(
          in.lp, in.m, out.d_log_prob,
          [&] { return compute_policy_loss(in.s, in.old_lp, in.lp, in.adv, in.m, cfg).pg_loss; },
          what.c_str());
      // Rollout importance weights scale the loss and its gradient (geo_mean: their geometric
      // mean per sequence).
      Vec isw(in.s.numel(), 0.5f);
      PolicyLossOutput half = compute_policy_loss(in.s, in.old_lp, in.lp, in.adv, in.m, cfg, isw);
      EXPECT_NEAR(half.pg_loss, 0.5 * out.pg_loss, 1e-6) << what;
    }
  }
}

TEST(Gradients, GspoStopGradient) {
  // GSPO's value depends on a token only through the sequence mean of the log-ratios, while its
  // gradient is the token's own term (the stop-gradient): so moving one token moves the loss by
  // 1/len_b of the row's summed gradient. A row of one token has no difference at all.
  ModeInputs in;
  PolicyLossConfig cfg;
  cfg.loss_mode = PolicyLossMode::Gspo;
  cfg.clip_ratio = 0.05;  // clip some sequences
  PolicyLossOutput out = compute_policy_loss(in.s, in.old_lp, in.lp, in.adv, in.m, cfg);
  Vec row_sum_over_len(in.s.numel(), 0.0f);
  for (int64_t b = 0; b < in.s.batch; ++b) {
    double sum = 0, len = 0;
    for (int64_t t = 0; t < in.s.length; ++t) {
      sum += out.d_log_prob[b * in.s.length + t];
      len += in.m[b * in.s.length + t];
    }
    for (int64_t t = 0; t < in.s.length; ++t)
      if (in.m[b * in.s.length + t] != 0)
        row_sum_over_len[b * in.s.length + t] = static_cast<float>(sum / len);
  }
  check_grad(
      in.lp, in.m, row_sum_over_len,
      [&] { return compute_policy_loss(in.s, in.old_lp, in.lp, in.adv, in.m, cfg).pg_loss; },
      "gspo");
  EXPECT_GT(out.pg_clipfrac, 0.0);
}

TEST(Gradients, CispoStopGradient) {
  // CISPO: inside the clip band its gradient is PPO's (-A r w); outside it the weight is a
  // constant, so the loss is -c A w logp there and finite differences see exactly -c A w.
  ModeInputs in;
  PolicyLossConfig cfg;
  cfg.loss_mode = PolicyLossMode::Cispo;
  cfg.clip_ratio_high = 0.28;
  PolicyLossOutput out = compute_policy_loss(in.s, in.old_lp, in.lp, in.adv, in.m, cfg);
  PolicyLossConfig ppo = cfg;
  ppo.loss_mode = PolicyLossMode::Vanilla;
  PolicyLossOutput ref = compute_policy_loss(in.s, in.old_lp, in.lp, in.adv, in.m, ppo);
  int inside = 0, outside = 0;
  for (int64_t i = 0; i < in.s.numel(); ++i) {
    if (in.m[i] == 0) continue;
    const float x0 = in.lp[i];
    const double r = std::exp(static_cast<double>(x0) - in.old_lp[i]);
    if (r > 0.8 && r < 1.28) {
      ++inside;
      EXPECT_NEAR(out.d_log_prob[i], ref.d_log_prob[i], 1e-7) << i;
      continue;
    }
    ++outside;
    const float xp = x0 + 1e-3f, xm = x0 - 1e-3f;
    in.lp[i] = xp;
    const double fp = compute_policy_loss(in.s, in.old_lp, in.lp, in.adv, in.m, cfg).pg_loss;
    in.lp[i] = xm;
    const double fm = compute_policy_loss(in.s, in.old_lp, in.lp, in.adv, in.m, cfg).pg_loss;
    in.lp[i] = x0;
    EXPECT_NEAR(out.d_log_prob[i], (fp - fm) / (static_cast<double>(xp) - xm), 1e-4) << i;
    EXPECT_NE(out.d_log_prob[i], 0.0f) << i;  // clipped tokens keep their gradient
  }
  EXPECT_GT(inside, 0);
  EXPECT_GT(outside, 0);
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
