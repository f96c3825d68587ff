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
#include <vector>

#include "model/batch.h"
#include "model/config.h"
#include "model/weights.h"
#include "ops/cuda/device.h"
#include "ops/cuda/ops_cuda.h"

namespace verl::ops::cuda {

class CudaTransformer {
 public:
  // `w` must be a causal LM. The RoPE frequencies are computed here (inline, in the caller's
  // object) so that verl_cuda needs nothing but headers from verl_model.
  CudaTransformer(const CudaContext& ctx, const model::Weights& w, int64_t max_tokens,
                  int64_t max_seqs, int64_t lm_head_chunk = 1024)
      : CudaTransformer(ctx, w, model::rope_inv_freq(w.config), max_tokens, max_seqs,
                        lm_head_chunk) {}
  CudaTransformer(const CudaContext& ctx, const model::Weights& w,
                  const std::vector<float>& inv_freq, int64_t max_tokens, int64_t max_seqs,
                  int64_t lm_head_chunk);

  // Uploads the batch and runs the model; logprob()/entropy() hold [T] fp32 results on device.
  void forward(const model::PackedBatch& batch, float temperature = 1.0f);
  // Accumulates into grads() the gradient of sum_t d_logprob[t] logprob[t] + d_entropy[t]
  // entropy[t] for the last forward's batch. Device pointers [T] (null = zero).
  void backward(const float* d_logprob, const float* d_entropy);
  // The same with host arrays [T] (copied to device first).
  void backward_host(const float* d_logprob, const float* d_entropy);
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
  const CudaContext& ctx() const { return ctx_; }

  // Synchronous downloads (tests, checkpoints).
  std::vector<float> download_logprob() const;
  std::vector<float> download_entropy() const;
  std::vector<float> download_grads() const;
  std::vector<float> download_weights() const;  // fp32 master weights, layout order

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
  void layer_forward(int l);
  void layer_backward(int l);

  CudaContext ctx_;
  model::ModelConfig cfg_;
  model::ParamLayout layout_;
  int lm_param_ = -1;
  int64_t max_tokens_, max_seqs_, chunk_;
  int64_t T_ = 0, B_ = 0, step_ = 0;
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
  bf16 *d_x_ = nullptr, *d_xn_ = nullptr, *d_act_ = nullptr, *d_gu_ = nullptr, *d_att_ = nullptr;
  float *d_q_ = nullptr, *d_k_ = nullptr, *d_v_ = nullptr;
  bf16 *d_q_bf_ = nullptr, *d_k_bf_ = nullptr, *d_qpre_ = nullptr, *d_kpre_ = nullptr;
  void* lm_scratch_ = nullptr;
  size_t lm_scratch_bytes_ = 0;
};

}  // namespace verl::ops::cuda
