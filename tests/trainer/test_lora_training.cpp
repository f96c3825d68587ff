// LoRA in the trainer on the CPU (issue 39): the CPU policy over an adapter state (fresh adapters
// give the base model's log-probs exactly, adapter gradients against finite differences, AdamW
// moves the adapters only and the base stays frozen), verl's LoRA keys, and a PPO run with LoRA
// whose checkpoints hold the adapters only, resume exactly and refuse another rank.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../common/test_util.h"
#include "config/config.h"
#include "core/error.h"
#include "core/rng.h"
#include "dist/communicator.h"
#include "trainer/checkpoint.h"
#include "trainer/policy_model.h"
#include "trainer/ppo_trainer.h"

namespace verl::trainer {
namespace {

namespace fs = std::filesystem;
#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << "message: " << (msg)
const std::string kRoot = VERL_SOURCE_DIR;

model::PackedBatch random_batch(const std::vector<int>& lens, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<std::vector<int32_t>> seqs;
  for (int n : lens) {
    seqs.emplace_back();
    for (int i = 0; i < n; ++i) seqs.back().push_back(static_cast<int32_t>(rng.below(vocab)));
  }
  return model::PackedBatch::from_sequences(seqs);
}

model::LoraConfig all_linear(int64_t r, double alpha) {
  model::LoraConfig c;
  c.r = r;
  c.alpha = alpha;
  c.target_modules = model::ModuleMatch::parse("all-linear", "target_modules", true);
  return c;
}

std::unique_ptr<PolicyModel> lora_policy(const model::Weights& w, const model::LoraWeights& lw,
                                         float lr = 1e-2f) {
  PolicyOptions po;
  po.optim.lr = lr;
  po.optim.weight_decay = 0.0f;
  po.lora = std::make_shared<const model::LoraWeights>(lw);
  return make_policy(Device::Cpu, w, po);
}

TEST(LoraPolicy, FreshAdaptersGiveTheBaseModelExactly) {
  const model::Weights w = model::Weights::load(kRoot + "/assets/demo/model");
  model::LoraWeights lw = model::LoraWeights::create(w.config, all_linear(16, 32));
  lw.init(7);  // A random, B zero
  PolicyOptions base_opts;
  base_opts.trainable = false;
  auto base = make_policy(Device::Cpu, w, base_opts);
  auto lora = lora_policy(w, lw);
  const model::PackedBatch b = random_batch({9, 4, 13}, w.config.vocab_size, 3);
  std::vector<float> lp_base, ent_base, lp, ent;
  base->forward(b, 0.7f, lp_base, &ent_base, false);
  lora->forward(b, 0.7f, lp, &ent, false);
  ASSERT_EQ(lp.size(), lp_base.size());
  EXPECT_TRUE(lp == lp_base) << "a fresh adapter (B = 0) changed the log-probs";
  EXPECT_TRUE(ent == ent_base);
  // The state is the adapters', the weights the frozen base.
  EXPECT_EQ(lora->state().numel(), lw.layout.total);
  EXPECT_EQ(lora->weights().data, w.data);
  ASSERT_NE(lora->lora(), nullptr);
  EXPECT_EQ(lora->lora()->data, lw.data);
}

// L = sum_t a[t] logprob[t] + c[t] entropy[t] through the policy, in fp64.
double policy_loss(PolicyModel& p, const model::PackedBatch& b, const std::vector<float>& a,
                   const std::vector<float>& c) {
  std::vector<float> lp, ent;
  p.forward(b, 1.0f, lp, &ent);
  double s = 0;
  for (size_t t = 0; t < lp.size(); ++t) s += double(a[t]) * lp[t] + double(c[t]) * ent[t];
  return s;
}

TEST(LoraPolicy, AdapterGradientsMatchFiniteDifferences) {
  const model::Weights w = model::Weights::load(kRoot + "/assets/demo/model");
  model::LoraWeights lw = model::LoraWeights::create(w.config, all_linear(4, 8));
  Rng init(11);
  for (float& x : lw.data) x = 0.1f * init.normal();  // B nonzero: both A and B get gradients
  auto p = lora_policy(w, lw);
  const model::PackedBatch b = random_batch({7, 5}, w.config.vocab_size, 5);
  const int64_t T = b.num_tokens();
  Rng rng(5);
  std::vector<float> a(T), c(T);
  for (int64_t t = 0; t < T; ++t) {
    a[t] = b.targets[t] >= 0 ? rng.normal() : 0.0f;
    c[t] = 0.5f * rng.normal();
  }
  p->zero_grad();
  std::vector<float> lp, ent;
  p->forward(b, 1.0f, lp, &ent);
  p->backward(a.data(), c.data());
  const std::vector<float> g(p->state().grads(), p->state().grads() + lw.layout.total);
  const float eps = 1e-2f;
  int checked = 0;
  double worst = 0;
  std::vector<float> x = lw.data;
  for (const model::ParamInfo& pi : lw.layout.params) {
    {  // one coordinate of every A and B
      const int64_t i =
          pi.offset + static_cast<int64_t>(rng.below(static_cast<uint64_t>(pi.numel)));
      const float keep = x[i];
      x[i] = keep + eps;
      p->restore(x, p->optimizer_state());
      const double up = policy_loss(*p, b, a, c);
      x[i] = keep - eps;
      p->restore(x, p->optimizer_state());
      const double down = policy_loss(*p, b, a, c);
      x[i] = keep;
      const double fd = (up - down) / (2.0 * eps);
      const double err = std::fabs(fd - g[i]);
      EXPECT_LE(err, 2e-3 + 1e-2 * std::fabs(fd))
          << pi.name << " element " << i - pi.offset << ": analytic " << g[i] << ", fd " << fd;
      worst = std::max(worst, err);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 * 7 * w.config.num_hidden_layers);
  std::printf("worst |fd - analytic| %.3g over %d adapter coordinates\n", worst, checked);
}

TEST(LoraPolicy, AdamWMovesTheAdaptersOnlyAndSwitchingThemOffIsTheBase) {
  const model::Weights w = model::Weights::load(kRoot + "/assets/demo/model");
  model::LoraWeights lw = model::LoraWeights::create(w.config, all_linear(8, 16));
  lw.init(3);
  auto p = lora_policy(w, lw, 1e-2f);
  const model::PackedBatch b = random_batch({11, 6}, w.config.vocab_size, 9);
  std::vector<float> lp0, lp1, lp_off, d(b.num_tokens(), 1.0f);
  p->forward(b, 1.0f, lp0, nullptr);
  p->zero_grad();
  p->backward(d.data(), nullptr);
  dist::SingleProcess comm;
  const double norm = p->optimizer_step(1e-2f, comm);
  EXPECT_GT(norm, 0.0);
  EXPECT_EQ(p->state().steps(), 1);
  // The update reached the adapters the decoder reads: AdamW descended sum_t logprob[t] (the
  // objective whose gradient backward gave).
  p->forward(b, 1.0f, lp1, nullptr);
  double before = 0, after = 0;
  for (size_t t = 0; t < lp0.size(); ++t) {
    before += lp0[t];
    after += lp1[t];
  }
  EXPECT_LT(after, before - 1e-3);
  const std::vector<float> master(p->state().master(), p->state().master() + lw.layout.total);
  EXPECT_EQ(p->lora()->data, master);
  EXPECT_NE(p->lora()->data, lw.data);
  EXPECT_EQ(p->weights().data, w.data) << "the frozen base changed";
  // Adapters off: the base model's log-probs exactly (the reference policy inside the actor).
  p->set_adapters_enabled(false);
  p->forward(b, 1.0f, lp_off, nullptr, false);
  EXPECT_EQ(lp_off, lp0);  // lp0 was the fresh (B = 0) adapter: the base
  EXPECT_THROW(p->backward(d.data(), nullptr), Error);
  p->set_adapters_enabled(true);
  std::vector<float> lp2;
  p->forward(b, 1.0f, lp2, nullptr);
  EXPECT_EQ(lp2, lp1);
}

// ---- the trainer ---------------------------------------------------------------------------

config::Config lora_cfg(const std::string& out, int64_t steps,
                        std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {
      "actor_rollout_ref.model.path=" + kRoot + "/assets/demo/model",
      "data.train_files=[" + kRoot + "/assets/demo/train.jsonl]",
      "data.val_files=null",
      "data.train_batch_size=4",
      "actor_rollout_ref.actor.ppo_mini_batch_size=2",
      "actor_rollout_ref.rollout.n=2",
      "actor_rollout_ref.model.lora_rank=8",
      "actor_rollout_ref.model.lora_alpha=16",
      "actor_rollout_ref.actor.optim.lr=1e-3",
      "actor_rollout_ref.actor.use_kl_loss=true",  // the reference: the actor with adapters off
      "trainer.total_training_steps=" + std::to_string(steps),
      "trainer.logger=[jsonl]",
      "trainer.save_freq=2",
      "trainer.default_local_dir=" + out,
  };
  o.insert(o.end(), extra.begin(), extra.end());
  return test::demo_config(o);
}

std::vector<nlohmann::json> read_metrics(const std::string& dir) {
  std::ifstream f(dir + "/metrics.jsonl");
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(LoraTrainer, CheckpointsHoldAdaptersAndResumeExactly) {
  const test::TempDir scratch("test_lora_ckpt");
  const std::string full = (scratch.path() / "full").string(),
                    part = (scratch.path() / "part").string();
  std::vector<float> full_adapters;
  {
    PpoTrainer t(lora_cfg(full, 4));
    t.fit();
    ASSERT_NE(t.actor_lora(), nullptr);
    full_adapters = t.actor_lora()->data;
    EXPECT_EQ(t.actor().data, model::Weights::load(kRoot + "/assets/demo/model").data)
        << "the base moved";
  }
  const fs::path ck = fs::path(full) / "global_step_4" / "actor";
  EXPECT_TRUE(fs::exists(ck / "lora_adapter" / "adapter_config.json"));
  EXPECT_TRUE(fs::exists(ck / "lora_adapter" / "adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(ck / "optim.safetensors"));
  EXPECT_FALSE(fs::exists(ck / "huggingface")) << "a LoRA checkpoint holds the adapters only";
  {
    PpoTrainer t(lora_cfg(part, 2));
    t.fit();
  }
  std::vector<float> resumed;
  {
    PpoTrainer t(lora_cfg(part, 4));
    t.fit();
    EXPECT_EQ(t.global_step(), 4);
    resumed = t.actor_lora()->data;
  }
  auto a = read_metrics(full), b = read_metrics(part);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    for (const char* k : {"critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/kl_loss",
                          "response_length/mean"}) {
      ASSERT_TRUE(a[i].contains(k)) << k;
      EXPECT_EQ(a[i][k].get<double>(), b[i][k].get<double>()) << k << " at step " << i + 1;
    }
  EXPECT_TRUE(full_adapters == resumed) << "resumed adapters differ from the uninterrupted run";
  // The KL to the reference (adapters off) starts at zero (B = 0; the first step's second
  // mini-batch sees one small update) and grows.
  EXPECT_LT(a[0]["actor/kl_loss"].get<double>(), 1e-8);
  EXPECT_GT(a[3]["actor/kl_loss"].get<double>(), 100 * a[0]["actor/kl_loss"].get<double>());

  // Another rank, or full fine-tuning, over this checkpoint: refused naming both sides.
  std::string m = test::expected_error_of(
      [&] { PpoTrainer(lora_cfg(full, 6, {"actor_rollout_ref.model.lora_rank=4"})).fit(); });
  EXPECT_HAS(m, "rank 8, this run's actor_rollout_ref.model.lora_rank is 4");
  m = test::expected_error_of(
      [&] { PpoTrainer(lora_cfg(full, 6, {"actor_rollout_ref.model.lora_rank=0"})).fit(); });
  EXPECT_HAS(m, "a LoRA checkpoint (rank 8)");
}

TEST(LoraTrainer, VerlKeysAreReadAndCheckedByName) {
  auto read = [](std::vector<std::string> o) {
    return PpoConfig::read(test::demo_config(o), 1, false);
  };
  EXPECT_FALSE(read({}).lora.has_value());  // lora_rank 0: off, verl's default
  PpoConfig c =
      read({"actor_rollout_ref.model.lora_rank=32", "actor_rollout_ref.model.lora_alpha=64",
            "actor_rollout_ref.model.target_modules=[q_proj,v_proj]",
            "actor_rollout_ref.model.exclude_modules=.*layers\\.0\\..*"});
  ASSERT_TRUE(c.lora.has_value());
  EXPECT_EQ(c.lora->config.r, 32);
  EXPECT_DOUBLE_EQ(c.lora->config.scale(), 2.0);
  EXPECT_TRUE(c.lora->config.adapts(1, model::LoraTarget::Q));
  EXPECT_FALSE(c.lora->config.adapts(1, model::LoraTarget::K));
  EXPECT_FALSE(c.lora->config.adapts(0, model::LoraTarget::Q));  // excluded by the regex
  c = read({"actor_rollout_ref.model.lora_rank=8"});  // verl's defaults: all-linear, alpha 16
  EXPECT_TRUE(c.lora->config.adapts(0, model::LoraTarget::Down));
  EXPECT_DOUBLE_EQ(c.lora->config.scale(), 2.0);
  std::string m = test::expected_error_of([&] {
    read({"actor_rollout_ref.model.lora_rank=8",
          "actor_rollout_ref.model.target_modules=[q_proj,lm_head]"});
  });
  EXPECT_HAS(m, "actor_rollout_ref.model.target_modules: 'lm_head' is not a projection");
  m = test::expected_error_of([&] { read({"actor_rollout_ref.model.lora_rank=-1"}); });
  EXPECT_HAS(m, "actor_rollout_ref.model.lora_rank");
}

}  // namespace
}  // namespace verl::trainer
