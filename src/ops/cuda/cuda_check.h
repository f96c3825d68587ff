// Error checks for CUDA runtime and cuBLASLt calls. Each macro throws verl::Error with the failing
// statement, the error's name and text, and the source location. Plain C++ (no fmt), so both nvcc
// and the host compiler can include it.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

namespace verl::ops::cuda::detail {

// Throw verl::Error: "<api> call `<stmt>` failed: <name> (<text>) [file:line]".
[[noreturn]] void fail_call(const char* api, const char* stmt, const char* name, const char* text,
                            const char* file, int line);
// Throw verl::Error with a message built by the caller (the .cu files cannot use fmt: nvcc's
// front end rejects its consteval format strings).
[[noreturn]] void fail(const char* file, int line, const std::string& msg);

}  // namespace verl::ops::cuda::detail

#define VERL_CUDA_CHECK(call)                                                                  \
  do {                                                                                         \
    const cudaError_t verl_err_ = (call);                                                      \
    if (verl_err_ != cudaSuccess) {                                                            \
      ::verl::ops::cuda::detail::fail_call("CUDA", #call, cudaGetErrorName(verl_err_),         \
                                           cudaGetErrorString(verl_err_), __FILE__, __LINE__); \
    }                                                                                          \
  } while (0)

#define VERL_CUBLAS_CHECK(call)                                                                    \
  do {                                                                                             \
    const cublasStatus_t verl_st_ = (call);                                                        \
    if (verl_st_ != CUBLAS_STATUS_SUCCESS) {                                                       \
      ::verl::ops::cuda::detail::fail_call("cuBLASLt", #call, cublasLtGetStatusName(verl_st_),     \
                                           cublasLtGetStatusString(verl_st_), __FILE__, __LINE__); \
    }                                                                                              \
  } while (0)

// After a kernel launch: reports a bad launch configuration at the launch site.
#define VERL_CUDA_CHECK_LAUNCH() VERL_CUDA_CHECK(cudaGetLastError())

// A precondition on the arguments of a CUDA op; msg is a std::string expression.
#define VERL_CUDA_REQUIRE(cond, msg)                                         \
  do {                                                                       \
    if (!(cond)) ::verl::ops::cuda::detail::fail(__FILE__, __LINE__, (msg)); \
  } while (0)
