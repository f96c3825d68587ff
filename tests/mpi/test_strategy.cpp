// The data-parallel strategies (optim/strategy.h) over a training state whose layout is no
// model's (two named tensors), with two real ranks under mpirun: gradients written through the
// strategy's sink as a backward does, then AdamW steps, at ZeRO stages 0 to 3 and with lossless
// LightweightSync, equal one process stepping on the ranks' mean gradient; the factory refuses
// LightweightSync with ZeRO-2 naming the key.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/mpi_communicator.h"
#include "model/arch/arch.h"
#include "optim/adamw.h"
#include "optim/strategy.h"
#include "optim/train_state.h"

namespace verl::optim {
namespace {

dist::MpiCommunicator& comm() {
  static dist::MpiCommunicator c(/*timeout_s=*/60);
  return c;
}

// Two tensors: "a" [3, 5] and "b" [8], 23 elements (an odd count: the last shard is padded).
model::ParamLayout two_tensors() {
  model::ParamLayout l;
  model::arch::LayoutBuilder b(l);
  b.add("a", {3, 5});
  b.add("b", {8});
  return l;
}

std::vector<float> initial() {
  std::vector<float> w(23);
  for (int i = 0; i < 23; ++i) w[i] = 0.05f * static_cast<float>(i % 9) - 0.2f;
  return w;
}

// Rank r's gradient of element i at step k (step 1 large enough to be clipped).
float grad(int r, int i, int k) {
  return (k == 1 ? 0.9f : 0.05f) * std::cos(0.3f * static_cast<float>(i + 7 * r + 5 * k)) +
         0.01f * static_cast<float>(r);
}

AdamWConfig optim_config() {
  AdamWConfig c;
  c.lr = 0.02f;
  c.weight_decay = 0.05f;
  c.grad_clip = 1.0f;
  return c;
}

constexpr int kSteps = 3;

// One process: the state's gradient is the ranks' mean, which is what the data-parallel step
// divides its sum by the world size to get (the same floats: halving is exact).
std::vector<float> one_process(int world) {
  CpuTrainState st(two_tensors(), initial(), true);
  dist::SingleProcess single;
  const AdamW opt(optim_config());
  for (int k = 0; k < kSteps; ++k) {
    st.zero_grad();
    for (int i = 0; i < 23; ++i) {
      float sum = 0;
      for (int r = 0; r < world; ++r) sum += grad(r, i, k);
      st.grads()[i] = sum / static_cast<float>(world);
    }
    opt.step(st, optim_config().lr, single);
  }
  return st.download_weights();
}

// As a backward hands the ranges to the sink: the last tensor first.
void backward(Strategy& s, int k, bool last) {
  const int r = comm().rank();
  s.prepare_backward(last);
  model::GradSink* sink = s.grad_sink();
  ASSERT_NE(sink, nullptr);
  for (const auto& [b, e] : {std::pair<int64_t, int64_t>{15, 23}, {0, 15}}) {
    float* g = sink->open(b, e);
    // Two micro-batches: half the gradient each.
    for (int64_t i = b; i < e; ++i) g[i - b] += 0.5f * grad(r, static_cast<int>(i), k);
    sink->ready(b, e);
  }
}

// kSteps optimizer steps of two micro-batches each, the gradients through the strategy.
void train(TrainState& st, Strategy& s) {
  const AdamW opt(optim_config());
  for (int k = 0; k < kSteps; ++k) {
    st.zero_grad();
    backward(s, k, false);
    backward(s, k, true);
    opt.step(st, s, optim_config().lr, comm());
  }
}

TEST(DataParallelStrategy, EveryZeroStageEqualsOneProcess) {
  const int world = comm().world_size();
  if (world == 1) GTEST_SKIP() << "run under mpirun -np 2";
  const std::vector<float> want = one_process(world);
  for (int stage = 0; stage <= 3; ++stage) {
    CpuTrainState st(two_tensors(), initial(), true);
    StrategyConfig cfg;
    cfg.zero_stage = stage;
    std::unique_ptr<Strategy> s = make_strategy(st, comm(), cfg);
    EXPECT_EQ(s->zero_stage(), stage);
    EXPECT_EQ(st.whole(), stage == 0) << "stage " << stage;
    train(st, *s);
    s->gather_full_weights(/*bucket=*/7);  // ZeRO-3: the shards gathered; else nothing to do
    const std::vector<float> got = st.download_weights();
    s->drop_full_weights();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_FLOAT_EQ(got[i], want[i]) << "stage " << stage << ", element " << i;
    // The moments, gathered from the shards, equal on every rank.
    const AdamWState m = s->download_optimizer_state();
    ASSERT_EQ(m.exp_avg.size(), 23u);
    EXPECT_EQ(m.step, kSteps);
  }
}

TEST(DataParallelStrategy, LosslessLightweightSyncEqualsOneProcess) {
  // Every entry sent in fp32: the decoded sum is the dense one, and the carry stays zero.
  const int world = comm().world_size();
  if (world == 1) GTEST_SKIP() << "run under mpirun -np 2";
  const std::vector<float> want = one_process(world);
  CpuTrainState st(two_tensors(), initial(), true);
  StrategyConfig cfg;
  cfg.lightweight = LightweightConfig{};
  cfg.lightweight->top_k = 1.0;
  cfg.lightweight->values = SyncValues::F32;
  std::unique_ptr<Strategy> s = make_strategy(st, comm(), cfg);
  ASSERT_TRUE(s->lightweight().has_value());
  train(st, *s);
  EXPECT_EQ(s->sync_calls(), kSteps);
  const std::vector<float> got = st.download_weights();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << "element " << i;
  for (float c : s->download_carry()) EXPECT_EQ(c, 0.0f);
}

TEST(DataParallelStrategy, FactoryRefusesLightweightWithZeroTwoByKey) {
  if (comm().world_size() == 1) GTEST_SKIP() << "one rank shards nothing";
  CpuTrainState st(two_tensors(), initial(), true);
  StrategyConfig cfg;
  cfg.zero_stage = 2;
  cfg.lightweight = LightweightConfig{};
  cfg.zero_stage_key = "critic.zero_stage";
  std::string err;
  try {
    make_strategy(st, comm(), cfg);
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("critic.zero_stage=2"), std::string::npos) << err;
  EXPECT_NE(err.find("lightweight"), std::string::npos) << err;
  EXPECT_TRUE(st.whole());  // refused before anything was sharded
}

// A storage that says it is on the GPU, to reach the factory's device rule on a CPU machine.
class GpuLikeState final : public TrainState {
 public:
  GpuLikeState() : TrainState(two_tensors(), true) {}
  Device device() const override { return Device::Cuda; }
  float* master() override { return nullptr; }
  float* grads() override { return nullptr; }
  float* exp_avg() override { return nullptr; }
  float* exp_avg_sq() override { return nullptr; }
  void zero_grad() override {}
  double grad_sum_squares() override { return 0; }
  void adamw_update(const AdamWConfig&, float, float) override {}
  uint64_t weights_digest() override { return 0; }
  std::vector<float> download_weights() const override { return {}; }
  AdamWState download_optimizer_state() const override { return {}; }
  void upload(const std::vector<float>&, const AdamWState*) override {}
};

TEST(DataParallelStrategy, FactoryRefusesZeroThreeOnTheGpuByKey) {
  // ZeRO 1 and 2 of the GPU state are built (tests/cuda/mpi/test_zero_cuda.cpp); 3 is refused.
  if (comm().world_size() == 1) GTEST_SKIP() << "one rank shards nothing";
  GpuLikeState st;
  StrategyConfig cfg;
  cfg.zero_stage = 3;
  std::string err;
  try {
    make_strategy(st, comm(), cfg);
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("actor_rollout_ref.actor.zero_stage=3 on trainer.device=cuda"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("issue 43"), std::string::npos) << err;
}

}  // namespace
}  // namespace verl::optim
