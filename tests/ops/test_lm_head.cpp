// Fused LM head (logits, log-softmax, target gather, entropy): chunking invariance, a naive
// full-logits reference, temperature, missing targets, target checks and finite differences of
// L = sum_t a_t logprob_t + b_t entropy_t.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "ops/cpu/ops.h"
#include "test_util.h"

namespace verl::ops::test {
namespace cpu = verl::ops::cpu;

namespace {

struct Out {
  std::vector<float> logprob, entropy, lse;
};

Out forward(const std::vector<float>& h, const std::vector<float>& w,
            const std::vector<int32_t>& targets, int64_t T, int64_t C, int64_t V, float temp,
            int64_t chunk) {
  Out o{std::vector<float>(T, 9.0f), std::vector<float>(T, 9.0f), std::vector<float>(T, 9.0f)};
  cpu::lm_head_forward(o.logprob.data(), o.entropy.data(), o.lse.data(), h.data(), w.data(),
                       targets.data(), T, C, V, temp, chunk);
  return o;
}

// All T x V logits at once, in double.
void naive(std::vector<double>& logprob, std::vector<double>& entropy, std::vector<double>& lse,
           const std::vector<float>& h, const std::vector<float>& w,
           const std::vector<int32_t>& targets, int64_t T, int64_t C, int64_t V, double temp) {
  logprob.assign(T, 0.0);
  entropy.assign(T, 0.0);
  lse.assign(T, 0.0);
  std::vector<double> z(V);
  for (int64_t t = 0; t < T; ++t) {
    double m = -1e300;
    for (int64_t j = 0; j < V; ++j) {
      double s = 0.0;
      for (int64_t c = 0; c < C; ++c) s += static_cast<double>(h[t * C + c]) * w[j * C + c];
      z[j] = s / temp;
      m = std::max(m, z[j]);
    }
    double l = 0.0;
    for (int64_t j = 0; j < V; ++j) l += std::exp(z[j] - m);
    lse[t] = m + std::log(l);
    for (int64_t j = 0; j < V; ++j) {
      const double logp = z[j] - lse[t];
      entropy[t] -= std::exp(logp) * logp;
    }
    logprob[t] = targets[t] >= 0 ? z[targets[t]] - lse[t] : 0.0;
  }
}

}  // namespace

TEST(LmHead, MatchesNaiveAndIsChunkInvariant) {
  const int64_t T = 19, C = 13, V = 37;
  auto h = randn(T * C, 50), w = randn(V * C, 51, 0.5f);
  std::vector<int32_t> targets(T);
  for (int64_t t = 0; t < T; ++t) targets[t] = static_cast<int32_t>((t * 7) % V);
  targets[4] = -1;  // no next token
  targets[T - 1] = -1;
  for (float temp : {1.0f, 0.7f}) {
    std::vector<double> wl, we, wlse;
    naive(wl, we, wlse, h, w, targets, T, C, V, temp);
    const Out full = forward(h, w, targets, T, C, V, temp, T);
    const std::string tag = " temperature " + std::to_string(temp);
    expect_close("logprob" + tag, full.logprob, wl, kLmHeadRef);
    expect_close("entropy" + tag, full.entropy, we, kLmHeadRef);
    expect_close("lse" + tag, full.lse, wlse, kLmHeadRef);
    EXPECT_EQ(full.logprob[4], 0.0f);
    EXPECT_EQ(full.logprob[T - 1], 0.0f);
    EXPECT_GT(full.entropy[4], 0.0f);  // entropy is still defined without a target
    for (int64_t chunk : {1, 3, 0}) {  // 0 = all tokens in one chunk
      const Out c = forward(h, w, targets, T, C, V, temp, chunk);
      const std::string ct = tag + " chunk " + std::to_string(chunk);
      expect_close("logprob" + ct, c.logprob, full.logprob, kSameMath);
      expect_close("entropy" + ct, c.entropy, full.entropy, kSameMath);
      expect_close("lse" + ct, c.lse, full.lse, kSameMath);
    }
  }
}

TEST(LmHead, TemperatureChangesTheDistribution) {
  // Guards against a dropped 1/temperature: at T=0.7 the logits are sharper, lse differs.
  const int64_t T = 3, C = 4, V = 5;
  auto h = randn(T * C, 52), w = randn(V * C, 53);
  std::vector<int32_t> targets = {0, 1, 2};
  const Out a = forward(h, w, targets, T, C, V, 1.0f, T);
  const Out b = forward(h, w, targets, T, C, V, 0.7f, T);
  for (int64_t t = 0; t < T; ++t) EXPECT_GT(std::abs(a.lse[t] - b.lse[t]), 1e-3) << t;
}

TEST(LmHead, OutOfRangeTargetNamesPosition) {
  const int64_t T = 4, C = 3, V = 5;
  auto h = randn(T * C, 54), w = randn(V * C, 55);
  std::vector<int32_t> targets = {0, 1, 5, 2};
  try {
    forward(h, w, targets, T, C, V, 1.0f, 2);
    ADD_FAILURE() << "target 5 with V=5 was accepted";
  } catch (const verl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("position 2"), std::string::npos) << e.what();
  }
}

TEST(LmHead, FiniteDifferences) {
  const int64_t T = 7, C = 5, V = 11;
  for (float temp : {1.0f, 0.7f}) {
    for (int64_t chunk : {1, 3, 7}) {
      auto h = randn(T * C, 60), w = randn(V * C, 61);
      std::vector<int32_t> targets = {3, 0, 10, -1, 5, 5, 1};
      auto a = randn(T, 62), b = randn(T, 63);
      Out o;
      auto loss = [&] {
        o = forward(h, w, targets, T, C, V, temp, chunk);
        return dot(o.logprob, a) + dot(o.entropy, b);
      };
      loss();
      std::vector<float> dh(T * C, 0.5f), dw(V * C, 0.5f);
      cpu::lm_head_backward(dh.data(), dw.data(), a.data(), b.data(), h.data(), w.data(),
                            targets.data(), o.lse.data(), o.entropy.data(), T, C, V, temp, chunk);
      for (auto& e : dh) e -= 0.5f;
      for (auto& e : dw) e -= 0.5f;
      const std::string tag = " temp " + std::to_string(temp) + " chunk " + std::to_string(chunk);
      check_grad("lm_head d_h" + tag, h, dh, loss);
      check_grad("lm_head d_w" + tag, w, dw, loss);

      // Only d_logprob (the PPO loss without an entropy bonus): d_entropy = null means zero.
      std::fill(b.begin(), b.end(), 0.0f);
      std::vector<float> dh2(T * C, 0.0f);
      cpu::lm_head_backward(dh2.data(), nullptr, a.data(), nullptr, h.data(), w.data(),
                            targets.data(), o.lse.data(), nullptr, T, C, V, temp, chunk);
      check_grad("lm_head d_h (logprob only)" + tag, h, dh2, loss);
    }
  }
}

}  // namespace verl::ops::test
