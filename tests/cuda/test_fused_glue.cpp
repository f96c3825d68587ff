// The vectorised element-wise kernels, their fused variants and overwrite modes (glue.h,
// ops_cuda.h): each fused / overwrite call against the unfused sequence it replaces (bit for
// bit), and against the CPU ops, on odd shapes. Every case also runs on buffers shifted by one
// element, which breaks 16-byte alignment and sends the kernels down their scalar path.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops/cpu/ops.h"
#include "ops/cuda/glue.h"
#include "ops/cuda/paged_attention.h"
#include "test_util.h"

namespace verl::ops::cuda::test {
namespace {

using FusedGlue = CudaTest;

std::string shape(std::initializer_list<int64_t> dims) {
  std::string s;
  for (int64_t d : dims) {
    if (!s.empty()) s += 'x';
    s += std::to_string(d);
  }
  return s;
}

// A device copy of x placed `off` elements into its allocation (off = 1 breaks the alignment).
DeviceBuffer<bf16> up_bf16(const std::vector<float>& x, int off) {
  std::vector<uint16_t> h(x.size() + off, 0);
  for (size_t i = 0; i < x.size(); ++i) h[off + i] = f32_to_bf16(x[i]);
  DeviceBuffer<bf16> d(h.size());
  copy_to_device(d.data(), h.data(), h.size() * 2);
  return d;
}
DeviceBuffer<float> up_f32(const std::vector<float>& x, int off) {
  std::vector<float> h(x.size() + off, 0.0f);
  std::copy(x.begin(), x.end(), h.begin() + off);
  return DeviceBuffer<float>(h);
}
std::vector<uint16_t> down_bits(const bf16* p, size_t n) {
  std::vector<uint16_t> h(n);
  copy_to_host(h.data(), p, n * 2);
  return h;
}
std::vector<float> down_bf16(const bf16* p, size_t n) {
  const auto h = down_bits(p, n);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = bf16_to_f32(h[i]);
  return x;
}
std::vector<float> down_f32(const float* p, size_t n) {
  std::vector<float> x(n);
  copy_to_host(x.data(), p, n * 4);
  return x;
}
// Raw bits of fp32 values, so that a bitwise comparison reads as one.
std::vector<uint32_t> bits(const std::vector<float>& x) {
  std::vector<uint32_t> b(x.size());
  if (!x.empty()) std::memcpy(b.data(), x.data(), x.size() * 4);
  return b;
}

// Expects a == b element for element (bits), reporting the count and the first difference.
template <typename T>
void expect_same_bits(const std::string& what, const std::vector<T>& a, const std::vector<T>& b) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t diff = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i] && diff++ == 0) first = i;
  }
  EXPECT_EQ(diff, 0u) << what << ": " << diff << " of " << a.size() << " differ, first at " << first
                      << " (" << a[first] << " vs " << b[first] << ")";
}

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

// Columns [c0, c0 + w) of each row of x[T, W].
std::vector<float> cols(const std::vector<float>& x, int64_t T, int64_t W, int64_t c0, int64_t w) {
  std::vector<float> y(T * w);
  for (int64_t t = 0; t < T; ++t) {
    std::copy(x.begin() + t * W + c0, x.begin() + t * W + c0 + w, y.begin() + t * w);
  }
  return y;
}

struct QkvShape {
  int64_t T, H, Hkv, D;
};
const QkvShape kQkvShapes[] = {{1, 3, 1, 2},    {37, 3, 1, 24}, {37, 14, 2, 64},
                               {37, 2, 2, 128}, {19, 5, 1, 10}, {8, 14, 2, 64}};

// ---- split_qkv_rope -----------------------------------------------------------------------------

