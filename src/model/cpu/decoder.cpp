// The decoder stack on CPU. Per layer (HF LlamaDecoderLayer; the family's recipe adds the
// optional pieces: q/k/v and o biases, MLP biases, Qwen3's per-head q/k norm):
//   xn1 = rmsnorm(x);  q,k,v = split(xn1 Wqkv^T + bqkv);  [q,k = rmsnorm_D(q), rmsnorm_D(k)]
//   q,k = rope(q), rope(k);  att = causal_gqa(q,k,v);  x_mid = x + att Wo^T (+ bo)
//   xn2 = rmsnorm(x_mid);  x_out = x_mid + ffn(xn2)
//   (dense ffn: g|u = xn2 Wgu^T, (silu(g) * u) Wdown^T)
// The training backward walks the same steps in reverse; parameter gradients accumulate into a
// flat buffer. The rollout runs the same layer_forward with the rollout Backend.
#include "model/cpu/decoder.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "core/buffer.h"
#include "core/error.h"
#include "ops/cpu/ops.h"

namespace verl::model::cpu {
namespace ops = verl::ops::cpu;
namespace {

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd if (n > 65536)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

// The element range [begin, end) that parameters `ids` (-1 entries skipped) occupy together.
struct ParamRange {
  int64_t begin = INT64_MAX, end = 0;
};
ParamRange range_of(const ParamLayout& lay, std::initializer_list<int> ids) {
  ParamRange r;
  for (int i : ids) {
    if (i < 0) continue;
    r.begin = std::min(r.begin, lay.params[i].offset);
    r.end = std::max(r.end, lay.params[i].offset + lay.params[i].numel);
  }
  return r;
}

// Reads a range's weights from a source, or from the whole buffer without one.
class RangeReader {
 public:
  RangeReader(const Weights& w, WeightSource* source) : w_(w), source_(source) {}
  template <class R>
  const float* acquire(const R& r) const {
    return source_ ? source_->acquire(r.begin, r.end) : w_.data.data() + r.begin;
  }
  template <class R>
  void prefetch(const R& r) const {
    if (source_) source_->prefetch(r.begin, r.end);
  }
  template <class R>
  void release(const R& r) const {
    if (source_) source_->release(r.begin, r.end);
  }
  // Parameter i (-1: none) inside a range acquired at `base` that starts at element `begin`.
  const float* param(int i, const float* base, int64_t begin) const {
    return i >= 0 ? base + (w_.layout.params[i].offset - begin) : nullptr;
  }

 private:
  const Weights& w_;
  WeightSource* source_;
};

// A row-parallel projection's output y [T, C] holds this rank's partial sum: sum it over the
// group, then add the bias once (Megatron's RowParallelLinear).
void reduce_partial(TpGroup& tp, float* y, const float* bias, int64_t T, int64_t C) {
  tp.all_reduce_sum(y, T * C);
  if (bias == nullptr) return;
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = 0; j < C; ++j) y[i * C + j] += bias[j];
}

Tokens tokens_of(const PackedBatch& b) {
  return {b.num_tokens(), b.num_seqs(), b.tokens.data(), b.positions.data(), b.cu_seqlens.data()};
}

}  // namespace

