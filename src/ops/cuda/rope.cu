// Rotary position embedding, HF "rotate_half" layout, the same math as src/ops/cpu/rope.cpp:
//   a = pos[t] * inv_freq[i] (fp32, i < D/2),
//   x'[i] = x[i] cos a - x[i+D/2] sin a,  x'[i+D/2] = x[i+D/2] cos a + x[i] sin a.
// The backward is the rotation by -a applied to the gradient. rope_forward/backward overwrite
// their buffer in place; split_qkv_rope and rope_backward_pack_qkv (glue.h) run the same kernel
// with the q|k|v split or pack folded into its loads and stores, so they give the same bits as
// the two-step sequences (fp32 math, one rounding per output).
//
// One kernel for all four: a block takes a few tokens, computes their cos/sin once into shared
// memory (D/2 sincosf per token, shared by every head), then its threads walk the tokens' work
// items: a pair of V-element packs (i, i+D/2) of one head, rotated, or a pack of the v part,
// copied. sincosf is the accurate one (no fast-math); products are spelled with _rn intrinsics.
#include <type_traits>

#include "ops/cuda/common.cuh"
#include "ops/cuda/glue.h"
#include "ops/cuda/ops_cuda.h"
#include "ops/cuda/vec.cuh"

namespace verl::ops::cuda {

namespace {

using detail::Vec;
using detail::vload;
using detail::vstore;

// A part of each token's row: `n` heads of D to rotate, or (the copy part) n elements.
template <typename TI, typename TO>
struct Part {
  const TI* src = nullptr;
  TO* dst = nullptr;
  int64_t src_stride = 0, dst_stride = 0;  // elements from one token to the next
  int n = 0;
};

template <typename TI, typename TO>
struct RopeArgs {
  Part<TI, TO> q, k, v;  // q and k are rotated, v is copied (n counts packs in the kernel)
  const int32_t* pos;
  const float* inv_freq;
  int64_t T;
  int half, nch;  // D/2 and the packs per half head
  int tokens_per_block;
  float sign;  // +1 forward, -1 backward
};

constexpr int kThreads = 256;

template <typename TI, typename TO, int V>
__global__ void rope_rows_kernel(RopeArgs<TI, TO> p) {
  extern __shared__ __align__(16) float cs[];  // [tokens_per_block][half] cos, then as many sin
  const int half = p.half, tb = p.tokens_per_block;
  float* cos_s = cs;
  float* sin_s = cs + tb * half;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * tb;
  const int ntok = static_cast<int>(p.T - t0 < tb ? p.T - t0 : tb);

  for (int idx = threadIdx.x; idx < ntok * half; idx += blockDim.x) {
    const int tt = idx / half, i = idx - tt * half;
    const float a = __fmul_rn(static_cast<float>(p.pos[t0 + tt]), p.inv_freq[i]);
    float s, c;
    sincosf(a, &s, &c);
    cos_s[idx] = c;
    sin_s[idx] = p.sign * s;
  }
  __syncthreads();

  const int uq = p.q.n * p.nch, urot = uq + p.k.n * p.nch, units = urot + p.v.n;
  for (int idx = threadIdx.x; idx < ntok * units; idx += blockDim.x) {
    const int tt = idx / units;
    int u = idx - tt * units;
    const int64_t t = t0 + tt;
    if (u < urot) {
      // Fields picked one by one: a reference to p.q / p.k would copy p to local memory.
      const bool is_q = u < uq;
      if (!is_q) u -= uq;
      const int h = u / p.nch, j = u - h * p.nch;
      const int64_t off = static_cast<int64_t>(h) * 2 * half + j * V;
      const TI* src =
          (is_q ? p.q.src : p.k.src) + t * (is_q ? p.q.src_stride : p.k.src_stride) + off;
      TO* dst = (is_q ? p.q.dst : p.k.dst) + t * (is_q ? p.q.dst_stride : p.k.dst_stride) + off;
      const Vec<TI, V> x1 = vload<TI, V>(src), x2 = vload<TI, V>(src + half);
      const Vec<float, V> c = vload<float, V>(cos_s + tt * half + j * V);
      const Vec<float, V> s = vload<float, V>(sin_s + tt * half + j * V);
      Vec<TO, V> y1, y2;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float a = x1.f(i), b = x2.f(i);
        y1.set(i, __fmaf_rn(a, c.e[i], -__fmul_rn(b, s.e[i])));
        y2.set(i, __fmaf_rn(b, c.e[i], __fmul_rn(a, s.e[i])));
      }
      vstore(dst, y1);
      vstore(dst + half, y2);
    } else {
      const int64_t off = static_cast<int64_t>(u - urot) * V;
      const Vec<TI, V> x = vload<TI, V>(p.v.src + t * p.v.src_stride + off);
      vstore(p.v.dst + t * p.v.dst_stride + off, detail::vconvert<TO, TI, V>(x));
    }
  }
}

template <typename TI, typename TO>
bool part_ok(const Part<TI, TO>& part, int v) {
  return detail::vec_aligned(part.src, v) && detail::vec_aligned(part.dst, v) &&
         part.src_stride % v == 0 && part.dst_stride % v == 0;
}

// q, k: n = heads; v: n = elements. Checks the shape, picks the pack width and launches.
template <typename TI, typename TO>
void launch_rope(const char* op, const CudaContext& ctx, Part<TI, TO> q, Part<TI, TO> k,
                 Part<TI, TO> v, const int32_t* pos, const float* inv_freq, int64_t T, int64_t D,
                 float sign) {
  const int half = static_cast<int>(D / 2);
  VERL_CUDA_REQUIRE(
      D % 2 == 0 && half <= 4096,
      std::string(op) + ": head dim D = " + std::to_string(D) + ", need D even and <= 8192");
  const int64_t width = (static_cast<int64_t>(q.n) + k.n) * D + v.n;
  VERL_CUDA_REQUIRE(T < (int64_t{1} << 31),
                    std::string(op) + ": T = " + std::to_string(T) + ", need T < 2^31");
  if (T == 0 || D == 0 || width == 0) return;
  const int vec = detail::pick_vec(
      [&](int w) { return half % w == 0 && part_ok(q, w) && part_ok(k, w) && part_ok(v, w); });
  detail::dispatch_vec(vec, [&](auto vc) {
    constexpr int V = decltype(vc)::value;
    RopeArgs<TI, TO> a{q, k, v, pos, inv_freq, T, half, half / V, 1, sign};
    a.v.n = v.n / V;
    const int64_t units = (static_cast<int64_t>(q.n) + k.n) * a.nch + a.v.n;
    // About four work items per thread and at most 32 KiB of cos/sin per block.
    int64_t tb = detail::ceil_div(4 * kThreads, units);
    if (tb * half > 4096) tb = half > 0 ? 4096 / half : tb;
    if (tb > T) tb = T;
    if (tb < 1) tb = 1;
    a.tokens_per_block = static_cast<int>(tb);
    const size_t smem = sizeof(float) * 2 * static_cast<size_t>(tb) * half;
    rope_rows_kernel<TI, TO, V>
        <<<static_cast<unsigned>(detail::ceil_div(T, tb)), kThreads, smem, ctx.stream>>>(a);
  });
  VERL_CUDA_CHECK_LAUNCH();
}

template <typename T>
void rope_impl(const char* op, const CudaContext& ctx, T* x, const int32_t* pos,
               const float* inv_freq, int64_t T_, int64_t nh, int64_t D, float sign) {
  VERL_CUDA_REQUIRE(T_ >= 0 && nh >= 0 && D >= 0 && D % 2 == 0,
                    detail::shape_str(op, {T_, nh, D}) + ": the head dim D must be even");
  VERL_CUDA_REQUIRE(nh * D < (int64_t{1} << 30),
                    detail::shape_str(op, {T_, nh, D}) + ": need nh D < 2^30");
  const Part<T, T> q{x, x, nh * D, nh * D, static_cast<int>(nh)};
  launch_rope<T, T>(op, ctx, q, Part<T, T>{}, Part<T, T>{}, pos, inv_freq, T_, D, sign);
}

void check_qkv(const char* op, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  VERL_CUDA_REQUIRE(
      T >= 0 && H >= 0 && Hkv >= 0 && D >= 0 && D % 2 == 0 &&
          (H + 2 * Hkv) * D < (int64_t{1} << 30),
      detail::shape_str(op, {T, H, Hkv, D}) + ": need sizes >= 0, D even and (H + 2 Hkv) D < 2^30");
}

}  // namespace

