// Decode attention over the paged KV cache, the two kernels a rollout decode step can take:
//   paged    paged_attention (paged_attention.h): the rollout's own decode kernel, split along the
//            context when the batch is small (decode_partitions_for);
//   training attention_forward_paged (attention.h) on single-token items: the training kernel's
//            arithmetic, bitwise equal to the trainer's forward.
// B items of one query token at position context - 1 (contexts spread over +-spread around
// --context), block tables pointing at shuffled blocks, random bf16 inputs. Successive calls take
// successive layers' caches, --layers of them (default: enough for 256 MB of K and V), so a call
// finds its cache in HBM as a model's decode step does, not in the 50 MB L2 the previous call
// filled. One JSON line per (shape, kernel): microseconds per call (cudaEvents over --iters calls
// after --warmup), the bytes of K and V a call must read and that over the time against the
// 4.8 TB/s HBM peak of the H200.
//
//   bench_decode_attention_cuda --batch 256 --context 384 --spread 0 --iters 200
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_cuda.h"

#ifdef VERL_HAVE_CUDA
#include "ops/cuda/attention.h"
#include "ops/cuda/paged_attention.h"
#endif

namespace {

[[noreturn]] void fail(const std::string& msg) {
  verl::bench::fail("decode_attention_cuda", msg);
}

constexpr double kHbmBytesPerS = 4.8e12;  // H200 HBM3e peak

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 256, context = 384, spread = 0, block_size = 16, layers = 0, iters = 200,
          warmup = 10;
  verl::bench::parse_int_flags("decode_attention_cuda", argc, argv,
                               {{"--batch", &batch},
                                {"--context", &context},
                                {"--spread", &spread},
                                {"--block-size", &block_size},
                                {"--layers", &layers},
                                {"--iters", &iters},
                                {"--warmup", &warmup}});
  if (batch <= 0 || context <= 0 || spread < 0 || spread >= context || block_size <= 0 ||
      layers < 0 || iters <= 0 || warmup < 0)
    fail("bad --batch/--context/--spread/--block-size/--layers/--iters/--warmup");

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

    // Contexts, positions and shuffled block tables (the layout a long rollout leaves).
    std::mt19937_64 gen(7);
    std::vector<int32_t> ctxs(batch), positions(batch), cu(batch + 1);
    int64_t max_context = 0, keys = 0;
    for (int64_t b = 0; b < batch; ++b) {
      ctxs[b] =
          static_cast<int32_t>(context - spread + static_cast<int64_t>(gen() % (2 * spread + 1)));
      positions[b] = ctxs[b] - 1;
      cu[b] = static_cast<int32_t>(b);
      max_context = std::max<int64_t>(max_context, ctxs[b]);
      keys += ctxs[b];
    }
    cu[batch] = static_cast<int32_t>(batch);
    const int64_t W = (max_context + block_size - 1) / block_size;
    std::vector<int32_t> blocks(batch * W);
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), gen);
    const int64_t slots = batch * W * block_size;
    DeviceBuffer<int32_t> g_tables(blocks), g_cu(cu), g_pos(positions);
    bench::EventTimer timer;

    for (const bench::AttentionShape& s : bench::kAttentionShapes) {
      const int64_t H = s.H, Hkv = s.Hkv, D = s.D, T = batch;
      Rng rng(42);
      auto random_bf16 = [&](int64_t n) { return bench::random_bf16(rng, n); };
      const int64_t layer_bytes = slots * Hkv * D * 2 * 2;
      const int64_t L = layers > 0 ? layers : std::max<int64_t>(1, (256ll << 20) / layer_bytes + 1);
      DeviceBuffer<bf16> q = random_bf16(T * H * D), out(T * H * D);
      // One allocation per cache array: layer l's K at kc + l * slots * Hkv * D.
      DeviceBuffer<bf16> kc = random_bf16(L * slots * Hkv * D),
                         vc = random_bf16(L * slots * Hkv * D);
      int64_t call = 0;
      auto layer_k = [&] { return kc.data() + (call % L) * slots * Hkv * D; };
      auto layer_v = [&] { return vc.data() + (call % L) * slots * Hkv * D; };
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));
      PagedAttentionPlan plan;
      plan.max_context = max_context;
      plan.prefill = false;
      plan.max_partitions =
          decode_partitions_for(batch, Hkv, max_context, plan.partition, verl::cuda_sm_count());
      const size_t ws_bytes = paged_attention_workspace_bytes(batch, H, D, max_context,
                                                              plan.partition, plan.max_partitions);
      DeviceBuffer<unsigned char> ws(std::max<size_t>(ws_bytes, 1));

      auto time_us = [&](auto&& f) {
        return 1e3 * timer.ms_per_call(ctx.stream, warmup, iters, f);
      };
      const double kv_bytes = static_cast<double>(keys) * Hkv * D * 2 * 2;
      auto report = [&](const char* kernel, double us) {
        const double gbps = kv_bytes / (us * 1e-6) / 1e9;
        nlohmann::json j = {{"bench", "decode_attention_cuda"},
                            {"kernel", kernel},
                            {"shape", s.name},
                            {"batch", batch},
                            {"context", context},
                            {"spread", spread},
                            {"block_size", block_size},
                            {"layers", L},
                            {"us_per_call", us},
                            {"kv_bytes", kv_bytes},
                            {"gb_per_s", gbps},
                            {"hbm_fraction", gbps * 1e9 / kHbmBytesPerS}};
        std::printf("%s\n", j.dump().c_str());
      };
      report("paged", time_us([&] {
               paged_attention(ctx, out.data(), q.data(), layer_k(), layer_v(), g_tables.data(), W,
                               g_cu.data(), g_pos.data(), batch, T, H, Hkv, D, block_size, scale,
                               plan, ws.data(), ws_bytes);
               ++call;
             }));
      report("training", time_us([&] {
               attention_forward_paged(ctx, out.data(), q.data(), layer_k(), layer_v(),
                                       g_tables.data(), W, block_size, g_cu.data(), g_pos.data(),
                                       batch, T, H, Hkv, D, scale, true, false);
               ++call;
             }));
      session.synchronize();
    }
  } catch (const std::exception& e) {
    fail(e.what());
  }
  return 0;
#endif
}
