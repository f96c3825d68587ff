// The decoder-only causal LM (Llama / Qwen2 / Qwen3) and its token-classification variant (the
// critic) on CUDA: the same steps as the CPU model (src/model/cpu/decoder.cpp, its oracle), its
// forward through the CUDA decoder the rollout runs too (model/cuda/decoder.h), its backward here;
// bf16 activations with fp32 accumulation (docs/cuda.md). It computes over weights and gradients
// it is handed: bf16 weights flat in the layout's order and fp32 gradients of the same layout
// (optim/cuda/train_state.h owns both, with the master weights and the AdamW moments); the model
// owns only its activations.
//
// All activations and scratch come from one DeviceArena planned at construction for max_tokens
// tokens and max_seqs sequences, so forward / backward never call cudaMalloc. Everything is
// enqueued on the context's stream; downloads synchronise.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/numerics.h"
#include "model/batch.h"
#include "model/config.h"
#include "model/cuda/decoder.h"
#include "model/cuda/quantized_linears.h"
#include "model/weights.h"
#include "ops/cuda/device.h"
#include "ops/cuda/ops_cuda.h"
#include "ops/cuda/section_timer.h"

namespace verl::model::cuda {

using ops::cuda::bf16;
using ops::cuda::CudaContext;

// A range of the flat gradient buffer that a backward has finished writing for its micro-batch
// (elements [begin, end) of the layout): a layer's parameters, the head's, the embedding's. Data
// parallelism reduces gradient buckets from here while backward goes on.
struct GradRange {
  int64_t begin = 0, end = 0;
  int layer = -1;  // the layer, or -1 for the head (final norm + LM/value head) and the embedding
};
using GradReadyHook = std::function<void(const GradRange&)>;

// How a CudaTransformer is planned. max_tokens / max_seqs bound every forward's packed batch; the
// arena is sized for them once.
struct CudaTransformerOptions {
  int64_t max_tokens = 0;
  int64_t max_seqs = 0;
  int64_t lm_head_chunk = 4096;  // token rows of fp32 logits alive at once in the LM head
  // false: a forward-only model (a reference policy, a log-prob pass): no gradients, and the
  // layers share one activation buffer set.
  bool trainable = true;
  // Activation recomputation (actor_rollout_ref.model.enable_gradient_checkpointing): the forward
  // keeps only each layer's input; backward recomputes the layer's activations into one shared
  // buffer set before differentiating it. Trades one extra forward of the layers for memory.
  bool recompute = false;
  // Trainable models only: the LM head's forward keeps p = softmax(z) as bf16 [max_tokens, V] in
  // the arena (T x V x 2 bytes: 2.5 GB at 8192 tokens x 151936) and the backward forms d_z from it
  // (lm_head_backward_from_probs), saving the backward's logits GEMM and its fp32 logits read; p's
  // bf16 storage adds an error of about 2^-8 of the p-terms to d_z (lm_head.h). false: the
  // backward recomputes the logits (less memory).
  bool lm_head_keep_probs = true;
  // The GEMMs' numerics (core/numerics.h, CudaContext::numerics). BatchInvariant: a token's
  // log-prob does not depend on the batch it is computed in, so it equals a batch-invariant
  // rollout's bit for bit; MatchTrainer: forward GEMMs that never split k, as the matching
  // rollout's.
  Numerics numerics = Numerics::Fast;
  // Forward-only models: each layer's wqkv, wo, wgu and wdown come from this quantised set
  // (ops/cuda/quant_linear.h) instead of the weights, whose layout then gives those parameters no
  // space (the caller's choice; they are never read). Alive and unchanged while the model runs;
  // asleep is allowed between forwards. Quantised models are not batch-invariant: the kernel and
  // its k split depend on the batch's token count.
  const QuantizedLinears* quantized = nullptr;
  // The quantised matmuls' path choice (quant_linear.h): at most this many tokens take the fused
  // kernel, more dequantise into a bf16 scratch of one matrix (planned in the arena when
  // max_tokens is above it) and run cuBLASLt.
  int64_t quant_fused_max_tokens = ops::cuda::kQuantFusedMaxTokens;
  // LoRA (model/cuda/lora.h): the adapters every projection adds while lora->active(), the
  // caller's, alive while the model runs. A trainable model then may take null base gradients (a
  // frozen base: backward writes only the adapters' gradients, lora->grads(), and skips the base's
  // weight-gradient GEMMs); its gradient-ready ranges are then the adapter layout's, per layer.
  const CudaLora* lora = nullptr;
};

class CudaTransformer {
 public:
  // `cfg` must be a causal LM or a token-classification model (a critic). `weights`: bf16, flat in
  // `layout` order, alive and unchanged while the model runs; `grads`: fp32, same layout, required
  // when options.trainable (backward accumulates into it) unless LoRA adapters train over a frozen
  // base (options.lora), else null.
  CudaTransformer(const CudaContext& ctx, const model::ModelConfig& cfg,
                  const model::ParamLayout& layout, const bf16* weights, float* grads,
                  const CudaTransformerOptions& options);
  ~CudaTransformer();
  CudaTransformer(const CudaTransformer&) = delete;
  CudaTransformer& operator=(const CudaTransformer&) = delete;

