// RMSNorm, RoPE, SwiGLU and embedding on the GPU against the CPU reference ops (the oracle), on
// odd shapes, in bf16 (CPU fed the same bf16-rounded inputs) and in fp32.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/cpu/ops.h"
#include "test_util.h"

namespace verl::ops::cuda::test {
namespace {

const int64_t kRows[] = {1, 7, 19, 257};

std::string shape(std::initializer_list<int64_t> dims) {
  std::string s;
  for (int64_t d : dims) {
    if (!s.empty()) s += 'x';
    s += std::to_string(d);
  }
  return s;
}

using CudaOps = CudaTest;

// ---- rmsnorm -----------------------------------------------------------------------------------

TEST_F(CudaOps, RmsnormBf16MatchesCpu) {
  for (int64_t R : kRows) {
    for (int64_t C : {1, 67, 4101}) {
      SCOPED_TRACE(shape({R, C}));
      const auto x = bf16_rounded(randn(R * C, 10 + R, 2.0f));
      const auto w = bf16_rounded(randn(C, 11, 0.5f));
      const auto g = bf16_rounded(randn(R * C, 12 + C));
      const auto dx0 = bf16_rounded(randn(R * C, 13));  // backward accumulates into this
      const auto dw0 = randn(C, 14);
      const float eps = 1e-6f;

      std::vector<float> out(R * C), rstd(R), dx = dx0, dw = dw0;
      cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), R, C, eps);
      cpu::rmsnorm_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), R, C);

      auto d_x = upload_bf16(x), d_w = upload_bf16(w), d_g = upload_bf16(g),
           d_dx = upload_bf16(dx0);
      DeviceBuffer<bf16> d_out(R * C);
      DeviceBuffer<float> d_rstd(R), d_dw(dw0);
      rmsnorm_forward(ctx(), d_out.data(), d_rstd.data(), d_x.data(), d_w.data(), R, C, eps);
      // The backward reads the CPU's rstd so both sides differentiate at the same point.
      DeviceBuffer<float> d_rstd_cpu(rstd);
      rmsnorm_backward(ctx(), d_dx.data(), d_dw.data(), d_g.data(), d_x.data(), d_w.data(),
                       d_rstd_cpu.data(), R, C);
      sync();
      expect_close("out", download_bf16(d_out), out, kBf16Out);
      expect_close("rstd", d_rstd.download(), rstd, kF32Kernel);
      expect_close("d_x", download_bf16(d_dx), dx, kBf16Out);
      expect_close("d_w", d_dw.download(), dw, kF32RowSum);
    }
  }
}

TEST_F(CudaOps, RmsnormF32MatchesCpu) {
  for (int64_t R : kRows) {
    for (int64_t C : {1, 67, 4101}) {
      SCOPED_TRACE(shape({R, C}));
      const auto x = randn(R * C, 20 + R), w = randn(C, 21), g = randn(R * C, 22);
      const auto dx0 = randn(R * C, 23), dw0 = randn(C, 24);
      std::vector<float> out(R * C), rstd(R), dx = dx0, dw = dw0;
      cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), R, C, 1e-5f);
      cpu::rmsnorm_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), R, C);

      DeviceBuffer<float> d_x(x), d_w(w), d_g(g), d_dx(dx0), d_dw(dw0), d_out(R * C), d_rstd(R);
      rmsnorm_forward(ctx(), d_out.data(), d_rstd.data(), d_x.data(), d_w.data(), R, C, 1e-5f);
      DeviceBuffer<float> d_rstd_cpu(rstd);
      rmsnorm_backward(ctx(), d_dx.data(), d_dw.data(), d_g.data(), d_x.data(), d_w.data(),
                       d_rstd_cpu.data(), R, C);
      sync();
      expect_close("out", d_out.download(), out, kF32Kernel);
      expect_close("rstd", d_rstd.download(), rstd, kF32Kernel);
      expect_close("d_x", d_dx.download(), dx, kF32Kernel);
      expect_close("d_w", d_dw.download(), dw, kF32RowSum);
    }
  }
}

