// The cuBLASLt functions the project calls, each forwarding to libcublasLt loaded on first use
// (cublaslt_lazy.h says why). The library handle and each function pointer are resolved once,
// under the thread-safe initialisation of function-local statics.
#include "ops/cuda/cublaslt_lazy.h"

#include <cublasLt.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include "core/error.h"

// Every cuBLASLt function the project calls: X(return type, name, (parameters), (arguments)).
#define VERL_LT_FUNCTIONS(X)                                                                      \
  X(cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * h), (h))                                  \
  X(cublasStatus_t, cublasLtDestroy, (cublasLtHandle_t h), (h))                                   \
  X(const char*, cublasLtGetStatusName, (cublasStatus_t s), (s))                                  \
  X(const char*, cublasLtGetStatusString, (cublasStatus_t s), (s))                                \
  X(size_t, cublasLtGetVersion, (void), ())                                                       \
  X(cublasStatus_t, cublasLtMatmul,                                                               \
    (cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,             \
     cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta, \
     const void* C, cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,          \
     const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,                   \
     cudaStream_t stream),                                                                        \
    (h, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace,               \
     workspace_bytes, stream))                                                                    \
  X(cublasStatus_t, cublasLtMatmulAlgoCheck,                                                      \
    (cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,                 \
     cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,    \
     const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result),                  \
    (h, desc, Adesc, Bdesc, Cdesc, Ddesc, algo, result))                                          \
  X(cublasStatus_t, cublasLtMatmulAlgoConfigGetAttribute,                                         \
    (const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, void* buf,      \
     size_t size, size_t* written),                                                               \
    (algo, attr, buf, size, written))                                                             \
  X(cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,                                               \
    (cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,                 \
     cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,    \
     cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t results[],   \
     int* returned),                                                                              \
    (h, desc, Adesc, Bdesc, Cdesc, Ddesc, pref, requested, results, returned))                    \
  X(cublasStatus_t, cublasLtMatmulDescCreate,                                                     \
    (cublasLtMatmulDesc_t * desc, cublasComputeType_t compute, cudaDataType_t scale),             \
    (desc, compute, scale))                                                                       \
  X(cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))               \
  X(cublasStatus_t, cublasLtMatmulDescSetAttribute,                                               \
    (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf,             \
     size_t size),                                                                                \
    (desc, attr, buf, size))                                                                      \
  X(cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref), (pref))  \
  X(cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), (pref))   \
  X(cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,                                         \
    (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf, \
     size_t size),                                                                                \
    (pref, attr, buf, size))                                                                      \
  X(cublasStatus_t, cublasLtMatrixLayoutCreate,                                                   \
    (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows, uint64_t cols,            \
     int64_t ld),                                                                                 \
    (layout, type, rows, cols, ld))                                                               \
  X(cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))

namespace verl::ops::cuda {
namespace {

struct Library {
  void* handle = nullptr;
  std::string problem;  // why it could not be opened
};

const Library& library() {
  static const Library lib = [] {
    Library l;
    // The soname first (LD_LIBRARY_PATH, RUNPATH, the system's cache), then the build's toolkit.
    for (const char* name : {"libcublasLt.so." VERL_CUBLASLT_SOVERSION,
                             VERL_CUBLASLT_DIR "/libcublasLt.so." VERL_CUBLASLT_SOVERSION}) {
      l.handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (l.handle != nullptr) return l;
      const char* err = dlerror();
      l.problem += fmt::format("{}{}", l.problem.empty() ? "" : "; ", err ? err : name);
    }
    l.problem = fmt::format(
        "cannot load cuBLASLt ({}); install the CUDA {} toolkit's cuBLAS or put its lib "
        "directory on LD_LIBRARY_PATH",
        l.problem, VERL_CUBLASLT_SOVERSION);
    return l;
  }();
  return lib;
}

void* symbol(const char* name, std::string* problem) {
  const Library& lib = library();
  if (lib.handle == nullptr) {
    *problem = lib.problem;
    return nullptr;
  }
  void* p = dlsym(lib.handle, name);
  if (p == nullptr)
    *problem =
        fmt::format("the loaded cuBLASLt has no {} (an older library than the build's?)", name);
  return p;
}

template <class F>
F resolve(const char* name) {
  std::string problem;
  void* p = symbol(name, &problem);
  VERL_CHECK(p != nullptr, "{}", problem);
  return reinterpret_cast<F>(p);
}

// The functions forwarded below, for cublaslt_load_problem.
#define VERL_LT_NAME(ret, name, params, args) #name,
constexpr const char* kFunctions[] = {VERL_LT_FUNCTIONS(VERL_LT_NAME)};
#undef VERL_LT_NAME

}  // namespace

std::string cublaslt_load_problem() {
  for (const char* name : kFunctions) {
    std::string problem;
    if (symbol(name, &problem) == nullptr) return problem;
  }
  return "";
}

}  // namespace verl::ops::cuda

// Each definition has the header's prototype; the body calls the library's function of that name.
#define VERL_LT_FORWARD(ret, name, params, args)                               \
  ret CUBLASWINAPI name params {                                               \
    static const auto real = verl::ops::cuda::resolve<decltype(&name)>(#name); \
    return real args;                                                          \
  }

extern "C" {
VERL_LT_FUNCTIONS(VERL_LT_FORWARD)
}  // extern "C"