Decoder::Decoder(const Weights& w, const LoraWeights* lora)
    : w_(w), lora_(lora), inv_freq_(rope_inv_freq(w.config)) {
  const ParamLayout& lay = w.layout;
  if (lora) {
    const ModelConfig &c = w.config, &lc = lora->base;
    VERL_CHECK(c.num_hidden_layers == lc.num_hidden_layers && c.hidden_size == lc.hidden_size &&
                   c.intermediate_size == lc.intermediate_size && c.q_dim() == lc.q_dim() &&
                   c.kv_dim() == lc.kv_dim(),
               "the LoRA adapter was made for a model of {} layers, hidden {}, intermediate {}; "
               "the base model has {}, {}, {}",
               lc.num_hidden_layers, lc.hidden_size, lc.intermediate_size, c.num_hidden_layers,
               c.hidden_size, c.intermediate_size);
  }
  auto to_range = [](ParamRange r) { return Range{r.begin, r.end}; };
  embed_ = to_range(range_of(lay, {lay.embed}));
  final_norm_ = to_range(range_of(lay, {lay.final_norm}));
  head_ =
      to_range(w.config.head == HeadKind::CausalLM ? range_of(lay, {w.lm_head_param()})
                                                   : range_of(lay, {lay.score, lay.score_bias}));
  for (const LayerParams& p : lay.layers) {
    layers_.push_back(to_range(range_of(lay, {p.attn_norm, p.wqkv, p.bqkv, p.q_norm, p.k_norm, p.wo,
                                              p.bo, p.mlp_norm, p.wgu, p.bgu, p.wdown, p.bdown})));
  }
}

LayerWeights Decoder::layer_weights(int l, const float* base, int64_t base_offset) const {
  LayerWeights w = layer_tensors(w_.layout, l, base, base_offset);
  if (lora_) attach_lora(w, *lora_, l, lora_->data.data());
  return w;
}

void Decoder::layer_forward(const Backend& be, int l, const Tokens& t, LayerActivations& a,
                            float* x_out, const LayerWeights& w, TpGroup* tp) const {
  const ModelConfig& c = w_.config;
  const int64_t T = t.T, C = c.hidden_size;
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), Q3 = qd + 2 * kvd;

  be.norm(grow(a.xn1, T * C), grow(a.rstd1, T), a.x_in.data(), w.attn_norm, T, C);
  be.dump(a.xn1.data(), "attn_norm", l, {T, C});
  // The fused qkv projection goes through att's buffer (free until attention runs).
  float* qkv = grow(a.att, std::max(T * Q3, T * qd));
  be.project(qkv, a.xn1.data(), w.wqkv, w.bqkv, T, C, Q3, w.lora_qkv);
  float* q = grow(c.qk_norm ? a.q_pre : a.q, T * qd);
  float* k = grow(c.qk_norm ? a.k_pre : a.k, T * kvd);
  float* v = grow(a.v, T * kvd);
  for (int64_t i = 0; i < T; ++i) {
    const float* row = qkv + i * Q3;
    std::copy(row, row + qd, q + i * qd);
    std::copy(row + qd, row + qd + kvd, k + i * kvd);
    std::copy(row + qd + kvd, row + Q3, v + i * kvd);
  }
  if (c.qk_norm) {
    be.norm(grow(a.q, T * qd), grow(a.rstd_q, T * H), a.q_pre.data(), w.q_norm, T * H, D);
    be.norm(grow(a.k, T * kvd), grow(a.rstd_k, T * Hkv), a.k_pre.data(), w.k_norm, T * Hkv, D);
  }
  be.rope(a.q.data(), t, H);
  be.rope(a.k.data(), t, Hkv);
  be.dump(a.q.data(), "q", l, {T, qd});
  be.dump(a.k.data(), "k", l, {T, kvd});
  be.dump(a.v.data(), "v", l, {T, kvd});
  be.attention(l, a.att.data(), grow(a.lse, T * H), a.q.data(), a.k.data(), a.v.data(), t);
  be.dump(a.att.data(), "attn", l, {T, qd});
  float* x_mid = grow(a.x_mid, T * C);
  be.project(x_mid, a.att.data(), w.wo, tp ? nullptr : w.bo, T, qd, C, w.lora_o);
  if (tp) reduce_partial(*tp, x_mid, w.bo, T, C);
  add_inplace(x_mid, a.x_in.data(), T * C);
  be.dump(x_mid, "attn_res", l, {T, C});

  be.norm(grow(a.xn2, T * C), grow(a.rstd2, T), x_mid, w.mlp_norm, T, C);
  be.dump(a.xn2.data(), "mlp_norm", l, {T, C});
  const int64_t F = c.intermediate_size;
  LayerWeights wf = w;
  if (tp) wf.bdown = nullptr;  // added after the reduction
  be.ffn(l, x_out, grow(a.gu, T * 2 * F), grow(a.act, T * F), a.xn2.data(), wf, T);
  if (tp) reduce_partial(*tp, x_out, w.bdown, T, C);
  add_inplace(x_out, x_mid, T * C);
  be.dump(x_out, "out", l, {T, C});
}

