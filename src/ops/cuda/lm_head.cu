// LM head fused with log-softmax, target gather and entropy (API and math: lm_head.h), the same
// math as src/ops/cpu/lm_head.cpp. Per chunk of n <= chunk tokens:
//   forward   z[n,V] = h[n,C] w[V,C]^T / temperature     cuBLASLt, bf16 A/B, fp32 D (scratch)
//             one block per row: max, sum exp(z - max), sum exp(z - max)(z - max) -> lse, H,
//             logprob
//   backward  z recomputed as above; one block per row writes d_z / temperature as bf16 (scratch);
//             d_h[n,C] += d_z w   (bf16 D, beta = 1)    d_w[V,C] += d_z^T h   (fp32 D, beta = 1)
// cuBLASLt is column-major: a row-major [R, S] matrix is a column-major [S, R] one with ld = S. So
//   z^T[V,n]   = op_T(w: col-major [C,V]) h^T (col-major [C,n])       ("TN", m=V, n=n, k=C)
//   d_h^T[C,n] = w (col-major [C,V]) d_z^T (col-major [V,n])          ("NN", m=C, n=n, k=V)
//   d_w^T[C,V] = h^T (col-major [C,n]) op_T(d_z^T: col-major [V,n])   ("NT", m=C, n=V, k=n)
#include <cmath>
#include <cstdint>
#include <string>

#include "ops/cuda/common.cuh"
#include "ops/cuda/gemm.h"
#include "ops/cuda/lm_head.h"

namespace verl::ops::cuda {

namespace {

using detail::block_sum;
using detail::Gemm;
using detail::run_gemm;

constexpr int kRowThreads = 512;
constexpr size_t kAlign = 256;

size_t align_up(size_t b) {
  return (b + kAlign - 1) / kAlign * kAlign;
}

int64_t normalise_chunk(int64_t T, int64_t chunk) {
  return (chunk <= 0 || chunk > T) ? T : chunk;
}

// z[n,V] (row-major fp32) = h[n,C] w[V,C]^T / temperature.
void chunk_logits(const CudaContext& ctx, float* z, const bf16* h, const bf16* w, int64_t n,
                  int64_t C, int64_t V, float temperature, const char* what) {
  run_gemm(ctx,
          Gemm{CUBLAS_OP_T, CUBLAS_OP_N, V, n, C, w, C, h, C, CUDA_R_16BF, z, V, CUDA_R_32F, 0.0f,
               nullptr, 1.0f / temperature},
          what);
}

// ---- row kernels (one block per row of the chunk)
// ------------------------------------------------

// Max of v over the block, returned to every thread (blockDim.x a multiple of 32, <= 1024).
__device__ __forceinline__ float block_max(float v) {
  __shared__ float warp_max[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, off));
  __syncthreads();
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  float m = warp_max[0];
  for (int i = 1; i < nwarps; ++i) m = fmaxf(m, warp_max[i]);
  return m;
}

__device__ __forceinline__ int32_t target_of(const int32_t* targets, int64_t t, int64_t V) {
  if (targets == nullptr) return -1;
  const int32_t tg = targets[t];
  return (tg >= 0 && tg < V) ? tg : -1;
}

// Row r of the chunk is token t0 + r. Sums over the shifted logits z - max, so the entropy
// log(se) - E[z - max] does not subtract two large numbers (as the CPU op).
__global__ void forward_rows_kernel(float* logprob, float* entropy, float* lse, const float* z,
                                    const int32_t* targets, int64_t t0, int64_t V) {
  const int64_t r = blockIdx.x, t = t0 + r;
  const float* zr = z + r * V;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, zr[j]);
  m = block_max(m);
  float se = 0.0f, sez = 0.0f;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float zs = zr[j] - m;
    const float e = expf(zs);
    se += e;
    sez += e * zs;
  }
  se = block_sum(se);
  sez = block_sum(sez);
  if (threadIdx.x != 0) return;
  const float log_se = logf(se);
  if (lse != nullptr) lse[t] = m + log_se;
  if (entropy != nullptr) entropy[t] = log_se - sez / se;
  if (logprob != nullptr) {
    const int32_t tg = target_of(targets, t, V);
    logprob[t] = tg >= 0 ? (zr[tg] - m) - log_se : 0.0f;
  }
}

