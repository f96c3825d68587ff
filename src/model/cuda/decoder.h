// The decoder's layer math on CUDA, written once for both of its callers: the trainer's packed
// forward (CudaTransformer: varlen batches, activations kept for backward) and the rollout's paged
// step (rollout::cuda::CudaModelRunner: a paged KV cache, captured in CUDA graphs). Per layer:
//   xn1 = rmsnorm(x);  q|k|v = project(xn1, Wqkv) (+ bqkv);  [Qwen3: q, k = rmsnorm_D(q, k)]
//   q, k = rope(q), rope(k)  (paged: k, v written to the cache in the same kernel)
//   att = attention(q, k, v)  (packed: varlen causal; paged: over the cache, per numerics mode)
//   x_mid = x + project(att, Wo) (+ bo);  xn2 = rmsnorm(x_mid)
//   x_out = x_mid + ffn(xn2)  (dense: project(silu(g) * u, Wdown), g|u = project(xn2, Wgu))
// then the final norm and the LM head (logits for given rows, or log-probs of targets). A layer's
// backward (the trainer's) sits beside its forward. project is the one matmul entry: the base GEMM
// (bf16 or a quantised set) plus, with LoRA, the adapters' GEMMs (model/cuda/lora.h), the same in
// both contexts.
//
// The decoder holds no device memory: every buffer is the caller's (its arena), so the paged step
// stays capturable (no allocation, no host sync, no host branch on data that changes between
// replays). The two contexts run different kernels where that was measured to pay (the rollout's
// fused add + norm and fused q/k norm + RoPE + KV write); each path's kernels and their order are
// the ones the trainer and the runner ran before they shared this file.
#pragma once

#include <array>
#include <cstdint>

#include "core/numerics.h"
#include "model/config.h"
#include "model/cuda/lora.h"
#include "model/cuda/quantized_linears.h"
#include "model/weights.h"
#include "ops/cuda/device.h"
#include "ops/cuda/ops_cuda.h"
#include "ops/cuda/paged_attention.h"
#include "ops/cuda/quant_linear.h"
#include "ops/cuda/section_timer.h"

