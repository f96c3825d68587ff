// Causal GQA attention on the GPU (src/ops/cuda/attention.cu, tensor cores) against the CPU
// reference op (the oracle), both run on the same bf16-rounded inputs: packed batches of odd
// lengths (1, 17, 64, 65, 200, 300: tile boundaries crossed on both sides, a lone token), H = Hkv
// and GQA groups of 2, 3 and 8, head dims 24/64/128 (16-byte staging, zero-padded to 32/64/128)
// and 20/33/100 (element staging, odd D), gradients accumulated into random initial values, null
// gradients skipped, and bitwise-identical results on a second run.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/cpu/ops.h"
#include "ops/cuda/attention.h"
#include "test_util.h"

namespace verl::ops::cuda::test {
namespace {

struct Case {
  std::vector<int32_t> lens;
  int64_t H, Hkv, D;
};

std::string name(const Case& c) {
  std::string s = "lens";
  for (int32_t l : c.lens) {
    s += '_';
    s += std::to_string(l);
  }
  s += " H" + std::to_string(c.H);
  s += " Hkv" + std::to_string(c.Hkv);
  s += " D" + std::to_string(c.D);
  return s;
}

// Inputs, the CPU's results and, for the bound on the GPU's bf16 rounding of P and dS, the sum of
// the magnitudes of the terms of every output element (kAttnBf16Operand in tolerances.h):
//   out_i:  sum_j p_ij |v_j|        d_v_j: sum_{h,i} p_ij |d_out_i|
//   d_q_i:  |scale| sum_j |ds_ij| |k_j|   d_k_j: |scale| sum_{h,i} |ds_ij| |q_i|
struct Reference {
  int64_t B = 0, T = 0, H = 0, Hkv = 0, D = 0;
  float scale = 0;
  std::vector<int32_t> cu;
  std::vector<float> q, k, v, dout, dq0, dk0, dv0;
  std::vector<float> out, lse, out_b, dq, dk, dv;
  std::vector<float> out_mag, dq_mag, dk_mag, dv_mag;
};

Reference make_reference(const Case& c, uint64_t seed) {
  Reference r;
  r.B = static_cast<int64_t>(c.lens.size());
  r.cu.assign(r.B + 1, 0);
  for (int64_t b = 0; b < r.B; ++b) r.cu[b + 1] = r.cu[b] + c.lens[b];
  r.T = r.cu[r.B];
  r.H = c.H;
  r.Hkv = c.Hkv;
  r.D = c.D;
  r.scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  const int64_t T = r.T, H = r.H, Hkv = r.Hkv, D = r.D;
  r.q = bf16_rounded(randn(T * H * D, seed + 1));
  r.k = bf16_rounded(randn(T * Hkv * D, seed + 2));
  r.v = bf16_rounded(randn(T * Hkv * D, seed + 3));
  r.dout = bf16_rounded(randn(T * H * D, seed + 4));
  r.dq0 = randn(T * H * D, seed + 5);  // the backward accumulates into these
  r.dk0 = randn(T * Hkv * D, seed + 6);
  r.dv0 = randn(T * Hkv * D, seed + 7);

  // CPU forward; the backward on both sides reads the bf16 rounding of the CPU's out and the
  // CPU's lse, so both differentiate at the same point.
  r.out.resize(T * H * D);
  r.lse.resize(T * H);
  cpu::attention_forward(r.out.data(), r.lse.data(), r.q.data(), r.k.data(), r.v.data(),
                         r.cu.data(), r.B, T, H, Hkv, D, r.scale);
  r.out_b = bf16_rounded(r.out);
  r.dq = r.dq0;
  r.dk = r.dk0;
  r.dv = r.dv0;
  cpu::attention_backward(r.dq.data(), r.dk.data(), r.dv.data(), r.dout.data(), r.q.data(),
                          r.k.data(), r.v.data(), r.out_b.data(), r.lse.data(), r.cu.data(), r.B, T,
                          H, Hkv, D, r.scale);

  r.out_mag.assign(T * H * D, 0.0f);
  r.dq_mag.assign(T * H * D, 0.0f);
  r.dk_mag.assign(T * Hkv * D, 0.0f);
  r.dv_mag.assign(T * Hkv * D, 0.0f);
  auto dot = [D](const float* a, const float* b) {
    double s = 0;
    for (int64_t d = 0; d < D; ++d) s += double(a[d]) * b[d];
    return s;
  };
  const int64_t rep = H / Hkv;
  for (int64_t b = 0; b < r.B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / rep;
      for (int64_t i = r.cu[b]; i < r.cu[b + 1]; ++i) {
        const float* qi = &r.q[(i * H + h) * D];
        const float* oi = &r.dout[(i * H + h) * D];
        const double Di = dot(oi, &r.out_b[(i * H + h) * D]);
        for (int64_t j = r.cu[b]; j <= i; ++j) {
          const float* kj = &r.k[(j * Hkv + g) * D];
          const float* vj = &r.v[(j * Hkv + g) * D];
          const double p = std::exp(r.scale * dot(qi, kj) - r.lse[i * H + h]);
          const double ds = std::abs(r.scale) * std::abs(p * (dot(oi, vj) - Di));
          for (int64_t d = 0; d < D; ++d) {
            r.out_mag[(i * H + h) * D + d] += static_cast<float>(p * std::abs(vj[d]));
            r.dq_mag[(i * H + h) * D + d] += static_cast<float>(ds * std::abs(kj[d]));
            r.dv_mag[(j * Hkv + g) * D + d] += static_cast<float>(p * std::abs(oi[d]));
            r.dk_mag[(j * Hkv + g) * D + d] += static_cast<float>(ds * std::abs(qi[d]));
          }
        }
      }
    }
  }
  return r;
}

// |got - want| <= atol + rtol * base + kAttnBf16Operand * mag, base = |want| (init empty) or
// |init| + |want - init| (accumulated outputs, as expect_close_accumulated).
void expect_close_terms(const std::string& what, const std::vector<float>& got,
                        const std::vector<float>& want, const std::vector<float>& init,
                        const std::vector<float>& mag, Tol tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(mag.size(), want.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    const double base =
        init.empty() ? std::abs(w) : std::abs(double(init[i])) + std::abs(w - init[i]);
    const double bound = tol.atol + tol.rtol * base + kAttnBf16Operand * mag[i];
    if (!(std::abs(g - w) <= bound)) {
      if (++misses <= 5) {
        ADD_FAILURE() << what << "[" << i << "]: got " << g << " want " << w << " bound " << bound;
      }
    }
  }
  EXPECT_EQ(misses, 0) << what << ": " << misses << " of " << got.size() << " out of tolerance";
}

struct GpuInputs {
  DeviceBuffer<bf16> q, k, v, dout, out_cpu;
  DeviceBuffer<int32_t> cu;
  DeviceBuffer<float> lse_cpu;
  explicit GpuInputs(const Reference& r)
      : q(upload_bf16(r.q)),
        k(upload_bf16(r.k)),
        v(upload_bf16(r.v)),
        dout(upload_bf16(r.dout)),
        out_cpu(upload_bf16(r.out_b)),
        cu(r.cu),
        lse_cpu(r.lse) {}
};

using CudaAttention = CudaTest;

// Runs one case on the GPU and compares out, lse, d_q, d_k and d_v with the CPU.
void check_case(const CudaContext& ctx, const CudaSession& session, const Case& c, uint64_t seed) {
  SCOPED_TRACE(name(c));
  const Reference r = make_reference(c, seed);
  const int64_t B = r.B, T = r.T, H = r.H, Hkv = r.Hkv, D = r.D;
  GpuInputs in(r);
  DeviceBuffer<bf16> g_out(T * H * D);
  DeviceBuffer<float> g_lse(T * H), g_dq(r.dq0), g_dk(r.dk0), g_dv(r.dv0);
  attention_forward(ctx, g_out.data(), g_lse.data(), in.q.data(), in.k.data(), in.v.data(),
                    in.cu.data(), B, T, H, Hkv, D, r.scale);
  attention_backward(ctx, g_dq.data(), g_dk.data(), g_dv.data(), in.dout.data(), in.q.data(),
                     in.k.data(), in.v.data(), in.out_cpu.data(), in.lse_cpu.data(), in.cu.data(),
                     B, T, H, Hkv, D, r.scale);
  session.synchronize();
  expect_close_terms("out", download_bf16(g_out), r.out, {}, r.out_mag, kAttnOut);
  expect_close("lse", g_lse.download(), r.lse, kF32RowSum);
  expect_close_terms("d_q", g_dq.download(), r.dq, r.dq0, r.dq_mag, kAttnGrad);
  expect_close_terms("d_k", g_dk.download(), r.dk, r.dk0, r.dk_mag, kAttnGrad);
  expect_close_terms("d_v", g_dv.download(), r.dv, r.dv0, r.dv_mag, kAttnGrad);
}

// One packed batch with every tile-boundary case, all three padded head dims, GQA groups 1, 3, 8.
TEST_F(CudaAttention, MatchesCpuPackedBatch) {
  const std::vector<int32_t> lens = {1, 17, 64, 65, 200, 300};
  const int64_t heads[][2] = {{4, 4}, {6, 2}, {8, 1}};
  uint64_t seed = 1000;
  for (const auto& hh : heads) {
    for (int64_t D : {24, 64, 128}) {
      seed += 10;
      check_case(ctx(), *session_, Case{lens, hh[0], hh[1], D}, seed);
    }
  }
}

TEST_F(CudaAttention, MatchesCpuSmallBatches) {
  const std::vector<std::vector<int32_t>> batches = {{1, 5, 13}, {64, 3, 130}, {257}};
  const int64_t heads[][2] = {{4, 4}, {4, 2}};
  uint64_t seed = 100;
  for (const auto& lens : batches) {
    for (const auto& hh : heads) {
      for (int64_t D : {64, 24}) {
        seed += 10;
        check_case(ctx(), *session_, Case{lens, hh[0], hh[1], D}, seed);
      }
    }
  }
}

// D not a multiple of 8: rows are staged element by element; odd D also stores out one by one.
TEST_F(CudaAttention, HeadDimsOffTheVectorPath) {
  uint64_t seed = 300;
  for (int64_t D : {20, 33, 100}) {
    seed += 10;
    check_case(ctx(), *session_, Case{{65, 1, 130}, 4, 2, D}, seed);
  }
}

// The largest head dim (the most shared memory per block) and a zero-length sequence.
TEST_F(CudaAttention, HeadDim128AndEmptySequence) {
  check_case(ctx(), *session_, Case{{200, 0, 70}, 4, 2, 128}, 7);
}

// Null gradients are skipped; the others are still accumulated (d_v alone: only d_k/d_v blocks
// run; d_q alone: only d_q blocks).
TEST_F(CudaAttention, NullGradientsSkipped) {
  const Case c{{70, 5}, 4, 2, 32};
  const Reference r = make_reference(c, 1);
  const int64_t B = r.B, T = r.T, H = r.H, Hkv = r.Hkv, D = r.D;
  GpuInputs in(r);
  DeviceBuffer<float> g_dq(r.dq0), g_dv(r.dv0);
  attention_backward(ctx(), nullptr, nullptr, g_dv.data(), in.dout.data(), in.q.data(), in.k.data(),
                     in.v.data(), in.out_cpu.data(), in.lse_cpu.data(), in.cu.data(), B, T, H, Hkv,
                     D, r.scale);
  attention_backward(ctx(), g_dq.data(), nullptr, nullptr, in.dout.data(), in.q.data(), in.k.data(),
                     in.v.data(), in.out_cpu.data(), in.lse_cpu.data(), in.cu.data(), B, T, H, Hkv,
                     D, r.scale);
  sync();
  expect_close_terms("d_v", g_dv.download(), r.dv, r.dv0, r.dv_mag, kAttnGrad);
  expect_close_terms("d_q", g_dq.download(), r.dq, r.dq0, r.dq_mag, kAttnGrad);
}

// No atomics and a fixed summation order: a second run gives the same bits.
TEST_F(CudaAttention, Deterministic) {
  const Case c{{300, 17, 129}, 6, 2, 64};
  const Reference r = make_reference(c, 21);
  const int64_t B = r.B, T = r.T, H = r.H, Hkv = r.Hkv, D = r.D;
  GpuInputs in(r);
  std::vector<float> first[5];
  for (int run = 0; run < 2; ++run) {
    DeviceBuffer<bf16> g_out(T * H * D);
    DeviceBuffer<float> g_lse(T * H), g_dq(r.dq0), g_dk(r.dk0), g_dv(r.dv0);
    attention_forward(ctx(), g_out.data(), g_lse.data(), in.q.data(), in.k.data(), in.v.data(),
                      in.cu.data(), B, T, H, Hkv, D, r.scale);
    attention_backward(ctx(), g_dq.data(), g_dk.data(), g_dv.data(), in.dout.data(), in.q.data(),
                       in.k.data(), in.v.data(), g_out.data(), g_lse.data(), in.cu.data(), B, T, H,
                       Hkv, D, r.scale);
    sync();
    std::vector<float> now[5] = {download_bf16(g_out), g_lse.download(), g_dq.download(),
                                 g_dk.download(), g_dv.download()};
    for (int i = 0; i < 5; ++i) {
      if (run == 0) {
        first[i] = now[i];
      } else {
        EXPECT_TRUE(bitwise_equal(first[i], now[i])) << "output " << i << " changed between runs";
      }
    }
  }
}

TEST_F(CudaAttention, RejectsLargeHeadDim) {
  DeviceBuffer<int32_t> g_cu(std::vector<int32_t>{0, 1});
  EXPECT_ANY_THROW(attention_forward(ctx(), nullptr, nullptr, nullptr, nullptr, nullptr,
                                     g_cu.data(), 1, 1, 1, 1, 160, 1.0f));
}

}  // namespace
}  // namespace verl::ops::cuda::test
