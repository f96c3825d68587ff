// The batch-invariant linear layer: same values as the sgemm path within fp32 rounding, and each
// row's result bit-identical whatever batch it is computed in and at whatever row position.
#include <cstring>

#include "ops/cpu/ops.h"
#include "test_util.h"

namespace verl::ops::test {
namespace {

TEST(LinearInvariant, MatchesLinearForward) {
  for (auto [T, K, N] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 7, 3}, {5, 19, 257}, {37, 64, 130}}) {
    std::vector<float> x = randn(T * K, 1), w = randn(N * K, 2), b = randn(N, 3);
    std::vector<float> y0(T * N), y1(T * N);
    cpu::linear_forward(y0.data(), x.data(), w.data(), b.data(), T, K, N);
    cpu::linear_forward_invariant(y1.data(), x.data(), w.data(), b.data(), T, K, N);
    expect_close("invariant vs sgemm", y1, y0, kForwardF32);
    cpu::linear_forward_invariant(y1.data(), x.data(), w.data(), nullptr, T, K, N);
    for (int64_t i = 0; i < T * N; ++i) y0[i] -= b[i % N];
    expect_close("no bias", y1, y0, kForwardF32);
  }
}

TEST(LinearInvariant, RowResultDoesNotDependOnBatch) {
  const int64_t K = 77, N = 131, T = 37;
  std::vector<float> x = randn(T * K, 4), w = randn(N * K, 5), b = randn(N, 6);
  std::vector<float> all(T * N);
  cpu::linear_forward_invariant(all.data(), x.data(), w.data(), b.data(), T, K, N);
  for (int64_t t : {0, 1, 2, 3, 4, 17, 35, 36}) {
    std::vector<float> one(N);
    cpu::linear_forward_invariant(one.data(), x.data() + t * K, w.data(), b.data(), 1, K, N);
    EXPECT_EQ(0, std::memcmp(one.data(), all.data() + t * N, N * sizeof(float))) << "row " << t;
    // The same row inside a batch of 3 at position 2.
    std::vector<float> three(3 * K), y3(3 * N);
    std::copy(x.begin() + t * K, x.begin() + (t + 1) * K, three.begin() + 2 * K);
    std::copy(x.begin(), x.begin() + 2 * K, three.begin());
    cpu::linear_forward_invariant(y3.data(), three.data(), w.data(), b.data(), 3, K, N);
    EXPECT_EQ(0, std::memcmp(y3.data() + 2 * N, one.data(), N * sizeof(float))) << "row " << t;
  }
}

}  // namespace
}  // namespace verl::ops::test
