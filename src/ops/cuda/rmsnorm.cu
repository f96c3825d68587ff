// RMSNorm (HF LlamaRMSNorm) over R rows of C, the same math as src/ops/cpu/rmsnorm.cpp:
//   rstd[r] = 1 / sqrt(mean_c x[r,c]^2 + eps),  out[r,c] = w[c] * x[r,c] * rstd[r].
// Backward, with g = d_out and a = rstd[r]:
//   d_x[r,c] += a w[c] g[r,c] - a^3 / C x[r,c] sum_k w[k] g[r,k] x[r,k]
//   d_w[c]   += sum_r g[r,c] x[r,c] a_r
// One block per row for the forward and d_x; d_w is a two-pass column reduction (row chunks ->
// partial sums in the workspace -> chunks added in order), deterministic for a given R and C.
#include "ops/cuda/common.cuh"
#include "ops/cuda/ops_cuda.h"

namespace verl::ops::cuda {

namespace {

using detail::block_sum;
using detail::from_f32;
using detail::to_f32;

constexpr int kRowThreads = 256;

template <typename T>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* x, const T* w, int64_t C,
                                       float eps) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * C;
  T* yr = out + r * C;
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = to_f32(xr[c]);
    ss += v * v;
  }
  ss = block_sum(ss);
  const float a = 1.0f / sqrtf(ss / static_cast<float>(C) + eps);
  if (rstd != nullptr && threadIdx.x == 0) rstd[r] = a;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    yr[c] = from_f32<T>(to_f32(w[c]) * (to_f32(xr[c]) * a));
  }
}

template <typename T>
__global__ void rmsnorm_backward_dx_kernel(T* d_x, const T* d_out, const T* x, const T* w,
                                           const float* rstd, int64_t C) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * C;
  const T* gr = d_out + r * C;
  T* dxr = d_x + r * C;
  const float a = rstd[r];
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    dot += to_f32(w[c]) * to_f32(gr[c]) * to_f32(xr[c]);
  }
  dot = block_sum(dot);
  const float coef = a * a * a * dot / static_cast<float>(C);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = a * to_f32(w[c]) * to_f32(gr[c]) - coef * to_f32(xr[c]);
    dxr[c] = from_f32<T>(to_f32(dxr[c]) + d);
  }
}

// Pass 1 of d_w: block (32 columns x 8 row lanes) sums rows [chunk*rows_per, ...) of its columns.
constexpr int kColTile = 32, kRowLanes = 8;

template <typename T>
__global__ void rmsnorm_dw_partial_kernel(float* partial, const T* d_out, const T* x,
                                          const float* rstd, int64_t R, int64_t C,
                                          int64_t rows_per) {
  __shared__ float tile[kRowLanes][kColTile];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per;
  const int64_t r1 = r0 + rows_per < R ? r0 + rows_per : R;
  float acc = 0.0f;
  if (c < C) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      acc += to_f32(d_out[r * C + c]) * to_f32(x[r * C + c]) * rstd[r];
    }
  }
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float s = 0.0f;
    for (int i = 0; i < kRowLanes; ++i) s += tile[i][threadIdx.x];
    partial[chunk * C + c] = s;
  }
}

// Pass 2: d_w[c] += sum over chunks in order.
__global__ void rmsnorm_dw_final_kernel(float* d_w, const float* partial, int64_t nchunks,
                                        int64_t C) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s = 0.0f;
  for (int64_t k = 0; k < nchunks; ++k) s += partial[k * C + c];
  d_w[c] += s;
}

void check_rows(const char* op, int64_t R, int64_t C) {
  VERL_CUDA_REQUIRE(R >= 0 && C >= 0 && R < (int64_t{1} << 31),
                    detail::shape_str(op, {R, C}) + ": need 0 <= R < 2^31, C >= 0");
}

template <typename T>
void forward_impl(const CudaContext& ctx, T* out, float* rstd, const T* x, const T* w, int64_t R,
                  int64_t C, float eps) {
  check_rows("rmsnorm_forward", R, C);
  if (R == 0 || C == 0) return;
  rmsnorm_forward_kernel<T><<<static_cast<unsigned>(R), kRowThreads, 0, ctx.stream>>>(
      out, rstd, x, w, C, eps);
  VERL_CUDA_CHECK_LAUNCH();
}

template <typename T>
void backward_impl(const CudaContext& ctx, T* d_x, float* d_w, const T* d_out, const T* x,
                   const T* w, const float* rstd, int64_t R, int64_t C) {
  check_rows("rmsnorm_backward", R, C);
  if (R == 0 || C == 0) return;
  if (d_x != nullptr) {
    rmsnorm_backward_dx_kernel<T><<<static_cast<unsigned>(R), kRowThreads, 0, ctx.stream>>>(
        d_x, d_out, x, w, rstd, C);
    VERL_CUDA_CHECK_LAUNCH();
  }
  if (d_w != nullptr) {
    // About 64 rows per chunk, at most 128 chunks, as many as the workspace holds.
    const int64_t fit = static_cast<int64_t>(ctx.workspace_bytes / (sizeof(float) * C));
    int64_t nchunks = detail::ceil_div(R, 64);
    if (nchunks > 128) nchunks = 128;
    if (nchunks > fit) nchunks = fit;
    VERL_CUDA_REQUIRE(nchunks >= 1 && ctx.workspace != nullptr,
                      detail::shape_str("rmsnorm_backward", {R, C}) + ": d_w needs a workspace of "
                          "at least C floats, have " + std::to_string(ctx.workspace_bytes) +
                          " bytes");
    const int64_t rows_per = detail::ceil_div(R, nchunks);
    nchunks = detail::ceil_div(R, rows_per);
    float* partial = static_cast<float*>(ctx.workspace);
    const dim3 grid(static_cast<unsigned>(detail::ceil_div(C, kColTile)),
                    static_cast<unsigned>(nchunks));
    rmsnorm_dw_partial_kernel<T><<<grid, dim3(kColTile, kRowLanes), 0, ctx.stream>>>(
        partial, d_out, x, rstd, R, C, rows_per);
    VERL_CUDA_CHECK_LAUNCH();
    rmsnorm_dw_final_kernel<<<static_cast<unsigned>(detail::ceil_div(C, 256)), 256, 0,
                              ctx.stream>>>(d_w, partial, nchunks, C);
    VERL_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void rmsnorm_forward(const CudaContext& ctx, bf16* out, float* rstd, const bf16* x, const bf16* w,
                     int64_t R, int64_t C, float eps) {
  forward_impl(ctx, out, rstd, x, w, R, C, eps);
}
void rmsnorm_forward(const CudaContext& ctx, float* out, float* rstd, const float* x,
                     const float* w, int64_t R, int64_t C, float eps) {
  forward_impl(ctx, out, rstd, x, w, R, C, eps);
}
void rmsnorm_backward(const CudaContext& ctx, bf16* d_x, float* d_w, const bf16* d_out,
                      const bf16* x, const bf16* w, const float* rstd, int64_t R, int64_t C) {
  backward_impl(ctx, d_x, d_w, d_out, x, w, rstd, R, C);
}
void rmsnorm_backward(const CudaContext& ctx, float* d_x, float* d_w, const float* d_out,
                      const float* x, const float* w, const float* rstd, int64_t R, int64_t C) {
  backward_impl(ctx, d_x, d_w, d_out, x, w, rstd, R, C);
}

}  // namespace verl::ops::cuda
