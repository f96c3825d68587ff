// quant_linear_forward (ops/cuda/quant_linear.h) against the CPU reference: model::quantize_matrix
// then model::dequantize_matrix, and an fp64 matmul over the same bf16-rounded inputs and bias.
// int8, int4 in groups of 128 and of 32, short last groups, odd K (an int4 row's last byte half
// used), a group that is not a multiple of 8 (the Dequant path only); T in {1, 3, 16, 30, 100, 600}
// (the three fused tile configurations, with and without the k split) through both paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/quantize.h"
#include "ops/cuda/quant_linear.h"
#include "test_util.h"

namespace verl::ops::cuda::test {
namespace {

// A QuantizedMatrix in the device layout of quant_linear.h (codes rows padded to the stride).
struct DeviceQuant {
  DeviceBuffer<uint8_t> codes, zeros;
  DeviceBuffer<float> scales;
  QuantMatrixView view;
  explicit DeviceQuant(const model::QuantizedMatrix& q) {
    view.bits = q.bits;
    view.rows = q.rows;
    view.cols = q.cols;
    view.group = q.group;
    view.ld = quant_codes_stride(q.bits, q.cols);
    std::vector<uint8_t> padded(static_cast<size_t>(q.rows * view.ld), 0);
    for (int64_t r = 0; r < q.rows; ++r)
      std::memcpy(padded.data() + r * view.ld, q.codes.data() + r * q.row_bytes(),
                  static_cast<size_t>(q.row_bytes()));
    codes = DeviceBuffer<uint8_t>(padded);
    scales = DeviceBuffer<float>(q.scales);
    view.codes = codes.data();
    view.scales = scales.data();
    if (q.bits == 4) {
      zeros = DeviceBuffer<uint8_t>(q.zeros);
      view.zeros = zeros.data();
    }
  }
};

struct Case {
  int bits;
  int64_t group, K, N;
};

std::string name(const Case& c) {
  return "int" + std::to_string(c.bits) +
         (c.bits == 4 ? " group " + std::to_string(c.group) : std::string()) +
         " K=" + std::to_string(c.K) + " N=" + std::to_string(c.N);
}

// The inputs of one case and the reference: y = x deq(W)^T + b in fp64 over bf16-rounded x, b,
// and the bound of each element (below).
struct Problem {
  model::QuantizedMatrix q;
  std::vector<float> x, b, want, bound;
};

// |got - want| <= 1e-4 + 2^-7 |want| + 2^-6 sqrt(sum_k (x_k w_k)^2): one bf16 rounding of the
// output (half an ulp, 2^-9), plus the bf16 rounding of each dequantised weight (int4, and int8 on
// the Dequant path: at most 2^-9 of each product, random in sign, so its sum grows with the
// products' root sum of squares; the bound is over 10 standard deviations of it) and fp32 summation
// order.
Problem make_problem(const Case& c, int64_t T, uint64_t seed) {
  Problem p;
  const std::vector<float> w = randn(static_cast<size_t>(c.N * c.K), seed, 0.05f);
  p.q = model::quantize_matrix(w.data(), c.N, c.K, c.bits, c.bits == 8 ? c.K : c.group);
  std::vector<float> wd(w.size());
  model::dequantize_matrix(p.q, wd.data());
  p.x = bf16_rounded(randn(static_cast<size_t>(T * c.K), seed + 1));
  p.b = bf16_rounded(randn(static_cast<size_t>(c.N), seed + 2, 0.1f));
  p.want.resize(static_cast<size_t>(T * c.N));
  p.bound.resize(p.want.size());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < c.N; ++n) {
      double s = p.b[n], sq = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double prod = static_cast<double>(p.x[t * c.K + k]) * wd[n * c.K + k];
        s += prod;
        sq += prod * prod;
      }
      p.want[t * c.N + n] = static_cast<float>(s);
      p.bound[t * c.N + n] = static_cast<float>(1e-4 + std::abs(s) / 128 + std::sqrt(sq) / 64);
    }
  }
  return p;
}