TEST_F(CudaOps, RmsnormWeightGradIsDeterministic) {
  const int64_t R = 1000, C = 333;
  DeviceBuffer<float> x(randn(R * C, 30)), g(randn(R * C, 31)), rstd(randn(R, 32));
  std::vector<float> first;
  for (int run = 0; run < 3; ++run) {
    DeviceBuffer<float> dw(std::vector<float>(C, 0.0f));
    rmsnorm_backward(ctx(), nullptr, dw.data(), g.data(), x.data(), nullptr, rstd.data(), R, C);
    sync();
    if (run == 0)
      first = dw.download();
    else
      EXPECT_TRUE(bitwise_equal(dw.download(), first)) << "run " << run;
  }
}

// ---- rope -------------------------------------------------------------------------------------

std::vector<float> inv_freq_for(int64_t D) {
  std::vector<float> f(D / 2);
  for (int64_t i = 0; i < D / 2; ++i) {
    f[i] = static_cast<float>(1.0 / std::pow(10000.0, 2.0 * i / static_cast<double>(D)));
  }
  return f;
}

std::vector<int32_t> positions(int64_t T, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> p(T);
  for (auto& e : p) e = static_cast<int32_t>(rng.uniform() * 4096);
  return p;
}

TEST_F(CudaOps, RopeMatchesCpuBothPrecisions) {
  for (int64_t T : kRows) {
    for (int64_t nh : {1, 3}) {
      for (int64_t D : {2, 10, 128}) {
        SCOPED_TRACE(shape({T, nh, D}));
        const auto inv = inv_freq_for(D);
        const auto pos = positions(T, 40 + T);
        DeviceBuffer<float> d_inv(inv);
        DeviceBuffer<int32_t> d_pos(pos);
        const int64_t n = T * nh * D;
        for (bool backward : {false, true}) {
          SCOPED_TRACE(backward ? "backward" : "forward");
          const auto x = bf16_rounded(randn(n, 41 + D));
          std::vector<float> want = x;
          (backward ? cpu::rope_backward : cpu::rope_forward)(want.data(), pos.data(), inv.data(),
                                                              T, nh, D);
          auto d_b = upload_bf16(x);
          DeviceBuffer<float> d_f(x);
          if (backward) {
            rope_backward(ctx(), d_b.data(), d_pos.data(), d_inv.data(), T, nh, D);
            rope_backward(ctx(), d_f.data(), d_pos.data(), d_inv.data(), T, nh, D);
          } else {
            rope_forward(ctx(), d_b.data(), d_pos.data(), d_inv.data(), T, nh, D);
            rope_forward(ctx(), d_f.data(), d_pos.data(), d_inv.data(), T, nh, D);
          }
          sync();
          expect_close("bf16", download_bf16(d_b), want, kBf16Out);
          expect_close("f32", d_f.download(), want, kF32Kernel);
        }
      }
    }
  }
}

// ---- swiglu -----------------------------------------------------------------------------------

TEST_F(CudaOps, SwigluBf16MatchesCpu) {
  for (int64_t T : kRows) {
    for (int64_t F : {1, 13, 1001}) {
      SCOPED_TRACE(shape({T, F}));
      const auto gu = bf16_rounded(randn(T * 2 * F, 50 + F, 3.0f));
      const auto g = bf16_rounded(randn(T * F, 51));
      const auto dgu0 = bf16_rounded(randn(T * 2 * F, 52));
      std::vector<float> out(T * F), dgu = dgu0;
      cpu::swiglu_forward(out.data(), gu.data(), T, F);
      cpu::swiglu_backward(dgu.data(), g.data(), gu.data(), T, F);

      auto d_gu = upload_bf16(gu), d_g = upload_bf16(g), d_dgu = upload_bf16(dgu0);
      DeviceBuffer<bf16> d_out(T * F);
      swiglu_forward(ctx(), d_out.data(), d_gu.data(), T, F);
      swiglu_backward(ctx(), d_dgu.data(), d_g.data(), d_gu.data(), T, F);
      sync();
      expect_close("out", download_bf16(d_out), out, kBf16Out);
      expect_close("d_gu", download_bf16(d_dgu), dgu, kBf16Out);
    }
  }
}

