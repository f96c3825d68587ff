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
#include <string>
#include <vector>

#include "core/error.h"
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

TEST_F(CudaTransformerTest, RejectsBatchLargerThanPlanned) {
  model::Weights w = model::Weights::load(kGoldenDir + "qwen2");
  model::PackedBatch b = model::PackedBatch::from_sequences(load_sequences("qwen2"));
  CudaTransformer gpu(ctx(), w, b.num_tokens() - 1, b.num_seqs());
  EXPECT_THROW(gpu.forward(b), verl::Error);
}

}  // namespace
}  // namespace verl::ops::cuda::test
