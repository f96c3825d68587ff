// The ops a CPU decoder layer is written in (llama.cpp's build_norm / build_attn / build_ffn /
// build_lora_mm): norm, project, rope, attention, ffn, with their backwards. One Backend per
// forward picks how they run: training (plain OpenBLAS matmuls, attention within each packed
// sequence keeping the lse for the backward, named intermediates under the tag "cpu") or the
// rollout (batch-invariant matmuls, attention over the paged KV cache, no dumps).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <vector>

#include "model/config.h"
#include "model/lora.h"
#include "model/weights.h"

namespace verl::model::cpu {

// The tokens a forward runs over: T tokens of B sequences packed without padding
// (model/batch.h's layout; positions restart at 0 in each sequence for training, and are the
// absolute positions of a rollout step's new tokens).
struct Tokens {
  int64_t T = 0, B = 0;
  const int32_t* ids = nullptr;         // [T]
  const int32_t* positions = nullptr;   // [T]
  const int32_t* cu_seqlens = nullptr;  // [B+1]
};

// The rollout's paged KV cache as attention writes and reads it: layer l's keys (values) are
// [num_blocks, block_size, Hkv, D] at k + l * layer_stride (v + l * layer_stride); plus where
// this step's new tokens go and each item's block table.
struct PagedKv {
  float* k = nullptr;
  float* v = nullptr;
  int64_t layer_stride = 0;
  int64_t block_size = 0;
  const int32_t* slot_mapping = nullptr;  // [T] slot (block * block_size + offset) of each token
  const int32_t* block_tables = nullptr;  // [B, max_blocks_per_seq], padded with -1
  int64_t max_blocks_per_seq = 0;
};

// The LoRA adapters of one projection y[T, N] = x[T, K] W^T (model/lora.h): segment s adds
// scale * (x A_s^T) B_s^T to the output columns [col0, col0 + cols), A_s [r, K], B_s [cols, r].
// A fused projection carries one segment per adapted HF module (q, k, v rows of wqkv; gate, up
// rows of wgu). P = const float* for the adapters, float* for their gradients; count 0: none.
template <class P>
struct LoraProjection {
  struct Segment {
    P a = nullptr, b = nullptr;
    int64_t col0 = 0, cols = 0;
  };
  std::array<Segment, 3> seg{};
  int count = 0;
  int64_t r = 0;
  float scale = 0.0f;
};

// One layer's parameters (P = const float*) or their gradients (P = float*); null where the
// layer recipe has no such piece. The lora_* members are the layer's adapters (or their
// gradients), empty without LoRA.
template <class P>
struct LayerTensors {
  P attn_norm = nullptr, wqkv = nullptr, bqkv = nullptr, q_norm = nullptr, k_norm = nullptr;
  P wo = nullptr, bo = nullptr, mlp_norm = nullptr, wgu = nullptr, bgu = nullptr;
  P wdown = nullptr, bdown = nullptr;
  LoraProjection<P> lora_qkv, lora_o, lora_gu, lora_down;
};
using LayerWeights = LayerTensors<const float*>;
using LayerGrads = LayerTensors<float*>;

// Layer l's tensors inside a range of the flat layout held at `base` from element `base_offset`.
template <class P>
LayerTensors<P> layer_tensors(const ParamLayout& lay, int l, P base, int64_t base_offset) {
  const LayerParams& p = lay.layers[static_cast<size_t>(l)];
  auto at = [&](int i) -> P {
    return i >= 0 ? base + (lay.params[i].offset - base_offset) : nullptr;
  };
  LayerTensors<P> t;
  t.attn_norm = at(p.attn_norm), t.wqkv = at(p.wqkv), t.bqkv = at(p.bqkv);
  t.q_norm = at(p.q_norm), t.k_norm = at(p.k_norm), t.wo = at(p.wo), t.bo = at(p.bo);
  t.mlp_norm = at(p.mlp_norm), t.wgu = at(p.wgu), t.bgu = at(p.bgu);
  t.wdown = at(p.wdown), t.bdown = at(p.bdown);
  return t;
}

// Adds to `t` layer l's adapters of `lora` whose flat buffer (LoraWeights::layout) is at `base`:
// the adapters themselves (P = const float*) or their gradients (P = float*).
template <class P>
void attach_lora(LayerTensors<P>& t, const LoraWeights& lora, int l, P base);

class Backend {
 public:
  // Training and the trainer's log-prob passes: ops::cpu::linear_forward (OpenBLAS) and
  // ops::cpu::attention_forward over the packed batch; backward available.
  static Backend training(const ModelConfig& c, const float* inv_freq);
  // The rollout: ops::cpu::linear_forward_invariant and the paged attention over `kv`, whose
  // new keys and values each attention call writes first. Forward only.
  static Backend rollout(const ModelConfig& c, const float* inv_freq, const PagedKv& kv);