TEST_F(FusedGlue, SplitQkvRopeEqualsSplitThenRopeAndCpu) {
  for (const auto& s : kQkvShapes) {
    for (int off : {0, 1}) {
      const auto [T, H, Hkv, D] = s;
      SCOPED_TRACE(shape({T, H, Hkv, D}) + " offset " + std::to_string(off));
      const int64_t qd = H * D, kvd = Hkv * D, W = qd + 2 * kvd;
      const auto qkv = bf16_rounded(randn(T * W, 200 + D, 2.0f));
      const auto pos = positions(T, 201 + T);
      const auto inv = inv_freq_for(D);
      DeviceBuffer<int32_t> d_pos(pos);
      DeviceBuffer<float> d_inv(inv);
      auto d_qkv = up_bf16(qkv, off);
      const std::vector<float> zq(T * qd, 0.0f), zk(T * kvd, 0.0f);
      auto q1 = up_bf16(zq, off), k1 = up_bf16(zk, off), v1 = up_bf16(zk, off);
      auto q2 = up_bf16(zq, off), k2 = up_bf16(zk, off), v2 = up_bf16(zk, off);
      const bf16* src = d_qkv.data() + off;

      split_qkv(ctx(), q1.data() + off, k1.data() + off, v1.data() + off, src, T, qd, kvd);
      rope_forward(ctx(), q1.data() + off, d_pos.data(), d_inv.data(), T, H, D);
      rope_forward(ctx(), k1.data() + off, d_pos.data(), d_inv.data(), T, Hkv, D);
      split_qkv_rope(ctx(), q2.data() + off, k2.data() + off, v2.data() + off, src, d_pos.data(),
                     d_inv.data(), T, H, Hkv, D);
      sync();
      expect_same_bits("q", down_bits(q1.data() + off, T * qd), down_bits(q2.data() + off, T * qd));
      expect_same_bits("k", down_bits(k1.data() + off, T * kvd),
                       down_bits(k2.data() + off, T * kvd));
      expect_same_bits("v", down_bits(v1.data() + off, T * kvd),
                       down_bits(v2.data() + off, T * kvd));

      auto q = cols(qkv, T, W, 0, qd), k = cols(qkv, T, W, qd, kvd);
      cpu::rope_forward(q.data(), pos.data(), inv.data(), T, H, D);
      cpu::rope_forward(k.data(), pos.data(), inv.data(), T, Hkv, D);
      expect_close("q", down_bf16(q2.data() + off, T * qd), q, kBf16Out);
      expect_close("k", down_bf16(k2.data() + off, T * kvd), k, kBf16Out);
      expect_close("v", down_bf16(v2.data() + off, T * kvd), cols(qkv, T, W, qd + kvd, kvd),
                   Tol{0.0, 0.0});
    }
  }
}

// ---- rope_backward_pack_qkv ---------------------------------------------------------------------

TEST_F(FusedGlue, RopeBackwardPackQkvEqualsRopeBackwardThenPackAndCpu) {
  for (const auto& s : kQkvShapes) {
    for (int off : {0, 1}) {
      const auto [T, H, Hkv, D] = s;
      SCOPED_TRACE(shape({T, H, Hkv, D}) + " offset " + std::to_string(off));
      const int64_t qd = H * D, kvd = Hkv * D, W = qd + 2 * kvd;
      const auto dq = randn(T * qd, 210 + D), dk = randn(T * kvd, 211), dv = randn(T * kvd, 212);
      const auto pos = positions(T, 213 + T);
      const auto inv = inv_freq_for(D);
      DeviceBuffer<int32_t> d_pos(pos);
      DeviceBuffer<float> d_inv(inv);
      auto dq1 = up_f32(dq, off), dk1 = up_f32(dk, off), dv1 = up_f32(dv, off);
      auto dq2 = up_f32(dq, off), dk2 = up_f32(dk, off), dv2 = up_f32(dv, off);
      // Both outputs start as garbage: the pack overwrites every element.
      auto out1 = up_bf16(randn(T * W, 214), off), out2 = up_bf16(randn(T * W, 215), off);

      rope_backward(ctx(), dq1.data() + off, d_pos.data(), d_inv.data(), T, H, D);
      rope_backward(ctx(), dk1.data() + off, d_pos.data(), d_inv.data(), T, Hkv, D);
      pack_qkv(ctx(), out1.data() + off, dq1.data() + off, dk1.data() + off, dv1.data() + off, T,
               qd, kvd);
      rope_backward_pack_qkv(ctx(), out2.data() + off, dq2.data() + off, dk2.data() + off,
                             dv2.data() + off, d_pos.data(), d_inv.data(), T, H, Hkv, D);
      sync();
      expect_same_bits("d_qkv", down_bits(out1.data() + off, T * W),
                       down_bits(out2.data() + off, T * W));
      // The fused call reads its fp32 gradients without rotating them in place.
      expect_same_bits("d_q untouched", bits(down_f32(dq2.data() + off, T * qd)), bits(dq));
      expect_same_bits("d_k untouched", bits(down_f32(dk2.data() + off, T * kvd)), bits(dk));

      auto q = dq, k = dk;
      cpu::rope_backward(q.data(), pos.data(), inv.data(), T, H, D);
      cpu::rope_backward(k.data(), pos.data(), inv.data(), T, Hkv, D);
      std::vector<float> want(T * W);
      for (int64_t t = 0; t < T; ++t) {
        std::copy(q.begin() + t * qd, q.begin() + (t + 1) * qd, want.begin() + t * W);
        std::copy(k.begin() + t * kvd, k.begin() + (t + 1) * kvd, want.begin() + t * W + qd);
        std::copy(dv.begin() + t * kvd, dv.begin() + (t + 1) * kvd,
                  want.begin() + t * W + qd + kvd);
      }
      expect_close("d_qkv", down_bf16(out2.data() + off, T * W), want, kBf16Out);
    }
  }
}

