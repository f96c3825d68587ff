// Memory-roofline benchmark of the element-wise CUDA kernels (swiglu, rope, rmsnorm, embedding and
// the glue of glue.h) at the Qwen2.5-0.5B training shape: T = 8 x 1024 tokens, C = 896, 14 heads
// and 2 kv heads of 64, F = 4864. One JSON line per kernel (or unfused sequence): the bytes it
// must move (every input read once, every output written once, an accumulated output both), the
// mean time over --iters runs, each timed with a cudaEvent pair after a 256 MiB memset that
// evicts the L2 (so the data comes from HBM, as in a training step), GB/s and the fraction of
// 4.25 TB/s, the H200's measured device-to-device copy bandwidth.
//
//   bench_glue_cuda [--tokens 8192] [--iters 50]
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_cuda.h"

#ifdef VERL_HAVE_CUDA
#include <cuda_runtime.h>

#include "ops/cuda/device.h"
#include "ops/cuda/glue.h"
#include "ops/cuda/ops_cuda.h"
#endif

namespace {

constexpr double kCopyGBps = 4250.0;  // H200 device-to-device copy, measured

[[noreturn]] void fail(const std::string& msg) {
  verl::bench::fail("glue_cuda", msg);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t T = 8 * 1024, iters = 50;
  verl::bench::parse_int_flags("glue_cuda", argc, argv, {{"--tokens", &T}, {"--iters", &iters}});
  if (T <= 0 || iters <= 0) fail("bad --tokens/--iters");

#ifndef VERL_HAVE_CUDA
  fail("built without CUDA (VERL_CUDA=OFF)");
#else
  using namespace verl::ops::cuda;
  try {
    if (verl::cuda_device_count() == 0) fail("no CUDA device");
    const int64_t C = 896, H = 14, Hkv = 2, D = 64, F = 4864, V = 151936;
    const int64_t qd = H * D, kvd = Hkv * D, W = qd + 2 * kvd;

    // Inputs: small pseudo-random values (a 32-bit LCG), uploaded once.
    uint32_t state = 12345;
    auto rnd = [&] {
      state = state * 1664525u + 1013904223u;
      return static_cast<float>(state >> 8) / 16777216.0f - 0.5f;  // [-0.5, 0.5)
    };
    auto bf16_buf = [&](int64_t n) {
      std::vector<uint16_t> h(n);
      for (auto& e : h) {
        const float f = rnd();
        uint32_t u;
        std::memcpy(&u, &f, 4);
        e = static_cast<uint16_t>(u >> 16);
      }
      DeviceBuffer<bf16> d(n);
      VERL_CUDA_CHECK(cudaMemcpy(d.data(), h.data(), n * 2, cudaMemcpyHostToDevice));
      return d;
    };
    auto f32_buf = [&](int64_t n) {
      std::vector<float> h(n);
      for (auto& e : h) e = rnd();
      return DeviceBuffer<float>(h);
    };

    CudaSession session;
    const CudaContext& ctx = session.ctx();
    cudaDeviceProp prop{};
    VERL_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));

    std::vector<int32_t> pos_h(T), ids_h(T);
    for (int64_t t = 0; t < T; ++t) {
      pos_h[t] = static_cast<int32_t>(t % 1024);
      ids_h[t] = static_cast<int32_t>((t * 7919) % V);
    }
    std::vector<float> inv_h(D / 2);
    for (int64_t i = 0; i < D / 2; ++i) inv_h[i] = std::pow(1e6f, -2.0f * i / D);
    DeviceBuffer<int32_t> pos(pos_h), ids(ids_h);
    DeviceBuffer<float> inv_freq(inv_h);

    auto x = bf16_buf(T * C), y = bf16_buf(T * C), xn = bf16_buf(T * C), dxn = bf16_buf(T * C);
    auto dx = bf16_buf(T * C), wn = bf16_buf(C), table = bf16_buf(V * C);
    auto qkv = bf16_buf(T * W), q = bf16_buf(T * qd), k = bf16_buf(T * kvd), v = bf16_buf(T * kvd);
    auto dqkv = bf16_buf(T * W), qh = bf16_buf(T * qd), dqh = bf16_buf(T * qd);
    auto gu = bf16_buf(T * 2 * F), act = bf16_buf(T * F), dact = bf16_buf(T * F);
    auto dgu = bf16_buf(T * 2 * F), wh = bf16_buf(D);
    auto dq = f32_buf(T * qd), dk = f32_buf(T * kvd), dv = f32_buf(T * kvd), dwn = f32_buf(C);
    auto dwh = f32_buf(D);
    DeviceBuffer<float> rstd(T), rstd_h(T * H);
    rmsnorm_forward(ctx, xn.data(), rstd.data(), x.data(), wn.data(), T, C, 1e-6f);
    rmsnorm_forward(ctx, qh.data(), rstd_h.data(), q.data(), wh.data(), T * H, D, 1e-6f);
    DeviceBuffer<uint8_t> scrub(size_t{256} << 20);  // larger than the 50 MiB L2

    std::vector<cudaEvent_t> ev(2 * iters);
    for (auto& e : ev) VERL_CUDA_CHECK(cudaEventCreate(&e));