void Decoder::forward_layer(int l, const PackedBatch& b, LayerActivations& a, float* x_out) const {
  VERL_CHECK(l >= 0 && l < static_cast<int>(layers_.size()), "forward_layer: layer {} of {}", l,
             layers_.size());
  VERL_CHECK(static_cast<int64_t>(a.x_in.size()) >= b.num_tokens() * w_.config.hidden_size,
             "forward_layer: x_in holds {} values for {} tokens", a.x_in.size(), b.num_tokens());
  layer_forward(Backend::training(w_.config, inv_freq_.data()), l, tokens_of(b), a, x_out,
                layer_weights(l, w_.data.data(), int64_t{0}));
}

void Decoder::forward(const PackedBatch& b, Activations& acts, const ForwardOptions& opt,
                      WeightSource* source) const {
  const ModelConfig& c = w_.config;
  const ParamLayout& lay = w_.layout;
  const int64_t T = b.num_tokens(), B = b.num_seqs(), C = c.hidden_size, V = c.vocab_size;
  const int64_t L = c.num_hidden_layers;
  VERL_CHECK(T > 0 && B > 0 && b.cu_seqlens.back() == T && b.positions.size() == b.tokens.size(),
             "malformed packed batch: {} tokens, {} sequences", T, B);
  const Backend be = Backend::training(c, inv_freq_.data());
  const Tokens t = tokens_of(b);
  const RangeReader rd(w_, source);
  acts.T = T;
  acts.layers.resize(static_cast<size_t>(L));
  // Each range is read while the next one's gather (with a source) is under way.
  const float* we = rd.acquire(embed_);
  rd.prefetch(L > 0 ? layers_[0] : final_norm_);
  float* x0 = L > 0 ? grow(acts.layers[0].x_in, T * C) : grow(acts.x_final, T * C);
  ops::embedding_forward(x0, b.tokens.data(), rd.param(lay.embed, we, embed_.begin), T, C, V);
  rd.release(embed_);
  be.dump(x0, "embed", -1, {T, C});
  for (int64_t l = 0; l < L; ++l) {
    const float* wl = rd.acquire(layers_[l]);
    rd.prefetch(l + 1 < L ? layers_[l + 1] : final_norm_);
    float* x_out = l + 1 < L ? grow(acts.layers[l + 1].x_in, T * C) : grow(acts.x_final, T * C);
    layer_forward(be, static_cast<int>(l), t, acts.layers[l], x_out,
                  layer_weights(static_cast<int>(l), wl, layers_[l].begin));
    rd.release(layers_[l]);
  }
  const float* wn = rd.acquire(final_norm_);
  rd.prefetch(head_);
  be.norm(grow(acts.h_final, T * C), grow(acts.rstd_final, T), acts.x_final.data(),
          rd.param(lay.final_norm, wn, final_norm_.begin), T, C);
  rd.release(final_norm_);
  be.dump(acts.h_final.data(), "final_norm", -1, {T, C});
  const int64_t NL = c.num_labels;
  const float* wh = rd.acquire(head_);
  auto H = [&](int i) { return rd.param(i, wh, head_.begin); };
  switch (c.head) {
    case HeadKind::CausalLM:
      ops::lm_head_forward(grow(acts.logprob, T), grow(acts.entropy, T), grow(acts.lse_head, T),
                           acts.h_final.data(), H(w_.lm_head_param()), b.targets.data(), T, C, V,
                           opt.temperature, opt.lm_head_chunk);
      be.dump(acts.logprob.data(), "lm_head.logprob", -1, {T});
      be.dump(acts.entropy.data(), "lm_head.entropy", -1, {T});
      break;
    case HeadKind::TokenClassification:
      be.project(grow(acts.values, T * NL), acts.h_final.data(), H(lay.score), H(lay.score_bias), T,
                 C, NL);
      be.dump(acts.values.data(), "value_head.values", -1, {T, NL});
      break;
    case HeadKind::SequenceClassification:
      grow(acts.scores, B * NL);
      for (int64_t s = 0; s < B; ++s) {
        const int64_t last = b.cu_seqlens[s + 1] - 1;
        be.project(acts.scores.data() + s * NL, acts.h_final.data() + last * C, H(lay.score),
                   nullptr, 1, C, NL);
      }
      be.dump(acts.scores.data(), "score_head.scores", -1, {B, NL});
      break;
  }
  rd.release(head_);
}