TEST_F(FusedGlue, FusedQkvOpsWithNoTokensAreNoOps) {
  split_qkv_rope(ctx(), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 14, 2, 64);
  rope_backward_pack_qkv(ctx(), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 14, 2, 64);
  sync();
  EXPECT_THROW(
      split_qkv_rope(ctx(), nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1, 1, 7),
      verl::Error);  // odd head dim
}

// ---- rope: the vector path gives the scalar path's bits ----------------------------------------

TEST_F(FusedGlue, RopeVectorPathEqualsScalarPathAndCpu) {
  for (int64_t D : {24, 64, 128}) {
    for (bool backward : {false, true}) {
      const int64_t T = 37, nh = 3, n = T * nh * D;
      SCOPED_TRACE(shape({T, nh, D}) + (backward ? " backward" : " forward"));
      const auto x = bf16_rounded(randn(n, 220 + D));
      const auto pos = positions(T, 221);
      const auto inv = inv_freq_for(D);
      DeviceBuffer<int32_t> d_pos(pos);
      DeviceBuffer<float> d_inv(inv);
      auto run = [&](auto* p) {
        if (backward)
          rope_backward(ctx(), p, d_pos.data(), d_inv.data(), T, nh, D);
        else
          rope_forward(ctx(), p, d_pos.data(), d_inv.data(), T, nh, D);
      };
      auto b0 = up_bf16(x, 0), b1 = up_bf16(x, 1);
      auto f0 = up_f32(x, 0), f1 = up_f32(x, 1);
      run(b0.data());
      run(b1.data() + 1);
      run(f0.data());
      run(f1.data() + 1);
      sync();
      expect_same_bits("bf16 vector vs scalar", down_bits(b0.data(), n),
                       down_bits(b1.data() + 1, n));
      expect_same_bits("f32 vector vs scalar", bits(down_f32(f0.data(), n)),
                       bits(down_f32(f1.data() + 1, n)));
      std::vector<float> want = x;
      (backward ? cpu::rope_backward : cpu::rope_forward)(want.data(), pos.data(), inv.data(), T,
                                                          nh, D);
      expect_close("bf16", down_bf16(b0.data(), n), want, kBf16Out);
      expect_close("f32", down_f32(f0.data(), n), want, kF32Kernel);
    }
  }
}

// ---- swiglu -------------------------------------------------------------------------------------

