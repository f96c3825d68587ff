#include "ops/cuda/section_timer.h"

#include <cstring>

#include "ops/cuda/cuda_check.h"

namespace verl::ops::cuda {

SectionTimer::~SectionTimer() {
  for (cudaEvent_t e : pool_) cudaEventDestroy(e);  // no throw from a destructor
}

void SectionTimer::mark(cudaStream_t stream, const char* name) {
  if (used_ == pool_.size()) {
    cudaEvent_t e = nullptr;
    VERL_CUDA_CHECK(cudaEventCreate(&e));
    pool_.push_back(e);
    names_.push_back(nullptr);
  }
  names_[used_] = name;
  VERL_CUDA_CHECK(cudaEventRecord(pool_[used_], stream));
  ++used_;
}

std::vector<std::pair<std::string, double>> SectionTimer::take() {
  std::vector<std::pair<std::string, double>> out;
  if (used_ == 0) return out;
  VERL_CUDA_CHECK(cudaEventSynchronize(pool_[used_ - 1]));
  for (size_t i = 0; i + 1 < used_; ++i) {
    if (names_[i] == nullptr) continue;
    float ms = 0;
    VERL_CUDA_CHECK(cudaEventElapsedTime(&ms, pool_[i], pool_[i + 1]));
    auto it = out.begin();
    while (it != out.end() && it->first != names_[i]) ++it;
    if (it == out.end()) {
      out.emplace_back(names_[i], 0.0);
      it = out.end() - 1;
    }
    it->second += ms;
  }
  used_ = 0;
  return out;
}

}  // namespace verl::ops::cuda