void Decoder::forward_step(const Tokens& t, const PagedKv& kv, std::span<const int32_t> rows,
                           float* logits, StepWorkspace& ws, const TpContext* tp) const {
  const ModelConfig& c = w_.config;
  const ParamLayout& lay = w_.layout;
  const int64_t T = t.T, C = c.hidden_size, V = c.vocab_size, S = std::ssize(rows);
  VERL_CHECK(c.head == HeadKind::CausalLM, "the rollout needs a causal LM, got {}", c.architecture);
  if (T == 0) return;
  const Backend be = Backend::rollout(c, inv_freq_.data(), kv);
  TpGroup* group = tp ? tp->group : nullptr;
  if (group) {
    // Vocabulary-parallel embedding: each token's row comes from the rank that holds it, zeros
    // from the others, so the sum is exact.
    float* x = grow(ws.layer.x_in, T * C);
    const float* we = w_.param(lay.embed);
    for (int64_t i = 0; i < T; ++i) {
      VERL_CHECK(t.ids[i] >= 0 && t.ids[i] < tp->vocab_size,
                 "forward_step: token id {} at position {} is outside the vocabulary [0, {})",
                 t.ids[i], i, tp->vocab_size);
      const int64_t row = t.ids[i] - tp->vocab_begin;
      if (row >= 0 && row < V) {
        std::copy(we + row * C, we + (row + 1) * C, x + i * C);
      } else {
        std::fill(x + i * C, x + (i + 1) * C, 0.0f);
      }
    }
    group->all_reduce_sum(x, T * C);
  } else {
    ops::embedding_forward(grow(ws.layer.x_in, T * C), t.ids, w_.param(lay.embed), T, C, V);
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const int il = static_cast<int>(l);
    layer_forward(be, il, t, ws.layer, grow(ws.x_out, T * C),
                  layer_weights(il, w_.data.data(), int64_t{0}), group);
    std::swap(ws.layer.x_in, ws.x_out);  // the output is the next layer's input
  }
  if (S == 0) return;
  // Final norm and LM head only for the rows that sample.
  const float* x = ws.layer.x_in.data();
  float* h = grow(ws.rows, S * C);
  for (int64_t s = 0; s < S; ++s) {
    const int64_t i = rows[s];
    std::copy(x + i * C, x + (i + 1) * C, h + s * C);
  }
  float* hn = grow(ws.rows_norm, S * C);
  be.norm(hn, grow(ws.rstd, S), h, w_.param(lay.final_norm), S, C);
  if (!group) {
    be.project(logits, hn, w_.lm_head(), nullptr, S, C, V);
    return;
  }
  // Vocabulary-parallel head: V here is this rank's rows; gather every rank's [S, V] block and
  // lay them side by side, dropping the last rank's padding rows.
  const int64_t R = group->size(), Vf = tp->vocab_size;
  float* part = grow(ws.tp_logits, S * V);
  be.project(part, hn, w_.lm_head(), nullptr, S, C, V);
  float* all = grow(ws.tp_gathered, R * S * V);
  group->all_gather(part, all, S * V);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t n = std::clamp<int64_t>(Vf - r * V, 0, V);
    for (int64_t s = 0; s < S; ++s)
      std::copy(all + (r * S + s) * V, all + (r * S + s) * V + n, logits + s * Vf + r * V);
  }
}