class QuantLinear : public CudaTest {
 protected:
  // Runs one path and checks every element; returns the largest error relative to its bound.
  double check(const Case& c, int64_t T, QuantPath path) {
    const Problem p = make_problem(c, T, 1000 + 17 * static_cast<uint64_t>(T) + c.K);
    DeviceQuant dq(p.q);
    DeviceBuffer<bf16> x = upload_bf16(p.x), b = upload_bf16(p.b), y(static_cast<size_t>(T * c.N));
    DeviceBuffer<bf16> scratch(static_cast<size_t>(c.N * c.K));
    quant_linear_forward(ctx(), y.data(), x.data(), dq.view, b.data(), T, c.K, c.N, scratch.data(),
                         path);
    sync();
    const std::vector<float> got = download_bf16(y);
    const std::string what = name(c) + " T=" + std::to_string(T) +
                             (path == QuantPath::Fused  ? " fused"
                              : path == QuantPath::Gemv ? " gemv"
                                                        : " dequant+cuBLASLt");
    int misses = 0;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double err = std::abs(static_cast<double>(got[i]) - p.want[i]);
      worst = std::max(worst, err / p.bound[i]);
      if (!(err <= p.bound[i]) && ++misses <= 5)
        ADD_FAILURE() << what << " [t " << i / c.N << ", n " << i % c.N << "]: got " << got[i]
                      << " want " << p.want[i] << " (bound " << p.bound[i] << ")";
    }
    EXPECT_EQ(misses, 0) << what << ": " << misses << " of " << got.size() << " out of tolerance";
    return worst;
  }
};

const std::vector<Case> kCases = {
    {8, 0, 64, 128},     // the golden reward model's q|k|v projection
    {8, 0, 96, 64},      // its down projection (K = 96: a part k-tile)
    {8, 0, 1000, 384},   // K split over blocks at small T
    {8, 0, 77, 50},      // odd K and N: element-wise x staging, partial tiles
    {4, 128, 64, 192},   // one short group (64 of 128)
    {4, 128, 300, 130},  // groups of 128, 128, 44
    {4, 32, 200, 96},    // groups of 32, the last of 8
    {4, 32, 1024, 256},  // K split, many groups a tile
    {4, 128, 77, 33},    // odd K: the last byte's high nibble is unused
};

TEST_F(QuantLinear, MatchesTheCpuReferenceOnBothPaths) {
  for (const Case& c : kCases) {
    for (int64_t T : {1, 3, 16, 30, 100, 600}) {
      const double fused = check(c, T, QuantPath::Fused);
      const double deq = check(c, T, QuantPath::Dequant);
      std::printf("%-28s T=%-4lld worst error / bound: fused %.3f, dequant+cuBLASLt %.3f\n",
                  name(c).c_str(), static_cast<long long>(T), fused, deq);
    }
  }
}

// The GEMV kernel (at most 8 tokens) on every case it takes, against the same reference; the
// others are refused by name.
TEST_F(QuantLinear, GemvMatchesTheCpuReference) {
  int taken = 0;
  for (const Case& c : kCases) {
    const bool takes = c.K % 8 == 0 && (c.bits == 8 || c.group % 32 == 0 || c.K <= c.group);
    for (int64_t T : {1, 2, 3, 5, 8}) {
      if (!takes) {
        const Problem p = make_problem(c, T, 3);
        DeviceQuant dq(p.q);
        DeviceBuffer<bf16> x = upload_bf16(p.x), y(static_cast<size_t>(T * c.N));
        EXPECT_FALSE(quant_gemv_supported(dq.view, T, x.data())) << name(c);
        EXPECT_THROW(quant_linear_forward(ctx(), y.data(), x.data(), dq.view, nullptr, T, c.K, c.N,
                                          nullptr, QuantPath::Gemv),
                     Error)
            << name(c);
        continue;
      }
      ++taken;
      std::printf("%-28s T=%-4lld worst error / bound: gemv %.3f\n", name(c).c_str(),
                  static_cast<long long>(T), check(c, T, QuantPath::Gemv));
    }
  }
  EXPECT_GE(taken, 25);  // 6 of the cases, 5 token counts
}

