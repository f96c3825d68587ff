// cuBLASLt is opened on first use (ops/cuda/cublaslt_lazy.h): every function the project calls
// resolves in the library the build found, and calls through the forwarders reach it. Needs the
// library, not a GPU.
#include <cublasLt.h>
#include <gtest/gtest.h>

#include <string>

#include "ops/cuda/cublaslt_lazy.h"

namespace verl::ops::cuda {
namespace {

TEST(CublasLtLazy, EveryFunctionResolvesAndForwards) {
  EXPECT_EQ(cublaslt_load_problem(), "");
  EXPECT_GE(cublasLtGetVersion(), static_cast<size_t>(CUBLAS_VERSION));
  EXPECT_EQ(std::string(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED)),
            "CUBLAS_STATUS_NOT_SUPPORTED");
  // A matrix layout needs no device: created and destroyed through the library.
  cublasLtMatrixLayout_t layout = nullptr;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, 64, 32, 64), CUBLAS_STATUS_SUCCESS);
  EXPECT_NE(layout, nullptr);
  EXPECT_EQ(cublasLtMatrixLayoutDestroy(layout), CUBLAS_STATUS_SUCCESS);
}

}  // namespace
}  // namespace verl::ops::cuda
