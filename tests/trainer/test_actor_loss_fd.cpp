// The actor objective (PPO-clip + entropy bonus + KL loss) differentiated through the whole model:
// the per-token loss gradients from core_algos fed into the transformer's backward must match
// central finite differences of the loss with respect to individual parameters.
#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "model/transformer.h"
#include "trainer/core_algos.h"

namespace verl::trainer {
namespace {

TEST(ActorLoss, GradientThroughTheModelMatchesFiniteDifferences) {
  model::ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.model_type = "qwen3";
  c.family = model::Family::Qwen3;
  c.vocab_size = 23;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 6;
  c.max_position_embeddings = 64;
  c.qk_norm = true;
  model::Weights w = model::Weights::from_config(c);
  w.init_random(3, 0.3f);
  model::Transformer tf(w);

  // Two sequences: prompt lengths 3 and 2, responses of 4 and 5 tokens.
  const std::vector<std::vector<int32_t>> seqs = {{1, 2, 3, 4, 5, 6, 7},
                                                  {8, 9, 10, 11, 12, 13, 14}};
  const int64_t prompt[2] = {3, 2};
  const int64_t L = 5;
  model::PackedBatch pb = model::PackedBatch::from_sequences(seqs);
  Rng rng(17);
  std::vector<float> mask(2 * L, 0.0f), adv(2 * L, 0.0f), noise_old(2 * L), noise_ref(2 * L);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t j = 0; j < static_cast<int64_t>(seqs[b].size()) - prompt[b]; ++j) {
      mask[b * L + j] = 1.0f;
      adv[b * L + j] = rng.normal();
    }
  for (auto& x : noise_old) x = 0.05f * rng.normal();  // ratios near 1: inside the clip range
  for (auto& x : noise_ref) x = 0.3f * rng.normal();

  ActorLossConfig cfg;
  cfg.entropy_coeff = 0.01;
  cfg.use_kl_loss = true;
  cfg.kl_loss_coef = 0.1;
  cfg.kl_loss_type = parse_kl_type("low_var_kl");
  std::vector<float> old, ref;  // fixed from the unperturbed model

  model::Activations acts;
  auto response_values = [&](std::vector<float>& lp, std::vector<float>& ent) {
    tf.forward(pb, acts);
    lp.assign(2 * L, 0.0f);
    ent.assign(2 * L, 0.0f);
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t j = 0; j < static_cast<int64_t>(seqs[b].size()) - prompt[b]; ++j) {
        lp[b * L + j] = acts.logprob[pb.cu_seqlens[b] + prompt[b] - 1 + j];
        ent[b * L + j] = acts.entropy[pb.cu_seqlens[b] + prompt[b] - 1 + j];
      }
  };
  std::vector<float> lp, ent;
  response_values(lp, ent);
  for (int64_t i = 0; i < 2 * L; ++i) {
    old.push_back(lp[i] + noise_old[i]);
    ref.push_back(lp[i] + noise_ref[i]);
  }
  auto loss = [&] {
    std::vector<float> l, e;
    response_values(l, e);
    return compute_actor_loss({2, L}, old, l, adv, mask, e, ref, cfg).policy_loss;
  };

  // Analytic: per-token gradients scattered to packed positions, then the model's backward.
  response_values(lp, ent);
  ActorLossOutput out = compute_actor_loss({2, L}, old, lp, adv, mask, ent, ref, cfg);
  std::vector<float> d_lp(pb.num_tokens(), 0.0f), d_ent(pb.num_tokens(), 0.0f);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t j = 0; j < L; ++j) {
      if (mask[b * L + j] == 0) continue;
      d_lp[pb.cu_seqlens[b] + prompt[b] - 1 + j] = out.d_log_prob[b * L + j];
      d_ent[pb.cu_seqlens[b] + prompt[b] - 1 + j] = out.d_entropy[b * L + j];
    }
  std::vector<float> grads(w.data.size(), 0.0f);
  tf.backward(pb, acts, d_lp.data(), d_ent.data(), nullptr, grads.data());

  double gmax = 0;
  for (float g : grads) gmax = std::max(gmax, double(std::fabs(g)));
  ASSERT_GT(gmax, 1e-4);
  Rng pick(5);
  int checked = 0;
  for (int k = 0; k < 60; ++k) {
    const int64_t i = static_cast<int64_t>(pick.below(w.data.size()));
    const float keep = w.data[i];
    const float eps = 1e-2f;
    w.data[i] = keep + eps;
    const double up = loss();
    w.data[i] = keep - eps;
    const double down = loss();
    w.data[i] = keep;
    const double fd = (up - down) / (2.0 * eps);
    EXPECT_NEAR(fd, grads[i], 2e-3 * gmax + 3e-2 * std::fabs(grads[i]))
        << "parameter element " << i;
    ++checked;
  }
  EXPECT_EQ(checked, 60);
}

}  // namespace
}  // namespace verl::trainer