  // Uploads the batch and runs the model; logprob()/entropy() hold [T] fp32 results on device.
  // for_backward = false (a log-prob pass with no backward after it) skips what only backward
  // reads (the LM head's kept probabilities); backward() then refuses to run.
  void forward(const model::PackedBatch& batch, float temperature = 1.0f, bool for_backward = true);
  // Accumulates into the gradients the gradient of sum_t d_logprob[t] logprob[t] + d_entropy[t]
  // entropy[t] for the last forward's batch. Device pointers [T] (null = zero).
  void backward(const float* d_logprob, const float* d_entropy);
  // The same with host arrays [T] (copied to device first).
  void backward_host(const float* d_logprob, const float* d_entropy);
  // Token-classification models (critics): forward fills values() [T, num_labels] fp32 (the
  // value head, value_head.h); this accumulates the gradient of sum d_values * values (device or
  // host [T, num_labels]). Sequence-classification models (reward models, forward only) fill
  // the same values; a sequence's score is the value at its last token.
  void backward_values(const float* d_values);
  void backward_values_host(const float* d_values);
  const float* values() const { return values_; }
  std::vector<float> download_values() const;
  // Called (on the host, in backward order) each time a range of the gradients is complete for
  // this micro-batch; the work that wrote it is enqueued on the context's stream, not finished.
  void set_grad_ready_hook(GradReadyHook hook) { grad_hook_ = std::move(hook); }
  // The same weights at a new address (a reference policy whose weights were moved to the host
  // and back between passes, optim/cuda/train_state.h).
  void set_weights(const bf16* weights) {
    w_ = weights;
    decoder_.set_weights(weights);
  }

  const float* logprob() const { return logprob_; }
  const float* entropy() const { return entropy_; }
  int64_t num_tokens() const { return T_; }
  size_t arena_bytes() const { return arena_.capacity(); }
  // Device bytes this object holds (the arena and the RoPE table; the weights and a quantised
  // set are the caller's).
  size_t device_bytes() const;
  const CudaContext& ctx() const { return ctx_; }
  const model::ModelConfig& config() const { return cfg_; }
  const model::ParamLayout& layout() const { return layout_; }
  const CudaTransformerOptions& options() const { return opts_; }
  bool trainable() const { return opts_.trainable; }

  // Synchronous downloads (tests, log-prob passes).
  std::vector<float> download_logprob() const;
  std::vector<float> download_entropy() const;

  // Per-section GPU time (ms, cudaEvents) accumulated since the last call; sections are the op
  // families of the step ("attention_fwd", "gemm_bwd", ...). Empty unless profiling was enabled.
  // Profiling adds an event per op, so only benchmarks turn it on.
  void set_profiling(bool on);
  std::vector<std::pair<std::string, double>> take_profile();