// dz[r,j] = (d_logprob (1[j==target] - p_j) - d_entropy p_j (log p_j + H)) / temperature, bf16.
__global__ void backward_rows_kernel(bf16* dz, const float* z, const float* d_logprob,
                                     const float* d_entropy, const int32_t* targets,
                                     const float* lse, const float* entropy, int64_t t0, int64_t V,
                                     float inv_temp) {
  const int64_t r = blockIdx.x, t = t0 + r;
  const float* zr = z + r * V;
  bf16* dr = dz + r * V;
  const int32_t tg = target_of(targets, t, V);
  // logprob is the constant 0 when there is no target, so its gradient does not flow.
  const float dl = (d_logprob != nullptr && tg >= 0) ? d_logprob[t] : 0.0f;
  const float de = d_entropy != nullptr ? d_entropy[t] : 0.0f;
  const float ent = d_entropy != nullptr ? entropy[t] : 0.0f;
  const float lse_t = lse[t];
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float logp = zr[j] - lse_t;
    const float p = expf(logp);
    float g = -dl * p - de * p * (logp + ent);
    if (j == tg) g += dl;
    dr[j] = __float2bfloat16_rn(g * inv_temp);
  }
}

void check_args(const char* op, const CudaContext& ctx, int64_t T, int64_t C, int64_t V,
                float temperature) {
  VERL_CUDA_REQUIRE(T >= 0 && C >= 1 && V >= 1,
                    detail::shape_str(op, {T, C, V}) + ": need T >= 0, C >= 1, V >= 1");
  VERL_CUDA_REQUIRE(temperature > 0.0f, std::string(op) + ": temperature=" +
                                            std::to_string(temperature) + " must be > 0");
  VERL_CUDA_REQUIRE(ctx.lt != nullptr, std::string(op) + ": the context has no cuBLASLt handle");
}

void check_backward_args(const CudaContext& ctx, const float* d_entropy, const float* lse,
                         const float* entropy, int64_t T, int64_t C, int64_t V, float temperature) {
  check_args("lm_head_backward", ctx, T, C, V, temperature);
  VERL_CUDA_REQUIRE(lse != nullptr, std::string("lm_head_backward: the saved lse is required"));
  VERL_CUDA_REQUIRE(d_entropy == nullptr || entropy != nullptr,
                    std::string("lm_head_backward: d_entropy given but the saved entropy is null"));
}

void check_scratch(const char* op, const void* scratch, size_t have, size_t need) {
  VERL_CUDA_REQUIRE(scratch != nullptr && have >= need,
                    std::string(op) + ": scratch of " + std::to_string(have) + " bytes at " +
                        (scratch != nullptr ? "a device buffer" : "null") + ", need " +
                        std::to_string(need) + " bytes");
}

}  // namespace

size_t lm_head_forward_scratch_bytes(int64_t T, int64_t V, int64_t chunk) {
  if (T <= 0 || V <= 0) return 0;
  const auto c = static_cast<size_t>(normalise_chunk(T, chunk));
  return align_up(c * static_cast<size_t>(V) * sizeof(float));
}

size_t lm_head_backward_scratch_bytes(int64_t T, int64_t V, int64_t chunk) {
  if (T <= 0 || V <= 0) return 0;
  const auto c = static_cast<size_t>(normalise_chunk(T, chunk));
  return lm_head_forward_scratch_bytes(T, V, chunk) +
         align_up(c * static_cast<size_t>(V) * sizeof(bf16));
}

void lm_head_forward(const CudaContext& ctx, float* logprob, float* entropy, float* lse,
                     const bf16* h, const bf16* w, const int32_t* targets, int64_t T, int64_t C,
                     int64_t V, float temperature, int64_t chunk, void* scratch,
                     size_t scratch_bytes) {
  check_args("lm_head_forward", ctx, T, C, V, temperature);
  if (T == 0) return;
  check_scratch("lm_head_forward", scratch, scratch_bytes,
                lm_head_forward_scratch_bytes(T, V, chunk));
  chunk = normalise_chunk(T, chunk);
  auto* z = static_cast<float*>(scratch);
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = T - t0 < chunk ? T - t0 : chunk;
    chunk_logits(ctx, z, h + t0 * C, w, n, C, V, temperature, "lm_head_forward (logits)");
    forward_rows_kernel<<<static_cast<unsigned>(n), kRowThreads, 0, ctx.stream>>>(
        logprob, entropy, lse, z, targets, t0, V);
    VERL_CUDA_CHECK_LAUNCH();
  }
}