TEST_F(FusedGlue, SwigluOverwriteEqualsZeroThenAccumulateAndCpu) {
  const int64_t T = 37;
  for (int64_t F : {1, 13, 100, 896, 4864}) {
    SCOPED_TRACE(shape({T, F}));
    const auto gu = bf16_rounded(randn(T * 2 * F, 230 + F, 3.0f));
    const auto g = bf16_rounded(randn(T * F, 231));
    const auto junk = randn(T * 2 * F, 232);
    const std::vector<float> zeros(T * 2 * F, 0.0f);
    std::vector<float> out(T * F), dgu = zeros;
    cpu::swiglu_forward(out.data(), gu.data(), T, F);
    cpu::swiglu_backward(dgu.data(), g.data(), gu.data(), T, F);

    std::vector<uint16_t> first_out, first_dgu;
    for (int off : {0, 1}) {
      SCOPED_TRACE("offset " + std::to_string(off));
      auto d_gu = up_bf16(gu, off), d_g = up_bf16(g, off), d_out = up_bf16(zeros, off);
      auto acc = up_bf16(zeros, off), over = up_bf16(junk, off);
      swiglu_forward(ctx(), d_out.data() + off, d_gu.data() + off, T, F);
      swiglu_backward(ctx(), acc.data() + off, d_g.data() + off, d_gu.data() + off, T, F);
      swiglu_backward(ctx(), over.data() + off, d_g.data() + off, d_gu.data() + off, T, F,
                      /*accumulate=*/false);
      sync();
      const auto got_out = down_bits(d_out.data() + off, T * F);
      const auto got_acc = down_bits(acc.data() + off, T * 2 * F);
      expect_same_bits("overwrite vs accumulate", got_acc, down_bits(over.data() + off, T * 2 * F));
      if (off == 0) {
        first_out = got_out;
        first_dgu = got_acc;
      } else {  // the scalar path computes the same bits
        expect_same_bits("out vector vs scalar", got_out, first_out);
        expect_same_bits("d_gu vector vs scalar", got_acc, first_dgu);
      }
      expect_close("out", down_bf16(d_out.data() + off, T * F), out, kBf16Out);
      expect_close("d_gu", down_bf16(over.data() + off, T * 2 * F), dgu, kBf16Out);
    }

    // fp32 storage: the same kernels.
    const auto gu32 = randn(T * 2 * F, 233, 3.0f), g32 = randn(T * F, 234);
    std::vector<float> dgu32 = zeros;
    cpu::swiglu_backward(dgu32.data(), g32.data(), gu32.data(), T, F);
    DeviceBuffer<float> d_gu32(gu32), d_g32(g32), acc32(zeros), over32(junk);
    swiglu_backward(ctx(), acc32.data(), d_g32.data(), d_gu32.data(), T, F);
    swiglu_backward(ctx(), over32.data(), d_g32.data(), d_gu32.data(), T, F, false);
    sync();
    expect_same_bits("f32 overwrite vs accumulate", bits(acc32.download()),
                     bits(over32.download()));
    expect_close("d_gu f32", over32.download(), dgu32, kF32Kernel);
  }
}

// ---- rmsnorm ------------------------------------------------------------------------------------

// C covers every launch shape: 24 (4 lanes a row), 64 (8), 100 (scalar packs, a warp), 896 (a
// warp, 4 packs a lane), 1536 and 4096 (the block), 4101 (the plain path).
const int64_t kNormCols[] = {24, 64, 100, 896, 1536, 4096, 4101};

TEST_F(FusedGlue, RmsnormBf16OverwriteEqualsZeroThenAccumulateAndCpu) {
  for (int64_t R : {1, 37, 300}) {
    for (int64_t C : kNormCols) {
      for (int off : {0, 1}) {
        SCOPED_TRACE(shape({R, C}) + " offset " + std::to_string(off));
        const auto x = bf16_rounded(randn(R * C, 240 + R, 2.0f));
        const auto w = bf16_rounded(randn(C, 241, 0.5f));
        const auto g = bf16_rounded(randn(R * C, 242 + C));
        const auto dw0 = randn(C, 243);
        const std::vector<float> zeros(R * C, 0.0f);
        std::vector<float> out(R * C), rstd(R), dx = zeros, dw = dw0;
        cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), R, C, 1e-6f);
        cpu::rmsnorm_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), R,
                              C);

        auto d_x = up_bf16(x, off), d_w = up_bf16(w, off), d_g = up_bf16(g, off);
        auto d_out = up_bf16(zeros, off), acc = up_bf16(zeros, off);
        auto over = up_bf16(randn(R * C, 244), off);
        DeviceBuffer<float> d_rstd(R), d_rstd_cpu(rstd), dw_acc(dw0), dw_over(dw0);
        rmsnorm_forward(ctx(), d_out.data() + off, d_rstd.data(), d_x.data() + off,
                        d_w.data() + off, R, C, 1e-6f);
        rmsnorm_backward(ctx(), acc.data() + off, dw_acc.data(), d_g.data() + off, d_x.data() + off,
                         d_w.data() + off, d_rstd_cpu.data(), R, C);
        rmsnorm_backward(ctx(), over.data() + off, dw_over.data(), d_g.data() + off,
                         d_x.data() + off, d_w.data() + off, d_rstd_cpu.data(), R, C,
                         /*accumulate_dx=*/false);
        sync();
        expect_same_bits("d_x overwrite vs accumulate", down_bits(acc.data() + off, R * C),
                         down_bits(over.data() + off, R * C));
        expect_same_bits("d_w", bits(dw_acc.download()), bits(dw_over.download()));
        expect_close("out", down_bf16(d_out.data() + off, R * C), out, kBf16Out);
        expect_close("rstd", d_rstd.download(), rstd, kF32Kernel);
        expect_close("d_x", down_bf16(over.data() + off, R * C), dx, kBf16Out);
        expect_close("d_w", dw_over.download(), dw, kF32RowSum);
      }
    }
  }
}

