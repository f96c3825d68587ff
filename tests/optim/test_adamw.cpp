// The one optimizer (optim::AdamW over a flat training state) with global-norm clipping against
// hand-computed torch semantics, and a few full training steps on a tiny model that must lower the
// loss they optimise.
#include <gtest/gtest.h>

#include <cmath>

#include "dist/communicator.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "optim/train_state.h"

namespace verl::optim {
namespace {

// A training state over n loose floats (one flat parameter), started at `init`.
CpuTrainState flat_state(std::vector<float> init) {
  model::Weights w;
  const int64_t n = static_cast<int64_t>(init.size());
  w.layout.params.push_back(model::ParamInfo{"flat", {n}, 0, n});
  w.layout.total = n;
  w.data = std::move(init);
  return CpuTrainState(std::move(w), /*trainable=*/true);
}

// One step of `opt` on `state` with gradients `g`.
double step_with(const AdamW& opt, CpuTrainState& state, std::vector<float> g, float lr) {
  std::copy(g.begin(), g.end(), state.grads());
  dist::SingleProcess comm;
  return opt.step(state, lr, comm);
}

TEST(AdamW, ClipsByGlobalNormThenUpdatesLikeTorch) {
  AdamWConfig cfg;
  cfg.lr = 0.1f;
  cfg.weight_decay = 0.5f;
  cfg.grad_clip = 1.0f;
  const AdamW opt(cfg);
  CpuTrainState ps = flat_state({1.0f, -2.0f});
  const float* p = ps.master();
  double norm = step_with(opt, ps, {3.0f, 4.0f}, cfg.lr);  // norm 5 -> scale 1/(5+1e-6)
  EXPECT_DOUBLE_EQ(norm, 5.0);
  // Step 1: m = 0.1 g', v = 0.001 g'^2; mhat = g', vhat = g'^2, so the Adam step is lr*sign(g').
  // Weight decay first: p *= (1 - lr*wd) = 0.95.
  double s = 1.0 / (5.0 + 1e-6);
  double e0 = 1.0 * 0.95 - 0.1 * (3 * s) / (std::fabs(3 * s) + 1e-8);
  double e1 = -2.0 * 0.95 - 0.1 * (4 * s) / (std::fabs(4 * s) + 1e-8);
  EXPECT_NEAR(p[0], e0, 1e-6);
  EXPECT_NEAR(p[1], e1, 1e-6);
  // A small gradient is not scaled up.
  CpuTrainState qs = flat_state({0.0f, 0.0f});
  EXPECT_NEAR(step_with(opt, qs, {0.3f, 0.4f}, cfg.lr), 0.5, 1e-7);
  EXPECT_NEAR(qs.master()[0], -0.1 * 0.3 / (0.3 + 1e-8), 1e-6);
  // A non-finite gradient skips the update.
  const std::vector<float> before(qs.master(), qs.master() + 2);
  EXPECT_FALSE(std::isfinite(step_with(opt, qs, {NAN, 1.0f}, cfg.lr)));
  EXPECT_EQ(qs.master()[0], before[0]);
  EXPECT_EQ(qs.steps(), 1);
  EXPECT_EQ(qs.optimizer_state().step, 1);
}

TEST(Training, FewStepsLowerTheNegativeLogLikelihood) {
  model::ModelConfig c;
  c.architecture = "Qwen2ForCausalLM";
  c.model_type = "qwen2";
  c.family = model::Family::Qwen2;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  c.attention_bias = true;
  c.tie_word_embeddings = true;
  model::Weights w = model::Weights::from_config(c);
  w.init_random(7, 0.1f);
  CpuTrainState state(std::move(w), /*trainable=*/true);
  model::Transformer tf(state.weights());
  model::PackedBatch batch =
      model::PackedBatch::from_sequences({{1, 5, 9, 13, 17, 21, 25}, {2, 4, 8, 16, 32}});
  model::Activations acts;
  AdamWConfig cfg;
  cfg.lr = 1e-2f;
  cfg.weight_decay = 0.0f;
  const AdamW opt(cfg);
  dist::SingleProcess comm;
  std::vector<float> d_lp(batch.num_tokens());
  for (int64_t t = 0; t < batch.num_tokens(); ++t) d_lp[t] = batch.targets[t] >= 0 ? -1.0f : 0.0f;
  auto nll = [&] {
    double s = 0;
    for (int64_t t = 0; t < batch.num_tokens(); ++t) s -= acts.logprob[t];
    return s;
  };
  tf.forward(batch, acts);
  double first = nll();
  for (int step = 0; step < 20; ++step) {
    state.zero_grad();
    tf.backward(batch, acts, d_lp.data(), nullptr, nullptr, state.grads());
    double norm = opt.step(state, cfg.lr, comm);
    ASSERT_TRUE(std::isfinite(norm));
    tf.forward(batch, acts);
  }
  double last = nll();
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
}

}  // namespace
}  // namespace verl::optim
