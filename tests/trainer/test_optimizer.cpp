// AdamW with global-norm clipping against hand-computed torch semantics, and a few full training
// steps on a tiny model that must lower the loss they optimise.
#include <gtest/gtest.h>

#include <cmath>

#include "model/transformer.h"
#include "trainer/optimizer.h"

namespace verl::trainer {
namespace {

TEST(AdamW, ClipsByGlobalNormThenUpdatesLikeTorch) {
  AdamWConfig cfg;
  cfg.lr = 0.1f;
  cfg.weight_decay = 0.5f;
  cfg.grad_clip = 1.0f;
  AdamW opt(2, cfg);
  float p[2] = {1.0f, -2.0f};
  const float g[2] = {3.0f, 4.0f};  // norm 5 -> scale 1/(5+1e-6)
  double norm = opt.step(p, g, cfg.lr);
  EXPECT_DOUBLE_EQ(norm, 5.0);
  // Step 1: m = 0.1 g', v = 0.001 g'^2; mhat = g', vhat = g'^2, so the Adam step is lr*sign(g').
  // Weight decay first: p *= (1 - lr*wd) = 0.95.
  double s = 1.0 / (5.0 + 1e-6);
  double e0 = 1.0 * 0.95 - 0.1 * (3 * s) / (std::fabs(3 * s) + 1e-8);
  double e1 = -2.0 * 0.95 - 0.1 * (4 * s) / (std::fabs(4 * s) + 1e-8);
  EXPECT_NEAR(p[0], e0, 1e-6);
  EXPECT_NEAR(p[1], e1, 1e-6);
  // A small gradient is not scaled up.
  AdamW opt2(2, cfg);
  float q[2] = {0.0f, 0.0f};
  const float h[2] = {0.3f, 0.4f};
  EXPECT_NEAR(opt2.step(q, h, cfg.lr), 0.5, 1e-7);
  EXPECT_NEAR(q[0], -0.1 * 0.3 / (0.3 + 1e-8), 1e-6);
  // A non-finite gradient skips the update.
  const float bad[2] = {NAN, 1.0f};
  float r[2] = {1.0f, 1.0f};
  EXPECT_FALSE(std::isfinite(opt2.step(r, bad, cfg.lr)));
  EXPECT_EQ(r[0], 1.0f);
  EXPECT_EQ(opt2.num_steps(), 1);
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
  model::Transformer tf(w);
  model::PackedBatch batch =
      model::PackedBatch::from_sequences({{1, 5, 9, 13, 17, 21, 25}, {2, 4, 8, 16, 32}});
  model::Activations acts;
  AdamWConfig cfg;
  cfg.lr = 1e-2f;
  cfg.weight_decay = 0.0f;
  AdamW opt(w.layout.total, cfg);
  std::vector<float> grads(w.data.size());
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
    std::fill(grads.begin(), grads.end(), 0.0f);
    tf.backward(batch, acts, d_lp.data(), nullptr, nullptr, grads.data());
    double norm = opt.step(w.data.data(), grads.data(), cfg.lr);
    ASSERT_TRUE(std::isfinite(norm));
    tf.forward(batch, acts);
  }
  double last = nll();
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
}

}  // namespace
}  // namespace verl::trainer
