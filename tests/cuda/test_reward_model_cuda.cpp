// The reward model on the GPU (trainer::RewardModel: the forward-only bf16 model with the score
// head read at each sequence's last token) against the fp32 CPU model, which tests/model pins to
// transformers: the golden Llama reward model's sequences, packed and one a forward. Quantised
// (int8, int4): the GPU model computing from the codes (ops/cuda/quant_linear.h) against the CPU
// model over the same dequantised weights, and the device memory the codes save.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model/quantize.h"
#include "model/weights.h"
#include "ops/cuda/quant_linear.h"
#include "test_util.h"
#include "trainer/reward_model.h"

namespace verl::ops::cuda::test {
namespace {

const std::string kRm = std::string(VERL_SOURCE_DIR) + "/tests/fixtures/golden/llama_rm";

class RewardModelCudaTest : public CudaTest {};

TEST_F(RewardModelCudaTest, ScoresMatchTheCpuModel) {
  const model::Weights w = model::Weights::load(kRm);
  Rng rng(3);
  std::vector<std::vector<int32_t>> seqs;
  for (int n : {1, 5, 17, 64, 3, 120, 33}) {
    std::vector<int32_t> s(static_cast<size_t>(n));
    for (int32_t& t : s)
      t = static_cast<int32_t>(rng.uniform() * static_cast<double>(w.config.vocab_size - 1));
    seqs.push_back(std::move(s));
  }
  trainer::RewardModel cpu(Device::Cpu, w, kRm, 512, 16);
  trainer::RewardModel gpu(Device::Cuda, w, kRm, 512, 16);
  trainer::RewardModel gpu_one(Device::Cuda, w, kRm, 512, 1);
  const std::vector<float> want = cpu.score(seqs), got = gpu.score(seqs), one = gpu_one.score(seqs);
  ASSERT_EQ(got.size(), seqs.size());
  double worst = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    // bf16 weights and activations: the score's relative error stays within a few percent.
    EXPECT_NEAR(got[i], want[i], 0.05 * std::max(1.0f, std::fabs(want[i]))) << "sequence " << i;
    EXPECT_NEAR(one[i], got[i], 0.02 * std::max(1.0f, std::fabs(got[i]))) << "sequence " << i;
    worst = std::max(worst, static_cast<double>(std::fabs(got[i] - want[i])));
  }
  std::printf("reward model on the GPU against the CPU: %zu sequences, largest difference %.3g\n",
              seqs.size(), worst);
}

std::vector<std::vector<int32_t>> random_sequences(const std::vector<int>& lengths, int64_t vocab,
                                                   uint64_t seed) {
  Rng rng(seed);
  std::vector<std::vector<int32_t>> seqs;
  for (int n : lengths) {
    std::vector<int32_t> s(static_cast<size_t>(n));
    for (int32_t& t : s) t = static_cast<int32_t>(rng.uniform() * static_cast<double>(vocab - 1));
    seqs.push_back(std::move(s));
  }
  return seqs;
}

// Scores `w` quantised as `opt` on the CPU (fp32 over the dequantised weights) and on the GPU
// (the codes), packed (forwards of up to 512 tokens: the dequant+cuBLASLt path) and one sequence a
// forward (at most 120 tokens: the fused kernel), within the bf16 test's tolerance.
void expect_quantised_scores_match(model::Weights w, const model::QuantizeOptions& opt,
                                   const char* what) {
  std::vector<model::QuantizedLayer> layers;
  model::quantize_linear_weights(w, opt, &layers);
  ASSERT_EQ(static_cast<int64_t>(layers.size()), w.config.num_hidden_layers);
  const auto seqs = random_sequences({1, 5, 17, 64, 3, 120, 33}, w.config.vocab_size, 3);
  trainer::RewardModel cpu(Device::Cpu, w, kRm, 512, 16);
  trainer::RewardModel gpu(Device::Cuda, w, kRm, 512, 16, false, layers);
  trainer::RewardModel gpu_one(Device::Cuda, w, kRm, 512, 1, false, layers);
  const std::vector<float> want = cpu.score(seqs), got = gpu.score(seqs), one = gpu_one.score(seqs);
  ASSERT_EQ(got.size(), seqs.size());
  ASSERT_EQ(one.size(), seqs.size());
  double worst = 0, spread = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 0.05 * std::max(1.0f, std::fabs(want[i])))
        << what << " sequence " << i;
    EXPECT_NEAR(one[i], want[i], 0.05 * std::max(1.0f, std::fabs(want[i])))
        << what << " sequence " << i;
    worst = std::max({worst, static_cast<double>(std::fabs(got[i] - want[i])),
                      static_cast<double>(std::fabs(one[i] - want[i]))});
    spread = std::max(spread, static_cast<double>(std::fabs(want[i] - want[0])));
  }
  std::printf(
      "%s reward model on the GPU (quantised codes) against the CPU: largest difference %.3g "
      "(scores spread %.3g)\n",
      what, worst, spread);
}

