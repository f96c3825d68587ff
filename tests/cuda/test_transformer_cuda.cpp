// The whole causal LM on CUDA (src/ops/cuda/transformer_cuda.h) against the CPU model
// (src/model/transformer.h, itself pinned to HF transformers by tests/model/test_golden.cpp) on
// the tiny golden models of each family: log-probs and entropies, every parameter gradient of
// sum(logprob), and one AdamW step. Both sides start from the same bf16-rounded weights, so the
// differences are the GPU's bf16 activations (tolerances.h).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "model/safetensors.h"
#include "model/batch.h"
#include "model/transformer.h"
#include "model/weights.h"
#include "ops/cuda/transformer_cuda.h"
#include "test_util.h"
#include "trainer/optimizer.h"

namespace verl::ops::cuda::test {
namespace {

const std::string kGoldenDir = std::string(VERL_SOURCE_DIR) + "/tests/fixtures/golden/";

std::vector<std::vector<int32_t>> load_sequences(const std::string& name) {
  std::ifstream f(kGoldenDir + name + "/inputs.json");
  nlohmann::json j = nlohmann::json::parse(f);
  std::vector<std::vector<int32_t>> seqs;
  for (auto& s : j["sequences"]) seqs.push_back(s.get<std::vector<int32_t>>());
  return seqs;
}

// The transformers dump of a golden model (tools/make_golden.py): tensors by name, as fp32.
struct GoldenDump {
  explicit GoldenDump(const std::string& name)
      : file(model::SafetensorsFile::open(kGoldenDir + name + "/golden.safetensors")) {}
  std::vector<float> get(const std::string& key) const {
    const model::TensorInfo* t = file->find(key);
    EXPECT_NE(t, nullptr) << key;
    std::vector<float> out(t ? static_cast<size_t>(t->numel()) : 0);
    if (t) convert_to_f32(out.data(), file->data(*t), t->dtype, out.size());
    return out;
  }
  std::unique_ptr<model::SafetensorsFile> file;
};

// max |a-b| over [offset, offset+n) relative to max |ref| there.
double rel_max_err(const std::vector<float>& a, const std::vector<float>& ref, int64_t offset,
                   int64_t n) {
  double m = 0, e = 0;
  for (int64_t i = offset; i < offset + n; ++i) {
    m = std::max(m, std::fabs(double(ref[i])));
    e = std::max(e, std::fabs(double(a[i]) - ref[i]));
  }
  return m > 0 ? e / m : e;
}

// Every HF tensor's gradient against the dump's "grad.<name>", each relative to the tensor's max;
// returns the worst.
double expect_grads_match_dump(const model::Weights& w, const std::vector<float>& grads,
                               const GoldenDump& golden, const std::string& name) {
  double worst = 0;
  for (const model::HfTensorMap& m : w.layout.hf) {
    const std::vector<float> ref = golden.get("grad." + m.hf_name);
    const int64_t off = w.layout.params[m.param].offset + m.offset;
    std::vector<float> ours(grads.begin() + off, grads.begin() + off + ref.size());
    const double err = rel_max_err(ours, ref, 0, static_cast<int64_t>(ref.size()));
    EXPECT_LE(err, kModelGradRel) << name << ": gradient of " << m.hf_name;
    worst = std::max(worst, err);
  }
  return worst;
}

using CudaTransformerTest = CudaTest;

void run_golden(const CudaContext& ctx, const std::string& name, float temperature) {
  model::Weights w = model::Weights::load(kGoldenDir + name);
  w.data = bf16_rounded(std::move(w.data));
  model::PackedBatch b = model::PackedBatch::from_sequences(load_sequences(name));
  const int64_t T = b.num_tokens();

  // CPU reference.
  model::Transformer cpu(w);
  model::Activations acts;
  model::ForwardOptions fo;
  fo.temperature = temperature;
  cpu.forward(b, acts, fo);
  std::vector<float> d_lp(T, 1.0f);
  std::vector<float> cpu_grads(w.data.size(), 0.0f);
  cpu.backward(b, acts, d_lp.data(), nullptr, nullptr, cpu_grads.data(), fo);

  // GPU, with a small LM head chunk so the chunking runs.
  CudaTransformer gpu(ctx, w, T, b.num_seqs(), /*lm_head_chunk=*/7);
  gpu.forward(b, temperature);
  gpu.backward_host(d_lp.data(), nullptr);
  const std::vector<float> lp = gpu.download_logprob(), ent = gpu.download_entropy();
  expect_close(name + " logprob", lp, acts.logprob, kModelLogprob);
  expect_close(name + " entropy", ent, acts.entropy, kModelLogprob);

  const std::vector<float> grads = gpu.download_grads();
  double worst = 0;
  for (const model::ParamInfo& p : w.layout.params) {
    const double err = rel_max_err(grads, cpu_grads, p.offset, p.numel);
    EXPECT_LE(err, kModelGradRel) << name << ": gradient of " << p.name;
    worst = std::max(worst, err);
  }
  std::printf("%s: max relative gradient error over %zu tensors: %.3g\n", name.c_str(),
              w.layout.params.size(), worst);

  // One AdamW step on each side, same hyper-parameters, clipping on.
  trainer::AdamWConfig oc;
  oc.lr = 1e-3f;
  oc.grad_clip = 1.0f;
  trainer::AdamW cpu_opt(w.layout.total, oc);
  std::vector<float> cpu_w = w.data;
  const double cpu_norm = cpu_opt.step(cpu_w.data(), cpu_grads.data(), oc.lr);
  const double gpu_norm =
      gpu.optimizer_step(oc.lr, oc.beta1, oc.beta2, oc.eps, oc.weight_decay, oc.grad_clip);
  EXPECT_NEAR(gpu_norm, cpu_norm, kModelGradRel * cpu_norm) << name << ": gradient norm";
  const std::vector<float> gpu_w = gpu.download_weights();
  ASSERT_EQ(gpu_w.size(), cpu_w.size());
  double max_diff = 0, moved = 0;
  int64_t far = 0;
  for (size_t i = 0; i < cpu_w.size(); ++i) {
    const double d = std::fabs(double(gpu_w[i]) - cpu_w[i]);
    max_diff = std::max(max_diff, d);
    moved = std::max(moved, std::fabs(double(gpu_w[i]) - w.data[i]));
    if (d > oc.lr) ++far;
  }
  const double far_frac = double(far) / double(cpu_w.size());
  std::printf("%s: AdamW step: max |gpu - cpu| = %.3g lr, %.3g%% of weights differ by > lr\n",
              name.c_str(), max_diff / oc.lr, 100 * far_frac);
  EXPECT_GT(moved, 0.5 * oc.lr) << name << ": the GPU step did not move the weights";
  EXPECT_LE(max_diff, kModelAdamWInLr * oc.lr) << name;
  EXPECT_LE(far_frac, kModelAdamWFarFraction) << name;

  // A second forward after the step runs on the updated bf16 copy: it must change the log-probs.
  gpu.forward(b, temperature);
  const std::vector<float> lp2 = gpu.download_logprob();
  double change = 0;
  for (int64_t t = 0; t < T; ++t) change = std::max(change, std::fabs(double(lp2[t]) - lp[t]));
  EXPECT_GT(change, 0.0) << name << ": log-probs unchanged after the optimizer step";
}

TEST_F(CudaTransformerTest, Qwen2MatchesCpu) { run_golden(ctx(), "qwen2", 1.0f); }
TEST_F(CudaTransformerTest, Llama3MatchesCpu) { run_golden(ctx(), "llama3", 1.0f); }
TEST_F(CudaTransformerTest, Qwen3MatchesCpu) { run_golden(ctx(), "qwen3", 1.0f); }
TEST_F(CudaTransformerTest, Qwen2MatchesCpuAtTemperature) { run_golden(ctx(), "qwen2", 0.7f); }

// Straight against the transformers dumps (tests/fixtures/golden, tools/make_golden.py), from the
// fp32 HF weights: log-probs at temperature 1 and 0.7, and every HF tensor's gradient of
// sum(logprob), each relative to the tensor's max.
void run_against_hf(const CudaContext& ctx, const std::string& name) {
  model::Weights w = model::Weights::load(kGoldenDir + name);
  const GoldenDump golden(name);
  auto get = [&](const std::string& key) { return golden.get(key); };
  const auto seqs = load_sequences(name);
  model::PackedBatch b = model::PackedBatch::from_sequences(seqs);
  const int64_t T = b.num_tokens();
  CudaTransformer gpu(ctx, w, T, b.num_seqs(), /*lm_head_chunk=*/5);
  double worst_lp = 0, worst_lp07 = 0;
  for (float temp : {0.7f, 1.0f}) {
    gpu.forward(b, temp);
    const std::vector<float> lp = gpu.download_logprob();
    for (size_t s = 0; s < seqs.size(); ++s) {
      const std::vector<float> ref =
          get((temp == 1.0f ? "logprob." : "logprob_t07.") + std::to_string(s));
      for (size_t i = 0; i < ref.size(); ++i) {
        const double e = std::fabs(double(lp[b.cu_seqlens[s] + i]) - ref[i]);
        (temp == 1.0f ? worst_lp : worst_lp07) = std::max(temp == 1.0f ? worst_lp : worst_lp07, e);
      }
    }
  }
  EXPECT_LE(worst_lp, kModelLogprob.atol) << name;
  EXPECT_LE(worst_lp07, kModelLogprob.atol) << name;
  std::vector<float> d_lp(T);
  for (int64_t t = 0; t < T; ++t) d_lp[t] = b.targets[t] >= 0 ? 1.0f : 0.0f;
  gpu.backward_host(d_lp.data(), nullptr);
  const std::vector<float> grads = gpu.download_grads();
  const double worst = expect_grads_match_dump(w, grads, golden, name);
  std::printf("%s vs transformers: max |dlogprob| %.3g (T=0.7: %.3g), max relative gradient "
              "error over %zu tensors %.3g\n",
              name.c_str(), worst_lp, worst_lp07, w.layout.hf.size(), worst);
}

TEST_F(CudaTransformerTest, Qwen2MatchesTransformers) { run_against_hf(ctx(), "qwen2"); }
TEST_F(CudaTransformerTest, Llama3MatchesTransformers) { run_against_hf(ctx(), "llama3"); }
TEST_F(CudaTransformerTest, Qwen3MatchesTransformers) { run_against_hf(ctx(), "qwen3"); }

// Activation recomputation gives the same gradients (the same kernels rerun; only the
// embedding's atomics may order differently), with a smaller arena; a forward-only model gives
// the same log-probs with no gradient state.
TEST_F(CudaTransformerTest, RecomputeAndForwardOnlyMatchThePlainModel) {
  for (const bool keep_probs : {false, true})
  for (const std::string name : {"qwen2", "qwen3"}) {
    SCOPED_TRACE(name + (keep_probs ? " (LM head keeps p)" : " (LM head recomputes logits)"));
    model::Weights w = model::Weights::load(kGoldenDir + name);
    model::PackedBatch b = model::PackedBatch::from_sequences(load_sequences(name));
    const int64_t T = b.num_tokens();
    std::vector<float> d_lp(T, 1.0f), d_ent(T, 0.5f);
    CudaTransformerOptions o{T, b.num_seqs(), 7, true, false};
    o.lm_head_keep_probs = keep_probs;
    CudaTransformer plain(ctx(), w, o);
    o.recompute = true;
    CudaTransformer recompute(ctx(), w, o);
    o.recompute = false;
    o.trainable = false;
    CudaTransformer fwd_only(ctx(), w, o);
    EXPECT_LT(recompute.arena_bytes(), plain.arena_bytes()) << name;
    EXPECT_LT(fwd_only.device_bytes(), recompute.device_bytes()) << name;
    for (CudaTransformer* m : {&plain, &recompute}) {
      m->forward(b, 1.0f);
      m->backward_host(d_lp.data(), d_ent.data());
    }
    fwd_only.forward(b, 1.0f);
    const std::vector<float> lp0 = plain.download_logprob(), lp1 = recompute.download_logprob();
    const std::vector<float> g0 = plain.download_grads(), g1 = recompute.download_grads();
    double dlp = 0, gmax0 = 0, gmax1 = 0;
    for (size_t i = 0; i < lp0.size(); ++i) dlp = std::max(dlp, std::fabs(double(lp0[i]) - lp1[i]));
    for (size_t i = 0; i < g0.size(); ++i) {
      gmax0 = std::max(gmax0, std::fabs(double(g0[i])));
      gmax1 = std::max(gmax1, std::fabs(double(g1[i])));
    }
    std::printf("%s keep_probs=%d: max |dlogprob| plain vs recompute %.3g, max |grad| %.4g vs %.4g\n",
                name.c_str(), int(keep_probs), dlp, gmax0, gmax1);
    EXPECT_TRUE(bitwise_equal(lp1, lp0)) << name;
    EXPECT_TRUE(bitwise_equal(fwd_only.download_logprob(), plain.download_logprob())) << name;
    EXPECT_TRUE(bitwise_equal(fwd_only.download_entropy(), plain.download_entropy())) << name;
    for (const model::ParamInfo& p : w.layout.params) {
      EXPECT_LE(rel_max_err(g1, g0, p.offset, p.numel), 1e-6) << name << ": " << p.name;
    }
    EXPECT_THROW(fwd_only.backward_host(d_lp.data(), nullptr), verl::Error);
  }
}

// The critic: the value head on the GPU against the transformers dump (values and every
// gradient of sum(values)) and the CPU model (same bf16-rounded weights).
TEST_F(CudaTransformerTest, CriticValuesAndGradientsMatchTransformersAndCpu) {
  const std::string name = "qwen2_critic";
  model::Weights w = model::Weights::load(kGoldenDir + name);
  ASSERT_EQ(w.config.head, model::HeadKind::TokenClassification);
  const GoldenDump golden(name);
  auto get = [&](const std::string& key) { return golden.get(key); };
  const auto seqs = load_sequences(name);
  model::PackedBatch b = model::PackedBatch::from_sequences(seqs);
  const int64_t T = b.num_tokens();
  CudaTransformer gpu(ctx(), w, T, b.num_seqs());
  gpu.forward(b);
  const std::vector<float> values = gpu.download_values();
  ASSERT_EQ(static_cast<int64_t>(values.size()), T);
  double worst_hf = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const std::vector<float> ref = get("values." + std::to_string(s));
    for (size_t i = 0; i < ref.size(); ++i) {
      worst_hf = std::max(worst_hf, std::fabs(double(values[b.cu_seqlens[s] + i]) - ref[i]));
    }
  }
  EXPECT_LE(worst_hf, kModelLogprob.atol);
  std::vector<float> ones(T, 1.0f);
  gpu.backward_values_host(ones.data());
  const std::vector<float> grads = gpu.download_grads();
  const double worst = expect_grads_match_dump(w, grads, golden, name);
  // Against the CPU model on the bf16-rounded weights.
  model::Weights wb = w;
  wb.data = bf16_rounded(std::move(wb.data));
  model::Transformer cpu(wb);
  model::Activations acts;
  cpu.forward(b, acts);
  CudaTransformer gpu_b(ctx(), wb, T, b.num_seqs());
  gpu_b.forward(b);
  std::vector<float> cpu_values(acts.values.begin(), acts.values.begin() + T);
  expect_close("critic values", gpu_b.download_values(), cpu_values, kModelLogprob);
  std::printf("%s: max |dvalue| vs transformers %.3g, max relative gradient error %.3g over %zu "
              "tensors\n",
              name.c_str(), worst_hf, worst, w.layout.hf.size());
  EXPECT_THROW(gpu.backward_host(ones.data(), nullptr), verl::Error);  // not a causal LM
}

TEST_F(CudaTransformerTest, RejectsBatchLargerThanPlanned) {
  model::Weights w = model::Weights::load(kGoldenDir + "qwen2");
  model::PackedBatch b = model::PackedBatch::from_sequences(load_sequences("qwen2"));
  CudaTransformer gpu(ctx(), w, b.num_tokens() - 1, b.num_seqs());
  EXPECT_THROW(gpu.forward(b), verl::Error);
}

}  // namespace
}  // namespace verl::ops::cuda::test