namespace verl::model::cuda {

using ops::cuda::bf16;
using ops::cuda::CudaContext;

// Where a forward's GPU time goes, for a SectionTimer. Each caller names the sections (its
// benchmarks report the names); a null name marks nothing.
enum class Section : int {
  Embed,
  AttnNorm,
  QkvProj,
  QkRope,  // split / q,k norm / RoPE (paged: + KV write); the norm inside is QkNorm
  QkNorm,
  Attention,
  OProj,
  Residual,  // the packed path's residual adds
  MlpNorm,
  GateUp,
  Swiglu,
  Down,
  FinalNorm,
  LmHead,
  // Backward (the packed path only), by op family.
  MemsetBwd,
  GemmBwd,
  ElementwiseBwd,
  AttentionBwd,
  NormBwd,
  kCount
};
using SectionNames = std::array<const char*, static_cast<size_t>(Section::kCount)>;

// How a decoder computes: the GEMMs' numerics (core/numerics.h; the stronger of this and the
// context's applies) and an optional quantised set for the linear layers (forward only).
struct CudaDecoderOptions {
  Numerics numerics = Numerics::Fast;
  // Each layer's wqkv, wo, wgu and wdown from this set (ops/cuda/quant_linear.h) instead of the
  // weights. Alive while forwards run; asleep is allowed between them.
  const QuantizedLinears* quantized = nullptr;
  // At most this many tokens take the fused quantised kernel; more dequantise into the step's
  // quant_scratch and run cuBLASLt.
  int64_t quant_fused_max_tokens = ops::cuda::kQuantFusedMaxTokens;
  // LoRA adapters on the projections (model/cuda/lora.h), applied while lora->active(); the
  // caller's, alive while forwards run. Not with a quantised set.
  const CudaLora* lora = nullptr;
};

// The paged KV cache of a rollout step and how its attention runs. The cache holds per layer K and
// V [num_blocks * block_size, Hkv, D]; layer l's K starts at k + l * layer_stride, its V at v + l *
// layer_stride.
struct PagedKv {
  bf16 *k = nullptr, *v = nullptr;
  int64_t layer_stride = 0;  // elements
  int64_t block_size = 0;
  const int32_t* slots = nullptr;         // [T] cache slot of each token's K, V (-1: not written)
  const int32_t* block_tables = nullptr;  // [B, W]
  int64_t W = 0;
  // The paged kernels to launch (paged_attention.h); items that the two flags below hand to the
  // training kernel's arithmetic (attention_forward_paged) are left out of it.
  ops::cuda::PagedAttentionPlan plan;
  // Decode items (one query token) / prefill chunks on attention_forward_paged: the trainer's bits
  // row for row (the runner's numerics choices, CudaRunnerOptions).
  bool training_decode = false, training_prefill = false;
  void* workspace = nullptr;  // split-K decode partials (paged_attention_workspace_bytes)
  size_t workspace_bytes = 0;
};

// One forward's batch, as device pointers the caller owns: T tokens in B sequences (items).
struct DecoderStep {
  int64_t T = 0, B = 0;
  const int32_t* ids = nullptr;         // [T] token ids
  const int32_t* positions = nullptr;   // [T]
  const int32_t* cu_seqlens = nullptr;  // [B + 1]
  const float* inv_freq = nullptr;      // [D/2] RoPE frequencies (model::rope_inv_freq)
  bf16* qkv = nullptr;                  // [T, qd + 2 kvd] scratch: the fused projection
  bf16* quant_scratch = nullptr;   // a dequantised matrix (quantised sets over the fused limit)
  bf16* lora_u = nullptr;          // [T, r] scratch of the adapters' x A^T (with LoRA)
  const PagedKv* paged = nullptr;  // null: packed varlen attention over the step's own k, v
  ops::cuda::SectionTimer* timer = nullptr;  // profiling (null: off)
  const SectionNames* names = nullptr;
};

// One layer's activations. The packed path keeps them for backward (a set per layer, or one
// shared set); the paged path has one set for all layers and leaves what only backward reads null
// (rstd*, lse, q_pre, k_pre) as well as k and v, which go to the cache.
struct LayerActs {
  bf16 *xn1 = nullptr, *q_pre = nullptr, *k_pre = nullptr, *q = nullptr, *k = nullptr, *v = nullptr,
       *att = nullptr, *x_mid = nullptr, *xn2 = nullptr, *gu = nullptr, *act = nullptr;
  float *rstd1 = nullptr, *rstd_q = nullptr, *rstd_k = nullptr, *lse = nullptr, *rstd2 = nullptr;
  // Paged only: a block's output [T, C] waiting to join the residual stream inside the next norm.
  bf16* y = nullptr;
};

// A layer backward's activation gradients and scratch (the trainer's arena), reused by every
// layer: d_x carries dL/dx from one layer to the one below.
struct LayerGradBufs {
  bf16 *d_x = nullptr, *d_xn = nullptr, *d_act = nullptr, *d_gu = nullptr, *d_att = nullptr;
  float *d_q = nullptr, *d_k = nullptr, *d_v = nullptr;  // [T, qd], [T, kvd] x 2, accumulated
  // Qwen3's q/k norm: the rotated gradients in bf16 and the gradients before the norm.
  bf16 *d_q_bf = nullptr, *d_k_bf = nullptr, *d_qpre = nullptr, *d_kpre = nullptr;
  bf16* d_lora_u = nullptr;  // [T, r] the adapters' d_u (with LoRA)
};

class CudaDecoder {
 public:
  // `weights`: bf16, flat in `layout` order, alive and unchanged while forwards run.
  CudaDecoder(const CudaContext& ctx, const model::ModelConfig& cfg,
              const model::ParamLayout& layout, const bf16* weights,
              const CudaDecoderOptions& options = {});

  // The context every op runs in (the options' numerics applied).
  const CudaContext& ctx() const { return ctx_; }
  const model::ModelConfig& config() const { return cfg_; }
  void set_weights(const bf16* weights) { w_ = weights; }
  const bf16* weight(int param) const {
    return param >= 0 ? w_ + layout_.params[param].offset : nullptr;
  }
  // The LM head's matrix (the embedding when tied).
  int lm_head_param() const { return layout_.lm_head >= 0 ? layout_.lm_head : layout_.embed; }