void Decoder::layer_backward(const Backend& be, int l, const Tokens& t, LayerActivations& a,
                             Activations& s, float* d_x, const LayerWeights& w,
                             const LayerGrads& g) const {
  const ModelConfig& c = w_.config;
  const int64_t T = t.T, C = c.hidden_size, F = c.intermediate_size;
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), Q3 = qd + 2 * kvd;

  // MLP branch. On entry d_x = dL/dx_out, which is also the residual part of dL/dx_mid.
  float* scratch = zeroed(s.d_big, T * 3 * F);
  float* d_xn = zeroed(s.d_xn, T * C);
  be.ffn_backward(d_xn, g, d_x, a.xn2.data(), a.gu.data(), a.act.data(), w, scratch, T);
  be.norm_backward(d_x, g.mlp_norm, d_xn, a.x_mid.data(), w.mlp_norm, a.rstd2.data(), T, C);
  // Attention branch. Now d_x = dL/dx_mid, also the residual part of dL/dx_in.
  float* d_att = zeroed(s.d_att, T * qd);
  be.project_backward(d_att, g.wo, g.bo, d_x, a.att.data(), w.wo, T, qd, C, w.lora_o, g.lora_o);
  float* d_q = zeroed(s.d_q, T * qd);
  float* d_k = zeroed(s.d_k, T * kvd);
  float* d_v = zeroed(s.d_v, T * kvd);
  be.attention_backward(d_q, d_k, d_v, d_att, a.q.data(), a.k.data(), a.v.data(), a.att.data(),
                        a.lse.data(), t);
  be.rope_backward(d_q, t, H);
  be.rope_backward(d_k, t, Hkv);
  if (c.qk_norm) {
    // d_q/d_k are w.r.t. the normed q/k; take them back through the per-head RMSNorm.
    float* d_qpre = zeroed(s.scratch, T * (qd + kvd));
    float* d_kpre = d_qpre + T * qd;
    be.norm_backward(d_qpre, g.q_norm, d_q, a.q_pre.data(), w.q_norm, a.rstd_q.data(), T * H, D);
    be.norm_backward(d_kpre, g.k_norm, d_k, a.k_pre.data(), w.k_norm, a.rstd_k.data(), T * Hkv, D);
    d_q = d_qpre;
    d_k = d_kpre;
  }
  float* d_qkv = grow(s.d_qkv, T * Q3);
  for (int64_t i = 0; i < T; ++i) {
    float* row = d_qkv + i * Q3;
    std::copy(d_q + i * qd, d_q + (i + 1) * qd, row);
    std::copy(d_k + i * kvd, d_k + (i + 1) * kvd, row + qd);
    std::copy(d_v + i * kvd, d_v + (i + 1) * kvd, row + qd + kvd);
  }
  d_xn = zeroed(s.d_xn, T * C);
  be.project_backward(d_xn, g.wqkv, g.bqkv, d_qkv, a.xn1.data(), w.wqkv, T, C, Q3, w.lora_qkv,
                      g.lora_qkv);
  be.norm_backward(d_x, g.attn_norm, d_xn, a.x_in.data(), w.attn_norm, a.rstd1.data(), T, C);
}