    auto run = [&](const std::string& kernel, double bytes, const std::function<void()>& f) {
      for (int i = 0; i < 3; ++i) f();  // warm up
      for (int i = 0; i < iters; ++i) {
        VERL_CUDA_CHECK(cudaMemsetAsync(scrub.data(), i & 0xff, scrub.bytes(), ctx.stream));
        VERL_CUDA_CHECK(cudaEventRecord(ev[2 * i], ctx.stream));
        f();
        VERL_CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], ctx.stream));
      }
      session.synchronize();
      double ms = 0;
      for (int i = 0; i < iters; ++i) {
        float m = 0;
        VERL_CUDA_CHECK(cudaEventElapsedTime(&m, ev[2 * i], ev[2 * i + 1]));
        ms += m;
      }
      const double secs = ms / 1e3 / iters;
      const double gbps = bytes / secs / 1e9;
      nlohmann::json j = {{"bench", "glue_cuda"},
                          {"kernel", kernel},
                          {"device", prop.name},
                          {"tokens", T},
                          {"bytes", bytes},
                          {"us", secs * 1e6},
                          {"gbps", gbps},
                          {"roofline_gbps", kCopyGBps},
                          {"roofline_frac", gbps / kCopyGBps}};
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    };

    const double b2 = 2, b4 = 4;  // bytes per bf16 / fp32 element
    const double TC = static_cast<double>(T * C), TW = static_cast<double>(T * W);
    const double TQ = static_cast<double>(T * qd), TK = static_cast<double>(T * kvd);
    const double TF = static_cast<double>(T * F);

    // ---- forward ----
    run("rmsnorm_forward C=896", 2 * TC * b2,
        [&] { rmsnorm_forward(ctx, xn.data(), rstd.data(), x.data(), wn.data(), T, C, 1e-6f); });
    run("split_qkv", 2 * TW * b2,
        [&] { split_qkv(ctx, q.data(), k.data(), v.data(), qkv.data(), T, qd, kvd); });
    run("rope_forward q", 2 * TQ * b2,
        [&] { rope_forward(ctx, q.data(), pos.data(), inv_freq.data(), T, H, D); });
    run("split_qkv_rope", 2 * TW * b2, [&] {
      split_qkv_rope(ctx, q.data(), k.data(), v.data(), qkv.data(), pos.data(), inv_freq.data(), T,
                     H, Hkv, D);
    });
    run("split_qkv + rope_forward x2 (unfused)", (2 * TW + 2 * TQ + 2 * TK) * b2, [&] {
      split_qkv(ctx, q.data(), k.data(), v.data(), qkv.data(), T, qd, kvd);
      rope_forward(ctx, q.data(), pos.data(), inv_freq.data(), T, H, D);
      rope_forward(ctx, k.data(), pos.data(), inv_freq.data(), T, Hkv, D);
    });
    run("rmsnorm_forward qk-norm C=64", 2 * TQ * b2, [&] {
      rmsnorm_forward(ctx, qh.data(), rstd_h.data(), q.data(), wh.data(), T * H, D, 1e-6f);
    });
    run("add_inplace", 3 * TC * b2, [&] { add_inplace(ctx, y.data(), x.data(), T * C); });
    run("swiglu_forward", 3 * TF * b2, [&] { swiglu_forward(ctx, act.data(), gu.data(), T, F); });
    run("embedding_forward", 2 * TC * b2,
        [&] { embedding_forward(ctx, x.data(), ids.data(), table.data(), T, C, V); });

    // ---- backward ----
    run("swiglu_backward accumulate", (2 * TF + TF + 2 * 2 * TF) * b2,
        [&] { swiglu_backward(ctx, dgu.data(), dact.data(), gu.data(), T, F); });
    run("swiglu_backward overwrite", (2 * TF + TF + 2 * TF) * b2,
        [&] { swiglu_backward(ctx, dgu.data(), dact.data(), gu.data(), T, F, false); });
    run("rmsnorm_backward d_x accumulate + d_w C=896", 4 * TC * b2, [&] {
      rmsnorm_backward(ctx, dx.data(), dwn.data(), dxn.data(), x.data(), wn.data(), rstd.data(), T,
                       C);
    });
    run("rmsnorm_backward d_x overwrite + d_w C=896", 3 * TC * b2, [&] {
      rmsnorm_backward(ctx, dx.data(), dwn.data(), dxn.data(), x.data(), wn.data(), rstd.data(), T,
                       C, false);
    });
    run("rmsnorm_backward qk-norm d_x overwrite + d_w C=64", 3 * TQ * b2, [&] {
      rmsnorm_backward(ctx, dqh.data(), dwh.data(), qh.data(), q.data(), wh.data(), rstd_h.data(),
                       T * H, D, false);
    });
    run("rope_backward d_q fp32", 2 * TQ * b4,
        [&] { rope_backward(ctx, dq.data(), pos.data(), inv_freq.data(), T, H, D); });
    run("pack_qkv from fp32", TW * (b4 + b2),
        [&] { pack_qkv(ctx, dqkv.data(), dq.data(), dk.data(), dv.data(), T, qd, kvd); });
    run("rope_backward_pack_qkv", TW * (b4 + b2), [&] {
      rope_backward_pack_qkv(ctx, dqkv.data(), dq.data(), dk.data(), dv.data(), pos.data(),
                             inv_freq.data(), T, H, Hkv, D);
    });
    run("rope_backward x2 + pack_qkv (unfused)", (2 * TQ + 2 * TK) * b4 + TW * (b4 + b2), [&] {
      rope_backward(ctx, dq.data(), pos.data(), inv_freq.data(), T, H, D);
      rope_backward(ctx, dk.data(), pos.data(), inv_freq.data(), T, Hkv, D);
      pack_qkv(ctx, dqkv.data(), dq.data(), dk.data(), dv.data(), T, qd, kvd);
    });
    run("convert fp32->bf16", TQ * (b4 + b2), [&] { convert(ctx, qh.data(), dq.data(), T * qd); });

    for (auto& e : ev) cudaEventDestroy(e);
  } catch (const std::exception& e) {
    fail(e.what());
  }
  return 0;
#endif
}
