// The decoder-only causal LM (Llama / Qwen2 / Qwen3) on CUDA: the same steps as the CPU model
// (src/model/transformer.cpp, its oracle) built from the CUDA ops, in the mixed precision of
// docs/cuda.md: fp32 master weights, AdamW moments and flat gradients (same layout as
// model::Weights::layout), a bf16 compute copy of the weights, bf16 activations.
//
// All activations and scratch come from one DeviceArena planned at construction for max_tokens
// tokens and max_seqs sequences, so forward / backward / optimizer_step never call cudaMalloc.
// Everything is enqueued on the context's stream; only optimizer_step synchronises (it reads the
// gradient norm back for clipping, as clip_grad_norm_).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/batch.h"
#include "model/config.h"
#include "model/weights.h"
#include "ops/cuda/device.h"
#include "ops/cuda/ops_cuda.h"
#include "ops/cuda/section_timer.h"

namespace verl::ops::cuda {

// How a CudaTransformer is planned. max_tokens / max_seqs bound every forward's packed batch; the
// arena is sized for them once.
struct CudaTransformerOptions {
  int64_t max_tokens = 0;
  int64_t max_seqs = 0;
  int64_t lm_head_chunk = 4096;  // token rows of fp32 logits alive at once in the LM head
  // false: a forward-only model (a reference policy, a log-prob pass): only the bf16 weights are
  // kept (no fp32 master, gradients or moments) and the layers share one activation buffer set.
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
  // Forward GEMMs that never split k (CudaContext::batch_invariant: cuBLASLt's unsplit kernels or
  // gemm_invariant.cu, gemm.h): a token's log-prob no longer depends on the batch it is computed
  // in, so it equals the batch-invariant rollout's (CudaRunnerOptions::batch_invariant) bit for bit.
  bool batch_invariant = false;
  // Forward GEMMs that never split k (CudaContext::unsplit_k), as a rollout with
  // CudaRunnerOptions::match_trainer_numerics has.
  bool unsplit_k = false;
};

class CudaTransformer {
 public:
  // `w` must be a causal LM or a token-classification model (a critic). The RoPE frequencies are
  // computed here (inline, in the caller's object) so that verl_cuda needs nothing but headers
  // from verl_model.
  CudaTransformer(const CudaContext& ctx, const model::Weights& w, int64_t max_tokens,
                  int64_t max_seqs, int64_t lm_head_chunk = 1024)
      : CudaTransformer(ctx, w, model::rope_inv_freq(w.config),
                        CudaTransformerOptions{max_tokens, max_seqs, lm_head_chunk}) {}
  CudaTransformer(const CudaContext& ctx, const model::Weights& w,
                  const CudaTransformerOptions& options)
      : CudaTransformer(ctx, w, model::rope_inv_freq(w.config), options) {}
  CudaTransformer(const CudaContext& ctx, const model::Weights& w,
                  const std::vector<float>& inv_freq, const CudaTransformerOptions& options);
  ~CudaTransformer();

  // Uploads the batch and runs the model; logprob()/entropy() hold [T] fp32 results on device.
  // for_backward = false (a log-prob pass with no backward after it) skips what only backward
  // reads (the LM head's kept probabilities); backward() then refuses to run.
  void forward(const model::PackedBatch& batch, float temperature = 1.0f,
               bool for_backward = true);
  // Accumulates into grads() the gradient of sum_t d_logprob[t] logprob[t] + d_entropy[t]
  // entropy[t] for the last forward's batch. Device pointers [T] (null = zero).
  void backward(const float* d_logprob, const float* d_entropy);
  // The same with host arrays [T] (copied to device first).
  void backward_host(const float* d_logprob, const float* d_entropy);
  // Token-classification models (critics): forward fills values() [T, num_labels] fp32 (the
  // value head, value_head.h); this accumulates the gradient of sum d_values * values (device or
  // host [T, num_labels]).
  void backward_values(const float* d_values);
  void backward_values_host(const float* d_values);
  const float* values() const { return values_; }
  std::vector<float> download_values() const;
  void zero_grad();
  // clip_grad_norm_(grad_clip) (<= 0: no clipping) then one AdamW step over all parameters;
  // returns the gradient norm before clipping. A non-finite norm skips the update.
  double optimizer_step(float lr, float beta1 = 0.9f, float beta2 = 0.999f, float eps = 1e-8f,
                        float weight_decay = 0.01f, float grad_clip = 1.0f);

  const float* logprob() const { return logprob_; }
  const float* entropy() const { return entropy_; }
  float* grads() { return grads_.data(); }
  int64_t num_params() const { return layout_.total; }
  int64_t num_tokens() const { return T_; }
  size_t arena_bytes() const { return arena_.capacity(); }
  // Device bytes this object holds: weights, gradients, optimizer state and the arena.
  size_t device_bytes() const;
  const CudaContext& ctx() const { return ctx_; }
  const model::ModelConfig& config() const { return cfg_; }
  const model::ParamLayout& layout() const { return layout_; }
  const CudaTransformerOptions& options() const { return opts_; }
  bool trainable() const { return opts_.trainable; }
  // The bf16 compute copy of the weights, flat in layout() order: what the rollout engine reads
  // (the same buffer the optimizer writes; no copy).
  const bf16* weights_bf16() const { return wbf_.data(); }

