// The training state's storage apart from the parallel strategy (optim/train_state.h,
// optim/strategy.h): a state over a layout that is no model's (two named tensors, as a LoRA
// adapter's A and B) takes AdamW steps equal to torch.optim.AdamW with clip_grad_norm_ computed
// here in double; the strategy factory's choice on one process. The same layout under the
// data-parallel strategies with two ranks: tests/mpi/test_strategy.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "dist/communicator.h"
#include "model/arch/arch.h"
#include "optim/adamw.h"
#include "optim/strategy.h"
#include "optim/train_state.h"

namespace verl::optim {
namespace {

// Two tensors: "a" [2, 3] and "b" [4], 10 elements.
model::ParamLayout two_tensors() {
  model::ParamLayout l;
  model::arch::LayoutBuilder b(l);
  b.add("a", {2, 3});
  b.add("b", {4});
  return l;
}

// torch.optim.AdamW after torch.nn.utils.clip_grad_norm_, in double: decoupled decay first, then
// the bias-corrected Adam step lr m_hat / (sqrt(v_hat) + eps).
struct TorchAdamW {
  AdamWConfig cfg;
  std::vector<double> p, m, v;
  int64_t t = 0;
  double step(const std::vector<float>& g) {
    double sq = 0;
    for (float x : g) sq += double(x) * x;
    const double norm = std::sqrt(sq);
    const double clip = std::min(1.0, cfg.grad_clip / (norm + 1e-6));
    ++t;
    const double bc1 = 1 - std::pow(double(cfg.beta1), double(t));
    const double bc2 = 1 - std::pow(double(cfg.beta2), double(t));
    for (size_t i = 0; i < p.size(); ++i) {
      const double gi = g[i] * clip;
      m[i] = cfg.beta1 * m[i] + (1 - cfg.beta1) * gi;
      v[i] = cfg.beta2 * v[i] + (1 - cfg.beta2) * gi * gi;
      p[i] *= 1 - double(cfg.lr) * cfg.weight_decay;
      p[i] -= cfg.lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + cfg.eps);
    }
    return norm;
  }
};

TEST(TrainStateOverALayout, AdamWStepsEqualTorchAdamW) {
  const model::ParamLayout layout = two_tensors();
  std::vector<float> init(10);
  for (int i = 0; i < 10; ++i) init[i] = 0.1f * static_cast<float>(i) - 0.45f;
  CpuTrainState st(layout, init, /*trainable=*/true);
  EXPECT_EQ(st.numel(), 10);
  EXPECT_EQ(st.layout().params[1].name, "b");
  EXPECT_TRUE(st.weights().config.architecture.empty());  // no model behind the layout

  AdamWConfig cfg;
  cfg.lr = 0.05f;
  cfg.weight_decay = 0.1f;
  cfg.grad_clip = 1.0f;
  const AdamW opt(cfg);
  TorchAdamW ref{cfg, std::vector<double>(init.begin(), init.end()), std::vector<double>(10, 0.0),
                 std::vector<double>(10, 0.0)};
  dist::SingleProcess comm;
  std::unique_ptr<Strategy> strategy = make_strategy(st, comm, StrategyConfig{});
  EXPECT_EQ(strategy->grad_sink(), nullptr);  // one process: the whole buffer, nothing to sync
  for (int step = 0; step < 4; ++step) {
    // Step 1's gradient has a norm above the clip (about 2.9), the others below it.
    std::vector<float> g(10);
    for (int i = 0; i < 10; ++i)
      g[i] = (step == 1 ? 1.3f : 0.07f) * std::sin(0.7f * static_cast<float>(i + 3 * step));
    st.zero_grad();
    std::copy(g.begin(), g.end(), st.grads());
    const double norm = opt.step(st, *strategy, cfg.lr, comm);
    const double want_norm = ref.step(g);
    EXPECT_NEAR(norm, want_norm, 1e-6 * want_norm) << "step " << step;
    for (int i = 0; i < 10; ++i)
      EXPECT_NEAR(st.master()[i], ref.p[i], 2e-6) << "step " << step << ", element " << i;
  }
  EXPECT_EQ(st.steps(), 4);
  const AdamWState s = strategy->download_optimizer_state();
  for (int i = 0; i < 10; ++i) {
    EXPECT_NEAR(s.exp_avg[i], ref.m[i], 1e-7) << i;
    EXPECT_NEAR(s.exp_avg_sq[i], ref.v[i], 1e-9) << i;
  }
}

TEST(TrainStateOverALayout, OneProcessGetsTheWholeAllReduce) {
  CpuTrainState st(two_tensors(), std::vector<float>(10, 1.0f), true);
  dist::SingleProcess comm;
  StrategyConfig cfg;
  cfg.zero_stage = 2;  // one rank has nothing to shard, and nothing to compress
  cfg.lightweight = LightweightConfig{};
  std::unique_ptr<Strategy> s = make_strategy(st, comm, cfg);
  EXPECT_NE(dynamic_cast<AllReduceAtStep*>(s.get()), nullptr);
  EXPECT_TRUE(st.whole());
  EXPECT_FALSE(s->lightweight().has_value());
  EXPECT_EQ(s->zero_stage(), 0);
}

}  // namespace
}  // namespace verl::optim
