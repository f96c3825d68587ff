// Helpers shared by the op tests: seeded random buffers, tolerance comparison and a central
// finite-difference gradient check.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.h"
#include "tolerances.h"

namespace verl::ops::test {

inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> x(n);
  for (auto& e : x) e = scale * rng.normal();
  return x;
}

inline std::vector<float> uniform(size_t n, uint64_t seed, float lo, float hi) {
  Rng rng(seed);
  std::vector<float> x(n);
  for (auto& e : x) e = lo + (hi - lo) * rng.uniform();
  return x;
}

// sum_i a_i b_i in double: the scalar loss L = sum(out * R) of the gradient checks.
inline double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Expects |got[i] - want[i]| <= atol + rtol |want[i]| for all i; reports the first few misses.
template <typename A, typename B>
void expect_close(const std::string& what, const std::vector<A>& got, const std::vector<B>& want,
                  Tol tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    const double lim = tol.atol + tol.rtol * std::abs(w);
    if (!(std::abs(g - w) <= lim)) {
      if (++misses <= 5) ADD_FAILURE() << what << "[" << i << "]: got " << g << " want " << w;
    }
  }
  EXPECT_EQ(misses, 0) << what << ": " << misses << " of " << got.size() << " out of tolerance";
}

// Compares an analytic gradient of `loss` with respect to x with central differences
// (L(x + eps e_i) - L(x - eps e_i)) / (2 eps), for every element of x.
inline void check_grad(const std::string& what, std::vector<float>& x,
                       const std::vector<float>& analytic, const std::function<double()>& loss) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  std::vector<double> numeric(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float x0 = x[i];
    x[i] = x0 + static_cast<float>(kFdEps);
    const double lp = loss();
    x[i] = x0 - static_cast<float>(kFdEps);
    const double lm = loss();
    x[i] = x0;
    // Divide by the step actually taken in fp32, not the nominal one.
    const double h = static_cast<double>(x0 + static_cast<float>(kFdEps)) -
                     static_cast<double>(x0 - static_cast<float>(kFdEps));
    numeric[i] = (lp - lm) / h;
  }
  double scale = 0.0;
  for (size_t i = 0; i < x.size(); ++i) scale = std::max(scale, std::abs(numeric[i]));
  // A gradient that is identically zero would make this test vacuous; every use has signal.
  ASSERT_GT(scale, 1e-3) << what << ": finite-difference gradient is ~0";
  expect_close(what, analytic, numeric, Tol{kFdRel * scale, 0.0});
}

}  // namespace verl::ops::test