  // Synchronous downloads (tests, checkpoints).
  std::vector<float> download_logprob() const;
  std::vector<float> download_entropy() const;
  std::vector<float> download_grads() const;
  // fp32 weights in layout order: the master copy (trainable) or the bf16 copy widened.
  std::vector<float> download_weights() const;
  // Replaces the weights (master and bf16 copy) with w (layout order, layout().total floats).
  void upload_weights(const std::vector<float>& w);
  // AdamW state (trainable only): first/second moments in layout order and the step count.
  void download_optimizer_state(std::vector<float>& m, std::vector<float>& v) const;
  void upload_optimizer_state(const std::vector<float>& m, const std::vector<float>& v,
                              int64_t step);
  int64_t optimizer_steps() const { return step_; }

  // Per-section GPU time (ms, cudaEvents) accumulated since the last call; sections are the op
  // families of the step ("attention_fwd", "gemm_bwd", ...). Empty unless profiling was enabled.
  // Profiling adds an event per op, so only benchmarks turn it on.
  void set_profiling(bool on);
  std::vector<std::pair<std::string, double>> take_profile();

 private:
  struct LayerBufs {
    bf16 *xn1 = nullptr, *q_pre = nullptr, *k_pre = nullptr, *q = nullptr, *k = nullptr,
         *v = nullptr, *att = nullptr, *x_mid = nullptr, *xn2 = nullptr, *gu = nullptr,
         *act = nullptr;
    float *rstd1 = nullptr, *rstd_q = nullptr, *rstd_k = nullptr, *lse = nullptr,
          *rstd2 = nullptr;
  };
  const bf16* W(int i) const { return i >= 0 ? wbf_.data() + layout_.params[i].offset : nullptr; }
  float* G(int i) { return i >= 0 ? grads_.data() + layout_.params[i].offset : nullptr; }
  LayerBufs& bufs(int l) { return layers_[opts_.trainable && !opts_.recompute ? l : 0]; }
  // full = false (recomputation inside backward) stops before the down projection: backward
  // needs the layer's activations, not its output.
  void layer_forward(int l, bool full = true);
  void layer_backward(int l);
  void require_trainable(const char* what) const;
  void check_backward(model::HeadKind head, const char* what) const;
  // Everything below the head: final norm, the layers (recomputed when asked), the embedding.
  void backward_trunk(const bf16* d_h);
  void mark(const char* section);  // profiling: the ops enqueued next belong to `section`

  CudaContext ctx_;
  model::ModelConfig cfg_;
  model::ParamLayout layout_;
  CudaTransformerOptions opts_;
  int lm_param_ = -1;
  int64_t max_tokens_, max_seqs_, chunk_;
  int64_t T_ = 0, B_ = 0, step_ = 0;
  bool backward_ready_ = false;  // the last forward kept what backward needs
  float temperature_ = 1.0f;

  DeviceBuffer<float> master_, grads_, m_, v_, inv_freq_;
  DeviceBuffer<bf16> wbf_;
  DeviceBuffer<double> norm_;
  DeviceArena arena_;

  // arena slices
  int32_t *tokens_ = nullptr, *positions_ = nullptr, *targets_ = nullptr, *cu_ = nullptr;
  std::vector<bf16*> x_;  // residual stream: x_[l] enters layer l, x_[L] is the final one
  std::vector<LayerBufs> layers_;
  bf16 *qkv_ = nullptr, *h_final_ = nullptr;
  float *rstd_final_ = nullptr, *logprob_ = nullptr, *entropy_ = nullptr, *lse_head_ = nullptr;
  float *d_lp_ = nullptr, *d_ent_ = nullptr;
  float *values_ = nullptr, *d_values_ = nullptr;  // token classification [T, num_labels]
  bf16 *d_x_ = nullptr, *d_xn_ = nullptr, *d_act_ = nullptr, *d_gu_ = nullptr, *d_att_ = nullptr;
  float *d_q_ = nullptr, *d_k_ = nullptr, *d_v_ = nullptr;
  bf16 *d_q_bf_ = nullptr, *d_k_bf_ = nullptr, *d_qpre_ = nullptr, *d_kpre_ = nullptr;
  bf16* lm_probs_ = nullptr;  // [max_tokens, V] kept p (trainable with lm_head_keep_probs)
  void* lm_scratch_ = nullptr;
  size_t lm_scratch_bytes_ = 0;
  std::unique_ptr<SectionTimer> timer_;  // null unless profiling
};

}  // namespace verl::ops::cuda
