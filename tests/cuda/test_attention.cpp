// Causal GQA attention on the GPU (src/ops/cuda/attention.cu) against the CPU reference op (the
// oracle), both run on the same bf16-rounded inputs: packed batches of odd lengths (a tile
// boundary at 64 crossed, a lone token, one long sequence), H = Hkv and two GQA groupings,
// D = 64 and D = 24.
#include "ops/cuda/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/cpu/ops.h"
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

using CudaAttention = CudaTest;

// Runs one case on the GPU and on the CPU and compares out, lse, d_q, d_k and d_v.
void check_case(const CudaContext& ctx, const CudaSession& session, const Case& c, uint64_t seed);

TEST_F(CudaAttention, MatchesCpu) {
  const std::vector<std::vector<int32_t>> batches = {{1, 5, 13}, {64, 3, 130}, {257}};
  const int64_t heads[][2] = {{4, 4}, {4, 2}, {8, 1}};
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

// The largest head dim (the most shared memory per block) and a zero-length sequence.
TEST_F(CudaAttention, HeadDim128AndEmptySequence) {
  check_case(ctx(), *session_, Case{{200, 0, 70}, 4, 2, 128}, 7);
}

void check_case(const CudaContext& ctx, const CudaSession& session, const Case& c, uint64_t seed) {
  const int64_t D = c.D;
  SCOPED_TRACE(name(c));
  const int64_t B = static_cast<int64_t>(c.lens.size());
  std::vector<int32_t> cu(B + 1, 0);
  for (int64_t b = 0; b < B; ++b) cu[b + 1] = cu[b] + c.lens[b];
  const int64_t T = cu[B], H = c.H, Hkv = c.Hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  const auto q = bf16_rounded(randn(T * H * D, seed + 1));
  const auto k = bf16_rounded(randn(T * Hkv * D, seed + 2));
  const auto v = bf16_rounded(randn(T * Hkv * D, seed + 3));
  const auto dout = bf16_rounded(randn(T * H * D, seed + 4));
  const auto dq0 = randn(T * H * D, seed + 5);  // the backward accumulates into these
  const auto dk0 = randn(T * Hkv * D, seed + 6);
  const auto dv0 = randn(T * Hkv * D, seed + 7);

  // CPU forward; the backward on both sides reads the bf16 rounding of the CPU's out and
  // the CPU's lse, so both differentiate at the same point.
  std::vector<float> out(T * H * D), lse(T * H);
  cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), cu.data(), B,
                         T, H, Hkv, D, scale);
  const auto out_b = bf16_rounded(out);
  std::vector<float> dq = dq0, dk = dk0, dv = dv0;
  cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                          v.data(), out_b.data(), lse.data(), cu.data(), B, T, H, Hkv, D,
                          scale);

  auto g_q = upload_bf16(q), g_k = upload_bf16(k), g_v = upload_bf16(v);
  auto g_dout = upload_bf16(dout), g_out_cpu = upload_bf16(out_b);
  DeviceBuffer<int32_t> g_cu(cu);
  DeviceBuffer<bf16> g_out(T * H * D);
  DeviceBuffer<float> g_lse(T * H), g_lse_cpu(lse), g_dq(dq0), g_dk(dk0), g_dv(dv0);
  attention_forward(ctx, g_out.data(), g_lse.data(), g_q.data(), g_k.data(), g_v.data(),
                    g_cu.data(), B, T, H, Hkv, D, scale);
  attention_backward(ctx, g_dq.data(), g_dk.data(), g_dv.data(), g_dout.data(),
                     g_q.data(), g_k.data(), g_v.data(), g_out_cpu.data(), g_lse_cpu.data(),
                     g_cu.data(), B, T, H, Hkv, D, scale);
  session.synchronize();
  expect_close("out", download_bf16(g_out), out, kAttnOut);
  expect_close("lse", g_lse.download(), lse, kF32RowSum);
  expect_close_accumulated("d_q", g_dq.download(), dq, dq0, kAttnGrad);
  expect_close_accumulated("d_k", g_dk.download(), dk, dk0, kAttnGrad);
  expect_close_accumulated("d_v", g_dv.download(), dv, dv0, kAttnGrad);
}

// Null gradients are skipped; the others are still accumulated.
TEST_F(CudaAttention, NullGradientsSkipped) {
  const std::vector<int32_t> cu = {0, 70, 75};
  const int64_t B = 2, T = 75, H = 4, Hkv = 2, D = 32;
  const float scale = 0.2f;
  const auto q = bf16_rounded(randn(T * H * D, 1)), k = bf16_rounded(randn(T * Hkv * D, 2));
  const auto v = bf16_rounded(randn(T * Hkv * D, 3)), dout = bf16_rounded(randn(T * H * D, 4));
  std::vector<float> out(T * H * D), lse(T * H), dv(T * Hkv * D, 0.0f);
  cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), cu.data(), B, T, H,
                         Hkv, D, scale);
  const auto out_b = bf16_rounded(out);
  cpu::attention_backward(nullptr, nullptr, dv.data(), dout.data(), q.data(), k.data(), v.data(),
                          out_b.data(), lse.data(), cu.data(), B, T, H, Hkv, D, scale);

  auto g_q = upload_bf16(q), g_k = upload_bf16(k), g_v = upload_bf16(v);
  auto g_dout = upload_bf16(dout), g_out = upload_bf16(out_b);
  DeviceBuffer<int32_t> g_cu(cu);
  DeviceBuffer<float> g_lse(lse), g_dv(std::vector<float>(T * Hkv * D, 0.0f));
  attention_backward(ctx(), nullptr, nullptr, g_dv.data(), g_dout.data(), g_q.data(), g_k.data(),
                     g_v.data(), g_out.data(), g_lse.data(), g_cu.data(), B, T, H, Hkv, D, scale);
  sync();
  expect_close("d_v", g_dv.download(), dv, kAttnGrad);
}

TEST_F(CudaAttention, RejectsLargeHeadDim) {
  DeviceBuffer<int32_t> g_cu(std::vector<int32_t>{0, 1});
  EXPECT_ANY_THROW(attention_forward(ctx(), nullptr, nullptr, nullptr, nullptr, nullptr,
                                     g_cu.data(), 1, 1, 1, 1, 160, 1.0f));
}

}  // namespace
}  // namespace verl::ops::cuda::test
