// The offloaded GPU training state (optim/cuda/train_state.h, actor_offload_ratio and verl's
// fsdp_config.param_offload / optimizer_offload): master weights and moments partly or wholly in
// pinned host memory, streamed through the device in the optimizer step, give the resident
// state's weights, bf16 copy and moments bit for bit (the same elementwise AdamW kernel on the
// same numbers); a sleeping forward-only state (the reference policy's param_offload) holds no
// device memory between passes and wakes with the same bits. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/device.h"
#include "model/weights.h"
#include "optim/adamw.h"
#include "optim/cuda/train_state.h"
#include "test_util.h"

namespace verl::ops::cuda::test {
namespace {

using optim::OffloadConfig;
using optim::cuda::CudaTrainState;

const std::string kRoot = VERL_SOURCE_DIR;

std::vector<uint16_t> bf16_bits(const CudaTrainState& s) {
  std::vector<uint16_t> h(static_cast<size_t>(s.numel()));
  copy_to_host(h.data(), s.weights_bf16(), h.size() * sizeof(uint16_t));
  return h;
}

// Three AdamW steps with the same gradients (clipping scales included) on a state.
void train(CudaTrainState& s, const CudaContext& ctx) {
  optim::AdamWConfig cfg;
  cfg.lr = 1e-3f;
  cfg.weight_decay = 0.01f;
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> g = randn(static_cast<size_t>(s.numel()), 100 + step, 0.05f);
    copy_to_device(s.grads(), g.data(), g.size() * sizeof(float));
    s.adamw_update(cfg, cfg.lr, step == 1 ? 0.5f : 1.0f);
  }
  VERL_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
}

using OffloadTest = CudaTest;

TEST_F(OffloadTest, OffloadedStateStepsBitwiseLikeResident) {
  model::Weights w = model::Weights::load(kRoot + "/assets/demo/model");
  const int64_t n = w.layout.total;
  CudaTrainState resident(ctx(), w, /*trainable=*/true);
  train(resident, ctx());
  const std::vector<float> want_w = resident.download_weights();
  const optim::AdamWState want_opt = resident.download_optimizer_state();
  const std::vector<uint16_t> want_bf16 = bf16_bits(resident);

  // Shares that cut the layout at odd places, buckets smaller than the offloaded part (several
  // slots in flight, a bucket cut at a part's boundary) and larger.
  struct Case {
    double params, optimizer;
    int64_t bucket;
  };
  for (const Case c : {Case{0.3, 0.3, 4096}, Case{1.0, 0.0, 1000}, Case{0.0, 1.0, 1 << 20},
                       Case{0.25, 0.7, 8192}, Case{1.0, 1.0, 77777}}) {
    SCOPED_TRACE("params " + std::to_string(c.params) + " optimizer " +
                 std::to_string(c.optimizer) + " bucket " + std::to_string(c.bucket));
    OffloadConfig o;
    o.params = c.params;
    o.optimizer = c.optimizer;
    o.bucket = c.bucket;
    CudaTrainState off(ctx(), w, /*trainable=*/true, o);
    // What lives on the host: the offloaded shares of the master (4 bytes) and both moments (8).
    const double expect_host = 4.0 * c.params * n + 8.0 * c.optimizer * n;
    EXPECT_NEAR(static_cast<double>(off.host_bytes()), expect_host, 12.0 * 256 + 1);
    EXPECT_LT(off.device_bytes(),
              resident.device_bytes() + 9 * sizeof(float) * static_cast<size_t>(o.bucket));
    train(off, ctx());
    EXPECT_EQ(off.download_weights(), want_w);
    const optim::AdamWState opt = off.download_optimizer_state();
    EXPECT_EQ(opt.exp_avg, want_opt.exp_avg);
    EXPECT_EQ(opt.exp_avg_sq, want_opt.exp_avg_sq);
    EXPECT_EQ(opt.step, want_opt.step);
    EXPECT_EQ(bf16_bits(off), want_bf16);
  }
}

TEST_F(OffloadTest, ResumeIntoOffloadedState) {
  // upload() of weights and moments (a resume) fills the host part and rewrites the bf16 copy of
  // the offloaded master through the staging slots.
  model::Weights w = model::Weights::load(kRoot + "/assets/demo/model");
  CudaTrainState a(ctx(), w, true);
  train(a, ctx());
  const std::vector<float> weights = a.download_weights();
  const optim::AdamWState opt = a.download_optimizer_state();
  OffloadConfig o;
  o.params = 0.6;
  o.optimizer = 0.4;
  o.bucket = 3000;
  CudaTrainState b(ctx(), w, true, o);
  b.upload(weights, &opt);
  EXPECT_EQ(bf16_bits(b), bf16_bits(a));
  train(a, ctx());
  train(b, ctx());
  EXPECT_EQ(b.download_weights(), a.download_weights());
}

TEST_F(OffloadTest, ForwardOnlyStateSleepsBetweenPasses) {
  model::Weights w = model::Weights::load(kRoot + "/assets/demo/model");
  const size_t bytes = static_cast<size_t>(w.layout.total) * sizeof(uint16_t);
  CudaTrainState awake(ctx(), w, /*trainable=*/false);
  OffloadConfig o;
  o.params = 1.0;
  const size_t before = tracked_device_memory();
  CudaTrainState ref(ctx(), w, /*trainable=*/false, o);
  EXPECT_TRUE(ref.sleeps());
  EXPECT_EQ(ref.weights_bf16(), nullptr);
  EXPECT_EQ(tracked_device_memory(), before);  // nothing on the device while asleep
  EXPECT_EQ(ref.host_bytes(), bytes);
  ref.wake();
  ASSERT_NE(ref.weights_bf16(), nullptr);
  EXPECT_EQ(tracked_device_memory(), before + bytes);
  EXPECT_EQ(bf16_bits(ref), bf16_bits(awake));
  ref.sleep();
  EXPECT_EQ(ref.weights_bf16(), nullptr);
  EXPECT_EQ(tracked_device_memory(), before);
  EXPECT_EQ(ref.download_weights(), awake.download_weights());  // asleep: from the pinned copy
}

}  // namespace
}  // namespace verl::ops::cuda::test
