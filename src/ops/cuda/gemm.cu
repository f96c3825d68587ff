// cuBLASLt matmul with per-call descriptors and the alignment-aware algorithm heuristic (gemm.h).
// The forward form has two more policies: batch-invariant mode (unsplit cuBLASLt or
// gemm_invariant.cu) and unsplit_k (an algorithm that does not split k, at every row count).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

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

// Which algorithm a plan holds: the heuristic's first, or the first of its candidates that does not
// split k.
enum class Choice : int32_t { kHeuristic, kUnsplit };

// A planned matmul: descriptors and an algorithm for one (shape, types, alignments, epilogue,
// workspace, choice) key. Planning costs tens of microseconds of host time (the heuristic query),
// more than the kernels of a small layer, so plans are cached for the process and a step loop
// plans nothing after its first iteration.
struct Plan {
  MatmulDesc op;
  Layout la, lb, ld;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;    // kUnsplit: an algorithm that fits (else the caller falls back)
  bool split_k = false;  // the algorithm sums k in more than one slice
  // Unsplit, with A, B and D 16-byte aligned and leading dimensions of whole 16-byte rows: the
  // cases GemmInvariant.SameBitsAsCublasLtWithoutSplitK checks against our kernel.
  bool tested_unsplit = false;
};

struct PlanKey {
  int32_t ta, tb;
  int64_t m, n, k, lda, ldb, ldd;
  int32_t ab_type, d_type;
  bool bias;
  uint32_t al_a, al_b, al_d;
  uint64_t workspace;
  int device;
  Choice choice = Choice::kHeuristic;

  bool operator==(const PlanKey& o) const {
    return ta == o.ta && tb == o.tb && m == o.m && n == o.n && k == o.k && lda == o.lda &&
           ldb == o.ldb && ldd == o.ldd && ab_type == o.ab_type && d_type == o.d_type &&
           bias == o.bias && al_a == o.al_a && al_b == o.al_b && al_d == o.al_d &&
           workspace == o.workspace && device == o.device && choice == o.choice;
  }
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    size_t h = 1469598103934665603ull;
    auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(static_cast<uint64_t>(k.ta) | static_cast<uint64_t>(k.tb) << 8 |
        static_cast<uint64_t>(k.ab_type) << 16 | static_cast<uint64_t>(k.d_type) << 32 |
        static_cast<uint64_t>(k.bias) << 48 | static_cast<uint64_t>(k.choice) << 56);
    for (int64_t v : {k.m, k.n, k.k, k.lda, k.ldb, k.ldd}) mix(static_cast<uint64_t>(v));
    mix(static_cast<uint64_t>(k.al_a) | static_cast<uint64_t>(k.al_b) << 16 |
        static_cast<uint64_t>(k.al_d) << 32);
    mix(k.workspace);
    mix(static_cast<uint64_t>(k.device));
    return h;
  }
};

int32_t splits_of(const cublasLtMatmulAlgo_t& algo) {
  int32_t splits = 1;
  size_t written = 0;
  VERL_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                                         &splits, sizeof(splits), &written));
  return splits;
}

std::unique_ptr<Plan> make_plan(const CudaContext& ctx, const Gemm& g, const PlanKey& key,
                                const char* what) {
  auto plan = std::make_unique<Plan>();
  VERL_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op.h, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int32_t ta = g.ta, tb = g.tb;
  VERL_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op.h, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  VERL_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->op.h, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (g.bias != nullptr) {
    const uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
    VERL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op.h, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                     &epi, sizeof(epi)));
    VERL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &g.bias, sizeof(g.bias)));
  }
  // Stored (not transposed) shapes of A and B, column-major.
  const bool a_n = g.ta == CUBLAS_OP_N, b_n = g.tb == CUBLAS_OP_N;
  VERL_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&plan->la.h, g.ab_type, a_n ? g.m : g.k, a_n ? g.k : g.m, g.lda));
  VERL_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&plan->lb.h, g.ab_type, b_n ? g.k : g.n, b_n ? g.n : g.k, g.ldb));
  VERL_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->ld.h, g.d_type, g.m, g.n, g.ldd));
  const auto finish = [&](const cublasLtMatmulAlgo_t& algo) {
    plan->algo = algo;
    plan->found = true;
    plan->split_k = splits_of(algo) > 1;
    plan->tested_unsplit = !plan->split_k && key.al_a >= 16 && key.al_b >= 16 && key.al_d >= 16 &&
                           g.lda % 8 == 0 && g.ldb % 8 == 0 && g.ldd % 4 == 0;
  };

  Preference pref;
  VERL_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.h));
  const uint64_t ws = ctx.workspace_bytes;
  VERL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  VERL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key.al_a, sizeof(key.al_a)));
  VERL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key.al_b, sizeof(key.al_b)));
  VERL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key.al_d, sizeof(key.al_d)));
  VERL_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key.al_d, sizeof(key.al_d)));

  constexpr int kCandidates = 16;
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  VERL_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(
      ctx.lt, plan->op.h, plan->la.h, plan->lb.h, plan->ld.h, plan->ld.h, pref.h,
      key.choice == Choice::kUnsplit ? kCandidates : 1, results, &found));
  if (key.choice == Choice::kUnsplit) {
    for (int i = 0; i < found; ++i) {
      if (splits_of(results[i].algo) == 1) {
        finish(results[i].algo);
        break;
      }
    }
    return plan;
  }
  VERL_CUDA_REQUIRE(found > 0,
                    std::string(what) + ": cuBLASLt has no algorithm for m=" + std::to_string(g.m) +
                        " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) +
                        " (alignments A/B/D " + std::to_string(key.al_a) + "/" +
                        std::to_string(key.al_b) + "/" + std::to_string(key.al_d) +
                        " bytes, workspace " + std::to_string(ctx.workspace_bytes) + " bytes)");
  finish(results[0].algo);
  return plan;
}

