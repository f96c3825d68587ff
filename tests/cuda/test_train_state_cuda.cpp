// The GPU storage of the training state (optim/cuda/train_state.h) over a layout that is no
// model's (two named tensors, as a LoRA adapter's A and B): AdamW steps through the one optimizer
// and the whole-buffer strategy equal the CPU storage's (the oracle) within the AdamW op's
// tolerance, and its bf16 copy is the master rounded. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "dist/communicator.h"
#include "model/arch/arch.h"
#include "optim/adamw.h"
#include "optim/cuda/train_state.h"
#include "optim/strategy.h"
#include "optim/train_state.h"
#include "test_util.h"
#include "tolerances.h"

namespace verl::ops::cuda::test {
namespace {

model::ParamLayout two_tensors() {
  model::ParamLayout l;
  model::arch::LayoutBuilder b(l);
  b.add("a", {7, 19});
  b.add("b", {257});
  return l;
}

using CudaTrainStateTest = CudaTest;

TEST_F(CudaTrainStateTest, AdapterLayoutStepsLikeTheCpuState) {
  const model::ParamLayout layout = two_tensors();
  const std::vector<float> init = randn(390, 3, 0.1f);
  optim::CpuTrainState cpu(layout, init, /*trainable=*/true);
  optim::cuda::CudaTrainState gpu(ctx(), layout, init, /*trainable=*/true);
  ASSERT_EQ(gpu.numel(), 390);
  optim::AdamWConfig cfg;
  cfg.lr = 1e-2f;
  cfg.weight_decay = 0.05f;
  cfg.grad_clip = 1.0f;
  const optim::AdamW opt(cfg);
  dist::SingleProcess comm;
  std::unique_ptr<optim::Strategy> sc = optim::make_strategy(cpu, comm, {});
  std::unique_ptr<optim::Strategy> sg = optim::make_strategy(gpu, comm, {});
  for (int step = 0; step < 3; ++step) {
    // Step 1 above the clip (a norm of about 6), the others below.
    const std::vector<float> g = randn(390, 10 + step, step == 1 ? 0.3f : 0.01f);
    cpu.zero_grad();
    gpu.zero_grad();
    std::copy(g.begin(), g.end(), cpu.grads());
    copy_to_device(gpu.grads(), g.data(), g.size() * sizeof(float));
    const double nc = opt.step(cpu, *sc, cfg.lr, comm);
    const double ng = opt.step(gpu, *sg, cfg.lr, comm);
    EXPECT_NEAR(ng, nc, 1e-5 * nc) << "step " << step;
  }
  expect_close("master", gpu.download_weights(), cpu.download_weights(), kAdamW);
  const optim::AdamWState mc = cpu.download_optimizer_state(), mg = gpu.download_optimizer_state();
  expect_close("exp_avg", mg.exp_avg, mc.exp_avg, kAdamW);
  expect_close("exp_avg_sq", mg.exp_avg_sq, mc.exp_avg_sq, kAdamW);
  EXPECT_EQ(mg.step, 3);
  // The bf16 compute copy is the updated master, rounded.
  const std::vector<float> w = gpu.download_weights();
  std::vector<uint16_t> bits(390);
  copy_to_host(bits.data(), gpu.weights_bf16(), bits.size() * sizeof(uint16_t));
  for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(bits[i], f32_to_bf16(w[i])) << i;
}

}  // namespace
}  // namespace verl::ops::cuda::test
