// Linear and embedding: forward and backward against naive loops, finite differences,
// accumulation into d_* buffers and the id checks.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "ops/cpu/ops.h"
#include "test_util.h"

namespace verl::ops::test {
namespace cpu = verl::ops::cpu;

TEST(Linear, ForwardMatchesNaive) {
  const int64_t K = 13, N = 11;
  for (int64_t T : {1, 7, 19}) {
    for (bool bias : {false, true}) {
      auto x = randn(T * K, 1), w = randn(N * K, 2), b = randn(N, 3);
      std::vector<float> y(T * N, 123.0f);  // garbage: the forward must overwrite
      cpu::linear_forward(y.data(), x.data(), w.data(), bias ? b.data() : nullptr, T, K, N);
      std::vector<double> want(T * N);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t n = 0; n < N; ++n) {
          double s = bias ? b[n] : 0.0;
          for (int64_t k = 0; k < K; ++k) s += static_cast<double>(x[t * K + k]) * w[n * K + k];
          want[t * N + n] = s;
        }
      expect_close("y T=" + std::to_string(T), y, want, kForwardF32);
    }
  }
}

TEST(Linear, BackwardMatchesNaiveAndAccumulates) {
  const int64_t T = 19, K = 13, N = 11;
  auto x = randn(T * K, 4), w = randn(N * K, 5), dy = randn(T * N, 6);
  const float init = 0.5f;  // d_* start non-zero: the backward must add, not overwrite
  std::vector<float> dx(T * K, init), dw(N * K, init), db(N, init);
  cpu::linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), T, K, N);
  std::vector<double> wdx(T * K, init), wdw(N * K, init), wdb(N, init);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      const double g = dy[t * N + n];
      wdb[n] += g;
      for (int64_t k = 0; k < K; ++k) {
        wdx[t * K + k] += g * w[n * K + k];
        wdw[n * K + k] += g * x[t * K + k];
      }
    }
  expect_close("d_x", dx, wdx, kForwardF32);
  expect_close("d_w", dw, wdw, kForwardF32);
  expect_close("d_b", db, wdb, kForwardF32);

  // Null pointers skip those gradients and leave the others unchanged.
  std::vector<float> dw2(N * K, init);
  cpu::linear_backward(nullptr, dw2.data(), nullptr, dy.data(), x.data(), w.data(), T, K, N);
  expect_close("d_w (others null)", dw2, wdw, kForwardF32);
}

TEST(Linear, FiniteDifferences) {
  const int64_t T = 7, K = 5, N = 3;
  auto x = randn(T * K, 7), w = randn(N * K, 8), b = randn(N, 9), R = randn(T * N, 10);
  std::vector<float> y(T * N);
  auto loss = [&] {
    cpu::linear_forward(y.data(), x.data(), w.data(), b.data(), T, K, N);
    return dot(y, R);
  };
  std::vector<float> dx(T * K), dw(N * K), db(N);
  cpu::linear_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), T, K, N);
  check_grad("linear d_x", x, dx, loss);
  check_grad("linear d_w", w, dw, loss);
  check_grad("linear d_b", b, db, loss);
}

TEST(Embedding, ForwardGathersRows) {
  const int64_t V = 6, C = 5;
  auto table = randn(V * C, 11);
  std::vector<int32_t> ids = {3, 0, 5, 3};
  std::vector<float> out(ids.size() * C);
  cpu::embedding_forward(out.data(), ids.data(), table.data(), ids.size(), C, V);
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(out[t * C + c], table[ids[t] * C + c]);
}

TEST(Embedding, OutOfRangeIdNamesPosition) {
  const int64_t V = 6, C = 2;
  auto table = randn(V * C, 12);
  std::vector<float> out(3 * C);
  for (int32_t bad : {6, -1}) {
    std::vector<int32_t> ids = {1, 2, bad};
    try {
      cpu::embedding_forward(out.data(), ids.data(), table.data(), 3, C, V);
      ADD_FAILURE() << "id " << bad << " was accepted";
    } catch (const verl::Error& e) {
      EXPECT_NE(std::string(e.what()).find("position 2"), std::string::npos) << e.what();
    }
  }
}

TEST(Embedding, BackwardAccumulatesRepeatedIds) {
  const int64_t V = 5, C = 3;
  std::vector<int32_t> ids = {3, 1, 3, 3, 0};
  const int64_t T = ids.size();
  auto dout = randn(T * C, 13);
  std::vector<float> dtable(V * C, 0.25f);
  cpu::embedding_backward(dtable.data(), dout.data(), ids.data(), T, C);
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_FLOAT_EQ(dtable[3 * C + c], 0.25f + dout[0 * C + c] + dout[2 * C + c] + dout[3 * C + c]);
    EXPECT_FLOAT_EQ(dtable[1 * C + c], 0.25f + dout[1 * C + c]);
    EXPECT_FLOAT_EQ(dtable[0 * C + c], 0.25f + dout[4 * C + c]);
    EXPECT_EQ(dtable[2 * C + c], 0.25f);  // never looked up: untouched
    EXPECT_EQ(dtable[4 * C + c], 0.25f);
  }
}

}  // namespace verl::ops::test
