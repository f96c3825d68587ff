// AdamW against numbers worked out by hand from the torch.optim.AdamW update, and the double
// sum of squares used for the global gradient norm.
#include <gtest/gtest.h>

#include <cmath>

#include "ops/cpu/ops.h"
#include "test_util.h"

namespace verl::ops::test {
namespace cpu = verl::ops::cpu;

// lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01, grad_scale = 0.5, p0 = 1.
// Raw grads 2, -4, 1 -> scaled g = 1, -2, 0.5.
//   step 1: p = 0.999; m = 0.1; v = 0.001; m^ = 1, v^ = 1; p = 0.999 - 0.1 * 1/(1 + 1e-8)
//           = 0.899000001
//   step 2: p = 0.899000001 * 0.999; m = 0.09 - 0.2 = -0.11; v = 0.000999 + 0.004 = 0.004999;
//           m^ = -0.11/0.19, v^ = 0.004999/0.001999; p = 0.9347113534710749
//   step 3: m = -0.099 + 0.05 = -0.049; v = 0.004999*0.999 + 0.001*0.25 = 0.005244001;
//           p = 0.9474457083193505
// A second element with grad 0 only decays: p = -3 * 0.999^3 = -2.991008997.
TEST(AdamW, ThreeStepsByHand) {
  std::vector<float> p = {1.0f, -3.0f}, m(2, 0.0f), v(2, 0.0f);
  const float raw[3] = {2.0f, -4.0f, 1.0f};
  const double want_p[3] = {0.899000001, 0.9347113534710749, 0.9474457083193505};
  const double want_m[3] = {0.1, -0.11, -0.049};
  const double want_v[3] = {0.001, 0.004999, 0.005244001};
  for (int s = 0; s < 3; ++s) {
    std::vector<float> g = {raw[s], 0.0f};
    cpu::adamw_step(p.data(), g.data(), m.data(), v.data(), 2, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f,
                    s + 1, 0.5f);
    EXPECT_NEAR(p[0], want_p[s], kAdamW.atol + kAdamW.rtol * std::abs(want_p[s]))
        << "step " << s + 1;
    EXPECT_NEAR(m[0], want_m[s], kAdamW.atol + kAdamW.rtol * std::abs(want_m[s]))
        << "step " << s + 1;
    EXPECT_NEAR(v[0], want_v[s], kAdamW.atol + kAdamW.rtol * std::abs(want_v[s]))
        << "step " << s + 1;
  }
  EXPECT_NEAR(p[1], -2.991008997, 1e-6);
  EXPECT_EQ(m[1], 0.0f);
  EXPECT_EQ(v[1], 0.0f);
}

TEST(AdamW, LongBufferMatchesScalarFormula) {
  // Exercises the parallel/vectorised path on an odd length; reference in double per element.
  const int64_t n = 10007;
  auto p = randn(n, 70), g = randn(n, 71), m = randn(n, 72, 0.1f);
  auto v = uniform(n, 73, 0.0f, 0.01f);
  auto p0 = p, m0 = m, v0 = v;
  const int64_t step = 5;
  cpu::adamw_step(p.data(), g.data(), m.data(), v.data(), n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, step,
                  0.25f);
  const double bc1 = 1 - std::pow(0.9, step), bc2 = 1 - std::pow(0.95, step);
  std::vector<double> wp(n);
  for (int64_t i = 0; i < n; ++i) {
    const double gi = 0.25 * g[i];
    const double mi = 0.9 * m0[i] + 0.1 * gi;
    const double vi = 0.95 * v0[i] + 0.05 * gi * gi;
    const double pd = p0[i] * (1 - 3e-4 * 0.1);
    wp[i] = pd - 3e-4 / bc1 * mi / (std::sqrt(vi / bc2) + 1e-8);
  }
  expect_close("adamw p", p, wp, kAdamW);
}

TEST(SumSquares, SmallAndLarge) {
  std::vector<float> x = {3.0f, -4.0f, 0.5f};
  EXPECT_DOUBLE_EQ(cpu::sum_squares(x.data(), 3), 25.25);
  EXPECT_EQ(cpu::sum_squares(x.data(), 0), 0.0);
  // 1,000,003 copies of 0.1f: the exact double sum is n * (double)0.1f^2; a float accumulator
  // would be off by far more than 1e-9 relative.
  const int64_t n = 1000003;
  std::vector<float> big(n, 0.1f);
  const double e = static_cast<double>(0.1f) * static_cast<double>(0.1f);
  EXPECT_NEAR(cpu::sum_squares(big.data(), n), n * e, 1e-9 * n * e);
}

}  // namespace verl::ops::test