void rope_forward(const CudaContext& ctx, bf16* x, const int32_t* pos, const float* inv_freq,
                  int64_t T, int64_t nh, int64_t D) {
  rope_impl("rope_forward", ctx, x, pos, inv_freq, T, nh, D, 1.0f);
}
void rope_forward(const CudaContext& ctx, float* x, const int32_t* pos, const float* inv_freq,
                  int64_t T, int64_t nh, int64_t D) {
  rope_impl("rope_forward", ctx, x, pos, inv_freq, T, nh, D, 1.0f);
}
void rope_backward(const CudaContext& ctx, bf16* d_x, const int32_t* pos, const float* inv_freq,
                   int64_t T, int64_t nh, int64_t D) {
  rope_impl("rope_backward", ctx, d_x, pos, inv_freq, T, nh, D, -1.0f);
}
void rope_backward(const CudaContext& ctx, float* d_x, const int32_t* pos, const float* inv_freq,
                   int64_t T, int64_t nh, int64_t D) {
  rope_impl("rope_backward", ctx, d_x, pos, inv_freq, T, nh, D, -1.0f);
}

void split_qkv_rope(const CudaContext& ctx, bf16* q, bf16* k, bf16* v, const bf16* qkv,
                    const int32_t* pos, const float* inv_freq, int64_t T, int64_t H, int64_t Hkv,
                    int64_t D) {
  check_qkv("split_qkv_rope", T, H, Hkv, D);
  const int64_t qd = H * D, kvd = Hkv * D, W = qd + 2 * kvd;
  using P = Part<bf16, bf16>;
  launch_rope<bf16, bf16>("split_qkv_rope", ctx, P{qkv, q, W, qd, static_cast<int>(H)},
                          P{qkv + qd, k, W, kvd, static_cast<int>(Hkv)},
                          P{qkv + qd + kvd, v, W, kvd, static_cast<int>(kvd)}, pos, inv_freq, T, D,
                          1.0f);
}

void rope_backward_pack_qkv(const CudaContext& ctx, bf16* d_qkv, const float* d_q, const float* d_k,
                            const float* d_v, const int32_t* pos, const float* inv_freq, int64_t T,
                            int64_t H, int64_t Hkv, int64_t D) {
  check_qkv("rope_backward_pack_qkv", T, H, Hkv, D);
  const int64_t qd = H * D, kvd = Hkv * D, W = qd + 2 * kvd;
  using P = Part<float, bf16>;
  launch_rope<float, bf16>("rope_backward_pack_qkv", ctx, P{d_q, d_qkv, qd, W, static_cast<int>(H)},
                           P{d_k, d_qkv + qd, kvd, W, static_cast<int>(Hkv)},
                           P{d_v, d_qkv + qd + kvd, kvd, W, static_cast<int>(kvd)}, pos, inv_freq,
                           T, D, -1.0f);
}

}  // namespace verl::ops::cuda
