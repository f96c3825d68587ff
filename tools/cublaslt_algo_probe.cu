// What cuBLASLt's algorithms do to the bits of a row (docs/cuda.md, determinism): for each forward
// GEMM shape of Qwen2.5-0.5B / 1.5B (y[M, N] = x[M, K] W[N, K]^T, bf16 in, bf16 or fp32 out), the
// heuristic's candidates at 16384 (2048 for the LM head) and at 256 rows are run at 16384, 256 and
// 7 rows; each line says whether the 256- and 7-row results equal the first rows of the big call,
// whether they equal the first candidate's, and the time per call. Standalone; on the GPU machine:
//   nvcc -O2 -std=c++17 -arch=sm_90 -o /tmp/probe tools/cublaslt_algo_probe.cu -lcublasLt &&
//   /tmp/probe
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <tuple>
#include <vector>
#define CK(x)                                                  \
  do {                                                         \
    auto e = (x);                                              \
    if (e != 0) {                                              \
      printf("err %d at %s:%d\n", (int)e, __FILE__, __LINE__); \
      exit(1);                                                 \
    }                                                          \
  } while (0)
struct Shape {
  const char* name;
  int N, K;
  bool bias;
  bool f32out;
  int Mbig;
};
struct Cfg {
  int id, tile, splitk, red, swz, custom, stages, inner, cluster;
};
static Cfg cfg_of(const cublasLtMatmulAlgo_t& a) {
  Cfg c{};
  size_t w;
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &c.id, sizeof(int), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &c.tile, sizeof(int), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &c.splitk, sizeof(int),
                                       &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &c.red,
                                       sizeof(int), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &c.swz, sizeof(int),
                                       &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &c.custom,
                                       sizeof(int), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &c.stages, sizeof(int),
                                       &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &c.inner,
                                       sizeof(int), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &c.cluster,
                                       sizeof(int), &w);
  return c;
}
cublasLtHandle_t lt;
void* ws;
size_t wsb = size_t(512) << 20;
struct Call {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, ld;
  Call(const Shape& s, int M, const void* bias) {
    CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, 4));
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, 4));
    if (bias) {
      int epi = CUBLASLT_EPILOGUE_BIAS;
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, 4));
      CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, 8));
    }
    CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.K, s.N, s.K));
    CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.K, M, s.K));
    CK(cublasLtMatrixLayoutCreate(&ld, s.f32out ? CUDA_R_32F : CUDA_R_16BF, s.N, M, s.N));
  }
  std::vector<cublasLtMatmulHeuristicResult_t> heur(int count) {
    cublasLtMatmulPreference_t p;
    CK(cublasLtMatmulPreferenceCreate(&p));
    CK(cublasLtMatmulPreferenceSetAttribute(p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, 8));
    std::vector<cublasLtMatmulHeuristicResult_t> r(count);
    int f = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, p, count, r.data(), &f));
    r.resize(f);
    cublasLtMatmulPreferenceDestroy(p);
    return r;
  }
  bool check(const cublasLtMatmulAlgo_t& a) {
    cublasLtMatmulHeuristicResult_t r;
    return cublasLtMatmulAlgoCheck(lt, op, la, lb, ld, ld, &a, &r) == 0;
  }
  bool run(const cublasLtMatmulAlgo_t& a, const void* w, const void* x, void* d) {
    float al = 1, be = 0;
    return cublasLtMatmul(lt, op, &al, w, la, x, lb, &be, d, ld, d, ld, &a, ws, wsb, 0) == 0;
  }
};
float timeit(Call& c, const cublasLtMatmulAlgo_t& a, const void* w, const void* x, void* d,
             int reps) {
  for (int i = 0; i < 3; ++i) c.run(a, w, x, d);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  for (int i = 0; i < reps; ++i) c.run(a, w, x, d);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms;
  cudaEventElapsedTime(&ms, e0, e1);
  return ms * 1000 / reps;
}
int main() {
  CK(cublasLtCreate(&lt));
  CK(cudaMalloc(&ws, wsb));
  std::vector<Shape> shapes = {
      {"qkv05", 1152, 896, true, false, 16384},     {"o05", 896, 896, false, false, 16384},
      {"gateup05", 9728, 896, false, false, 16384}, {"down05", 896, 4864, false, false, 16384},
      {"lmhead05", 151936, 896, false, true, 2048}, {"qkv15", 2048, 1536, true, false, 16384},
      {"o15", 1536, 1536, false, false, 16384},     {"gateup15", 17920, 1536, false, false, 16384},
      {"down15", 1536, 8960, false, false, 16384}};
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (auto& s : shapes) {
    size_t ob = s.f32out ? 4 : 2;
    std::vector<__nv_bfloat16> hw((size_t)s.N * s.K), hx((size_t)s.Mbig * s.K), hb(s.N);
    for (auto& v : hw) v = __float2bfloat16(nd(rng) * 0.03f);
    for (auto& v : hx) v = __float2bfloat16(nd(rng));
    for (auto& v : hb) v = __float2bfloat16(nd(rng));
    void *w, *x, *b, *dbig, *dsmall, *d7;
    CK(cudaMalloc(&w, hw.size() * 2));
    CK(cudaMalloc(&x, hx.size() * 2));
    CK(cudaMalloc(&b, s.N * 2));
    CK(cudaMalloc(&dbig, (size_t)s.N * s.Mbig * ob));
    CK(cudaMalloc(&dsmall, (size_t)s.N * 256 * ob));
    CK(cudaMalloc(&d7, (size_t)s.N * 7 * ob));
    cudaMemcpy(w, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(b, hb.data(), s.N * 2, cudaMemcpyHostToDevice);
    const void* bias = s.bias ? b : nullptr;
    Call cbig(s, s.Mbig, bias), c256(s, 256, bias), c7(s, 7, bias), c1(s, 1, bias);
    auto hb_big = cbig.heur(32), hb_256 = c256.heur(32);
    Cfg d256 = cfg_of(hb_256[0].algo), dbg = cfg_of(hb_big[0].algo);
    float t_def256 = timeit(c256, hb_256[0].algo, w, x, dsmall, 200);
    float t_defbig = timeit(cbig, hb_big[0].algo, w, x, dbig, 20);
    printf(
        "== %s N=%d K=%d Mbig=%d | heuristic@256: id%d tile%d sk%d st%d cl%d %.2fus | "
        "heuristic@big: id%d tile%d sk%d st%d cl%d %.1fus\n",
        s.name, s.N, s.K, s.Mbig, d256.id, d256.tile, d256.splitk, d256.stages, d256.cluster,
        t_def256, dbg.id, dbg.tile, dbg.splitk, dbg.stages, dbg.cluster, t_defbig);
    std::vector<cublasLtMatmulAlgo_t> cands;
    std::set<std::vector<int>> seen;
    for (auto* v : {&hb_big, &hb_256})
      for (auto& r : *v) {
        Cfg c = cfg_of(r.algo);
        std::vector<int> key = {c.id,     c.tile,   c.splitk, c.red,    c.swz,
                                c.custom, c.stages, c.inner,  c.cluster};
        if (seen.insert(key).second) cands.push_back(r.algo);
      }
    std::vector<char> big((size_t)s.N * s.Mbig * ob), sm((size_t)s.N * 256 * ob),
        s7((size_t)s.N * 7 * ob);
    std::vector<char> ref256;
    for (auto& a : cands) {
      Cfg c = cfg_of(a);
      bool ok = cbig.check(a) && c256.check(a) && c7.check(a) && c1.check(a);
      printf("  id%-3d tile%-3d sk%-2d red%d swz%d cust%d st%-3d in%d cl%-2d ", c.id, c.tile,
             c.splitk, c.red, c.swz, c.custom, c.stages, c.inner, c.cluster);
      if (!ok) {
        printf("check failed for some M\n");
        continue;
      }
      cudaMemset(dbig, 0, (size_t)s.N * s.Mbig * ob);
      cudaMemset(dsmall, 0, (size_t)s.N * 256 * ob);
      cudaMemset(d7, 0, (size_t)s.N * 7 * ob);
      if (!cbig.run(a, w, x, dbig) || !c256.run(a, w, x, dsmall) || !c7.run(a, w, x, d7)) {
        printf("run failed\n");
        continue;
      }
      CK(cudaDeviceSynchronize());
      cudaMemcpy(big.data(), dbig, big.size(), cudaMemcpyDeviceToHost);
      cudaMemcpy(sm.data(), dsmall, sm.size(), cudaMemcpyDeviceToHost);
      cudaMemcpy(s7.data(), d7, s7.size(), cudaMemcpyDeviceToHost);
      bool eq256 = memcmp(big.data(), sm.data(), sm.size()) == 0,
           eq7 = memcmp(big.data(), s7.data(), s7.size()) == 0;
      float t256 = timeit(c256, a, w, x, dsmall, 200), tbig = timeit(cbig, a, w, x, dbig, 20);
      if (ref256.empty()) ref256 = sm;
      bool same_ref = memcmp(ref256.data(), sm.data(), sm.size()) == 0;
      printf("rows256==big %d rows7==big %d same_as_first %d t256 %.2fus tbig %.1fus\n", eq256, eq7,
             same_ref, t256, tbig);
    }
    // Default heuristic per M: invariant?
    {
      cudaMemset(dsmall, 0, (size_t)s.N * 256 * ob);
      cbig.run(hb_big[0].algo, w, x, dbig);
      c256.run(hb_256[0].algo, w, x, dsmall);
      CK(cudaDeviceSynchronize());
      cudaMemcpy(big.data(), dbig, big.size(), cudaMemcpyDeviceToHost);
      cudaMemcpy(sm.data(), dsmall, sm.size(), cudaMemcpyDeviceToHost);
      printf("  default heuristics rows256==big %d\n",
             memcmp(big.data(), sm.data(), sm.size()) == 0);
    }
    cudaFree(w);
    cudaFree(x);
    cudaFree(b);
    cudaFree(dbig);
    cudaFree(dsmall);
    cudaFree(d7);
  }
}
