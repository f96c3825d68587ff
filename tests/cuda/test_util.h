// Helpers shared by the CUDA op tests: a fixture that skips without a device and owns a
// CudaSession, seeded random inputs, bf16 rounding on the host, bf16 upload/download, and the
// tolerance comparison.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "ops/cuda/ops_cuda.h"
#include "tolerances.h"

namespace verl::ops::cuda::test {

// Skips the test (never fails it) on a machine without a CUDA driver or device, such as CI.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) {
      GTEST_SKIP() << "no CUDA device: the CUDA op tests run on a GPU machine (docs/cuda.md)";
    }
    session_ = std::make_unique<CudaSession>();
  }
  const CudaContext& ctx() const { return session_->ctx(); }
  void sync() const { session_->synchronize(); }

  std::unique_ptr<CudaSession> session_;
};

inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> x(n);
  for (auto& e : x) e = scale * rng.normal();
  return x;
}

// Rounds every element to bf16 and back, so the CPU reference sees the GPU's inputs exactly.
inline std::vector<float> bf16_rounded(std::vector<float> x) {
  for (auto& e : x) e = bf16_to_f32(f32_to_bf16(e));
  return x;
}

inline DeviceBuffer<bf16> upload_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = f32_to_bf16(x[i]);
  DeviceBuffer<bf16> d(x.size());
  copy_to_device(d.data(), h.data(), h.size() * 2);
  return d;
}

inline std::vector<float> download_bf16(const DeviceBuffer<bf16>& d) {
  std::vector<uint16_t> h(d.size());
  copy_to_host(h.data(), d.data(), h.size() * 2);
  std::vector<float> x(h.size());
  for (size_t i = 0; i < h.size(); ++i) x[i] = bf16_to_f32(h[i]);
  return x;
}

// Expects |got[i] - want[i]| <= atol + rtol |want[i]| for all i; reports the first few misses.
inline void expect_close(const std::string& what, const std::vector<float>& got,
                         const std::vector<float>& want, Tol tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    if (!(std::abs(g - w) <= tol.atol + tol.rtol * std::abs(w))) {
      if (++misses <= 5) ADD_FAILURE() << what << "[" << i << "]: got " << g << " want " << w;
    }
  }
  EXPECT_EQ(misses, 0) << what << ": " << misses << " of " << got.size() << " out of tolerance";
}

// For accumulating outputs: |got[i] - want[i]| <= atol + rtol (|init[i]| + |want[i] - init[i]|).
inline void expect_close_accumulated(const std::string& what, const std::vector<float>& got,
                                     const std::vector<float>& want, const std::vector<float>& init,
                                     Tol tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i], scale = std::abs(double(init[i])) + std::abs(w - init[i]);
    if (!(std::abs(g - w) <= tol.atol + tol.rtol * scale)) {
      if (++misses <= 5) ADD_FAILURE() << what << "[" << i << "]: got " << g << " want " << w;
    }
  }
  EXPECT_EQ(misses, 0) << what << ": " << misses << " of " << got.size() << " out of tolerance";
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace verl::ops::cuda::test
