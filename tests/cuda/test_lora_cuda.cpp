// LoRA on the GPU (model/cuda/lora.h through the CUDA decoder, the CUDA policy and its rollout)
// against the CPU model with the same adapters (model/lora.h, itself pinned to PEFT by
// tests/model/test_lora.cpp): log-probs, entropies, adapter and base gradients on the tiny golden
// models with PEFT's adapters (tests/fixtures/lora, all seven projections, nonzero B); a fresh
// adapter and switched-off adapters give the base model's bits; an optimizer step moves only the
// adapters; the rollout's log-probs equal the trainer's (bit for bit in batch-invariant mode).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/rng.h"
#include "dist/communicator.h"
#include "model/batch.h"
#include "model/cuda/lora.h"
#include "model/cuda/transformer.h"
#include "model/lora.h"
#include "model/transformer.h"
#include "model/weights.h"
#include "optim/adamw.h"
#include "optim/cuda/train_state.h"
#include "rollout/engine.h"
#include "test_util.h"
#include "tolerances.h"
#include "trainer/policy_model.h"

namespace verl::ops::cuda::test {
namespace {

using model::cuda::CudaLora;
using model::cuda::CudaTransformer;
using model::cuda::CudaTransformerOptions;

const std::string kGolden = std::string(VERL_SOURCE_DIR) + "/tests/fixtures/golden/";
const std::string kLora = std::string(VERL_SOURCE_DIR) + "/tests/fixtures/lora/";

std::vector<std::vector<int32_t>> golden_inputs(const std::string& name) {
  std::ifstream f(kGolden + name + "/inputs.json");
  nlohmann::json j = nlohmann::json::parse(f);
  std::vector<std::vector<int32_t>> seqs;
  for (auto& s : j["sequences"]) seqs.push_back(s.get<std::vector<int32_t>>());
  return seqs;
}

model::LoraConfig all_linear(int64_t r, double alpha) {
  model::LoraConfig c;
  c.r = r;
  c.alpha = alpha;
  c.target_modules = model::ModuleMatch::parse("all-linear", "target_modules", true);
  return c;
}

// Every A and B drawn from N(0, std^2), rounded to bf16 (what the GPU computes with).
model::LoraWeights random_adapter(const model::ModelConfig& base, int64_t r, uint64_t seed,
                                  float std = 0.1f) {
  model::LoraWeights lw = model::LoraWeights::create(base, all_linear(r, 2.0 * r));
  Rng rng(seed, 3);
  for (float& x : lw.data) x = std * rng.normal();
  lw.data = bf16_rounded(std::move(lw.data));
  return lw;
}

// The golden base model and its PEFT adapter, both rounded to bf16 so that the CPU model sees the
// GPU's weights exactly.
struct Fixture {
  explicit Fixture(const std::string& name)
      : w(model::Weights::load(kGolden + name)),
        lw(model::LoraWeights::load(kLora + name, w.config)),
        batch(model::PackedBatch::from_sequences(golden_inputs(name))) {
    w.data = bf16_rounded(std::move(w.data));
    lw.data = bf16_rounded(std::move(lw.data));
  }
  model::Weights w;
  model::LoraWeights lw;
  model::PackedBatch batch;
};

// The GPU model as the LoRA policy builds it: the base in a forward-only bf16 state, the adapters
// in a trainable one; with train_base the base is trainable too (its gradients then show the
// adapters' part of the input gradient).
struct GpuLoraModel {
  GpuLoraModel(const CudaContext& ctx, const model::Weights& w, const model::LoraWeights& lw,
               CudaTransformerOptions o, bool train_base = false)
      : base(ctx, w, train_base), adapters(ctx, lw.layout, lw.data, o.trainable), view(lw) {
    view.set_weights(adapters.weights_bf16());
    view.set_grads(o.trainable ? adapters.grads() : nullptr);
    o.lora = &view;
    tf = std::make_unique<CudaTransformer>(ctx, w.config, w.layout, base.weights_bf16(),
                                           train_base ? base.grads() : nullptr, o);
  }
  static std::vector<float> grads_of(optim::cuda::CudaTrainState& s) {
    std::vector<float> g(static_cast<size_t>(s.numel()));
    copy_to_host(g.data(), s.grads(), g.size() * sizeof(float));
    return g;
  }
  optim::cuda::CudaTrainState base, adapters;
  CudaLora view;
  std::unique_ptr<CudaTransformer> tf;
};

CudaTransformerOptions plan(const model::PackedBatch& b, bool trainable = true) {
  CudaTransformerOptions o;
  o.max_tokens = b.num_tokens();
  o.max_seqs = b.num_seqs();
  o.lm_head_chunk = 7;  // the chunked LM head runs
  o.trainable = trainable;
  return o;
}

// max |a - ref| over [offset, offset + n) relative to max |ref| there.
double rel_max_err(const std::vector<float>& a, const std::vector<float>& ref, int64_t offset,
                   int64_t n) {
  double m = 0, e = 0;
  for (int64_t i = offset; i < offset + n; ++i) {
    m = std::max(m, std::fabs(double(ref[i])));
    e = std::max(e, std::fabs(double(a[i]) - ref[i]));
  }
  return m > 0 ? e / m : e;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
  return d;
}

// The view's bookkeeping (host only, runs without a GPU): each layer's gradient range is exactly
// its adapters' tensors, the ranges tile the layout in layer order (data parallelism reduces them
// as backward finishes each layer), and a layer without adapters has an empty range.
TEST(LoraCudaView, LayerRangesTileTheAdapterLayout) {
  const model::Weights w = model::Weights::load(kGolden + "qwen3");
  model::LoraConfig cfg = all_linear(4, 8.0);
  const model::LoraWeights all = model::LoraWeights::create(w.config, cfg);
  cfg.target_modules = model::ModuleMatch::parse(nlohmann::json::array({"q_proj", "down_proj"}),
                                                 "target_modules", true);
  cfg.exclude_modules =
      model::ModuleMatch::parse("model\\.layers\\.0\\..*", "exclude_modules", false);
  const model::LoraWeights some = model::LoraWeights::create(w.config, cfg);
  for (const model::LoraWeights* lw : {&all, &some}) {
    const CudaLora view(*lw);
    EXPECT_EQ(view.rank(), 4);
    EXPECT_FLOAT_EQ(view.scale(), 2.0f);
    EXPECT_EQ(view.numel(), lw->layout.total);
    ASSERT_EQ(view.num_layers(), w.config.num_hidden_layers);
    int64_t at = 0;
    for (int l = 0; l < view.num_layers(); ++l) {
      const auto [begin, end] = view.layer_range(l);
      int64_t own = 0;
      for (int t = 0; t < model::kNumLoraTargets; ++t) {
        for (int i : {lw->a[static_cast<size_t>(l)][t], lw->b[static_cast<size_t>(l)][t]}) {
          if (i < 0) continue;
          const model::ParamInfo& p = lw->layout.params[static_cast<size_t>(i)];
          EXPECT_GE(p.offset, begin);
          EXPECT_LE(p.offset + p.numel, end);
          own += p.numel;
        }
      }
      EXPECT_EQ(begin, at) << "layer " << l;
      EXPECT_EQ(end - begin, own) << "layer " << l;
      at = end;
    }
    EXPECT_EQ(at, lw->layout.total);
  }
  EXPECT_EQ(CudaLora(some).layer_range(0).first, CudaLora(some).layer_range(0).second);
  EXPECT_EQ(CudaLora(all).layer_range(1).second - CudaLora(all).layer_range(1).first,
            all.layout.total / w.config.num_hidden_layers);
}

class LoraCudaFamilies : public CudaTest, public ::testing::WithParamInterface<std::string> {};

// Forward log-probs and entropies, every adapter gradient (frozen base) and every base gradient
// (base trained beside the adapters: the input gradients carry the adapters' d_u A) against the
// CPU model with the same adapters.
TEST_P(LoraCudaFamilies, LogprobsAndGradientsMatchTheCpuModel) {
  const std::string name = GetParam();
  const Fixture f(name);
  const model::PackedBatch& b = f.batch;
  const int64_t T = b.num_tokens();
  std::vector<float> d_lp(T);
  for (int64_t t = 0; t < T; ++t) d_lp[t] = b.targets[t] >= 0 ? 1.0f : 0.0f;

  // CPU: adapter gradients with a frozen base, then base and adapter gradients together.
  model::Transformer cpu(f.w, &f.lw);
  model::Activations acts;
  cpu.forward(b, acts);
  std::vector<float> cpu_lg(f.lw.data.size(), 0.0f), cpu_g(f.w.data.size(), 0.0f);
  cpu.backward(b, acts, d_lp.data(), nullptr, nullptr, nullptr, {}, nullptr, nullptr,
               {cpu_lg.data(), true});
  std::vector<float> cpu_lg2(f.lw.data.size(), 0.0f);
  cpu.backward(b, acts, d_lp.data(), nullptr, nullptr, cpu_g.data(), {}, nullptr, nullptr,
               {cpu_lg2.data(), false});

  GpuLoraModel g(ctx(), f.w, f.lw, plan(b));
  g.tf->forward(b, 1.0f);
  g.tf->backward_host(d_lp.data(), nullptr);
  const std::vector<float> lp = g.tf->download_logprob(), ent = g.tf->download_entropy();
  expect_close(name + " logprob", lp, acts.logprob, kModelLogprob);
  expect_close(name + " entropy", ent, acts.entropy, kModelLogprob);
  // The adapters matter: the GPU's base model alone is far from the adapted log-probs.
  g.view.set_enabled(false);
  g.tf->forward(b, 1.0f, /*for_backward=*/false);
  EXPECT_GT(max_abs_diff(g.tf->download_logprob(), lp), 1e-2) << name;
  g.view.set_enabled(true);

  const std::vector<float> lg = GpuLoraModel::grads_of(g.adapters);
  double worst = 0;
  for (const model::ParamInfo& p : f.lw.layout.params) {
    const double err = rel_max_err(lg, cpu_lg, p.offset, p.numel);
    EXPECT_LE(err, kModelGradRel) << name << ": gradient of " << p.name;
    worst = std::max(worst, err);
  }
  // Base trained too: the base's gradients through the adapters' input gradients, and the adapter
  // gradients bitwise those of the frozen-base run (the base's weight GEMMs do not touch them).
  GpuLoraModel both(ctx(), f.w, f.lw, plan(b), /*train_base=*/true);
  both.tf->forward(b, 1.0f);
  both.tf->backward_host(d_lp.data(), nullptr);
  EXPECT_TRUE(bitwise_equal(GpuLoraModel::grads_of(both.adapters), lg)) << name;
  const std::vector<float> bg = GpuLoraModel::grads_of(both.base);
  double worst_base = 0;
  for (const model::ParamInfo& p : f.w.layout.params) {
    const double err = rel_max_err(bg, cpu_g, p.offset, p.numel);
    EXPECT_LE(err, kModelGradRel) << name << ": base gradient of " << p.name;
    worst_base = std::max(worst_base, err);
  }
  std::printf(
      "%s LoRA: max |dlogprob| %.3g; max relative gradient error: adapters %.3g over %zu "
      "tensors, base %.3g\n",
      name.c_str(), max_abs_diff(lp, acts.logprob), worst, f.lw.layout.params.size(), worst_base);
}

// A fresh adapter (PEFT's init: B = 0) gives the base model's log-probs and entropies bit for bit,
// and so do switched-off adapters with nonzero B; the LoRA model then runs no adapter GEMM.
TEST_P(LoraCudaFamilies, FreshOrSwitchedOffAdaptersGiveTheBaseModelsBits) {
  const std::string name = GetParam();
  const Fixture f(name);
  const model::PackedBatch& b = f.batch;
  optim::cuda::CudaTrainState base(ctx(), f.w, false);
  CudaTransformer plain(ctx(), f.w.config, f.w.layout, base.weights_bf16(), nullptr,
                        plan(b, false));
  plain.forward(b, 0.8f, false);
  const std::vector<float> lp = plain.download_logprob(), ent = plain.download_entropy();

  model::LoraWeights fresh = model::LoraWeights::create(f.w.config, all_linear(8, 16.0));
  fresh.init(5);
  for (bool trainable : {false, true}) {
    GpuLoraModel g(ctx(), f.w, fresh, plan(b, trainable));
    g.tf->forward(b, 0.8f, /*for_backward=*/false);
    EXPECT_TRUE(bitwise_equal(g.tf->download_logprob(), lp)) << name << " fresh adapter";
    EXPECT_TRUE(bitwise_equal(g.tf->download_entropy(), ent)) << name << " fresh adapter";
  }
  GpuLoraModel off(ctx(), f.w, f.lw, plan(b));
  off.view.set_enabled(false);
  off.tf->forward(b, 0.8f, /*for_backward=*/false);
  EXPECT_TRUE(bitwise_equal(off.tf->download_logprob(), lp)) << name << " adapters off";
  EXPECT_TRUE(bitwise_equal(off.tf->download_entropy(), ent)) << name << " adapters off";
  // Backward needs the adapters: refused while they are off, and after a forward without them.
  off.tf->forward(b, 0.8f, /*for_backward=*/true);
  std::vector<float> d_lp(static_cast<size_t>(b.num_tokens()), 1.0f);
  EXPECT_ANY_THROW(off.tf->backward_host(d_lp.data(), nullptr));
  off.view.set_enabled(true);
  EXPECT_ANY_THROW(off.tf->backward_host(d_lp.data(), nullptr));
}

INSTANTIATE_TEST_SUITE_P(Families, LoraCudaFamilies, ::testing::Values("qwen2", "llama3", "qwen3"));

// ---- the CUDA policy with adapters
// ----------------------------------------------------------------

trainer::PolicyOptions lora_policy_options(const model::LoraWeights& lw, int64_t max_tokens,
                                           int64_t max_seqs, Numerics numerics) {
  trainer::PolicyOptions po;
  po.trainable = true;
  po.optim.lr = 1e-3f;
  po.optim.grad_clip = 1.0f;
  po.max_tokens = max_tokens;
  po.max_seqs = max_seqs;
  po.lm_head_chunk = 64;
  po.numerics = numerics;
  po.lora = std::make_shared<const model::LoraWeights>(lw);
  return po;
}

// One step of sum(logprob) ascent.
double ascend(trainer::PolicyModel& p, const model::PackedBatch& b) {
  std::vector<float> lp;
  p.zero_grad();
  p.forward(b, 1.0f, lp, nullptr);
  std::vector<float> d_lp(lp.size());
  for (size_t t = 0; t < d_lp.size(); ++t) d_lp[t] = b.targets[t] >= 0 ? -1.0f : 0.0f;
  p.backward(d_lp.data(), nullptr);
  dist::SingleProcess comm;
  return p.optimizer_step(1e-3f, comm);
}

using LoraCudaPolicy = CudaTest;

// The training state is the adapters' alone; a step moves them as the CPU's AdamW moves them from
// the CPU model's adapter gradients (lora() sees it) and leaves the base as it was: with the
// adapters off the policy still gives a no-LoRA policy's bits. Memory: less than a full-parameter
// policy of the same plan.
TEST_F(LoraCudaPolicy, StepMovesOnlyTheAdaptersAndAdaptersOffIsTheBase) {
  const Fixture f("qwen2");
  const model::PackedBatch& b = f.batch;
  const trainer::PolicyOptions po =
      lora_policy_options(f.lw, b.num_tokens(), b.num_seqs(), Numerics::Fast);
  auto policy = trainer::make_policy(Device::Cuda, f.w, po);
  trainer::PolicyOptions full_po = po;
  full_po.lora = nullptr;
  auto full = trainer::make_policy(Device::Cuda, f.w, full_po);
  full_po.trainable = false;
  auto plain = trainer::make_policy(Device::Cuda, f.w, full_po);

  EXPECT_EQ(policy->state().numel(), f.lw.layout.total);
  EXPECT_TRUE(policy->trainable());
  EXPECT_LT(policy->device_bytes(), full->device_bytes());
  ASSERT_NE(policy->lora(), nullptr);
  EXPECT_EQ(policy->lora()->data, f.lw.data);
  EXPECT_EQ(plain->lora(), nullptr);

  std::vector<float> base_lp, base_ent;
  plain->forward(b, 1.0f, base_lp, &base_ent, false);
  std::vector<float> lp0;
  policy->forward(b, 1.0f, lp0, nullptr, false);
  const std::vector<float> base_before = policy->weights().data;

  const double norm = ascend(*policy, b);
  EXPECT_TRUE(std::isfinite(norm));
  const std::vector<float> after = policy->lora()->data;
  const float lr = po.optim.lr;
  EXPECT_GT(max_abs_diff(after, f.lw.data), 0.5 * lr) << "the step did not move the adapters";
  std::vector<float> lp1;
  policy->forward(b, 1.0f, lp1, nullptr, false);
  EXPECT_GT(max_abs_diff(lp1, lp0), 0.0) << "log-probs unchanged after the step";

  // The same step on the CPU: the CPU model's adapter gradients (frozen base), AdamW over the
  // adapter layout alone (run_golden's bounds, tests/cuda/test_transformer_cuda.cpp).
  model::Transformer cpu(f.w, &f.lw);
  model::Activations acts;
  cpu.forward(b, acts);
  std::vector<float> d_lp(static_cast<size_t>(b.num_tokens()));
  for (size_t t = 0; t < d_lp.size(); ++t) d_lp[t] = b.targets[t] >= 0 ? -1.0f : 0.0f;
  optim::CpuTrainState cpu_state(f.lw.layout, f.lw.data, /*trainable=*/true);
  cpu.backward(b, acts, d_lp.data(), nullptr, nullptr, nullptr, {}, nullptr, nullptr,
               {cpu_state.grads(), true});
  dist::SingleProcess comm;
  const double cpu_norm = optim::AdamW(po.optim).step(cpu_state, lr, comm);
  EXPECT_NEAR(norm, cpu_norm, kModelGradRel * cpu_norm) << "gradient norm";
  const std::vector<float> cpu_after = cpu_state.download_weights();
  double worst = 0;
  int64_t far = 0;
  for (size_t i = 0; i < after.size(); ++i) {
    const double d = std::fabs(double(after[i]) - cpu_after[i]);
    worst = std::max(worst, d);
    far += d > lr;
  }
  EXPECT_LE(worst, kModelAdamWInLr * lr);
  EXPECT_LE(double(far) / double(after.size()), kModelAdamWFarFraction);
  std::printf("LoRA policy step: grad norm %.4g (CPU %.4g), max |gpu - cpu| adapters %.3g lr\n",
              norm, cpu_norm, worst / lr);

  policy->set_adapters_enabled(false);
  std::vector<float> off_lp, off_ent;
  policy->forward(b, 1.0f, off_lp, &off_ent, false);
  EXPECT_TRUE(bitwise_equal(off_lp, base_lp)) << "adapters off after a step != the base model";
  EXPECT_TRUE(bitwise_equal(off_ent, base_ent));
  policy->forward(b, 1.0f, off_lp, nullptr);
  EXPECT_ANY_THROW(policy->backward(off_lp.data(), nullptr)) << "backward with the adapters off";
  policy->set_adapters_enabled(true);
  EXPECT_EQ(policy->weights().data, base_before);

  // Resume: restore() puts back the adapters and their moments alone.
  optim::AdamWState opt;
  opt.exp_avg.assign(f.lw.data.size(), 0.0f);
  opt.exp_avg_sq.assign(f.lw.data.size(), 0.0f);
  policy->restore(f.lw.data, opt);
  EXPECT_EQ(policy->lora()->data, f.lw.data);
  std::vector<float> lp_restored;
  policy->forward(b, 1.0f, lp_restored, nullptr, false);
  EXPECT_TRUE(bitwise_equal(lp_restored, lp0));
}

// The rollout runner of a LoRA policy runs the same adapter GEMMs as its trainer forward: the
// log-probs it reports for its samples equal the policy's forward on them (bit for bit in
// batch-invariant mode), after an optimizer step that the runner, made before it, sees (it reads
// the live adapters); a snapshot's runner gives the same.
class LoraCudaRollout : public CudaTest, public ::testing::WithParamInterface<Numerics> {};

TEST_P(LoraCudaRollout, SampledLogprobsEqualTheTrainersForward) {
  const Numerics mode = GetParam();
  for (const char* family : {"qwen2", "qwen3"}) {
    SCOPED_TRACE(family);
    model::Weights w = model::Weights::load(kGolden + family);
    const int64_t V = w.config.vocab_size;
    const model::LoraWeights lw = random_adapter(w.config, 8, 17);
    Rng rng(9);
    std::vector<rollout::Request> reqs;
    for (int64_t len : {5, 23, 40}) {
      rollout::Request r;
      r.prompt.resize(static_cast<size_t>(len));
      for (auto& t : r.prompt) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
      r.params.temperature = 0.8f;
      r.params.max_tokens = 40;
      r.params.ignore_eos = true;
      r.params.seed = 31 + static_cast<uint64_t>(len);
      r.n = 4;
      reqs.push_back(r);
    }
    rollout::EngineConfig cfg;
    cfg.scheduler.num_blocks = 64;
    cfg.scheduler.block_size = 16;
    cfg.scheduler.max_model_len = 128;
    cfg.scheduler.max_num_seqs = 16;
    cfg.scheduler.max_num_batched_tokens = 256;
    auto policy =
        trainer::make_policy(Device::Cuda, w, lora_policy_options(lw, 12 * 128, 12, mode));
    auto runner = policy->make_rollout_runner(cfg.scheduler, trainer::RolloutRunnerOptions{});
    ASSERT_NE(runner, nullptr);
    // A step on the prompts first: the runner must read the adapters as they are now.
    ascend(*policy,
           model::PackedBatch::from_sequences({reqs[0].prompt, reqs[1].prompt, reqs[2].prompt}));

    auto check = [&](rollout::StepRunner& run, const char* which) {
      rollout::Engine engine(run, cfg);
      const std::vector<rollout::Completion> done = engine.generate(reqs);
      ASSERT_EQ(done.size(), 12u);
      std::vector<std::vector<int32_t>> seqs;
      for (const rollout::Completion& c : done) {
        std::vector<int32_t> s = reqs[static_cast<size_t>(c.request)].prompt;
        s.insert(s.end(), c.tokens.begin(), c.tokens.end());
        seqs.push_back(std::move(s));
      }
      const model::PackedBatch b = model::PackedBatch::from_sequences(seqs);
      std::vector<float> lp;
      policy->forward(b, 0.8f, lp, nullptr, false);
      double worst = 0;
      int64_t n = 0;
      for (size_t i = 0; i < done.size(); ++i) {
        const int64_t at =
            b.cu_seqlens[i] +
            static_cast<int64_t>(reqs[static_cast<size_t>(done[i].request)].prompt.size()) - 1;
        for (size_t j = 0; j < done[i].tokens.size(); ++j, ++n) {
          worst = std::max(
              worst, std::fabs(double(done[i].logprobs[j]) - lp[at + static_cast<int64_t>(j)]));
        }
      }
      std::printf("%s LoRA %s: rollout vs trainer log-probs over %lld tokens: max |diff| %.3g\n",
                  family, which, static_cast<long long>(n), worst);
      if (mode == Numerics::BatchInvariant) {
        EXPECT_EQ(worst, 0.0) << which;
      } else if (mode == Numerics::MatchTrainer) {
        EXPECT_LE(worst, 1e-3) << which;
      } else {
        EXPECT_LE(worst, kModelLogprob.atol) << which;
      }
    };
    check(*runner, "runner");
    runner.reset();
    auto snap = policy->rollout_snapshot();
    ASSERT_NE(snap, nullptr);
    auto snap_runner = snap->make_rollout_runner(cfg.scheduler, trainer::RolloutRunnerOptions{});
    check(*snap_runner, "snapshot runner");
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, LoraCudaRollout,
                         ::testing::Values(Numerics::Fast, Numerics::MatchTrainer,
                                           Numerics::BatchInvariant),
                         [](const ::testing::TestParamInfo<Numerics>& i) {
                           return i.param == Numerics::BatchInvariant ? "BatchInvariant"
                                  : i.param == Numerics::MatchTrainer ? "MatchTrainer"
                                                                      : "Default";
                         });

}  // namespace
}  // namespace verl::ops::cuda::test