TEST_F(FusedGlue, RmsnormF32OverwriteEqualsZeroThenAccumulateAndCpu) {
  for (int64_t R : {1, 37, 300}) {
    for (int64_t C : kNormCols) {
      SCOPED_TRACE(shape({R, C}));
      const auto x = randn(R * C, 250 + R), w = randn(C, 251), g = randn(R * C, 252);
      const auto dw0 = randn(C, 253);
      const std::vector<float> zeros(R * C, 0.0f);
      std::vector<float> out(R * C), rstd(R), dx = zeros, dw = dw0;
      cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), R, C, 1e-5f);
      cpu::rmsnorm_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), R, C);

      DeviceBuffer<float> d_x(x), d_w(w), d_g(g), d_out(R * C), d_rstd(R), d_rstd_cpu(rstd);
      DeviceBuffer<float> acc(zeros), over(randn(R * C, 254)), dw_acc(dw0), dw_over(dw0);
      rmsnorm_forward(ctx(), d_out.data(), d_rstd.data(), d_x.data(), d_w.data(), R, C, 1e-5f);
      rmsnorm_backward(ctx(), acc.data(), dw_acc.data(), d_g.data(), d_x.data(), d_w.data(),
                       d_rstd_cpu.data(), R, C);
      rmsnorm_backward(ctx(), over.data(), dw_over.data(), d_g.data(), d_x.data(), d_w.data(),
                       d_rstd_cpu.data(), R, C, false);
      sync();
      expect_same_bits("d_x overwrite vs accumulate", bits(acc.download()), bits(over.download()));
      expect_same_bits("d_w", bits(dw_acc.download()), bits(dw_over.download()));
      expect_close("out", d_out.download(), out, kF32Kernel);
      expect_close("rstd", d_rstd.download(), rstd, kF32Kernel);
      expect_close("d_x", over.download(), dx, kF32Kernel);
      expect_close("d_w", dw_over.download(), dw, kF32RowSum);
    }
  }
}

// d_w alone (d_x and w null, as the existing determinism test calls it), on the fast path, with
// the default workspace and with one that holds only three rows of partial sums.
TEST_F(FusedGlue, RmsnormFastWeightGradIsDeterministicAndFitsASmallWorkspace) {
  const int64_t R = 1000, C = 896;
  const auto x = bf16_rounded(randn(R * C, 260)), g = bf16_rounded(randn(R * C, 261));
  const auto rstd = randn(R, 262);
  std::vector<float> want(C, 0.0f);
  cpu::rmsnorm_backward(nullptr, want.data(), g.data(), x.data(), nullptr, rstd.data(), R, C);
  auto d_x = upload_bf16(x), d_g = upload_bf16(g);
  DeviceBuffer<float> d_rstd(rstd);
  CudaSession small(3 * C * sizeof(float));
  std::vector<float> first;
  for (int run = 0; run < 4; ++run) {
    const CudaContext& c = run < 3 ? ctx() : small.ctx();
    DeviceBuffer<float> dw(std::vector<float>(C, 0.0f));
    rmsnorm_backward(c, static_cast<bf16*>(nullptr), dw.data(), d_g.data(), d_x.data(), nullptr,
                     d_rstd.data(), R, C);
    VERL_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = dw.download();
    expect_close("d_w run " + std::to_string(run), got, want, kF32RowSum);
    if (run == 0)
      first = got;
    else if (run < 3)
      expect_same_bits("d_w run " + std::to_string(run), bits(got), bits(first));
  }
}