 private:
  const bf16* W(int i) const { return i >= 0 ? w_ + layout_.params[i].offset : nullptr; }
  // Null for a frozen base (LoRA over null base gradients).
  float* G(int i) { return g_ != nullptr && i >= 0 ? g_ + layout_.params[i].offset : nullptr; }
  LayerActs& bufs(int l) { return layers_[opts_.trainable && !opts_.recompute ? l : 0]; }
  // The decoder's view of the last forward's batch (the arena's metadata and scratch).
  DecoderStep step() const;
  // full = false (recomputation inside backward) stops before the down projection: backward
  // needs the layer's activations, not its output.
  void layer_forward(int l, bool full = true);
  void layer_backward(int l);
  void require_trainable(const char* what) const;
  void check_backward(model::HeadKind head, const char* what) const;
  // Everything below the head: final norm, the layers (recomputed when asked), the embedding.
  void backward_trunk(const bf16* d_h);
  void mark(const char* section);  // profiling: the ops enqueued next belong to `section`
  void grads_ready(int64_t begin, int64_t end, int layer) {
    if (grad_hook_) grad_hook_(GradRange{begin, end, layer});
  }
  CudaContext ctx_;
  model::ModelConfig cfg_;
  model::ParamLayout layout_;
  CudaTransformerOptions opts_;
  CudaDecoder decoder_;  // the forward's layer math
  int lm_param_ = -1;
  int64_t max_tokens_, max_seqs_, chunk_;
  int64_t T_ = 0, B_ = 0;
  bool backward_ready_ = false;  // the last forward kept what backward needs
  bool adapters_off_ = false;    // the last forward ran with the LoRA adapters switched off
  float temperature_ = 1.0f;

  const bf16* w_ = nullptr;  // the caller's weights and gradients
  float* g_ = nullptr;
  GradReadyHook grad_hook_;
  ops::cuda::DeviceBuffer<float> inv_freq_;
  ops::cuda::DeviceArena arena_;

  // arena slices
  int32_t *tokens_ = nullptr, *positions_ = nullptr, *targets_ = nullptr, *cu_ = nullptr;
  std::vector<bf16*> x_;  // residual stream: x_[l] enters layer l, x_[L] is the final one
  std::vector<LayerActs> layers_;
  bf16 *qkv_ = nullptr, *h_final_ = nullptr;
  float *rstd_final_ = nullptr, *logprob_ = nullptr, *entropy_ = nullptr, *lse_head_ = nullptr;
  float *d_lp_ = nullptr, *d_ent_ = nullptr;
  float *values_ = nullptr, *d_values_ = nullptr;  // token classification [T, num_labels]
  bf16 *d_x_ = nullptr, *d_xn_ = nullptr, *d_act_ = nullptr, *d_gu_ = nullptr, *d_att_ = nullptr;
  float *d_q_ = nullptr, *d_k_ = nullptr, *d_v_ = nullptr;
  bf16 *d_q_bf_ = nullptr, *d_k_bf_ = nullptr, *d_qpre_ = nullptr, *d_kpre_ = nullptr;
  bf16* lm_probs_ = nullptr;  // [max_tokens, V] kept p (trainable with lm_head_keep_probs)
  // The LM head on the batch's head_rows only (model/batch.h): their indices, the final hidden
  // states, targets and outputs gathered to [n_head_, ...], and the backward's compact inputs and
  // d_h. n_head_ = 0: the last forward ran the head on every row.
  int64_t n_head_ = 0;
  int32_t *head_rows_ = nullptr, *targets_head_ = nullptr;
  bf16 *h_head_ = nullptr, *d_h_head_ = nullptr;
  float *logprob_head_ = nullptr, *entropy_head_ = nullptr, *d_lp_head_ = nullptr,
        *d_ent_head_ = nullptr;
  bf16* quant_scratch_ = nullptr;  // a dequantised matrix (quantised models over the fused limit)
  bf16 *lora_u_ = nullptr, *d_lora_u_ = nullptr;  // [T, r] adapter scratch (with LoRA)
  void* lm_scratch_ = nullptr;
  size_t lm_scratch_bytes_ = 0;
  std::unique_ptr<ops::cuda::SectionTimer> timer_;  // null unless profiling
};

}  // namespace verl::model::cuda
