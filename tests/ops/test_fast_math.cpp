// The vectorisable exp used by the softmax loops (src/ops/cpu/fast_math.h) against std::exp.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ops/cpu/fast_math.h"

namespace verl::ops::test {

TEST(FastExp, RelativeErrorWithinFewUlp) {
  using verl::ops::cpu::detail::fast_exp;
  double worst = 0.0;
  for (int i = 0; i <= 2000000; ++i) {
    const float x = -87.0f + 175.0f * static_cast<float>(i) / 2000000.0f;
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::abs(fast_exp(x) - want) / want);
  }
  EXPECT_LT(worst, 4e-7);  // ~3 ulp of fp32 (2^-23 = 1.19e-7)
  EXPECT_EQ(fast_exp(0.0f), 1.0f);
  EXPECT_LT(fast_exp(-std::numeric_limits<float>::infinity()), 1e-37f);  // clamped, not NaN
  EXPECT_LT(fast_exp(-200.0f), 1e-37f);
  EXPECT_GT(fast_exp(100.0f), 1e38f);  // clamped to e^88.7, finite
}

}  // namespace verl::ops::test