// ---- glue: exact ops ----------------------------------------------------------------------------

TEST_F(FusedGlue, AddConvertSplitPackAreExactOnEveryPath) {
  for (int64_t n : {1, 7, 1001, 4096}) {
    for (int off : {0, 1, 4}) {
      SCOPED_TRACE("n " + std::to_string(n) + " offset " + std::to_string(off));
      const auto a = bf16_rounded(randn(n, 270 + n)), b = bf16_rounded(randn(n, 271));
      const auto f = randn(n, 272);
      auto d_a = up_bf16(a, off), d_b = up_bf16(b, off), d_h = up_bf16(randn(n, 273), off);
      auto d_f = up_f32(f, off), d_back = up_f32(randn(n, 274), off);
      add_inplace(ctx(), d_a.data() + off, d_b.data() + off, n);
      convert(ctx(), d_h.data() + off, d_f.data() + off, n);
      convert(ctx(), d_back.data() + off, d_b.data() + off, n);
      sync();
      std::vector<float> sum(n), rounded(n);
      for (int64_t i = 0; i < n; ++i) {
        sum[i] = bf16_to_f32(f32_to_bf16(a[i] + b[i]));
        rounded[i] = bf16_to_f32(f32_to_bf16(f[i]));
      }
      expect_same_bits("add_inplace", bits(down_bf16(d_a.data() + off, n)), bits(sum));
      expect_same_bits("convert to bf16", bits(down_bf16(d_h.data() + off, n)), bits(rounded));
      expect_same_bits("convert to f32", bits(down_f32(d_back.data() + off, n)), bits(b));
    }
  }
  for (int64_t T : {1, 37}) {
    const std::pair<int64_t, int64_t> kSplits[] = {{896, 128}, {30, 6}, {7, 3}};
    for (auto [qd, kvd] : kSplits) {
      for (int off : {0, 1}) {
        SCOPED_TRACE(shape({T, qd, kvd}) + " offset " + std::to_string(off));
        const int64_t W = qd + 2 * kvd;
        const auto qkv = bf16_rounded(randn(T * W, 280 + qd));
        const auto dq = randn(T * qd, 281), dk = randn(T * kvd, 282), dv = randn(T * kvd, 283);
        auto d_qkv = up_bf16(qkv, off), q = up_bf16(randn(T * qd, 284), off);
        auto k = up_bf16(randn(T * kvd, 285), off), v = up_bf16(randn(T * kvd, 286), off);
        auto d_dq = up_f32(dq, off), d_dk = up_f32(dk, off), d_dv = up_f32(dv, off);
        auto d_dqb = up_bf16(dq, off), d_dkb = up_bf16(dk, off);
        auto packed = up_bf16(randn(T * W, 287), off), packed_b = up_bf16(randn(T * W, 288), off);
        split_qkv(ctx(), q.data() + off, k.data() + off, v.data() + off, d_qkv.data() + off, T, qd,
                  kvd);
        pack_qkv(ctx(), packed.data() + off, d_dq.data() + off, d_dk.data() + off,
                 d_dv.data() + off, T, qd, kvd);
        pack_qkv(ctx(), packed_b.data() + off, d_dqb.data() + off, d_dkb.data() + off,
                 d_dv.data() + off, T, qd, kvd);
        sync();
        expect_same_bits("split q", bits(down_bf16(q.data() + off, T * qd)),
                         bits(cols(qkv, T, W, 0, qd)));
        expect_same_bits("split k", bits(down_bf16(k.data() + off, T * kvd)),
                         bits(cols(qkv, T, W, qd, kvd)));
        expect_same_bits("split v", bits(down_bf16(v.data() + off, T * kvd)),
                         bits(cols(qkv, T, W, qd + kvd, kvd)));
        std::vector<float> want(T * W);
        for (int64_t t = 0; t < T; ++t) {
          for (int64_t c = 0; c < W; ++c) {
            const float x = c < qd         ? dq[t * qd + c]
                            : c < qd + kvd ? dk[t * kvd + c - qd]
                                           : dv[t * kvd + c - qd - kvd];
            want[t * W + c] = bf16_to_f32(f32_to_bf16(x));
          }
        }
        // From bf16 d_q / d_k the values are already rounded: the same result.
        expect_same_bits("pack from f32", bits(down_bf16(packed.data() + off, T * W)), bits(want));
        expect_same_bits("pack from bf16", bits(down_bf16(packed_b.data() + off, T * W)),
                         bits(want));
      }
    }
  }
}

