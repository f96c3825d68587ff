// LM head fused with log-softmax, target gather and entropy (API and math: lm_head.h), the same
// math as src/ops/cpu/lm_head.cpp. Per chunk of n <= chunk tokens:
//   forward   z[n,V] = h[n,C] w[V,C]^T / temperature     cuBLASLt, bf16 A/B, fp32 D (scratch)
//             one block per row, one pass (float4 loads): online max, sum exp(z - max) and
//             sum exp(z - max)(z - max) per thread, combined in a fixed order -> lse, H, logprob;
//             keep_probs: a second pass over the row writes p = exp(z - lse) as bf16
//   backward  z recomputed as above; one block per row writes d_z / temperature as bf16 (scratch);
//             (from_probs: d_z from the kept bf16 p instead, no logits GEMM)
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

__device__ __forceinline__ int32_t target_of(const int32_t* targets, int64_t t, int64_t V) {
  if (targets == nullptr) return -1;
  const int32_t tg = targets[t];
  return (tg >= 0 && tg < V) ? tg : -1;
}

// Online softmax statistics of a set of logits (Milakov & Gimelshein 2018, extended to the
// entropy): m = max z, s = sum e^(z - m), u = sum e^(z - m) (z - m). Sums over the shifted logits,
// so the entropy log s - u / s does not subtract two large numbers (as the CPU op). s == 0 marks
// the empty set (a non-empty one holds e^0 = 1 for its max).
struct RowStats {
  float m = -INFINITY, s = 0.0f, u = 0.0f;
};

// Moves the reference of a (non-empty) a to m_new >= a.m: e^(z - m_new) = al e^(z - m) and
// z - m_new = (z - m) + d, with al = e^d, d = m - m_new.
__device__ __forceinline__ void rescale(RowStats& a, float m_new) {
  if (a.s == 0.0f) {
    a.m = m_new;
    return;
  }
  const float d = a.m - m_new, al = expf(d);
  a.u = al * (a.u + d * a.s);
  a.s *= al;
  a.m = m_new;
}

__device__ __forceinline__ void push1(RowStats& a, float z) {
  if (z > a.m) rescale(a, z);
  const float d = z - a.m, e = expf(d);
  a.s += e;
  a.u += e * d;
}

// Four logits with one rescale at most.
__device__ __forceinline__ void push4(RowStats& a, float4 z) {
  const float mx = fmaxf(fmaxf(z.x, z.y), fmaxf(z.z, z.w));
  if (mx > a.m) rescale(a, mx);
  const float d0 = z.x - a.m, d1 = z.y - a.m, d2 = z.z - a.m, d3 = z.w - a.m;
  const float e0 = expf(d0), e1 = expf(d1), e2 = expf(d2), e3 = expf(d3);
  a.s += (e0 + e1) + (e2 + e3);
  a.u += (e0 * d0 + e1 * d1) + (e2 * d2 + e3 * d3);
}

// Statistics of the union of two disjoint sets (a first: the order is fixed by the callers).
__device__ __forceinline__ RowStats combine(RowStats a, const RowStats& b) {
  if (b.s == 0.0f) return a;
  if (a.s == 0.0f) return b;
  const float m = fmaxf(a.m, b.m);
  const float da = a.m - m, db = b.m - m;
  const float ea = expf(da), eb = expf(db);
  RowStats r;
  r.m = m;
  r.s = a.s * ea + b.s * eb;
  r.u = ea * (a.u + da * a.s) + eb * (b.u + db * b.s);
  return r;
}

// Combines every thread's statistics: a shuffle-down tree within each warp, then warp 0..n-1 in
// order by thread 0. The result is valid in thread 0 only. The order depends only on blockDim.x.
__device__ __forceinline__ RowStats block_combine(RowStats a) {
  __shared__ float wm[32], ws[32], wu[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  for (int off = 16; off > 0; off >>= 1) {
    RowStats b;
    b.m = __shfl_down_sync(0xffffffffu, a.m, off);
    b.s = __shfl_down_sync(0xffffffffu, a.s, off);
    b.u = __shfl_down_sync(0xffffffffu, a.u, off);
    a = combine(a, b);
  }
  if (lane == 0) {
    wm[warp] = a.m;
    ws[warp] = a.s;
    wu[warp] = a.u;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < nwarps; ++i) {
      RowStats b;
      b.m = wm[i];
      b.s = ws[i];
      b.u = wu[i];
      a = combine(a, b);
    }
  }
  return a;
}

