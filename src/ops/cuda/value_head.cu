// The token-classification (value) head: see value_head.h.
//   forward   one warp per token: NL dot products over C, lanes strided over C, a fixed shuffle
//   tree d_h       one thread per (t, c): sum over the NL labels in order d_w, d_b  pass 1: block
//   (32 columns x 8 row lanes) per (column tile, row chunk) sums its chunk
//             of d_values[t,n] h[t,c] into partial[chunk, n, c]; pass 2 adds the chunks in order
#include "ops/cuda/common.cuh"
#include "ops/cuda/value_head.h"

namespace verl::ops::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kMaxLabels = 16;  // per-warp accumulators; larger heads are rejected
constexpr int kCols = 32, kLanes = 8;

__global__ void value_forward_kernel(float* values, const bf16* h, const bf16* w, const bf16* b,
                                     int64_t T, int64_t C, int64_t NL) {
  const int lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (t >= T) return;
  float acc[kMaxLabels];
  for (int n = 0; n < kMaxLabels; ++n) acc[n] = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    const float x = __bfloat162float(h[t * C + c]);
    for (int n = 0; n < NL; ++n) acc[n] += x * __bfloat162float(w[n * C + c]);
  }
  for (int n = 0; n < NL; ++n) {
    float s = acc[n];
    for (int off = 16; off > 0; off >>= 1) s += __shfl_down_sync(0xffffffffu, s, off);
    if (lane == 0) values[t * NL + n] = s + (b != nullptr ? __bfloat162float(b[n]) : 0.0f);
  }
}

__global__ void value_dh_kernel(bf16* d_h, const float* d_values, const bf16* w, int64_t T,
                                int64_t C, int64_t NL) {
  const int64_t total = T * C;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / C, c = i - t * C;
    float s = __bfloat162float(d_h[i]);
    for (int64_t n = 0; n < NL; ++n) s += d_values[t * NL + n] * __bfloat162float(w[n * C + c]);
    d_h[i] = __float2bfloat16_rn(s);
  }
}

// partial[chunk][n][c] (c < C) and partial[chunk][n][C] (the bias column) for label n = blockIdx.z.
__global__ void value_dw_partial_kernel(float* partial, const float* d_values, const bf16* h,
                                        int64_t T, int64_t C, int64_t NL, int64_t rows_per) {
  __shared__ float tile[kLanes][kCols];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kCols + threadIdx.x;  // c == C: bias
  const int64_t n = blockIdx.z, chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per;
  const int64_t r1 = r0 + rows_per < T ? r0 + rows_per : T;
  float s = 0.0f;
  if (c <= C) {
    for (int64_t t = r0 + threadIdx.y; t < r1; t += kLanes) {
      const float g = d_values[t * NL + n];
      s += c < C ? g * __bfloat162float(h[t * C + c]) : g;
    }
  }
  tile[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c <= C) {
    float total = 0.0f;
    for (int i = 0; i < kLanes; ++i) total += tile[i][threadIdx.x];
    partial[(chunk * NL + n) * (C + 1) + c] = total;
  }
}

__global__ void value_dw_final_kernel(float* d_w, float* d_b, const float* partial, int64_t chunks,
                                      int64_t C, int64_t NL) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // n * (C+1) + c
  if (i >= NL * (C + 1)) return;
  float s = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) s += partial[k * NL * (C + 1) + i];
  const int64_t n = i / (C + 1), c = i - n * (C + 1);
  if (c < C) {
    if (d_w != nullptr) d_w[n * C + c] += s;
  } else if (d_b != nullptr) {
    d_b[n] += s;
  }
}

void check(const char* op, int64_t T, int64_t C, int64_t NL) {
  VERL_CUDA_REQUIRE(T >= 0 && C >= 1 && NL >= 1 && NL <= kMaxLabels,
                    detail::shape_str(op, {T, C, NL}) +
                        ": need T >= 0, C >= 1, 1 <= NL <= " + std::to_string(kMaxLabels));
}

}  // namespace

void value_head_forward(const CudaContext& ctx, float* values, const bf16* h, const bf16* w,
                        const bf16* b, int64_t T, int64_t C, int64_t NL) {
  check("value_head_forward", T, C, NL);
  if (T == 0) return;
  const auto blocks = static_cast<unsigned>(detail::ceil_div(T, kWarpsPerBlock));
  value_forward_kernel<<<blocks, 32 * kWarpsPerBlock, 0, ctx.stream>>>(values, h, w, b, T, C, NL);
  VERL_CUDA_CHECK_LAUNCH();
}

void value_head_backward(const CudaContext& ctx, bf16* d_h, float* d_w, float* d_b,
                         const float* d_values, const bf16* h, const bf16* w, int64_t T, int64_t C,
                         int64_t NL) {
  check("value_head_backward", T, C, NL);
  if (T == 0) return;
  if (d_h != nullptr) {
    value_dh_kernel<<<detail::grid_for(T * C, 256), 256, 0, ctx.stream>>>(d_h, d_values, w, T, C,
                                                                          NL);
    VERL_CUDA_CHECK_LAUNCH();
  }
  if (d_w == nullptr && d_b == nullptr) return;
  const int64_t per_chunk = NL * (C + 1);
  const int64_t fit = static_cast<int64_t>(ctx.workspace_bytes / (sizeof(float) * per_chunk));
  int64_t chunks = detail::ceil_div(T, 64);
  if (chunks > 256) chunks = 256;
  if (chunks > fit) chunks = fit;
  VERL_CUDA_REQUIRE(chunks >= 1 && ctx.workspace != nullptr,
                    detail::shape_str("value_head_backward", {T, C, NL}) +
                        ": d_w needs a workspace of at least NL*(C+1) floats");
  const int64_t rows_per = detail::ceil_div(T, chunks);
  chunks = detail::ceil_div(T, rows_per);
  float* partial = static_cast<float*>(ctx.workspace);
  const dim3 grid(static_cast<unsigned>(detail::ceil_div(C + 1, kCols)),
                  static_cast<unsigned>(chunks), static_cast<unsigned>(NL));
  value_dw_partial_kernel<<<grid, dim3(kCols, kLanes), 0, ctx.stream>>>(partial, d_values, h, T, C,
                                                                        NL, rows_per);
  VERL_CUDA_CHECK_LAUNCH();
  value_dw_final_kernel<<<static_cast<unsigned>(detail::ceil_div(per_chunk, 256)), 256, 0,
                          ctx.stream>>>(d_w, d_b, partial, chunks, C, NL);
  VERL_CUDA_CHECK_LAUNCH();
}

}  // namespace verl::ops::cuda