TEST_F(RewardModelCudaTest, QuantisedScoresMatchTheCpuModel) {
  const model::Weights w = model::Weights::load(kRm);
  model::QuantizeOptions opt;
  opt.calibration_samples = 0;  // round to nearest (GPTQ changes the codes, not the kernels)
  opt.bits = 8;
  expect_quantised_scores_match(w, opt, "int8");
  opt.bits = 4;
  opt.group = 32;  // K = 64 and 96: two and three full groups
  expect_quantised_scores_match(w, opt, "int4 g32");
  opt.group = 128;  // one short group a row
  expect_quantised_scores_match(w, opt, "int4 g128");
}

// param_offload with quantised matrices: the codes and the bf16 rest wait in pinned host memory
// between score() calls (the device holds only the activations then) and come back for each call
// with the same bits.
TEST_F(RewardModelCudaTest, QuantisedOffloadedModelSleepsBetweenPasses) {
  model::Weights w = model::Weights::load(kRm);
  model::QuantizeOptions opt;
  opt.calibration_samples = 0;
  opt.bits = 4;
  opt.group = 32;
  std::vector<model::QuantizedLayer> layers;
  model::quantize_linear_weights(w, opt, &layers);
  const auto seqs = random_sequences({1, 5, 17, 64, 3, 120, 33}, w.config.vocab_size, 4);
  trainer::RewardModel resident(Device::Cuda, w, kRm, 512, 16, false, layers);
  trainer::RewardModel sleeping(Device::Cuda, w, kRm, 512, 16, true, layers);
  const std::vector<float> want = resident.score(seqs);
  for (int pass = 0; pass < 2; ++pass) {
    const std::vector<float> got = sleeping.score(seqs);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)))
        << "pass " << pass;
  }
  // Asleep: the weights' and codes' bytes are off the device.
  EXPECT_LT(sleeping.device_bytes() + 2 * 16 * 1024, resident.device_bytes());
  std::printf("quantised reward model asleep: %zu device bytes, resident %zu\n",
              sleeping.device_bytes(), resident.device_bytes());
}

// A wider model of the golden one's family (random weights; hidden 512, MLP 1536): the shapes of
// real models (multiples of 64), where the quantised matrices are most of the memory.
model::Weights wider_model() {
  model::ModelConfig cfg = model::Weights::load(kRm).config;
  cfg.hidden_size = 512;
  cfg.intermediate_size = 1536;
  cfg.num_attention_heads = 8;
  cfg.num_key_value_heads = 4;
  cfg.head_dim = 64;
  model::Weights w = model::Weights::from_config(cfg);
  w.init_random(11, 0.05f);
  return w;
}

TEST_F(RewardModelCudaTest, QuantisedWiderModelScoresMatch) {
  model::QuantizeOptions opt;
  opt.calibration_samples = 0;
  opt.bits = 8;
  expect_quantised_scores_match(wider_model(), opt, "wide int8");
  opt.bits = 4;
  opt.group = 128;
  expect_quantised_scores_match(wider_model(), opt, "wide int4 g128");
}

// The device bytes of a quantised model are the bf16 model's less what the codes save: each
// quantised matrix's 2 bytes a weight, less its codes, scales and zero points (ops::cuda::
// QuantMatrixView::bytes, rows padded to 16 bytes), up to the 256-byte alignment of each array.
// A plan of at most kQuantFusedMaxTokens tokens takes the fused kernel only (no dequantisation
// scratch); a larger plan adds the bf16 scratch of the largest matrix.
TEST_F(RewardModelCudaTest, QuantisedModelHoldsLessDeviceMemory) {
  for (int bits : {8, 4}) {
    model::Weights w = wider_model();
    trainer::RewardModel bf16_rm(Device::Cuda, w, kRm, kQuantFusedMaxTokens, 8);
    model::QuantizeOptions opt;
    opt.calibration_samples = 0;
    opt.bits = bits;
    std::vector<model::QuantizedLayer> layers;
    model::quantize_linear_weights(w, opt, &layers);
    int64_t saved = 0, arrays = 0;
    for (const model::QuantizedLayer& l : layers) {
      for (const model::QuantizedMatrix* m : {&l.wqkv, &l.wo, &l.wgu, &l.wdown}) {
        ops::cuda::QuantMatrixView v;
        v.bits = m->bits;
        v.rows = m->rows;
        v.cols = m->cols;
        v.group = m->group;
        v.ld = ops::cuda::quant_codes_stride(m->bits, m->cols);
        saved += 2 * m->rows * m->cols - static_cast<int64_t>(v.bytes());
        arrays += bits == 4 ? 3 : 2;
      }
    }
    trainer::RewardModel q_rm(Device::Cuda, w, kRm, kQuantFusedMaxTokens, 8, false,
                              std::move(layers));
    const auto full = static_cast<int64_t>(bf16_rm.device_bytes());
    const auto quant = static_cast<int64_t>(q_rm.device_bytes());
    std::printf("int%d: device bytes %lld (bf16 %lld): %.2f of it; the codes save %lld bytes\n",
                bits, static_cast<long long>(quant), static_cast<long long>(full),
                static_cast<double>(quant) / static_cast<double>(full),
                static_cast<long long>(saved));
    EXPECT_GT(saved, 0);
    EXPECT_LE(std::llabs((full - quant) - saved), 256 * (arrays + 4)) << "int" << bits;
  }
}

}  // namespace
}  // namespace verl::ops::cuda::test