// Row r of the chunk is token t0 + r. One pass over the row (online statistics); kVec: the row is
// read as float4 (V % 4 == 0 and z 16-byte aligned, so every row is). kKeep: a second pass writes
// p = e^(z - lse) as bf16 to probs[t, :] (8-byte stores when kVec; probs 8-byte aligned), reading
// the row backwards so that its most recently read part is still in L2.
template <bool kVec, bool kKeep>
__global__ void forward_rows_kernel(float* logprob, float* entropy, float* lse, bf16* probs,
                                    const float* z, const int32_t* targets, int64_t t0, int64_t V) {
  const int64_t r = blockIdx.x, t = t0 + r;
  const float* zr = z + r * V;
  RowStats a;
  if constexpr (kVec) {
    const auto* z4 = reinterpret_cast<const float4*>(zr);
    const int64_t n4 = V / 4, stride = blockDim.x;
    int64_t i = threadIdx.x;
    for (; i + stride < n4; i += 2 * stride) {  // two loads in flight before the dependent math
      const float4 v0 = z4[i], v1 = z4[i + stride];
      push4(a, v0);
      push4(a, v1);
    }
    if (i < n4) push4(a, z4[i]);
  } else {
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) push1(a, zr[j]);
  }
  a = block_combine(a);
  __shared__ float lse_sh;
  if (threadIdx.x == 0) {
    const float log_se = logf(a.s);
    lse_sh = a.m + log_se;
    if (lse != nullptr) lse[t] = a.m + log_se;
    if (entropy != nullptr) entropy[t] = log_se - a.u / a.s;
    if (logprob != nullptr) {
      const int32_t tg = target_of(targets, t, V);
      logprob[t] = tg >= 0 ? (zr[tg] - a.m) - log_se : 0.0f;
    }
  }
  if constexpr (kKeep) {
    __syncthreads();
    const float lse_t = lse_sh;
    bf16* pr = probs + t * V;
    if constexpr (kVec) {
      const auto* z4 = reinterpret_cast<const float4*>(zr);
      auto* p4 = reinterpret_cast<uint2*>(pr);
      const int64_t n4 = V / 4;
      for (int64_t i = n4 - 1 - threadIdx.x; i >= 0; i -= blockDim.x) {
        const float4 v = z4[i];
        const __nv_bfloat162 lo = __floats2bfloat162_rn(expf(v.x - lse_t), expf(v.y - lse_t));
        const __nv_bfloat162 hi = __floats2bfloat162_rn(expf(v.z - lse_t), expf(v.w - lse_t));
        uint2 out;
        out.x = *reinterpret_cast<const uint32_t*>(&lo);
        out.y = *reinterpret_cast<const uint32_t*>(&hi);
        __stcs(p4 + i, out);  // streaming: p is next read by the backward, keep L2 for z
      }
    } else {
      for (int64_t j = V - 1 - threadIdx.x; j >= 0; j -= blockDim.x) {
        pr[j] = __float2bfloat16_rn(expf(zr[j] - lse_t));
      }
    }
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

// The same d_z from the kept bf16 p (lm_head_forward_keep_probs): log p_j = log(p_j as stored);
// p_j == 0 contributes p_j (log p_j + H) = 0. kVec: 8 bf16 (16 bytes) per load and store
// (V % 8 == 0, probs and dz 16-byte aligned).
__device__ __forceinline__ float dz_from_p(float p, int64_t j, int32_t tg, float dl, float de,
                                           float ent, float inv_temp) {
  float g = -dl * p;
  if (de != 0.0f && p > 0.0f) g -= de * p * (__logf(p) + ent);
  if (j == tg) g += dl;
  return g * inv_temp;
}

template <bool kVec>
__global__ void backward_probs_rows_kernel(bf16* dz, const bf16* probs, const float* d_logprob,
                                           const float* d_entropy, const int32_t* targets,
                                           const float* entropy, int64_t t0, int64_t V,
                                           float inv_temp) {
  const int64_t r = blockIdx.x, t = t0 + r;
  const bf16* pr = probs + t * V;
  bf16* dr = dz + r * V;
  const int32_t tg = target_of(targets, t, V);
  const float dl = (d_logprob != nullptr && tg >= 0) ? d_logprob[t] : 0.0f;
  const float de = d_entropy != nullptr ? d_entropy[t] : 0.0f;
  const float ent = d_entropy != nullptr ? entropy[t] : 0.0f;
  if constexpr (kVec) {
    const auto* p8 = reinterpret_cast<const uint4*>(pr);
    auto* d8 = reinterpret_cast<uint4*>(dr);
    const int64_t n8 = V / 8;
    for (int64_t i = threadIdx.x; i < n8; i += blockDim.x) {
      uint4 in = __ldcs(p8 + i), out;
      const uint32_t* iw = reinterpret_cast<const uint32_t*>(&in);
      uint32_t* ow = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 p = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(iw + k));
        const int64_t j = i * 8 + 2 * k;
        const __nv_bfloat162 o =
            __floats2bfloat162_rn(dz_from_p(p.x, j, tg, dl, de, ent, inv_temp),
                                  dz_from_p(p.y, j + 1, tg, dl, de, ent, inv_temp));
        ow[k] = *reinterpret_cast<const uint32_t*>(&o);
      }
      d8[i] = out;
    }
  } else {
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      dr[j] = __float2bfloat16_rn(dz_from_p(__bfloat162float(pr[j]), j, tg, dl, de, ent, inv_temp));
    }
  }
}

bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// The row kernels of one chunk of n rows starting at token t0 (probs null: no kept p).
void launch_forward_rows(const CudaContext& ctx, float* logprob, float* entropy, float* lse,
                         bf16* probs, const float* z, const int32_t* targets, int64_t t0, int64_t n,
                         int64_t V) {
  const bool vec = V % 4 == 0 && aligned(z, 16) && (probs == nullptr || aligned(probs, 8));
  const auto grid = static_cast<unsigned>(n);
  if (probs == nullptr) {
    if (vec) {
      forward_rows_kernel<true, false>
          <<<grid, kRowThreads, 0, ctx.stream>>>(logprob, entropy, lse, probs, z, targets, t0, V);
    } else {
      forward_rows_kernel<false, false>
          <<<grid, kRowThreads, 0, ctx.stream>>>(logprob, entropy, lse, probs, z, targets, t0, V);
    }
  } else if (vec) {
    forward_rows_kernel<true, true>
        <<<grid, kRowThreads, 0, ctx.stream>>>(logprob, entropy, lse, probs, z, targets, t0, V);
  } else {
    forward_rows_kernel<false, true>
        <<<grid, kRowThreads, 0, ctx.stream>>>(logprob, entropy, lse, probs, z, targets, t0, V);
  }
  VERL_CUDA_CHECK_LAUNCH();
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

// d_h[t0:t0+n] += d_z w and d_w += d_z^T h[t0:t0+n] for one chunk's bf16 d_z [n,V] (null outputs
// skipped).
void chunk_grads(const CudaContext& ctx, bf16* d_h, float* d_w, const bf16* dz, const bf16* hc,
                 const bf16* w, int64_t n, int64_t C, int64_t V, const char* what_dh,
                 const char* what_dw) {
  if (d_h != nullptr) {
    // d_h^T[C,n] += w (col-major [C,V]) d_z^T (col-major [V,n]).
    run_gemm(ctx,
             Gemm{CUBLAS_OP_N, CUBLAS_OP_N, C, n, V, w, C, dz, V, CUDA_R_16BF, d_h, C, CUDA_R_16BF,
                  1.0f},
             what_dh);
  }
  if (d_w != nullptr) {
    // d_w^T[C,V] += h^T (col-major [C,n]) op_T(d_z^T: col-major [V,n]).
    run_gemm(ctx,
             Gemm{CUBLAS_OP_N, CUBLAS_OP_T, C, V, n, hc, C, dz, V, CUDA_R_16BF, d_w, C, CUDA_R_32F,
                  1.0f},
             what_dw);
  }
}

// The forward on caller scratch; probs null: the plain forward, else p is kept there.
void forward_impl(const char* op, const CudaContext& ctx, float* logprob, float* entropy,
                  float* lse, bf16* probs, const bf16* h, const bf16* w, const int32_t* targets,
                  int64_t T, int64_t C, int64_t V, float temperature, int64_t chunk, void* scratch,
                  size_t scratch_bytes) {
  check_args(op, ctx, T, C, V, temperature);
  if (T == 0) return;
  check_scratch(op, scratch, scratch_bytes, lm_head_forward_scratch_bytes(T, V, chunk));
  chunk = normalise_chunk(T, chunk);
  auto* z = static_cast<float*>(scratch);
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = T - t0 < chunk ? T - t0 : chunk;
    chunk_logits(ctx, z, h + t0 * C, w, n, C, V, temperature, "lm_head_forward (logits)");
    launch_forward_rows(ctx, logprob, entropy, lse, probs, z, targets, t0, n, V);
  }
}

