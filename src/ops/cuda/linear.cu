// Linear layer y = x W^T + b in the HF nn.Linear layout (W is [N, K]) on cuBLASLt, the same math
// as src/ops/cpu/linear.cpp:
//   forward   y[T,N]   = x[T,K] w[N,K]^T (+ b[N])        bf16 in/out, fp32 accumulate, bias in epilogue
//   backward  d_x[T,K] += d_y[T,N] w[N,K]                 bf16 out (beta = 1: accumulated in fp32)
//             d_w[N,K] += d_y^T x                         fp32 out (the fp32 gradient buffer)
//             d_b[N]   += sum_t d_y[t,:]                  fp32, rows summed in order
// cuBLASLt is column-major: a row-major [R, S] matrix is a column-major [S, R] one with ld = S.
// So y^T[N,T] = op(w)[N,K] x^T[K,T] with w read transposed ("TN"), d_x^T[K,T] = w^T[K,N] d_y^T[N,T]
// ("NN") and d_w^T[K,N] = x^T[K,T] d_y[T,N] ("NT"). The accumulating GEMMs run in place (C == D).
#include <cstdint>

#include "ops/cuda/common.cuh"
#include "ops/cuda/ops_cuda.h"

namespace verl::ops::cuda {

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

// D[m,n] (column-major, ld = ldd) = op(A)[m,k] op(B)[k,n] + beta D (+ bias[m]).
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
  const void* bias;  // length m, D's type; nullptr = none
};

// Largest power of two (<= 256) dividing the address: what the heuristic may assume.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al >>= 1;
  return al;
}

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
  const float alpha = 1.0f;
  VERL_CUBLAS_CHECK(cublasLtMatmul(ctx.lt, op.h, &alpha, g.a, la.h, g.b, lb.h, &g.beta, g.d, ld.h,
                                   g.d, ld.h, &result.algo, ctx.workspace, ctx.workspace_bytes,
                                   ctx.stream));
}

// d_b[n] += sum_t d_y[t,n]: one thread per column walking the rows in order (deterministic).
__global__ void bias_grad_kernel(float* d_b, const bf16* d_y, int64_t T, int64_t N) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  float s = 0.0f;
  for (int64_t t = 0; t < T; ++t) s += __bfloat162float(d_y[t * N + n]);
  d_b[n] += s;
}

void check_linear(const char* op, const CudaContext& ctx, int64_t T, int64_t K, int64_t N) {
  VERL_CUDA_REQUIRE(T >= 0 && K >= 1 && N >= 1,
                    detail::shape_str(op, {T, K, N}) + ": need T >= 0, K >= 1, N >= 1");
  VERL_CUDA_REQUIRE(ctx.lt != nullptr, std::string(op) + ": the context has no cuBLASLt handle");
}

}  // namespace

void linear_forward(const CudaContext& ctx, bf16* y, const bf16* x, const bf16* w, const bf16* b,
                    int64_t T, int64_t K, int64_t N) {
  check_linear("linear_forward", ctx, T, K, N);
  if (T == 0) return;
  // y^T[N,T] = op_T(w: col-major [K,N]) x^T (col-major [K,T]).
  run_gemm(ctx,
           Gemm{CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, w, K, x, K, CUDA_R_16BF, y, N, CUDA_R_16BF, 0.0f,
                b},
           "linear_forward");
}

void linear_backward(const CudaContext& ctx, bf16* d_x, float* d_w, float* d_b, const bf16* d_y,
                     const bf16* x, const bf16* w, int64_t T, int64_t K, int64_t N) {
  check_linear("linear_backward", ctx, T, K, N);
  if (T == 0) return;
  if (d_x != nullptr) {
    // d_x^T[K,T] += w (col-major [K,N]) d_y^T (col-major [N,T]).
    run_gemm(ctx,
             Gemm{CUBLAS_OP_N, CUBLAS_OP_N, K, T, N, w, K, d_y, N, CUDA_R_16BF, d_x, K,
                  CUDA_R_16BF, 1.0f, nullptr},
             "linear_backward (d_x)");
  }
  if (d_w != nullptr) {
    // d_w^T[K,N] += x^T (col-major [K,T]) op_T(d_y^T: col-major [N,T]).
    run_gemm(ctx,
             Gemm{CUBLAS_OP_N, CUBLAS_OP_T, K, N, T, x, K, d_y, N, CUDA_R_16BF, d_w, K,
                  CUDA_R_32F, 1.0f, nullptr},
             "linear_backward (d_w)");
  }
  if (d_b != nullptr) {
    constexpr int kThreads = 256;
    bias_grad_kernel<<<static_cast<unsigned>(detail::ceil_div(N, kThreads)), kThreads, 0,
                       ctx.stream>>>(d_b, d_y, T, N);
    VERL_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace verl::ops::cuda