  // x [T, C] = the embedding rows of the step's ids.
  void embed(const DecoderStep& s, bf16* x) const;
  // Layer l. Packed: reads x_in, writes a and x_out (x_out distinct from x_in); full = false stops
  // before the down projection (backward's recompute needs the activations, not the output).
  // Paged: x_in == x_out is the residual stream, updated in place: the previous layer's a.y joins
  // it inside this layer's first norm (l > 0), and this layer leaves its output in a.y.
  void layer_forward(const DecoderStep& s, int l, LayerActs& a, const bf16* x_in, bf16* x_out,
                     bool full = true) const;
  // Packed: layer l's backward over the activations a its forward kept (x_in: the layer's input;
  // the step's qkv scratch holds d_qkv). On entry g.d_x = dL/dx_out, on return dL/dx_in; the
  // parameters' gradients accumulate into `grads` (fp32, the layout's order; null: a frozen base,
  // whose weight-gradient GEMMs are skipped) and the adapters' into their own (CudaLora).
  void layer_backward(const DecoderStep& s, int l, const LayerActs& a, const bf16* x_in,
                      const LayerGradBufs& g, float* grads) const;
  // Packed: h [T, C] = rmsnorm(x) with its rstd [T].
  void final_norm(const DecoderStep& s, bf16* h, float* rstd, const bf16* x) const;
  // Paged, only the n rows `rows` [n] (device) of the stream x plus the last layer's y: gathered
  // into gx, gy [n, C] (x becomes gx + gy), h [n, C] = rmsnorm(gx + gy).
  void final_norm_rows(const DecoderStep& s, bf16* h, bf16* gx, bf16* gy, const bf16* x,
                       const bf16* y, const int32_t* rows, int64_t n) const;
  // logits [n, V] fp32 = h W_lm^T for h [n, C].
  void lm_head_logits(float* logits, const bf16* h, int64_t n) const;
  // The fused LM-head op (ops/cuda/lm_head.h) on h [n, C]: log-probs of targets at `temperature`
  // (entropy, lse optional); with probs it also keeps softmax(z) bf16 [n, V] for the backward.
  void lm_head_logprobs(float* logprob, float* entropy, float* lse, bf16* probs, const bf16* h,
                        const int32_t* targets, int64_t n, float temperature, int64_t chunk,
                        void* scratch, size_t scratch_bytes) const;
  // Scratch bytes of lm_head_logprobs over n rows, chunk rows at a time.
  size_t lm_head_scratch_bytes(int64_t n, int64_t chunk) const;
  // Token / sequence classification heads: values [n, num_labels] fp32 from h [n, C].
  void value_head(float* values, const bf16* h, int64_t n) const;

  // The whole paged step: embedding, layers, final norm of the n sampled rows and their logits.
  // x, gx, gy, h and logits as above; a is the one activation set.
  void forward_paged(const DecoderStep& s, LayerActs& a, bf16* x, const int32_t* rows, int64_t n,
                     bf16* gx, bf16* gy, bf16* h, float* logits) const;

 private:
  // y [T, N] = x [T, K] W^T (+ b) (+ layer l's adapters on `site`): the one matmul entry of the
  // layers. bf16 cuBLASLt over the weights, or the quantised matrix q of the layer's set.
  void project(const DecoderStep& s, bf16* y, const bf16* x, int w,
               const ops::cuda::QuantMatrixView* q, int b, int64_t K, int64_t N, int l,
               LoraSite site) const;
  // Its backward: d_x [T, K] = d_y W (overwritten) plus the adapters' part; the base's d_W and
  // d_b into `grads` (skipped when null), the adapters' gradients into theirs.
  void project_backward(const DecoderStep& s, const LayerGradBufs& g, bf16* d_x, float* grads,
                        const bf16* d_y, const bf16* x, int w, int b, int64_t K, int64_t N, int l,
                        LoraSite site) const;
  void attention(const DecoderStep& s, int l, LayerActs& a) const;
  void mark(const DecoderStep& s, Section section) const {
    if (s.timer != nullptr && s.names != nullptr) {
      const char* name = (*s.names)[static_cast<size_t>(section)];
      if (name != nullptr) s.timer->mark(ctx_.stream, name);
    }
  }

  CudaContext ctx_;
  model::ModelConfig cfg_;
  model::ParamLayout layout_;
  const bf16* w_;
  CudaDecoderOptions opts_;
};

// VERL_DUMP (core/dump.h): downloads a [rows, cols] bf16 / fp32 device tensor (fp32 with cols =
// 0: a vector [rows]) under `name`, prefixed "L<layer>." for layer >= 0. Synchronous.
void dump_tensor(const char* name, int64_t layer, const bf16* x, int64_t rows, int64_t cols);
void dump_tensor(const char* name, int64_t layer, const float* x, int64_t rows, int64_t cols);

}  // namespace verl::model::cuda