// ---- embedding: the vector path -----------------------------------------------------------------

TEST_F(FusedGlue, EmbeddingVectorPathMatchesCpu) {
  const int64_t T = 37, V = 50;
  for (int64_t C : {8, 100, 896}) {
    for (int off : {0, 1}) {
      SCOPED_TRACE(shape({T, C}) + " offset " + std::to_string(off));
      Rng rng(290 + C);
      std::vector<int32_t> ids(T);
      for (auto& e : ids) e = static_cast<int32_t>(rng.uniform() * V);
      ids[3] = -1;  // out of range: a zero row, no gradient
      const auto table = bf16_rounded(randn(V * C, 291));
      const auto g = bf16_rounded(randn(T * C, 292));
      const auto dtab0 = randn(V * C, 293);
      std::vector<float> out(T * C), dtab = dtab0;
      std::vector<int32_t> ids_cpu = ids;
      ids_cpu[3] = 0;
      cpu::embedding_forward(out.data(), ids_cpu.data(), table.data(), T, C, V);
      std::fill(out.begin() + 3 * C, out.begin() + 4 * C, 0.0f);
      std::vector<float> g_cpu = g;
      std::fill(g_cpu.begin() + 3 * C, g_cpu.begin() + 4 * C, 0.0f);
      cpu::embedding_backward(dtab.data(), g_cpu.data(), ids_cpu.data(), T, C);

      DeviceBuffer<int32_t> d_ids(ids);
      auto d_table = up_bf16(table, off), d_g = up_bf16(g, off);
      auto d_out = up_bf16(randn(T * C, 294), off);
      DeviceBuffer<float> d_dtab(dtab0);
      embedding_forward(ctx(), d_out.data() + off, d_ids.data(), d_table.data() + off, T, C, V);
      embedding_backward(ctx(), d_dtab.data(), d_g.data() + off, d_ids.data(), T, C, V);
      sync();
      expect_close("out", down_bf16(d_out.data() + off, T * C), out, Tol{0.0, 0.0});
      expect_close("d_table", d_dtab.download(), dtab, kF32Kernel);
    }
  }
}

// ---- the rollout's fused kernels against the trainer's sequence ---------------------------------

// add_rmsnorm_forward (the rollout's residual add inside the next norm) gives the bits of the
// trainer's add_inplace followed by rmsnorm_forward, on the vector path and the scalar one.
TEST_F(FusedGlue, AddRmsnormEqualsAddThenRmsnorm) {
  for (const auto& [R, C] :
       {std::pair<int64_t, int64_t>{37, 896}, {5, 4096}, {300, 64}, {3, 100}}) {
    for (int off : {0, 1}) {
      SCOPED_TRACE(shape({R, C}) + " offset " + std::to_string(off));
      const auto x = bf16_rounded(randn(R * C, 300 + C, 3.0f));
      const auto y = bf16_rounded(randn(R * C, 301 + C, 1.0f));
      const auto w = bf16_rounded(randn(C, 302 + C, 0.5f));
      auto x1 = up_bf16(x, off), x2 = up_bf16(x, off), dy = up_bf16(y, off);
      auto dw = up_bf16(w, 0);
      const std::vector<float> z(R * C, 0.0f);
      auto o1 = up_bf16(z, off), o2 = up_bf16(z, off);
      DeviceBuffer<float> r1(R), r2(R);
      add_inplace(ctx(), x1.data() + off, dy.data() + off, R * C);
      rmsnorm_forward(ctx(), o1.data() + off, r1.data(), x1.data() + off, dw.data(), R, C, 1e-6f);
      add_rmsnorm_forward(ctx(), o2.data() + off, r2.data(), x2.data() + off, dy.data() + off,
                          dw.data(), R, C, 1e-6f);
      sync();
      expect_same_bits("x", down_bits(x1.data() + off, R * C), down_bits(x2.data() + off, R * C));
      expect_same_bits("out", down_bits(o1.data() + off, R * C), down_bits(o2.data() + off, R * C));
      expect_same_bits("rstd", bits(down_f32(r1.data(), R)), bits(down_f32(r2.data(), R)));
    }
  }
}