void check_backward_probs_args(const CudaContext& ctx, const bf16* probs, const float* d_entropy,
                               const float* entropy, int64_t T, int64_t C, int64_t V,
                               float temperature) {
  check_args("lm_head_backward_from_probs", ctx, T, C, V, temperature);
  VERL_CUDA_REQUIRE(probs != nullptr || T == 0,
                    std::string("lm_head_backward_from_probs: the kept probabilities are null"));
  VERL_CUDA_REQUIRE(
      d_entropy == nullptr || entropy != nullptr,
      std::string("lm_head_backward_from_probs: d_entropy given but the saved entropy is null"));
}

}  // namespace

size_t lm_head_forward_scratch_bytes(int64_t T, int64_t V, int64_t chunk) {
  if (T <= 0 || V <= 0) return 0;
  const auto c = static_cast<size_t>(normalise_chunk(T, chunk));
  return align_up(c * static_cast<size_t>(V) * sizeof(float));
}

size_t lm_head_backward_scratch_bytes(int64_t T, int64_t V, int64_t chunk) {
  if (T <= 0 || V <= 0) return 0;
  return lm_head_forward_scratch_bytes(T, V, chunk) +
         lm_head_backward_from_probs_scratch_bytes(T, V, chunk);
}

size_t lm_head_probs_bytes(int64_t T, int64_t V) {
  if (T <= 0 || V <= 0) return 0;
  return static_cast<size_t>(T) * static_cast<size_t>(V) * sizeof(bf16);
}

size_t lm_head_backward_from_probs_scratch_bytes(int64_t T, int64_t V, int64_t chunk) {
  if (T <= 0 || V <= 0) return 0;
  const auto c = static_cast<size_t>(normalise_chunk(T, chunk));
  return align_up(c * static_cast<size_t>(V) * sizeof(bf16));
}