TEST_F(CudaOps, SwigluF32MatchesCpu) {
  for (int64_t T : kRows) {
    for (int64_t F : {1, 13, 1001}) {
      SCOPED_TRACE(shape({T, F}));
      const auto gu = randn(T * 2 * F, 60 + F, 3.0f), g = randn(T * F, 61);
      const auto dgu0 = randn(T * 2 * F, 62);
      std::vector<float> out(T * F), dgu = dgu0;
      cpu::swiglu_forward(out.data(), gu.data(), T, F);
      cpu::swiglu_backward(dgu.data(), g.data(), gu.data(), T, F);
      DeviceBuffer<float> d_gu(gu), d_g(g), d_dgu(dgu0), d_out(T * F);
      swiglu_forward(ctx(), d_out.data(), d_gu.data(), T, F);
      swiglu_backward(ctx(), d_dgu.data(), d_g.data(), d_gu.data(), T, F);
      sync();
      expect_close("out", d_out.download(), out, kF32Kernel);
      expect_close("d_gu", d_dgu.download(), dgu, kF32Kernel);
    }
  }
}

// ---- embedding --------------------------------------------------------------------------------

TEST_F(CudaOps, EmbeddingMatchesCpuWithRepeatedIds) {
  const int64_t V = 50;
  for (int64_t T : kRows) {
    for (int64_t C : {1, 33, 515}) {
      SCOPED_TRACE(shape({T, C}));
      Rng rng(70 + T);
      std::vector<int32_t> ids(T);
      for (auto& e : ids) e = static_cast<int32_t>(rng.uniform() * V);  // T = 257 repeats ids
      const auto table = bf16_rounded(randn(V * C, 71));
      const auto g = bf16_rounded(randn(T * C, 72));
      const auto dtab0 = randn(V * C, 73);
      std::vector<float> out(T * C), dtab = dtab0;
      cpu::embedding_forward(out.data(), ids.data(), table.data(), T, C, V);
      cpu::embedding_backward(dtab.data(), g.data(), ids.data(), T, C);

      DeviceBuffer<int32_t> d_ids(ids);
      auto d_table = upload_bf16(table), d_g = upload_bf16(g);
      DeviceBuffer<bf16> d_out(T * C);
      DeviceBuffer<float> d_dtab(dtab0), d_table32(table), d_out32(T * C), d_g32(g),
          d_dtab32(dtab0);
      embedding_forward(ctx(), d_out.data(), d_ids.data(), d_table.data(), T, C, V);
      embedding_backward(ctx(), d_dtab.data(), d_g.data(), d_ids.data(), T, C, V);
      embedding_forward(ctx(), d_out32.data(), d_ids.data(), d_table32.data(), T, C, V);
      embedding_backward(ctx(), d_dtab32.data(), d_g32.data(), d_ids.data(), T, C, V);
      sync();
      expect_close("out bf16", download_bf16(d_out), out, Tol{0.0, 0.0});  // a copy: exact
      expect_close("out f32", d_out32.download(), out, Tol{0.0, 0.0});
      expect_close("d_table from bf16", d_dtab.download(), dtab, kF32Kernel);
      expect_close("d_table from f32", d_dtab32.download(), dtab, kF32Kernel);
    }
  }
}

TEST_F(CudaOps, EmbeddingOutOfRangeIdGivesZeroRowAndNoGradient) {
  const int64_t T = 3, C = 5, V = 4;
  const std::vector<int32_t> ids = {1, 4, -1};
  DeviceBuffer<int32_t> d_ids(ids);
  DeviceBuffer<float> table(randn(V * C, 80)), out(T * C), dtab(std::vector<float>(V * C, 0.0f));
  DeviceBuffer<float> g(std::vector<float>(T * C, 1.0f));
  embedding_forward(ctx(), out.data(), d_ids.data(), table.data(), T, C, V);
  embedding_backward(ctx(), dtab.data(), g.data(), d_ids.data(), T, C, V);
  sync();
  const auto o = out.download(), d = dtab.download();
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_EQ(o[1 * C + c], 0.0f);
    EXPECT_EQ(o[2 * C + c], 0.0f);
  }
  float total = 0.0f;
  for (float e : d) total += e;
  EXPECT_EQ(total, static_cast<float>(C));  // only id 1's row got its gradient
}

}  // namespace
}  // namespace verl::ops::cuda::test