// The process's plans (guarded by the caller's lock on plans_mutex()).
std::mutex& plans_mutex() {
  static std::mutex mu;
  return mu;
}
Plan* plan_for(const CudaContext& ctx, const Gemm& g, const PlanKey& key, const char* what) {
  static std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans;
  auto it = plans.find(key);
  if (it == plans.end()) it = plans.emplace(key, make_plan(ctx, g, key, what)).first;
  return it->second.get();
}

// Enqueues g with a plan's descriptors and algorithm (under the plans lock: the bias pointer is a
// per-call attribute of a shared descriptor).
void launch(const CudaContext& ctx, const Gemm& g, Plan* plan) {
  if (g.bias != nullptr) {
    VERL_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->op.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &g.bias, sizeof(g.bias)));
  }
  const void* c = g.c != nullptr ? g.c : g.d;
  VERL_CUBLAS_CHECK(cublasLtMatmul(ctx.lt, plan->op.h, &g.alpha, g.a, plan->la.h, g.b, plan->lb.h,
                                   &g.beta, c, plan->ld.h, g.d, plan->ld.h, &plan->algo,
                                   ctx.workspace, ctx.workspace_bytes, ctx.stream));
}

}  // namespace

void run_gemm(const CudaContext& ctx, const Gemm& g, const char* what) {
  const bool forward_form = g.ta == CUBLAS_OP_T && g.tb == CUBLAS_OP_N &&
                            g.ab_type == CUDA_R_16BF &&
                            (g.d_type == CUDA_R_16BF || g.d_type == CUDA_R_32F);
  // C (the beta term) shares D's layout; its alignment joins D's in the key.
  const void* c = g.c != nullptr ? g.c : g.d;
  int device = 0;
  VERL_CUDA_CHECK(cudaGetDevice(&device));
  const PlanKey key{static_cast<int32_t>(g.ta),
                    static_cast<int32_t>(g.tb),
                    g.m,
                    g.n,
                    g.k,
                    g.lda,
                    g.ldb,
                    g.ldd,
                    static_cast<int32_t>(g.ab_type),
                    static_cast<int32_t>(g.d_type),
                    g.bias != nullptr,
                    alignment_of(g.a),
                    alignment_of(g.b),
                    std::min(alignment_of(g.d), alignment_of(c)),
                    static_cast<uint64_t>(ctx.workspace_bytes),
                    device};
  std::lock_guard<std::mutex> lock(plans_mutex());
  Plan* plan = plan_for(ctx, g, key, what);
  if (!forward_form) {
    launch(ctx, g, plan);
    return;
  }
  // Batch-invariant mode: cuBLASLt only where it matches our kernel bit for bit (an unsplit
  // algorithm, aligned operands, alpha = 1, no C term; gemm.h), else ours.
  if (ctx.batch_invariant()) {
    if (plan->tested_unsplit && g.alpha == 1.0f && g.beta == 0.0f && alignment_of(g.bias) >= 16) {
      launch(ctx, g, plan);
    } else {
      run_gemm_invariant(ctx, g, what);
    }
    return;
  }
  if (!ctx.unsplit_k()) {
    launch(ctx, g, plan);
    return;
  }
  // ctx.unsplit_k(): an algorithm that does not split k, whose bits every unsplit algorithm shares;
  // our kernel has them too when cuBLASLt offers none.
  if (plan->split_k) {
    PlanKey unsplit_key = key;
    unsplit_key.choice = Choice::kUnsplit;
    plan = plan_for(ctx, g, unsplit_key, what);
    if (!plan->found) {
      run_gemm_invariant(ctx, g, what);
      return;
    }
  }
  launch(ctx, g, plan);
}

}  // namespace verl::ops::cuda::detail