void lm_head_forward(const CudaContext& ctx, float* logprob, float* entropy, float* lse,
                     const bf16* h, const bf16* w, const int32_t* targets, int64_t T, int64_t C,
                     int64_t V, float temperature, int64_t chunk, void* scratch,
                     size_t scratch_bytes) {
  forward_impl("lm_head_forward", ctx, logprob, entropy, lse, nullptr, h, w, targets, T, C, V,
               temperature, chunk, scratch, scratch_bytes);
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

void lm_head_forward_keep_probs(const CudaContext& ctx, float* logprob, float* entropy, float* lse,
                                bf16* probs, const bf16* h, const bf16* w, const int32_t* targets,
                                int64_t T, int64_t C, int64_t V, float temperature, int64_t chunk,
                                void* scratch, size_t scratch_bytes) {
  VERL_CUDA_REQUIRE(probs != nullptr || T == 0,
                    std::string("lm_head_forward_keep_probs: the probabilities buffer is null"));
  forward_impl("lm_head_forward_keep_probs", ctx, logprob, entropy, lse, probs, h, w, targets, T, C,
               V, temperature, chunk, scratch, scratch_bytes);
}

void lm_head_forward_keep_probs(const CudaContext& ctx, DeviceArena& arena, float* logprob,
                                float* entropy, float* lse, bf16* probs, const bf16* h,
                                const bf16* w, const int32_t* targets, int64_t T, int64_t C,
                                int64_t V, float temperature, int64_t chunk) {
  check_args("lm_head_forward_keep_probs", ctx, T, C, V, temperature);
  if (T == 0) return;
  const size_t bytes = lm_head_forward_scratch_bytes(T, V, chunk);
  lm_head_forward_keep_probs(ctx, logprob, entropy, lse, probs, h, w, targets, T, C, V, temperature,
                             chunk, arena.alloc(bytes), bytes);
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
    chunk_grads(ctx, d_h != nullptr ? d_h + t0 * C : nullptr, d_w, dz, hc, w, n, C, V,
                "lm_head_backward (d_h)", "lm_head_backward (d_w)");
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

void lm_head_backward_from_probs(const CudaContext& ctx, bf16* d_h, float* d_w,
                                 const float* d_logprob, const float* d_entropy, const bf16* probs,
                                 const bf16* h, const bf16* w, const int32_t* targets,
                                 const float* entropy, int64_t T, int64_t C, int64_t V,
                                 float temperature, int64_t chunk, void* scratch,
                                 size_t scratch_bytes) {
  check_backward_probs_args(ctx, probs, d_entropy, entropy, T, C, V, temperature);
  if (T == 0 || (d_h == nullptr && d_w == nullptr)) return;
  if (d_logprob == nullptr && d_entropy == nullptr) return;  // d_z = 0
  check_scratch("lm_head_backward_from_probs", scratch, scratch_bytes,
                lm_head_backward_from_probs_scratch_bytes(T, V, chunk));
  chunk = normalise_chunk(T, chunk);
  auto* dz = static_cast<bf16*>(scratch);
  const float inv_temp = 1.0f / temperature;
  const bool vec = V % 8 == 0 && aligned(probs, 16) && aligned(dz, 16);
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = T - t0 < chunk ? T - t0 : chunk;
    const auto grid = static_cast<unsigned>(n);
    if (vec) {
      backward_probs_rows_kernel<true><<<grid, kRowThreads, 0, ctx.stream>>>(
          dz, probs, d_logprob, d_entropy, targets, entropy, t0, V, inv_temp);
    } else {
      backward_probs_rows_kernel<false><<<grid, kRowThreads, 0, ctx.stream>>>(
          dz, probs, d_logprob, d_entropy, targets, entropy, t0, V, inv_temp);
    }
    VERL_CUDA_CHECK_LAUNCH();
    chunk_grads(ctx, d_h != nullptr ? d_h + t0 * C : nullptr, d_w, dz, h + t0 * C, w, n, C, V,
                "lm_head_backward_from_probs (d_h)", "lm_head_backward_from_probs (d_w)");
  }
}

void lm_head_backward_from_probs(const CudaContext& ctx, DeviceArena& arena, bf16* d_h, float* d_w,
                                 const float* d_logprob, const float* d_entropy, const bf16* probs,
                                 const bf16* h, const bf16* w, const int32_t* targets,
                                 const float* entropy, int64_t T, int64_t C, int64_t V,
                                 float temperature, int64_t chunk) {
  check_backward_probs_args(ctx, probs, d_entropy, entropy, T, C, V, temperature);
  if (T == 0 || (d_h == nullptr && d_w == nullptr)) return;
  if (d_logprob == nullptr && d_entropy == nullptr) return;
  const size_t bytes = lm_head_backward_from_probs_scratch_bytes(T, V, chunk);
  lm_head_backward_from_probs(ctx, d_h, d_w, d_logprob, d_entropy, probs, h, w, targets, entropy, T,
                              C, V, temperature, chunk, arena.alloc(bytes), bytes);
}

}  // namespace verl::ops::cuda
