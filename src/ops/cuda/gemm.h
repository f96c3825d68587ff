// One cuBLASLt matmul call, shared by the ops that run GEMMs (linear, lm_head):
//   D[m,n] (column-major, ld = ldd) = alpha op(A)[m,k] op(B)[k,n] + beta C (+ bias[m])
// with fp32 compute; C is D itself unless given (same type and ld as D: a residual input).
// Plans (descriptors and the heuristic's algorithm) are cached per shape for the process. A row-major [R, S] matrix is a column-major [S, R] one with ld = S.
#pragma once

#include <cublasLt.h>

#include <cstdint>

#include "ops/cuda/device.h"

namespace verl::ops::cuda::detail {

struct Gemm {
  cublasOperation_t ta, tb;
  int64_t m, n, k;
  const void* a;
  int64_t lda;
  const void* b;
  int64_t ldb;
  cudaDataType_t ab_type;
  void* d;
  int64_t ldd;
  cudaDataType_t d_type;
  float beta;
  const void* bias = nullptr;  // length m, D's type; nullptr = none
  float alpha = 1.0f;
  const void* c = nullptr;  // the beta term's matrix; nullptr = D
};

// Runs g on ctx's stream with its workspace; `what` names the caller in errors (e.g. no algorithm).
void run_gemm(const CudaContext& ctx, const Gemm& g, const char* what);

}  // namespace verl::ops::cuda::detail
