// The one CPU decoder (Llama / Qwen2 / Qwen3, fp32): the same layer code serves the trainer's
// forward and backward over a packed batch and the rollout's forward over the paged KV cache; a
// Backend (backend.h) decides which kernels run. model::Transformer (model/transformer.h) is its
// public name for the trainer. The heads: LM head fused with log-softmax/entropy (causal LM),
// per-token value (token classification, the critic), per-sequence score at each sequence's last
// token (reward model); the rollout's step ends in the logits of the rows it samples.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/batch.h"
#include "model/cpu/backend.h"
#include "model/grad_sink.h"
#include "model/lora.h"
#include "model/tp.h"
#include "model/weight_source.h"
#include "model/weights.h"

namespace verl::model {

// Saved activations of one layer (all [T, ...] row-major).
struct LayerActivations {
  std::vector<float> x_in, xn1, rstd1, q_pre, k_pre, rstd_q, rstd_k, q, k, v, att, lse;
  std::vector<float> x_mid, xn2, rstd2, gu, act;
};

// Everything a forward keeps for the backward, plus the outputs. Buffers grow to the largest
// batch seen and are then reused, so a training loop allocates only on its first step.
struct Activations {
  int64_t T = 0;
  std::vector<LayerActivations> layers;
  std::vector<float> x_final, h_final, rstd_final;
  // outputs
  std::vector<float> logprob, entropy, lse_head;  // causal LM, [T]
  std::vector<float> values;                      // token classification, [T, num_labels]
  std::vector<float> scores;                      // sequence classification, [B, num_labels]
  // backward scratch
  std::vector<float> d_x, d_xn, d_big, d_att, d_q, d_k, d_v, d_qkv, scratch;
};

// The adapter side of a backward by a decoder with LoRA adapters: their gradients accumulate into
// `grads` (LoraWeights::layout; null: not wanted), and with `base_frozen` no base gradient is
// written (LoRA training; backward's `grads` and `sink` may then be null).
struct LoraGrads {
  float* grads = nullptr;
  bool base_frozen = false;
};

struct ForwardOptions {
  float temperature = 1.0f;     // logits are divided by this before log-softmax (verl's rollout T)
  int64_t lm_head_chunk = 256;  // tokens per chunk of the fused LM head
};

namespace cpu {

// The rollout step's workspace: one layer's activations reused by every layer, grown to the
// largest step and then reused.
struct StepWorkspace {
  LayerActivations layer;
  std::vector<float> x_out, rows, rows_norm, rstd;
  std::vector<float> tp_logits, tp_gathered;  // tensor parallel: this rank's vocab rows, all ranks'
};

class Decoder {
 public:
  // With `lora`, every projection it adapts adds its adapter (training forward and backward, and
  // the rollout's step); both objects must outlive the decoder.
  explicit Decoder(const Weights& w, const LoraWeights* lora = nullptr);

  // ---- training (and the trainer's log-prob passes) ----
  // Runs the model over `batch`, filling the head's outputs and saved activations in `acts`. With
  // a `source` the weights are read range by range from it (ZeRO-3) instead of weights().data.
  void forward(const PackedBatch& batch, Activations& acts, const ForwardOptions& opt = {},
               WeightSource* source = nullptr) const;
  // Accumulates into `grads` (flat, same layout as the weights) the gradient of
  //   sum_t d_logprob[t]*logprob[t] + d_entropy[t]*entropy[t]   (causal LM)
  //   sum d_out * values (token classification) or sum d_out * scores (sequence classification).
  // Null upstream gradients count as zero. Requires the forward's `acts` for the same batch.
  // With a `sink`, `grads` is unused: each range (the head, the final norm, each layer from the
  // last, the embedding) is accumulated into the view sink->open() gives and handed back with
  // sink->ready() as soon as it is final.
  void backward(const PackedBatch& batch, Activations& acts, const float* d_logprob,
                const float* d_entropy, const float* d_out, float* grads,
                const ForwardOptions& opt = {}, GradSink* sink = nullptr,
                WeightSource* source = nullptr, const LoraGrads& lora_grads = {}) const;
  // Layer l alone over `batch`: reads a.x_in ([T, C], set by the caller), writes x_out [T, C] and
  // keeps the layer's activations in `a` (the inputs of its linear layers: GPTQ's calibration,
  // model/quantize.cpp). Weights from weights().data.
  void forward_layer(int l, const PackedBatch& batch, LayerActivations& a, float* x_out) const;

  // ---- the rollout ----
  // One scheduled step: embeds the T new tokens of `t` (absolute positions), runs every layer
  // over the paged cache `kv` (writing the new tokens' keys and values), and writes the logits
  // of the tokens `sample_rows` (indices into [0, T)) to logits [rows, V]. Batch-invariant: a
  // token's results do not depend on the other tokens of the step.
  // With `tp` the weights are a TpSlice's (model/tp.h) and `kv` holds this rank's kv heads: the
  // embedding rows and the partial outputs of the o and down projections are summed over the
  // group (the row-parallel biases added once after), and the logits of the rank's vocabulary
  // rows are gathered, so `logits` is [rows, tp->vocab_size] on every rank.
  void forward_step(const Tokens& t, const PagedKv& kv, std::span<const int32_t> sample_rows,
                    float* logits, StepWorkspace& ws, const TpContext* tp = nullptr) const;

  const Weights& weights() const { return w_; }
  const LoraWeights* lora() const { return lora_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }

 private:
  // An element range of the flat layout: a layer's parameters, the embedding, the final norm, the
  // head (what a weight source gathers and a gradient sink reduces as one).
  struct Range {
    int64_t begin = 0, end = 0;
  };
  // The decoder layer: x_out = layer(a.x_in), keeping in `a` what the backward reads.
  // With `tp` the o and down projections are row-parallel: summed over the group before their
  // biases and the residual.
  void layer_forward(const Backend& be, int l, const Tokens& t, LayerActivations& a, float* x_out,
                     const LayerWeights& w, TpGroup* tp = nullptr) const;
  // On entry d_x = dL/d(layer output); on exit dL/d(layer input). Parameter gradients accumulate
  // into `g`; `s` lends the backward scratch.
  void layer_backward(const Backend& be, int l, const Tokens& t, LayerActivations& a,
                      Activations& s, float* d_x, const LayerWeights& w, const LayerGrads& g) const;
  // Layer l's weights inside a range at `base` from element `base_offset`, with its adapters.
  LayerWeights layer_weights(int l, const float* base, int64_t base_offset) const;
  const Weights& w_;
  const LoraWeights* lora_ = nullptr;
  std::vector<float> inv_freq_;
  Range embed_, final_norm_,
      head_;  // head_: the LM head (the embedding when tied) or the score head
  std::vector<Range> layers_;
};

}  // namespace cpu
}  // namespace verl::model