void Decoder::backward(const PackedBatch& b, Activations& acts, const float* d_logprob,
                       const float* d_entropy, const float* d_out, float* grads,
                       const ForwardOptions& opt, GradSink* sink, WeightSource* source,
                       const LoraGrads& lora_grads) const {
  const ModelConfig& c = w_.config;
  const ParamLayout& lay = w_.layout;
  const int64_t T = b.num_tokens(), B = b.num_seqs(), C = c.hidden_size, V = c.vocab_size;
  const int64_t NL = c.num_labels;
  VERL_CHECK(acts.T == T, "backward called with a batch of {} tokens after a forward of {}", T,
             acts.T);
  const bool frozen = lora_grads.base_frozen;
  VERL_CHECK(sink != nullptr || grads != nullptr || frozen,
             "backward: neither a gradient buffer nor a sink");
  VERL_CHECK(lora_grads.grads == nullptr || lora_ != nullptr,
             "backward: adapter gradients asked of a decoder without LoRA adapters");
  const Backend be = Backend::training(c, inv_freq_.data());
  const Tokens t = tokens_of(b);
  const RangeReader rd(w_, source);
  // Each range's gradient view: the sink's, or the whole buffer's slice.
  // A frozen base writes no gradient: every view is null (the ops skip null gradients).
  auto open = [&](const Range& r) -> float* {
    if (frozen) return nullptr;
    return sink ? sink->open(r.begin, r.end) : grads + r.begin;
  };
  auto ready = [&](const Range& r) {
    if (sink && !frozen) sink->ready(r.begin, r.end);
  };
  // A tied LM head's range is the embedding's, final only after the embedding's backward.
  const bool tied = c.head == HeadKind::CausalLM && w_.lm_head_param() == lay.embed;
  float* head_base = open(head_);
  auto G = [&](int i, float* base, const Range& r) {
    return i >= 0 && base ? base + (lay.params[i].offset - r.begin) : nullptr;
  };
  const int64_t L = c.num_hidden_layers;

  const float* wh = rd.acquire(head_);
  rd.prefetch(final_norm_);
  auto H = [&](int i) { return rd.param(i, wh, head_.begin); };
  float* d_h = zeroed(acts.d_xn, T * C);
  switch (c.head) {
    case HeadKind::CausalLM:
      ops::lm_head_backward(d_h, G(w_.lm_head_param(), head_base, head_), d_logprob, d_entropy,
                            acts.h_final.data(), H(w_.lm_head_param()), b.targets.data(),
                            acts.lse_head.data(), acts.entropy.data(), T, C, V, opt.temperature,
                            opt.lm_head_chunk);
      break;
    case HeadKind::TokenClassification:
      if (d_out) {
        be.project_backward(d_h, G(lay.score, head_base, head_),
                            G(lay.score_bias, head_base, head_), d_out, acts.h_final.data(),
                            H(lay.score), T, C, NL);
      }
      break;
    case HeadKind::SequenceClassification:
      if (d_out) {
        for (int64_t s = 0; s < B; ++s) {
          const int64_t last = b.cu_seqlens[s + 1] - 1;
          be.project_backward(d_h + last * C, G(lay.score, head_base, head_), nullptr,
                              d_out + s * NL, acts.h_final.data() + last * C, H(lay.score), 1, C,
                              NL);
        }
      }
      break;
  }
  rd.release(head_);
  if (!tied) ready(head_);
  const float* wn = rd.acquire(final_norm_);
  if (L > 0) rd.prefetch(layers_[L - 1]);
  float* d_x = zeroed(acts.d_x, T * C);
  be.norm_backward(d_x, G(lay.final_norm, open(final_norm_), final_norm_), d_h, acts.x_final.data(),
                   rd.param(lay.final_norm, wn, final_norm_.begin), acts.rstd_final.data(), T, C);
  rd.release(final_norm_);
  ready(final_norm_);
  for (int64_t l = L - 1; l >= 0; --l) {
    const Range& r = layers_[l];
    const int il = static_cast<int>(l);
    const float* wl = rd.acquire(r);
    if (l > 0) rd.prefetch(layers_[l - 1]);
    LayerGrads g = frozen ? LayerGrads{} : layer_tensors(lay, il, open(r), r.begin);
    if (lora_grads.grads) attach_lora(g, *lora_, il, lora_grads.grads);
    layer_backward(be, il, t, acts.layers[l], acts, d_x, layer_weights(il, wl, r.begin), g);
    rd.release(r);
    ready(r);
  }
  // The embedding's backward reads no weights.
  ops::embedding_backward(G(lay.embed, open(embed_), embed_), d_x, b.tokens.data(), T, C);
  ready(embed_);
}

}  // namespace verl::model::cpu