// Auto takes the GEMV kernel up to quant_gemv_auto_max_tokens, the fused kernel up to
// kQuantFusedMaxTokens, then dequantise + cuBLASLt (quant_auto_path), and its output is that
// path's bit for bit.
TEST_F(QuantLinear, AutoTakesTheMeasuredPathForEachTokenCount) {
  for (const Case& c : {Case{8, 0, 1000, 384}, Case{4, 32, 1024, 256}}) {
    for (int64_t T : {1, 2, 3, 4, 8, 32, 33, 100}) {
      const Problem p = make_problem(c, T, 77 + static_cast<uint64_t>(T));
      DeviceQuant dq(p.q);
      DeviceBuffer<bf16> x = upload_bf16(p.x), scratch(static_cast<size_t>(c.N * c.K));
      const QuantPath want = T <= quant_gemv_auto_max_tokens(c.bits) ? QuantPath::Gemv
                             : T <= kQuantFusedMaxTokens             ? QuantPath::Fused
                                                                     : QuantPath::Dequant;
      const QuantPath got = quant_auto_path(dq.view, T, x.data(), true);
      EXPECT_EQ(static_cast<int>(got), static_cast<int>(want)) << name(c) << " T=" << T;
      auto run = [&](QuantPath path) {
        DeviceBuffer<bf16> y(static_cast<size_t>(T * c.N));
        quant_linear_forward(ctx(), y.data(), x.data(), dq.view, nullptr, T, c.K, c.N,
                             scratch.data(), path);
        sync();
        return download_bf16(y);
      };
      EXPECT_EQ(run(QuantPath::Auto), run(want)) << name(c) << " T=" << T;
    }
  }
  // Without a scratch buffer Auto stays on the fused kernel at any T.
  const DeviceQuant dq(make_problem(Case{8, 0, 1000, 384}, 1, 3).q);
  EXPECT_EQ(static_cast<int>(quant_auto_path(dq.view, 600, nullptr, false)),
            static_cast<int>(QuantPath::Fused));
}

TEST_F(QuantLinear, GroupsNotAMultipleOfEightTakeTheDequantPath) {
  const Case c{4, 6, 50, 40};
  for (int64_t T : {1, 100}) {
    check(c, T, QuantPath::Dequant);
    check(c, T, QuantPath::Auto);  // Auto goes the dequant way whatever T is
  }
  const Problem p = make_problem(c, 2, 5);
  DeviceQuant dq(p.q);
  DeviceBuffer<bf16> x = upload_bf16(p.x), y(static_cast<size_t>(2 * c.N));
  EXPECT_THROW(quant_linear_forward(ctx(), y.data(), x.data(), dq.view, nullptr, 2, c.K, c.N,
                                    nullptr, QuantPath::Fused),
               Error);
}

// The dequantisation kernel gives model::dequantize_matrix's fp32 values rounded to bf16, bit
// for bit (one fp32 product each side).
TEST_F(QuantLinear, DequantizeIsTheCpuValueRounded) {
  for (const Case& c :
       {Case{8, 0, 77, 50}, Case{4, 32, 200, 96}, Case{4, 128, 77, 33}, Case{4, 6, 50, 40}}) {
    const Problem p = make_problem(c, 1, 9);
    std::vector<float> wd(static_cast<size_t>(c.N * c.K));
    model::dequantize_matrix(p.q, wd.data());
    DeviceQuant dq(p.q);
    DeviceBuffer<bf16> out(wd.size());
    quant_dequantize(ctx(), out.data(), dq.view);
    sync();
    const std::vector<float> got = download_bf16(out), want = bf16_rounded(wd);
    EXPECT_TRUE(bitwise_equal(got, want)) << name(c);
  }
}

}  // namespace
}  // namespace verl::ops::cuda::test