void lm_head_forward(const CudaContext& ctx, DeviceArena& arena, float* logprob, float* entropy,
                     float* lse, const bf16* h, const bf16* w, const int32_t* targets, int64_t T,
                     int64_t C, int64_t V, float temperature, int64_t chunk) {
  check_args("lm_head_forward", ctx, T, C, V, temperature);
  if (T == 0) return;
  const size_t bytes = lm_head_forward_scratch_bytes(T, V, chunk);
  lm_head_forward(ctx, logprob, entropy, lse, h, w, targets, T, C, V, temperature, chunk,
                  arena.alloc(bytes), bytes);
}

void lm_head_backward(const CudaContext& ctx, bf16* d_h, float* d_w, const float* d_logprob,
                      const float* d_entropy, const bf16* h, const bf16* w, const int32_t* targets,
                      const float* lse, const float* entropy, int64_t T, int64_t C, int64_t V,
                      float temperature, int64_t chunk, void* scratch, size_t scratch_bytes) {
  check_backward_args(ctx, d_entropy, lse, entropy, T, C, V, temperature);
  if (T == 0 || (d_h == nullptr && d_w == nullptr)) return;
  if (d_logprob == nullptr && d_entropy == nullptr) return;  // d_z = 0
  check_scratch("lm_head_backward", scratch, scratch_bytes,
                lm_head_backward_scratch_bytes(T, V, chunk));
  const size_t z_bytes = lm_head_forward_scratch_bytes(T, V, chunk);
  chunk = normalise_chunk(T, chunk);
  auto* z = static_cast<float*>(scratch);
  auto* dz = reinterpret_cast<bf16*>(static_cast<char*>(scratch) + z_bytes);
  const float inv_temp = 1.0f / temperature;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = T - t0 < chunk ? T - t0 : chunk;
    const bf16* hc = h + t0 * C;
    chunk_logits(ctx, z, hc, w, n, C, V, temperature, "lm_head_backward (logits)");
    backward_rows_kernel<<<static_cast<unsigned>(n), kRowThreads, 0, ctx.stream>>>(
        dz, z, d_logprob, d_entropy, targets, lse, entropy, t0, V, inv_temp);
    VERL_CUDA_CHECK_LAUNCH();
    if (d_h != nullptr) {
      // d_h^T[C,n] += w (col-major [C,V]) d_z^T (col-major [V,n]).
      run_gemm(ctx,
              Gemm{CUBLAS_OP_N, CUBLAS_OP_N, C, n, V, w, C, dz, V, CUDA_R_16BF, d_h + t0 * C, C,
                   CUDA_R_16BF, 1.0f},
              "lm_head_backward (d_h)");
    }
    if (d_w != nullptr) {
      // d_w^T[C,V] += h^T (col-major [C,n]) op_T(d_z^T: col-major [V,n]).
      run_gemm(
          ctx,
          Gemm{CUBLAS_OP_N, CUBLAS_OP_T, C, V, n, hc, C, dz, V, CUDA_R_16BF, d_w, C, CUDA_R_32F, 1.0f},
          "lm_head_backward (d_w)");
    }
  }
}

void lm_head_backward(const CudaContext& ctx, DeviceArena& arena, bf16* d_h, float* d_w,
                      const float* d_logprob, const float* d_entropy, const bf16* h, const bf16* w,
                      const int32_t* targets, const float* lse, const float* entropy, int64_t T,
                      int64_t C, int64_t V, float temperature, int64_t chunk) {
  check_backward_args(ctx, d_entropy, lse, entropy, T, C, V, temperature);
  if (T == 0 || (d_h == nullptr && d_w == nullptr)) return;
  if (d_logprob == nullptr && d_entropy == nullptr) return;
  const size_t bytes = lm_head_backward_scratch_bytes(T, V, chunk);
  lm_head_backward(ctx, d_h, d_w, d_logprob, d_entropy, h, w, targets, lse, entropy, T, C, V,
                   temperature, chunk, arena.alloc(bytes), bytes);
}

}  // namespace verl::ops::cuda
