// CUDA attention benchmark (src/ops/cuda/attention.h): causal GQA forward and backward on packed
// sequences of equal length with random bf16 inputs, for the attention shapes of Qwen2.5-0.5B
// (H=14, Hkv=2, D=64) and Qwen2.5-1.5B (H=12, Hkv=2, D=128). One JSON line per shape:
//   fwd_flops = B * 2 * S^2 * H * D   (QK^T and PV over the causal half: 2 matmuls x 2 S^2/2 H D)
//   bwd_flops = 2.5 * fwd_flops       (dQ, dK, dV, dP and the recomputed S; the kernels actually
//                                      run 7/5 of that, since d_q recomputes S and dP)
// time per call from cudaEvents over --iters calls after --warmup calls (the backward includes the
// D_i = d_out . out pass), tflops = flops / time, mfu = tflops / 800 (the H200 dense bf16 peak used
// across this project).
//
//   bench_attention_cuda --batch 8 --seq 1024 --iters 20 --warmup 3
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_cuda.h"

#ifdef VERL_HAVE_CUDA
#include "ops/cuda/attention.h"
#endif

namespace {

[[noreturn]] void fail(const std::string& msg) {
  verl::bench::fail("attention_cuda", msg);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 8, seq = 1024, iters = 20, warmup = 3;
  verl::bench::parse_int_flags(
      "attention_cuda", argc, argv,
      {{"--batch", &batch}, {"--seq", &seq}, {"--iters", &iters}, {"--warmup", &warmup}});
  if (batch <= 0 || seq <= 0 || iters <= 0 || warmup < 0)
    fail("bad --batch/--seq/--iters/--warmup");

#ifndef VERL_HAVE_CUDA
  fail("built without CUDA (VERL_CUDA=OFF)");
  return 1;
#else
  using namespace verl;
  using namespace verl::ops::cuda;
  try {
    if (verl::cuda_device_count() == 0) fail("no CUDA device");
    CudaSession session;
    const CudaContext& ctx = session.ctx();
    const int64_t T = batch * seq;
    std::vector<int32_t> cu(batch + 1);
    for (int64_t b = 0; b <= batch; ++b) cu[b] = static_cast<int32_t>(b * seq);
    DeviceBuffer<int32_t> g_cu(cu);
    bench::EventTimer timer;

    for (const bench::AttentionShape& s : bench::kAttentionShapes) {
      const int64_t H = s.H, Hkv = s.Hkv, D = s.D;
      Rng rng(42);
      auto random_bf16 = [&](int64_t n) { return bench::random_bf16(rng, n); };
      DeviceBuffer<bf16> q = random_bf16(T * H * D), k = random_bf16(T * Hkv * D);
      DeviceBuffer<bf16> v = random_bf16(T * Hkv * D), d_out = random_bf16(T * H * D);
      DeviceBuffer<bf16> out(T * H * D);
      DeviceBuffer<float> lse(T * H), d_q(T * H * D), d_k(T * Hkv * D), d_v(T * Hkv * D);
      d_q.zero(ctx.stream);
      d_k.zero(ctx.stream);
      d_v.zero(ctx.stream);
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));

      auto fwd = [&] {
        attention_forward(ctx, out.data(), lse.data(), q.data(), k.data(), v.data(), g_cu.data(),
                          batch, T, H, Hkv, D, scale);
      };
      auto bwd = [&] {
        attention_backward(ctx, d_q.data(), d_k.data(), d_v.data(), d_out.data(), q.data(),
                           k.data(), v.data(), out.data(), lse.data(), g_cu.data(), batch, T, H,
                           Hkv, D, scale);
      };
      auto time_ms = [&](auto&& f) { return timer.ms_per_call(ctx.stream, warmup, iters, f); };
      const double fwd_ms = time_ms(fwd);  // also leaves out and lse for the backward
      const double bwd_ms = time_ms(bwd);
      session.synchronize();

      const double S = static_cast<double>(seq);
      const double fwd_flops = static_cast<double>(batch) * 2.0 * S * S * H * D;
      const double bwd_flops = 2.5 * fwd_flops;
      const double fwd_tflops = fwd_flops / (fwd_ms * 1e-3) / 1e12;
      const double bwd_tflops = bwd_flops / (bwd_ms * 1e-3) / 1e12;
      nlohmann::json j = {{"bench", "attention_cuda"},
                          {"impl", "verl.cpp mma.sync"},
                          {"shape", s.name},
                          {"batch", batch},
                          {"seq", seq},
                          {"H", H},
                          {"Hkv", Hkv},
                          {"D", D},
                          {"causal", true},
                          {"iters", iters},
                          {"warmup", warmup},
                          {"fwd_ms", fwd_ms},
                          {"bwd_ms", bwd_ms},
                          {"fwd_tflops", fwd_tflops},
                          {"bwd_tflops", bwd_tflops},
                          {"fwd_flops", fwd_flops},
                          {"bwd_flops", bwd_flops},
                          {"flops_formula", "fwd B*2*S^2*H*D (causal), bwd 2.5x fwd"},
                          {"fwd_mfu", fwd_tflops / 800.0},
                          {"bwd_mfu", bwd_tflops / 800.0},
                          {"mfu_peak_tflops", 800.0}};
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    fail(e.what());
  }
  return 0;
#endif
}
