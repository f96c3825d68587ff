// The flat training state (optim/train_state.h) on the CPU: its buffers, its copies for
// checkpoints, and the errors a wrong restore or a forward-only state give.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "core/error.h"
#include "optim/train_state.h"

namespace verl::optim {
namespace {

model::Weights flat(std::vector<float> data) {
  model::Weights w;
  const int64_t n = static_cast<int64_t>(data.size());
  w.layout.params.push_back(model::ParamInfo{"flat", {n}, 0, n});
  w.layout.total = n;
  w.data = std::move(data);
  return w;
}

TEST(CpuTrainState, HoldsTheWholeRangeAndItsBuffers) {
  CpuTrainState s(flat({1, 2, 3}), /*trainable=*/true);
  EXPECT_EQ(s.device(), Device::Cpu);
  EXPECT_EQ(s.numel(), 3);
  EXPECT_TRUE(s.whole());
  EXPECT_EQ(s.shard().size(), 3);
  EXPECT_EQ(s.master(), s.weights().data.data());  // the CPU model reads the master weights
  s.grads()[0] = 3.0f;
  s.grads()[2] = 4.0f;
  EXPECT_DOUBLE_EQ(s.grad_sum_squares(), 25.0);
  s.zero_grad();
  EXPECT_DOUBLE_EQ(s.grad_sum_squares(), 0.0);
}

TEST(CpuTrainState, UploadRestoresWeightsMomentsAndSteps) {
  CpuTrainState s(flat({1, 2, 3}), true);
  AdamWState opt{{0.1f, 0.2f, 0.3f}, {1, 2, 3}, 17};
  s.upload({4, 5, 6}, &opt);
  EXPECT_EQ(s.download_weights(), (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(s.steps(), 17);
  const AdamWState back = s.download_optimizer_state();
  EXPECT_EQ(back.exp_avg, opt.exp_avg);
  EXPECT_EQ(back.exp_avg_sq, opt.exp_avg_sq);
  EXPECT_EQ(back.step, 17);
  EXPECT_NE(test::error_of([&] {
              s.upload({1, 2}, nullptr);
            }).find("restore: 2 weights for a model of 3"),
            std::string::npos);
  AdamWState short_opt{{0.1f}, {1}, 1};
  EXPECT_NE(test::error_of([&] {
              s.upload({1, 2, 3}, &short_opt);
            }).find("optimizer moments"),
            std::string::npos);
}

TEST(CpuTrainState, ForwardOnlyHasNoGradientsOrMoments) {
  CpuTrainState s(flat({1, 2}), /*trainable=*/false);
  EXPECT_FALSE(s.trainable());
  EXPECT_EQ(s.grads(), nullptr);
  EXPECT_EQ(s.exp_avg(), nullptr);
  EXPECT_NE(test::error_of([&] { s.zero_grad(); }).find("forward-only"), std::string::npos);
  EXPECT_NE(test::error_of([&] { s.download_optimizer_state(); }).find("forward-only"),
            std::string::npos);
  s.upload({7, 8}, nullptr);  // a reference policy's weights can still be replaced
  EXPECT_EQ(s.download_weights(), (std::vector<float>{7, 8}));
}

}  // namespace
}  // namespace verl::optim
