// One cuBLASLt matmul call, shared by the ops that run GEMMs (linear, lm_head):
//   D[m,n] (column-major, ld = ldd) = alpha op(A)[m,k] op(B)[k,n] + beta C (+ bias[m])
// with fp32 compute; C is D itself unless given (same type and ld as D: a residual input).
// Plans (descriptors and the heuristic's algorithm) are cached per shape for the process. A
// row-major [R, S] matrix is a column-major [S, R] one with ld = S.
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
// With ctx.batch_invariant() (Numerics::BatchInvariant), the forward form (ta = T, tb = N, bf16 A
// and B, bf16 or fp32 D) stays on cuBLASLt only where the heuristic's algorithm does not split k,
// A, B, D and the bias are 16-byte aligned, the leading dimensions are whole 16-byte rows, alpha =
// 1 and beta = 0 (its scaling and C term round differently from ours); the rest goes to
// run_gemm_invariant. cuBLASLt's unsplit kernels chain fp32 tensor-core steps over 16-wide k
// chunks from zero, as ours do, and give the same bits
// (GemmInvariant.SameBitsAsCublasLtWithoutSplitK checks the model shapes on the GPU), so a row has
// the same bits whichever of the two runs it; split-K (the heuristic's choice for the decode MLP
// down projection) would not. Every other form stays on cuBLASLt. With ctx.unsplit_k()
// (Numerics::MatchTrainer), the forward form never splits k: where the heuristic's first algorithm
// splits k (the decode MLP down projection), the first of its candidates that does not, or our
// kernel when there is none. A cuBLASLt algorithm gives a row the same bits at every row count, and
// the unsplit ones all give the same bits (measured on the H200: tools/cublaslt_algo_probe.cu), so
// rows agree between a decode step and the trainer's forward. It costs the decode down projection
// about half a microsecond a call against the split-K choice (10.2 against 9.7 us at 0.5B, 17.9
// against 17.2 at 1.5B, 256 rows), and nothing at the row counts of prefill and training, where the
// heuristic does not split.
void run_gemm(const CudaContext& ctx, const Gemm& g, const char* what);

// The batch-invariant GEMM of gemm_invariant.cu: only ta = CUBLAS_OP_T, tb = CUBLAS_OP_N,
// ab_type = CUDA_R_16BF, d_type = CUDA_R_16BF or CUDA_R_32F (throws naming `what` otherwise).
// Every D element is the same chain of fp32 tensor-core steps over k, whatever m, n and the
// leading dimensions are, so a row of D has the same bits in a call of any n. No workspace.
void run_gemm_invariant(const CudaContext& ctx, const Gemm& g, const char* what);

}  // namespace verl::ops::cuda::detail
