// GPU time per named section of a stream's work, from CUDA events: mark(s, "a") ... mark(s, "b")
// ... stop(s) attributes the time between consecutive marks to the earlier mark's name. take()
// waits for the last event and returns the totals per name (in first-seen order) since the last
// take(). Events are pooled, so a steady loop creates none after its first iteration.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

namespace verl::ops::cuda {

class SectionTimer {
 public:
  SectionTimer() = default;
  ~SectionTimer();
  SectionTimer(const SectionTimer&) = delete;
  SectionTimer& operator=(const SectionTimer&) = delete;

  void mark(cudaStream_t stream, const char* name);
  void stop(cudaStream_t stream) { mark(stream, nullptr); }
  std::vector<std::pair<std::string, double>> take();

 private:
  std::vector<cudaEvent_t> pool_;
  std::vector<const char*> names_;  // names_[i] starts at pool_[i]; nullptr = a stop
  size_t used_ = 0;
};

}  // namespace verl::ops::cuda
