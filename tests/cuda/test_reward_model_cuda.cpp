// The reward model on the GPU (trainer::RewardModel: the forward-only bf16 model with the score
// head read at each sequence's last token) against the fp32 CPU model, which tests/model pins to
// transformers: the golden Llama reward model's sequences, packed and one a forward.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model/weights.h"
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
    for (int32_t& t : s) t = static_cast<int32_t>(rng.uniform() * static_cast<double>(w.config.vocab_size - 1));
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

}  // namespace
}  // namespace verl::ops::cuda::test
