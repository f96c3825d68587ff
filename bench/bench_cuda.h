// Shared pieces of the CUDA op benchmarks (bench_attention_cuda, bench_decode_attention_cuda):
// the error line, the attention shapes of the model sizes we report, random bf16 device buffers and
// cudaEvent timing.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>

#ifdef VERL_HAVE_CUDA
#include <cuda_runtime.h>

#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "ops/cuda/device.h"
#include "ops/cuda/ops_cuda.h"
#endif

namespace verl::bench {

// Prints {"bench": bench, "error": msg} as the benchmark's one line and exits 1.
[[noreturn]] inline void fail(const char* bench, const std::string& msg) {
  nlohmann::json j = {{"bench", bench}, {"error", msg}};
  std::printf("%s\n", j.dump().c_str());
  std::exit(1);
}

// `--name value` pairs into integers: every argument must be one of `flags` followed by its
// value, else fail() names it (and lists the flags).
struct IntFlag {
  const char* name;
  int64_t* value;
};
inline void parse_int_flags(const char* bench, int argc, char** argv,
                            std::initializer_list<IntFlag> flags) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const IntFlag* hit = nullptr;
    for (const IntFlag& f : flags) {
      if (a == f.name) hit = &f;
    }
    if (hit == nullptr) {
      std::string known;
      for (const IntFlag& f : flags) known += std::string(known.empty() ? "" : " ") + f.name;
      fail(bench, "unknown option " + a + " (" + known + ")");
    }
    if (i + 1 >= argc) fail(bench, "missing value for " + a);
    *hit->value = std::atoll(argv[++i]);
  }
}

// Attention heads of the model sizes the benchmarks report.
struct AttentionShape {
  const char* name;
  int64_t H, Hkv, D;
};
inline constexpr AttentionShape kAttentionShapes[] = {{"qwen2.5-0.5b", 14, 2, 64},
                                                      {"qwen2.5-1.5b", 12, 2, 128}};

#ifdef VERL_HAVE_CUDA
// n standard-normal values rounded to bf16, on the device.
inline ops::cuda::DeviceBuffer<ops::cuda::bf16> random_bf16(Rng& rng, int64_t n) {
  std::vector<uint16_t> h(static_cast<size_t>(n));
  for (auto& x : h) x = f32_to_bf16(rng.normal());
  ops::cuda::DeviceBuffer<ops::cuda::bf16> d(static_cast<size_t>(n));
  VERL_CUDA_CHECK(cudaMemcpy(d.data(), h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  return d;
}

// Milliseconds per call of f: `warmup` untimed calls, then `iters` calls between two events on
// `stream`.
class EventTimer {
 public:
  EventTimer() {
    VERL_CUDA_CHECK(cudaEventCreate(&e0_));
    VERL_CUDA_CHECK(cudaEventCreate(&e1_));
  }
  ~EventTimer() {
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  template <typename F>
  double ms_per_call(cudaStream_t stream, int64_t warmup, int64_t iters, F&& f) {
    for (int64_t i = 0; i < warmup; ++i) f();
    VERL_CUDA_CHECK(cudaEventRecord(e0_, stream));
    for (int64_t i = 0; i < iters; ++i) f();
    VERL_CUDA_CHECK(cudaEventRecord(e1_, stream));
    VERL_CUDA_CHECK(cudaEventSynchronize(e1_));
    float ms = 0;
    VERL_CUDA_CHECK(cudaEventElapsedTime(&ms, e0_, e1_));
    return static_cast<double>(ms) / static_cast<double>(iters);
  }

 private:
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
};
#endif

}  // namespace verl::bench
