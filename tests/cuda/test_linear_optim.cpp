// cuBLASLt linear forward/backward, the fused AdamW step and the sum of squares on the GPU
// against the CPU reference ops, on odd shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/cpu/ops.h"
#include "test_util.h"

namespace verl::ops::cuda::test {
namespace {

using CudaOps = CudaTest;

struct LinearShape {
  int64_t T, K, N;
};

// Runs forward (with and without bias) and backward at one shape and compares with the CPU op.
void check_linear(const CudaContext& ctx, const CudaSession& session, LinearShape s) {
  const auto [T, K, N] = s;
  SCOPED_TRACE("T=" + std::to_string(T) + " K=" + std::to_string(K) + " N=" + std::to_string(N));
  const float wscale = 1.0f / std::sqrt(static_cast<float>(K));
  const auto x = bf16_rounded(randn(T * K, 100 + T));
  const auto w = bf16_rounded(randn(N * K, 101 + K, wscale));
  const auto b = bf16_rounded(randn(N, 102));
  const auto dy = bf16_rounded(randn(T * N, 103 + N));
  const auto dx0 = bf16_rounded(randn(T * K, 104));
  const auto dw0 = randn(N * K, 105), db0 = randn(N, 106);

  std::vector<float> y(T * N), yb(T * N), dx = dx0, dw = dw0, db = db0;
  cpu::linear_forward(y.data(), x.data(), w.data(), nullptr, T, K, N);
  cpu::linear_forward(yb.data(), x.data(), w.data(), b.data(), T, K, N);
  cpu::linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), T, K, N);

  auto d_x = upload_bf16(x), d_w = upload_bf16(w), d_b = upload_bf16(b), d_dy = upload_bf16(dy);
  auto d_dx = upload_bf16(dx0);
  DeviceBuffer<bf16> d_y(T * N), d_yb(T * N);
  DeviceBuffer<float> d_dw(dw0), d_db(db0);
  linear_forward(ctx, d_y.data(), d_x.data(), d_w.data(), nullptr, T, K, N);
  linear_forward(ctx, d_yb.data(), d_x.data(), d_w.data(), d_b.data(), T, K, N);
  linear_backward(ctx, d_dx.data(), d_dw.data(), d_db.data(), d_dy.data(), d_x.data(), d_w.data(),
                  T, K, N);
  session.synchronize();
  expect_close("y", download_bf16(d_y), y, kBf16Gemm);
  // Where the bias cannot go into the GEMM's epilogue it is added after the product is rounded to
  // bf16: two roundings, bounded at the magnitude of the operands.
  std::vector<float> bias_rows(T * N);
  for (int64_t t = 0; t < T; ++t) std::copy(b.begin(), b.end(), bias_rows.begin() + t * N);
  expect_close_accumulated("y + b", download_bf16(d_yb), yb, bias_rows, kBf16Accumulate);
  expect_close_accumulated("d_x", download_bf16(d_dx), dx, dx0, kBf16Accumulate);
  expect_close("d_w", d_dw.download(), dw, kF32Gemm);
  expect_close("d_b", d_db.download(), db, kF32Kernel);

  // d_x overwritten; and (leading dimensions multiples of 8, the model's layouts) the residual in
  // the epilogue: y = x W^T + b + r, one rounding. With other layouts cuBLASLt may round the
  // product before adding C, so the model adds residuals with add_inplace.
  const bool aligned = K % 8 == 0 && N % 8 == 0;
  const auto r = bf16_rounded(randn(T * N, 107));
  std::vector<float> yr = yb;
  for (int64_t i = 0; i < T * N; ++i) yr[i] += r[i];
  auto d_r = upload_bf16(r);
  DeviceBuffer<bf16> d_yr(T * N);
  linear_forward(ctx, d_yr.data(), d_x.data(), d_w.data(), d_b.data(), d_r.data(), T, K, N);
  linear_forward(ctx, d_r.data(), d_x.data(), d_w.data(), d_b.data(), d_r.data(), T, K,
                 N);  // in place
  std::vector<float> dx_only(T * K, 0.0f), dw_unused(N * K, 0.0f);
  cpu::linear_backward(dx_only.data(), dw_unused.data(), nullptr, dy.data(), x.data(), w.data(), T,
                       K, N);
  auto d_dx2 = upload_bf16(dx0);  // garbage the overwrite must ignore
  linear_backward(ctx, d_dx2.data(), nullptr, nullptr, d_dy.data(), d_x.data(), d_w.data(), T, K, N,
                  /*accumulate_dx=*/false);
  session.synchronize();
  if (aligned) {
    expect_close_accumulated("y + b + r", download_bf16(d_yr), yr, r, kBf16Accumulate);
    expect_close_accumulated("y + b + r in place", download_bf16(d_r), yr, r, kBf16Accumulate);
  }
  expect_close("d_x overwritten", download_bf16(d_dx2), dx_only, kBf16Gemm);
}

