// What `verl bench rollout` reports about the GPU runner's steps, accumulated from the runner's
// StepObserver hook (rollout/cuda/model_runner.h) so the runner's hot path carries no benchmark
// bookkeeping. Host times cover decode steps only (each step ends in a sync): prep = entry until
// the step's last GPU work is enqueued, sync_wait = in cudaStreamSynchronize, post = after it
// until step() returns, between = from the previous step's return to this one's entry (the
// engine's scheduler and postprocess). The GPU idles about between + post + the part of prep
// before the first upload.
#pragma once

#ifdef VERL_HAVE_CUDA

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "rollout/cuda/model_runner.h"

namespace verl::cli {

class RunnerStats final : public rollout::cuda::StepObserver {
 public:
  int64_t decode_steps = 0, decode_context_tokens = 0;
  double decode_seconds = 0, host_prep_seconds = 0, sync_wait_seconds = 0, host_post_seconds = 0;
  double between_steps_seconds = 0;
  int64_t between_steps = 0;  // decode steps with a previous step in the same generate()
  // GPU ms per section (profiling only), summed over the decode steps and, apart, the others.
  int64_t profiled_decode_steps = 0, profiled_other_steps = 0;
  std::vector<std::pair<std::string, double>> decode_profile_ms, other_profile_ms;

  void on_begin_generate() override { have_last_ = false; }  // no gap before a first step

  void on_step(const rollout::cuda::StepRecord& r) override {
    auto sec = [](auto d) { return std::chrono::duration<double>(d).count(); };
    if (r.sections != nullptr) {
      auto& acc = r.decode ? decode_profile_ms : other_profile_ms;
      ++(r.decode ? profiled_decode_steps : profiled_other_steps);
      for (const auto& [name, ms] : *r.sections) {
        auto it =
            std::find_if(acc.begin(), acc.end(), [&](const auto& e) { return e.first == name; });
        if (it == acc.end()) {
          acc.emplace_back(name, ms);
        } else {
          it->second += ms;
        }
      }
    }
    if (r.decode) {
      ++decode_steps;
      decode_context_tokens += r.context_tokens;
      decode_seconds += sec(r.done - r.entry);
      host_prep_seconds += sec(r.enqueued - r.entry);
      sync_wait_seconds += sec(r.synced - r.enqueued);
      host_post_seconds += sec(r.done - r.synced);
      if (have_last_) {
        between_steps_seconds += sec(r.entry - last_end_);
        ++between_steps;
      }
    }
    last_end_ = r.done;
    have_last_ = true;
  }

 private:
  std::chrono::steady_clock::time_point last_end_{};
  bool have_last_ = false;
};

}  // namespace verl::cli

#endif  // VERL_HAVE_CUDA
