// The CUDA runtime layer: error macros (these run without a GPU too), device discovery, device
// buffers, the device arena and the session.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device.h"
#include "test_util.h"

namespace verl::ops::cuda::test {
namespace {

TEST(CudaCheck, CudaErrorNamesStatementAndError) {
  try {
    VERL_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL() << "VERL_CUDA_CHECK did not throw";
  } catch (const verl::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cudaErrorInvalidValue"), std::string::npos) << msg;
    EXPECT_NE(msg.find("`cudaErrorInvalidValue`"), std::string::npos) << msg;  // the statement
    EXPECT_NE(msg.find("test_device.cpp"), std::string::npos) << msg;
  }
}

TEST(CudaCheck, CublasErrorNamesStatementAndStatus) {
  try {
    VERL_CUBLAS_CHECK(CUBLAS_STATUS_NOT_SUPPORTED);
    FAIL() << "VERL_CUBLAS_CHECK did not throw";
  } catch (const verl::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cuBLASLt call `CUBLAS_STATUS_NOT_SUPPORTED`"), std::string::npos) << msg;
  }
}

TEST(CudaCheck, SuccessDoesNotThrow) {
  EXPECT_NO_THROW(VERL_CUDA_CHECK(cudaSuccess));
  EXPECT_NO_THROW(VERL_CUBLAS_CHECK(CUBLAS_STATUS_SUCCESS));
}

TEST(CudaDevice, CountNeverThrows) {
  int n = -1;
  EXPECT_NO_THROW(n = cuda_device_count());
  EXPECT_GE(n, 0);
}

using CudaRuntime = CudaTest;

TEST_F(CudaRuntime, BufferRoundTripAndMove) {
  std::vector<float> host = randn(1001, 1);
  DeviceBuffer<float> a(host);
  EXPECT_EQ(a.size(), 1001u);
  DeviceBuffer<float> b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(b.download(), host);
  b.zero(ctx().stream);
  sync();
  EXPECT_EQ(b.download(), std::vector<float>(1001, 0.0f));
  EXPECT_THROW(b.upload(std::vector<float>(3)), verl::Error);
}

TEST_F(CudaRuntime, ArenaBumpsAlignsResetsAndReportsFull) {
  DeviceArena arena("train", 4096);
  auto* p = arena.alloc_n<float>(3);
  auto* q = arena.alloc_n<float>(1);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(q) - reinterpret_cast<uintptr_t>(p), 256u);
  EXPECT_EQ(arena.used(), 512u);
  VERL_CUDA_CHECK(cudaMemset(q, 0, sizeof(float)));  // the slice is usable device memory
  try {
    arena.alloc(8192);
    FAIL() << "a full arena did not throw";
  } catch (const verl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'train' is full"), std::string::npos) << e.what();
  }
  arena.reset();
  EXPECT_EQ(arena.used(), 0u);
  EXPECT_EQ(arena.peak(), 512u);
  EXPECT_EQ(arena.alloc(16), p);
}

TEST_F(CudaRuntime, SessionOwnsStreamHandleAndWorkspace) {
  EXPECT_NE(ctx().stream, nullptr);
  EXPECT_NE(ctx().lt, nullptr);
  EXPECT_NE(ctx().workspace, nullptr);
  EXPECT_EQ(ctx().workspace_bytes, CudaSession::kDefaultWorkspace);
  EXPECT_NO_THROW(sync());
}

TEST_F(CudaRuntime, BadArgumentsThrowNamingTheOp) {
  DeviceBuffer<float> x(8);
  try {
    rope_forward(ctx(), x.data(), nullptr, nullptr, 1, 1, 3);
    FAIL() << "odd head dim accepted";
  } catch (const verl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rope"), std::string::npos) << e.what();
  }
  EXPECT_THROW(adamw_step(ctx(), x.data(), nullptr, x.data(), x.data(), x.data(), 8, 1e-3f, 0.9f,
                          0.999f, 1e-8f, 0.0f, /*step=*/0, 1.0f),
               verl::Error);
}

}  // namespace
}  // namespace verl::ops::cuda::test