// K and N multiples of 8: the layouts the model uses (hidden sizes, head dims, vocabularies).
TEST_F(CudaOps, LinearAlignedShapesMatchCpu) {
  for (LinearShape s : {LinearShape{1, 64, 32}, LinearShape{7, 128, 96}, LinearShape{19, 256, 512},
                        LinearShape{257, 896, 136}, LinearShape{600, 64, 1152}}) {
    check_linear(ctx(), *session_, s);
  }
}

// K or N odd: leading dimensions that are not 16-byte multiples (slower kernels, same math).
TEST_F(CudaOps, LinearOddShapesMatchCpu) {
  for (LinearShape s : {LinearShape{1, 7, 5}, LinearShape{7, 19, 33}, LinearShape{19, 67, 129},
                        LinearShape{257, 33, 3}}) {
    check_linear(ctx(), *session_, s);
  }
}

TEST_F(CudaOps, LinearSkipsNullGradients) {
  const int64_t T = 7, K = 16, N = 8;
  auto x = upload_bf16(randn(T * K, 110)), w = upload_bf16(randn(N * K, 111));
  auto dy = upload_bf16(randn(T * N, 112));
  DeviceBuffer<float> dw(std::vector<float>(N * K, 0.0f));
  linear_backward(ctx(), nullptr, dw.data(), nullptr, dy.data(), x.data(), w.data(), T, K, N);
  sync();
  float norm = 0.0f;
  for (float e : dw.download()) norm += e * e;
  EXPECT_GT(norm, 0.0f);
}

// ---- adamw ------------------------------------------------------------------------------------

TEST_F(CudaOps, AdamWMatchesCpuAndWritesBf16Copy) {
  for (int64_t n : {1, 7, 19, 257, 100003}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    auto p = randn(n, 120), grad = randn(n, 121, 0.1f), m = randn(n, 122, 0.01f);
    auto v = randn(n, 123, 0.01f);
    for (auto& e : v) e = e * e;  // second moments are non-negative
    DeviceBuffer<float> d_p(p), d_g(grad), d_m(m), d_v(v);
    DeviceBuffer<bf16> d_pb(n);
    for (int64_t step = 1; step <= 3; ++step) {
      cpu::adamw_step(p.data(), grad.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                      step, 0.5f);
      adamw_step(ctx(), d_p.data(), d_pb.data(), d_g.data(), d_m.data(), d_v.data(), n, 1e-3f, 0.9f,
                 0.95f, 1e-8f, 0.1f, step, 0.5f);
    }
    sync();
    const auto gp = d_p.download();
    expect_close("param", gp, p, kAdamW);
    expect_close("m", d_m.download(), m, kAdamW);
    expect_close("v", d_v.download(), v, kAdamW);
    // The bf16 copy is exactly the rounding of the GPU's own fp32 master weights.
    expect_close("param_bf16", download_bf16(d_pb), bf16_rounded(gp), Tol{0.0, 0.0});
  }
}

// ---- sum_squares --------------------------------------------------------------------------------

TEST_F(CudaOps, SumSquaresMatchesCpuAndIsDeterministic) {
  for (int64_t n : {0, 1, 7, 19, 257, 4097, 1000003}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const auto x = randn(n, 130 + n);
    const double want = cpu::sum_squares(x.data(), n);
    DeviceBuffer<float> d_x(x);
    DeviceBuffer<double> d_out(1);
    std::vector<double> runs;
    for (int run = 0; run < 2; ++run) {
      sum_squares(ctx(), d_out.data(), d_x.data(), n);
      sync();
      runs.push_back(d_out.download()[0]);
    }
    EXPECT_NEAR(runs[0], want, kF64Sum.atol + kF64Sum.rtol * want);
    EXPECT_EQ(runs[0], runs[1]);  // bitwise: a fixed reduction order
  }
}

}  // namespace
}  // namespace verl::ops::cuda::test