  // HF LlamaRMSNorm over `rows` rows of n; rstd [rows] is kept for the backward.
  void norm(float* y, float* rstd, const float* x, const float* w, int64_t rows, int64_t n) const;
  // y[T, N] = x[T, K] w[N, K]^T (+ b) (+ the LoRA adapters' scale * (x A^T) B^T): the one
  // matmul entry of a layer (adapters or a quantised weight go here, not in the callers). The
  // base product is computed exactly as without adapters and the adapters' part added after.
  void project(float* y, const float* x, const float* w, const float* b, int64_t T, int64_t K,
               int64_t N, const LoraProjection<const float*>& lora = {}) const;
  // RoPE in place on x[T, heads, D] at the tokens' positions.
  void rope(float* x, const Tokens& t, int64_t heads) const;
  // Causal GQA attention of layer `layer`: q[T,H,D], k/v[T,Hkv,D] -> out[T,H,D]. Training keeps
  // lse[T,H] for the backward; the rollout stores k/v in the cache and ignores lse.
  void attention(int64_t layer, float* out, float* lse, const float* q, const float* k,
                 const float* v, const Tokens& t) const;
  // The feed-forward block on xn[T, C], out[T, C] overwritten; keeps gu[T, 2F] and act[T, F].
  // Dense SwiGLU (HF LlamaMLP) today; a mixture-of-experts block (router, top-k experts) is
  // the other branch this call will take, chosen by the layer recipe.
  void ffn(int64_t layer, float* out, float* gu, float* act, const float* xn, const LayerWeights& w,
           int64_t T) const;

  // Backwards (training only): gradients w.r.t. inputs and parameters ACCUMULATE (ops/cpu/ops.h),
  // except rope_backward, which rotates d_x in place.
  void norm_backward(float* d_x, float* d_w, const float* d_y, const float* x, const float* w,
                     const float* rstd, int64_t rows, int64_t n) const;
  // With adapters, d_lora's A and B gradients accumulate and d_x gets the adapters' part too; a
  // null d_w / d_b (a frozen base) skips the base's gradients.
  void project_backward(float* d_x, float* d_w, float* d_b, const float* d_y, const float* x,
                        const float* w, int64_t T, int64_t K, int64_t N,
                        const LoraProjection<const float*>& lora = {},
                        const LoraProjection<float*>& d_lora = {}) const;
  void rope_backward(float* d_x, const Tokens& t, int64_t heads) const;
  void attention_backward(float* d_q, float* d_k, float* d_v, const float* d_out, const float* q,
                          const float* k, const float* v, const float* out, const float* lse,
                          const Tokens& t) const;
  // d_xn += d(ffn)/d(xn) given d_out; `scratch` holds at least 3 * T * F floats.
  void ffn_backward(float* d_xn, const LayerGrads& g, const float* d_out, const float* xn,
                    const float* gu, const float* act, const LayerWeights& w, float* scratch,
                    int64_t T) const;

  // Names an intermediate (llama.cpp's cb(cur, name, il)): "L{layer}.{name}", or `name` alone
  // for layer < 0. Training writes it under VERL_DUMP (core/dump.h); the rollout writes nothing,
  // so a generation never overwrites the trainer's dump.
  void dump(const float* x, std::string_view name, int64_t layer,
            std::initializer_list<int64_t> shape) const;

 private:
  Backend(const ModelConfig& c, const float* inv_freq) : c_(c), inv_freq_(inv_freq) {}
  const ModelConfig& c_;
  const float* inv_freq_;
  bool paged_ = false;  // false: training (packed attention, plain matmuls, dumps)
  PagedKv kv_;
  // x A^T and the adapters' other intermediates, grown to the largest projection and reused.
  mutable std::vector<float> lora_scratch_;
};

}  // namespace verl::model::cpu