// qkv_rope_paged_write (the rollout's q/k norm + RoPE + KV write; token t's cache slot is T-1-t)
// gives the bits of the trainer's split_qkv_rope, or with Qwen3's q/k norms of split_qkv,
// rmsnorm_forward over the head dim and rope_forward, so a token's q, k, v are the same on both
// sides.
TEST_F(FusedGlue, RolloutQkvRopeEqualsTheTrainersKernels) {
  for (const auto& s : kQkvShapes) {
    for (bool norm : {false, true}) {
      const auto [T, H, Hkv, D] = s;
      if (D % 2 != 0) continue;
      SCOPED_TRACE(shape({T, H, Hkv, D}) + (norm ? " q/k norm" : ""));
      const int64_t qd = H * D, kvd = Hkv * D, W = qd + 2 * kvd;
      const auto qkv = bf16_rounded(randn(T * W, 400 + D, 2.0f));
      const auto pos = positions(T, 401 + T);
      const auto inv = inv_freq_for(D);
      const auto qn = bf16_rounded(randn(D, 402, 0.5f)), kn = bf16_rounded(randn(D, 403, 0.5f));
      DeviceBuffer<int32_t> d_pos(pos);
      DeviceBuffer<float> d_inv(inv);
      auto d_qkv = up_bf16(qkv, 0), d_qn = up_bf16(qn, 0), d_kn = up_bf16(kn, 0);
      std::vector<int32_t> slots(T);
      for (int64_t t = 0; t < T; ++t) slots[t] = static_cast<int32_t>(T - 1 - t);
      DeviceBuffer<int32_t> d_slots(slots);
      const std::vector<float> zq(T * qd, 0.0f), zk(T * kvd, 0.0f);
      auto q1 = up_bf16(zq, 0), k1 = up_bf16(zk, 0), v1 = up_bf16(zk, 0);
      auto q2 = up_bf16(zq, 0);
      auto kc = up_bf16(zk, 0), vc = up_bf16(zk, 0);
      if (norm) {
        auto qp = up_bf16(zq, 0), kp = up_bf16(zk, 0);
        split_qkv(ctx(), qp.data(), kp.data(), v1.data(), d_qkv.data(), T, qd, kvd);
        rmsnorm_forward(ctx(), q1.data(), nullptr, qp.data(), d_qn.data(), T * H, D, 1e-6f);
        rmsnorm_forward(ctx(), k1.data(), nullptr, kp.data(), d_kn.data(), T * Hkv, D, 1e-6f);
        rope_forward(ctx(), q1.data(), d_pos.data(), d_inv.data(), T, H, D);
        rope_forward(ctx(), k1.data(), d_pos.data(), d_inv.data(), T, Hkv, D);
        sync();
      } else {
        split_qkv_rope(ctx(), q1.data(), k1.data(), v1.data(), d_qkv.data(), d_pos.data(),
                       d_inv.data(), T, H, Hkv, D);
      }
      qkv_rope_paged_write(ctx(), q2.data(), kc.data(), vc.data(), d_qkv.data(),
                           norm ? d_qn.data() : nullptr, norm ? d_kn.data() : nullptr, 1e-6f,
                           d_pos.data(), d_inv.data(), d_slots.data(), T, H, Hkv, D);
      sync();
      // rmsnorm's order is matched for head dims that are 8 packs of at most 32 lanes.
      if (norm && !(D % 8 == 0 && D / 8 <= 32)) continue;
      expect_same_bits("q", down_bits(q1.data(), T * qd), down_bits(q2.data(), T * qd));
      // The cache rows back in token order (token t sits at slot T - 1 - t).
      auto token_order = [&](const std::vector<uint16_t>& cache) {
        std::vector<uint16_t> rows(cache.size());
        for (int64_t t = 0; t < T; ++t) {
          std::copy_n(cache.begin() + (T - 1 - t) * kvd, kvd, rows.begin() + t * kvd);
        }
        return rows;
      };
      expect_same_bits("k", down_bits(k1.data(), T * kvd),
                       token_order(down_bits(kc.data(), T * kvd)));
      expect_same_bits("v", down_bits(v1.data(), T * kvd),
                       token_order(down_bits(vc.data(), T * kvd)));
    }
  }
}

}  // namespace
}  // namespace verl::ops::cuda::test
