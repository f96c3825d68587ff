// RMSNorm, RoPE and SwiGLU: forward against naive formulas or hand values, backward by finite
// differences (loss L = sum(out * R)).
#include <gtest/gtest.h>

#include <cmath>

#include "ops/cpu/ops.h"
#include "test_util.h"

namespace verl::ops::test {
namespace cpu = verl::ops::cpu;

TEST(RmsNorm, ForwardMatchesNaive) {
  const int64_t R = 7, C = 13;
  const float eps = 1e-6f;
  auto x = randn(R * C, 20, 3.0f), w = randn(C, 21);
  std::vector<float> out(R * C), rstd(R);
  cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), R, C, eps);
  std::vector<double> want(R * C), want_rstd(R);
  for (int64_t r = 0; r < R; ++r) {
    double ms = 0.0;
    for (int64_t c = 0; c < C; ++c) ms += static_cast<double>(x[r * C + c]) * x[r * C + c];
    want_rstd[r] = 1.0 / std::sqrt(ms / C + eps);
    for (int64_t c = 0; c < C; ++c) want[r * C + c] = w[c] * x[r * C + c] * want_rstd[r];
  }
  expect_close("rstd", rstd, want_rstd, kForwardF32);
  expect_close("out", out, want, kForwardF32);
}

TEST(RmsNorm, FiniteDifferences) {
  for (int64_t C : {1, 13}) {
    const int64_t R = 7;
    auto x = randn(R * C, 22), w = randn(C, 23), Rw = randn(R * C, 24);
    std::vector<float> out(R * C), rstd(R);
    auto loss = [&] {
      cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), R, C, 1e-5f);
      return dot(out, Rw);
    };
    loss();                                           // fills rstd for the backward
    std::vector<float> dx(R * C, 0.5f), dw(C, 0.5f);  // accumulate onto 0.5
    cpu::rmsnorm_backward(dx.data(), dw.data(), Rw.data(), x.data(), w.data(), rstd.data(), R, C);
    for (auto& e : dx) e -= 0.5f;
    for (auto& e : dw) e -= 0.5f;
    if (C > 1) check_grad("rmsnorm d_x", x, dx, loss);  // C=1: out = w*sign(x), d_x ~ 0
    check_grad("rmsnorm d_w", w, dw, loss);
  }
}

namespace {
std::vector<float> inv_freq_for(int64_t D, double base) {
  std::vector<float> f(D / 2);
  for (int64_t i = 0; i < D / 2; ++i) f[i] = static_cast<float>(std::pow(base, -2.0 * i / D));
  return f;
}
}  // namespace

TEST(Rope, ForwardMatchesFormula) {
  const int64_t T = 7, nh = 3, D = 6;
  auto x = randn(T * nh * D, 30);
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = 3 + 2 * t;  // positions need not start at 0
  auto inv_freq = inv_freq_for(D, 10000.0);
  std::vector<float> y = x;
  cpu::rope_forward(y.data(), pos.data(), inv_freq.data(), T, nh, D);
  std::vector<double> want(x.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t i = 0; i < D / 2; ++i) {
        const double a = static_cast<double>(pos[t]) * inv_freq[i];
        const double x1 = x[(t * nh + h) * D + i], x2 = x[(t * nh + h) * D + i + D / 2];
        want[(t * nh + h) * D + i] = x1 * std::cos(a) - x2 * std::sin(a);
        want[(t * nh + h) * D + i + D / 2] = x2 * std::cos(a) + x1 * std::sin(a);
      }
  expect_close("rope", y, want, kForwardF32);
  // Position 0 is the identity.
  std::vector<int32_t> zero(T, 0);
  std::vector<float> y0 = x;
  cpu::rope_forward(y0.data(), zero.data(), inv_freq.data(), T, nh, D);
  EXPECT_EQ(y0, x);
}

TEST(Rope, BackwardIsInverseRotationAndMatchesFiniteDifferences) {
  const int64_t T = 7, nh = 2, D = 8;
  auto x = randn(T * nh * D, 31), R = randn(T * nh * D, 32);
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = static_cast<int32_t>(5 * t + 1);
  auto inv_freq = inv_freq_for(D, 1000.0);
  // backward(forward(x)) == x: the rotation is orthogonal.
  std::vector<float> y = x;
  cpu::rope_forward(y.data(), pos.data(), inv_freq.data(), T, nh, D);
  cpu::rope_backward(y.data(), pos.data(), inv_freq.data(), T, nh, D);
  expect_close("rope^-1 rope x", y, x, kForwardF32);

  std::vector<float> tmp(x.size());
  auto loss = [&] {
    tmp = x;
    cpu::rope_forward(tmp.data(), pos.data(), inv_freq.data(), T, nh, D);
    return dot(tmp, R);
  };
  std::vector<float> dx = R;
  cpu::rope_backward(dx.data(), pos.data(), inv_freq.data(), T, nh, D);
  check_grad("rope d_x", x, dx, loss);
}

TEST(SwiGlu, HandValues) {
  // silu(g) = g / (1 + e^-g): silu(0) = 0, silu(1) = 0.7310585786, silu(-2) = -0.2384058440.
  const int64_t T = 1, F = 3;
  std::vector<float> gu = {0.0f, 1.0f, -2.0f, 5.0f, 2.0f, -3.0f};
  std::vector<float> out(F, 99.0f);
  cpu::swiglu_forward(out.data(), gu.data(), T, F);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_NEAR(out[1], 2.0 * 0.7310585786, 1e-6);
  EXPECT_NEAR(out[2], -3.0 * -0.2384058440, 1e-6);
  // d_up = silu(g); d_gate at g=0 is u * sigmoid(0) * (1 + 0) = u / 2.
  std::vector<float> dgu(2 * F, 0.0f);
  std::vector<float> dout = {1.0f, 1.0f, 1.0f};
  cpu::swiglu_backward(dgu.data(), dout.data(), gu.data(), T, F);
  EXPECT_NEAR(dgu[0], 2.5, 1e-6);
  EXPECT_NEAR(dgu[F + 1], 0.7310585786, 1e-6);
  EXPECT_NEAR(dgu[F + 2], -0.2384058440, 1e-6);
}

TEST(SwiGlu, FiniteDifferences) {
  const int64_t T = 7, F = 5;
  auto gu = randn(T * 2 * F, 40, 2.0f), R = randn(T * F, 41);
  std::vector<float> out(T * F);
  auto loss = [&] {
    cpu::swiglu_forward(out.data(), gu.data(), T, F);
    return dot(out, R);
  };
  std::vector<float> dgu(T * 2 * F, 0.5f);
  cpu::swiglu_backward(dgu.data(), R.data(), gu.data(), T, F);
  for (auto& e : dgu) e -= 0.5f;
  check_grad("swiglu d_gu", gu, dgu, loss);
}

}  // namespace verl::ops::test
