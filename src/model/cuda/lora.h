// LoRA adapters on the CUDA decoder (model/lora.h's math, PEFT's LoraLayer): each adapted module
// of a projection y [T, N] = x [T, K] W^T adds scale * (x A^T) B^T to its columns of the fused
// output (q|k|v of wqkv, gate|up of wgu), as bf16 GEMMs with fp32 accumulation through the base
// GEMMs' helper (so the numerics mode's guarantees hold for the adapters too), and the backward
// into fp32 adapter gradients. The decoder calls it from its one matmul entry, so the trainer's
// forward and the rollout's step run the same adapter math.
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "model/lora.h"
#include "ops/cuda/device.h"
#include "ops/cuda/ops_cuda.h"

namespace verl::model::cuda {

using ops::cuda::bf16;
using ops::cuda::CudaContext;

// The decoder's four projections of a layer.
enum class LoraSite : int { Qkv, O, Gu, Down };

// A view of adapters on the device: their shapes and places (from a LoraWeights) and the device
// buffers their owner keeps (the adapter training state's bf16 copy and fp32 gradients). Copies
// are cheap and share the buffers.
class CudaLora {
 public:
  explicit CudaLora(const model::LoraWeights& lora);

  // bf16 adapters in the LoraWeights layout's order (the model reads them at every forward).
  void set_weights(const bf16* w) { w_ = w; }
  // fp32 gradients of the same layout that backward accumulates into (null: none wanted).
  void set_grads(float* g) { g_ = g; }
  // false: forward runs the base model alone (no adapter GEMMs) and backward refuses.
  void set_enabled(bool on) { enabled_ = on; }
  const bf16* weights() const { return w_; }
  float* grads() const { return g_; }
  bool enabled() const { return enabled_; }
  bool active() const { return enabled_ && w_ != nullptr; }

  int64_t rank() const { return r_; }
  float scale() const { return scale_; }
  int64_t numel() const { return numel_; }
  int64_t num_layers() const { return static_cast<int64_t>(sites_.size()); }
  // The elements [begin, end) of layer l's adapters in the layout (what its backward finishes).
  std::pair<int64_t, int64_t> layer_range(int l) const {
    return {layer_begin_[static_cast<size_t>(l)], layer_begin_[static_cast<size_t>(l) + 1]};
  }

  // y [T, N] += scale (x A^T) B^T on the columns of each adapted module of layer l's `site`
  // (x [T, K]). u [T, r] is scratch: x A^T rounded to bf16 (as PEFT's bf16 lora_A output), then
  // the second GEMM adds its fp32 sum times scale to y in its epilogue (beta = 1, one rounding).
  void forward(const CudaContext& ctx, int l, LoraSite site, bf16* y, const bf16* x, int64_t T,
               int64_t K, int64_t N, bf16* u) const;
  // For d_y [T, N] of the same projection and g = scale d_y[:, cols], u = x A^T (recomputed):
  //   d_B += g^T u;  d_u = g B;  d_A += d_u^T x;  d_x += d_u A   (d_x bf16 [T, K], accumulated).
  // The A and B gradients accumulate in fp32 into grads() (skipped when null). u, d_u [T, r].
  void backward(const CudaContext& ctx, int l, LoraSite site, bf16* d_x, const bf16* d_y,
                const bf16* x, int64_t T, int64_t K, int64_t N, bf16* u, bf16* d_u) const;

 private:
  // One adapted module: its A and B (element offsets in the layout) and output columns.
  struct Segment {
    int64_t a = 0, b = 0, col0 = 0, cols = 0;
  };
  struct Site {
    std::array<Segment, 3> seg{};
    int count = 0;
  };
  // u [T, r] = x [T, K] A^T (bf16 out, fp32 sum), the same GEMM in forward and backward.
  void x_a(const CudaContext& ctx, bf16* u, const bf16* x, const bf16* a, int64_t T,
           int64_t K) const;
  const Site& site(int l, LoraSite s) const {
    return sites_[static_cast<size_t>(l)][static_cast<size_t>(s)];
  }

  std::vector<std::array<Site, 4>> sites_;  // [layer][site]
  std::vector<int64_t> layer_begin_;        // [L + 1]
  int64_t r_ = 0, numel_ = 0;
  float scale_ = 0.0f;
  const bf16* w_ = nullptr;
  float* g_ = nullptr;
  bool enabled_ = true;
};

}  // namespace verl::model::cuda
