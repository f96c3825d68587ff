// cuBLASLt matmul with per-call descriptors and the alignment-aware algorithm heuristic (gemm.h).
#include <cstdint>
#include <string>

#include "ops/cuda/common.cuh"
#include "ops/cuda/gemm.h"

namespace verl::ops::cuda::detail {
namespace {

// RAII owners of the cuBLASLt descriptors of one call.
struct MatmulDesc {
  cublasLtMatmulDesc_t h = nullptr;
  ~MatmulDesc() {
    if (h != nullptr) cublasLtMatmulDescDestroy(h);
  }
};
struct Layout {
  cublasLtMatrixLayout_t h = nullptr;
  ~Layout() {
    if (h != nullptr) cublasLtMatrixLayoutDestroy(h);
  }
};
struct Preference {
  cublasLtMatmulPreference_t h = nullptr;
  ~Preference() {
    if (h != nullptr) cublasLtMatmulPreferenceDestroy(h);
  }
};

// Largest power of two (<= 256) dividing the address: what the heuristic may assume.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al >>= 1;
  return al;
}

}  // namespace

void run_gemm(const CudaContext& ctx, const Gemm& g, const char* what) {
  MatmulDesc op;
  VERL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&op.h, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int32_t ta = g.ta, tb = g.tb;
  VERL_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  VERL_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (g.bias != nullptr) {
    const uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
    VERL_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    VERL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &g.bias, sizeof(g.bias)));
  }
  // Stored (not transposed) shapes of A and B, column-major.
  const bool a_n = g.ta == CUBLAS_OP_N, b_n = g.tb == CUBLAS_OP_N;
  Layout la, lb, ld;
  VERL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la.h, g.ab_type, a_n ? g.m : g.k, a_n ? g.k : g.m,
                                               g.lda));
  VERL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb.h, g.ab_type, b_n ? g.k : g.n, b_n ? g.n : g.k,
                                               g.ldb));
  VERL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld.h, g.d_type, g.m, g.n, g.ldd));

  Preference pref;
  VERL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.h));
  const uint64_t ws = ctx.workspace_bytes;
  VERL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  const uint32_t al_a = alignment_of(g.a), al_b = alignment_of(g.b), al_d = alignment_of(g.d);
  VERL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  VERL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  VERL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d)));
  VERL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)));

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  VERL_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(ctx.lt, op.h, la.h, lb.h, ld.h, ld.h, pref.h, 1,
                                                   &result, &found));
  VERL_CUDA_REQUIRE(found > 0,
                    std::string(what) + ": cuBLASLt has no algorithm for m=" + std::to_string(g.m) +
                        " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) +
                        " (alignments A/B/D " + std::to_string(al_a) + "/" + std::to_string(al_b) +
                        "/" + std::to_string(al_d) + " bytes, workspace " +
                        std::to_string(ctx.workspace_bytes) + " bytes)");
  VERL_CUBLAS_CHECK(cublasLtMatmul(ctx.lt, op.h, &g.alpha, g.a, la.h, g.b, lb.h, &g.beta, g.d, ld.h,
                                   g.d, ld.h, &result.algo, ctx.workspace, ctx.workspace_bytes,
                                   ctx.stream));
}

}  // namespace verl::ops::cuda::detail
