// Forward and backward of the decoder stack on CPU. Per layer (HF LlamaDecoderLayer):
//   xn1 = rmsnorm(x);  q,k,v = split(xn1 Wqkv^T + bqkv);  [Qwen3: q,k = rmsnorm_D(q), rmsnorm_D(k)]
//   q,k = rope(q), rope(k);  att = causal_gqa(q,k,v);  x_mid = x + att Wo^T (+ bo)
//   xn2 = rmsnorm(x_mid);  gu = xn2 Wgu^T;  x_out = x_mid + (silu(g) * u) Wdown^T
// The backward walks the same steps in reverse; parameter gradients accumulate into a flat buffer.
// With VERL_DUMP set, the forward writes each op's output by name (core/dump.h, docs/model.md).
#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <span>
#include <string_view>

#include "core/buffer.h"
#include "core/dump.h"
#include "core/error.h"
#include "ops/cpu/ops.h"

namespace verl::model {
namespace ops = verl::ops::cpu;
namespace {

void add_inplace(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd if (n > 65536)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

// Names an intermediate (llama.cpp's cb(cur, name, il)): layer tensors become "L{il}.{name}".
// Costs one cached bool check when VERL_DUMP is off.
void cb(const float* x, std::string_view name, int il, std::initializer_list<int64_t> shape) {
  if (!dump::enabled()) return;
  const std::span<const int64_t> s(shape.begin(), shape.size());
  if (il < 0) {
    dump::tensor("cpu", name, x, s);
  } else {
    dump::tensor("cpu", fmt::format("L{}.{}", il, name), x, s);
  }
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

}  // namespace

Transformer::Transformer(const Weights& w) : w_(w), inv_freq_(rope_inv_freq(w.config)) {
  const ParamLayout& lay = w.layout;
  auto to_range = [](ParamRange r) { return Range{r.begin, r.end}; };
  embed_ = to_range(range_of(lay, {lay.embed}));
  final_norm_ = to_range(range_of(lay, {lay.final_norm}));
  head_ = to_range(w.config.head == HeadKind::CausalLM ? range_of(lay, {w.lm_head_param()})
                                                        : range_of(lay, {lay.score, lay.score_bias}));
  for (const LayerParams& p : lay.layers) {
    layers_.push_back(to_range(range_of(lay, {p.attn_norm, p.wqkv, p.bqkv, p.q_norm, p.k_norm, p.wo, p.bo,
                                              p.mlp_norm, p.wgu, p.bgu, p.wdown, p.bdown})));
  }
}

void Transformer::layer_forward(int l, const PackedBatch& b, LayerActivations& a, float* x_out,
                                const float* wbase, int64_t woffset) const {
  const ModelConfig& c = w_.config;
  const LayerParams& p = w_.layout.layers[l];
  auto W = [&](int i) { return i >= 0 ? wbase + (w_.layout.params[i].offset - woffset) : nullptr; };
  const int64_t T = b.num_tokens(), B = b.num_seqs(), C = c.hidden_size, F = c.intermediate_size;
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), Q3 = qd + 2 * kvd;
  const float eps = static_cast<float>(c.rms_norm_eps);

  ops::rmsnorm_forward(grow(a.xn1, T * C), grow(a.rstd1, T), a.x_in.data(), W(p.attn_norm), T, C,
                       eps);
  cb(a.xn1.data(), "attn_norm", l, {T, C});
  // The fused qkv projection goes through att's buffer (free until attention runs).
  float* qkv = grow(a.att, std::max(T * Q3, T * qd));
  ops::linear_forward(qkv, a.xn1.data(), W(p.wqkv), W(p.bqkv), T, C, Q3);
  float* q = grow(c.qk_norm ? a.q_pre : a.q, T * qd);
  float* k = grow(c.qk_norm ? a.k_pre : a.k, T * kvd);
  float* v = grow(a.v, T * kvd);
  for (int64_t t = 0; t < T; ++t) {
    const float* row = qkv + t * Q3;
    std::copy(row, row + qd, q + t * qd);
    std::copy(row + qd, row + qd + kvd, k + t * kvd);
    std::copy(row + qd + kvd, row + Q3, v + t * kvd);
  }
  if (c.qk_norm) {
    ops::rmsnorm_forward(grow(a.q, T * qd), grow(a.rstd_q, T * H), a.q_pre.data(), W(p.q_norm),
                         T * H, D, eps);
    ops::rmsnorm_forward(grow(a.k, T * kvd), grow(a.rstd_k, T * Hkv), a.k_pre.data(),
                         W(p.k_norm), T * Hkv, D, eps);
  }
  ops::rope_forward(a.q.data(), b.positions.data(), inv_freq_.data(), T, H, D);
  ops::rope_forward(a.k.data(), b.positions.data(), inv_freq_.data(), T, Hkv, D);
  cb(a.q.data(), "q", l, {T, qd});
  cb(a.k.data(), "k", l, {T, kvd});
  cb(a.v.data(), "v", l, {T, kvd});
  ops::attention_forward(a.att.data(), grow(a.lse, T * H), a.q.data(), a.k.data(), a.v.data(),
                         b.cu_seqlens.data(), B, T, H, Hkv, D, 1.0f / std::sqrt(float(D)));
  cb(a.att.data(), "attn", l, {T, qd});
  float* x_mid = grow(a.x_mid, T * C);
  ops::linear_forward(x_mid, a.att.data(), W(p.wo), W(p.bo), T, qd, C);
  add_inplace(x_mid, a.x_in.data(), T * C);
  cb(x_mid, "attn_res", l, {T, C});

  ops::rmsnorm_forward(grow(a.xn2, T * C), grow(a.rstd2, T), x_mid, W(p.mlp_norm), T, C, eps);
  cb(a.xn2.data(), "mlp_norm", l, {T, C});
  ops::linear_forward(grow(a.gu, T * 2 * F), a.xn2.data(), W(p.wgu), W(p.bgu), T, C, 2 * F);
  cb(a.gu.data(), "gate_up", l, {T, 2 * F});
  ops::swiglu_forward(grow(a.act, T * F), a.gu.data(), T, F);
  cb(a.act.data(), "act", l, {T, F});
  ops::linear_forward(x_out, a.act.data(), W(p.wdown), W(p.bdown), T, F, C);
  add_inplace(x_out, x_mid, T * C);
  cb(x_out, "out", l, {T, C});
}

void Transformer::forward_layer(int l, const PackedBatch& b, LayerActivations& a, float* x_out) const {
  VERL_CHECK(l >= 0 && l < static_cast<int>(layers_.size()), "forward_layer: layer {} of {}", l, layers_.size());
  VERL_CHECK(static_cast<int64_t>(a.x_in.size()) >= b.num_tokens() * w_.config.hidden_size,
             "forward_layer: x_in holds {} values for {} tokens", a.x_in.size(), b.num_tokens());
  layer_forward(l, b, a, x_out, w_.data.data(), 0);
}

void Transformer::forward(const PackedBatch& b, Activations& acts, const ForwardOptions& opt,
                          WeightSource* source) const {
  const ModelConfig& c = w_.config;
  const ParamLayout& lay = w_.layout;
  const int64_t T = b.num_tokens(), B = b.num_seqs(), C = c.hidden_size, V = c.vocab_size;
  const int64_t L = c.num_hidden_layers;
  VERL_CHECK(T > 0 && B > 0 && b.cu_seqlens.back() == T && b.positions.size() == b.tokens.size(),
             "malformed packed batch: {} tokens, {} sequences", T, B);
  const RangeReader rd(w_, source);
  acts.T = T;
  acts.layers.resize(static_cast<size_t>(L));
  // Each range is read while the next one's gather (with a source) is under way.
  const float* we = rd.acquire(embed_);
  rd.prefetch(L > 0 ? layers_[0] : final_norm_);
  float* x0 = L > 0 ? grow(acts.layers[0].x_in, T * C) : grow(acts.x_final, T * C);
  ops::embedding_forward(x0, b.tokens.data(), rd.param(lay.embed, we, embed_.begin), T, C, V);
  rd.release(embed_);
  cb(x0, "embed", -1, {T, C});
  for (int64_t l = 0; l < L; ++l) {
    const float* wl = rd.acquire(layers_[l]);
    rd.prefetch(l + 1 < L ? layers_[l + 1] : final_norm_);
    float* x_out = l + 1 < L ? grow(acts.layers[l + 1].x_in, T * C) : grow(acts.x_final, T * C);
    layer_forward(static_cast<int>(l), b, acts.layers[l], x_out, wl, layers_[l].begin);
    rd.release(layers_[l]);
  }
  const float* wn = rd.acquire(final_norm_);
  rd.prefetch(head_);
  ops::rmsnorm_forward(grow(acts.h_final, T * C), grow(acts.rstd_final, T), acts.x_final.data(),
                       rd.param(lay.final_norm, wn, final_norm_.begin), T, C,
                       static_cast<float>(c.rms_norm_eps));
  rd.release(final_norm_);
  cb(acts.h_final.data(), "final_norm", -1, {T, C});
  const int64_t NL = c.num_labels;
  const float* wh = rd.acquire(head_);
  auto H = [&](int i) { return rd.param(i, wh, head_.begin); };
  switch (c.head) {
    case HeadKind::CausalLM:
      ops::lm_head_forward(grow(acts.logprob, T), grow(acts.entropy, T), grow(acts.lse_head, T),
                           acts.h_final.data(), H(w_.lm_head_param()), b.targets.data(), T, C, V,
                           opt.temperature, opt.lm_head_chunk);
      cb(acts.logprob.data(), "lm_head.logprob", -1, {T});
      cb(acts.entropy.data(), "lm_head.entropy", -1, {T});
      break;
    case HeadKind::TokenClassification:
      ops::linear_forward(grow(acts.values, T * NL), acts.h_final.data(), H(lay.score),
                          H(lay.score_bias), T, C, NL);
      cb(acts.values.data(), "value_head.values", -1, {T, NL});
      break;
    case HeadKind::SequenceClassification:
      grow(acts.scores, B * NL);
      for (int64_t s = 0; s < B; ++s) {
        const int64_t last = b.cu_seqlens[s + 1] - 1;
        ops::linear_forward(acts.scores.data() + s * NL, acts.h_final.data() + last * C,
                            H(lay.score), nullptr, 1, C, NL);
      }
      cb(acts.scores.data(), "score_head.scores", -1, {B, NL});
      break;
  }
  rd.release(head_);
}

void Transformer::layer_backward(int l, const PackedBatch& b, LayerActivations& a, Activations& s,
                                 float* d_x, float* base, int64_t base_offset, const float* wbase,
                                 int64_t woffset) const {
  const ModelConfig& c = w_.config;
  const LayerParams& p = w_.layout.layers[l];
  auto W = [&](int i) { return i >= 0 ? wbase + (w_.layout.params[i].offset - woffset) : nullptr; };
  auto G = [&](int i) { return i >= 0 ? base + (w_.layout.params[i].offset - base_offset) : nullptr; };
  const int64_t T = b.num_tokens(), B = b.num_seqs(), C = c.hidden_size, F = c.intermediate_size;
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), Q3 = qd + 2 * kvd;

  // MLP branch. On entry d_x = dL/dx_out, which is also the residual part of dL/dx_mid.
  float* d_act = zeroed(s.d_big, T * 3 * F);
  float* d_gu = d_act + T * F;
  ops::linear_backward(d_act, G(p.wdown), G(p.bdown), d_x, a.act.data(), W(p.wdown), T, F, C);
  ops::swiglu_backward(d_gu, d_act, a.gu.data(), T, F);
  float* d_xn = zeroed(s.d_xn, T * C);
  ops::linear_backward(d_xn, G(p.wgu), G(p.bgu), d_gu, a.xn2.data(), W(p.wgu), T, C, 2 * F);
  ops::rmsnorm_backward(d_x, G(p.mlp_norm), d_xn, a.x_mid.data(), W(p.mlp_norm), a.rstd2.data(),
                        T, C);
  // Attention branch. Now d_x = dL/dx_mid, also the residual part of dL/dx_in.
  float* d_att = zeroed(s.d_att, T * qd);
  ops::linear_backward(d_att, G(p.wo), G(p.bo), d_x, a.att.data(), W(p.wo), T, qd, C);
  float* d_q = zeroed(s.d_q, T * qd);
  float* d_k = zeroed(s.d_k, T * kvd);
  float* d_v = zeroed(s.d_v, T * kvd);
  ops::attention_backward(d_q, d_k, d_v, d_att, a.q.data(), a.k.data(), a.v.data(), a.att.data(),
                          a.lse.data(), b.cu_seqlens.data(), B, T, H, Hkv, D,
                          1.0f / std::sqrt(float(D)));
  ops::rope_backward(d_q, b.positions.data(), inv_freq_.data(), T, H, D);
  ops::rope_backward(d_k, b.positions.data(), inv_freq_.data(), T, Hkv, D);
  if (c.qk_norm) {
    // d_q/d_k are w.r.t. the normed q/k; take them back through the per-head RMSNorm.
    float* d_qpre = zeroed(s.scratch, T * (qd + kvd));
    float* d_kpre = d_qpre + T * qd;
    ops::rmsnorm_backward(d_qpre, G(p.q_norm), d_q, a.q_pre.data(), W(p.q_norm), a.rstd_q.data(),
                          T * H, D);
    ops::rmsnorm_backward(d_kpre, G(p.k_norm), d_k, a.k_pre.data(), W(p.k_norm), a.rstd_k.data(),
                          T * Hkv, D);
    d_q = d_qpre;
    d_k = d_kpre;
  }
  float* d_qkv = grow(s.d_qkv, T * Q3);
  for (int64_t t = 0; t < T; ++t) {
    float* row = d_qkv + t * Q3;
    std::copy(d_q + t * qd, d_q + (t + 1) * qd, row);
    std::copy(d_k + t * kvd, d_k + (t + 1) * kvd, row + qd);
    std::copy(d_v + t * kvd, d_v + (t + 1) * kvd, row + qd + kvd);
  }
  d_xn = zeroed(s.d_xn, T * C);
  ops::linear_backward(d_xn, G(p.wqkv), G(p.bqkv), d_qkv, a.xn1.data(), W(p.wqkv), T, C, Q3);
  ops::rmsnorm_backward(d_x, G(p.attn_norm), d_xn, a.x_in.data(), W(p.attn_norm), a.rstd1.data(),
                        T, C);
}

void Transformer::backward(const PackedBatch& b, Activations& acts, const float* d_logprob,
                           const float* d_entropy, const float* d_out, float* grads,
                           const ForwardOptions& opt, GradSink* sink, WeightSource* source) const {
  const ModelConfig& c = w_.config;
  const ParamLayout& lay = w_.layout;
  const int64_t T = b.num_tokens(), B = b.num_seqs(), C = c.hidden_size, V = c.vocab_size;
  const int64_t NL = c.num_labels;
  VERL_CHECK(acts.T == T, "backward called with a batch of {} tokens after a forward of {}", T,
             acts.T);
  VERL_CHECK(sink != nullptr || grads != nullptr, "backward: neither a gradient buffer nor a sink");
  const RangeReader rd(w_, source);
  // Each range's gradient view: the sink's, or the whole buffer's slice.
  auto open = [&](const Range& r) { return sink ? sink->open(r.begin, r.end) : grads + r.begin; };
  auto ready = [&](const Range& r) {
    if (sink) sink->ready(r.begin, r.end);
  };
  // A tied LM head's range is the embedding's, final only after the embedding's backward.
  const bool tied = c.head == HeadKind::CausalLM && w_.lm_head_param() == lay.embed;
  float* head_base = open(head_);
  auto G = [&](int i, float* base, const Range& r) {
    return i >= 0 ? base + (lay.params[i].offset - r.begin) : nullptr;
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
        ops::linear_backward(d_h, G(lay.score, head_base, head_), G(lay.score_bias, head_base, head_),
                             d_out, acts.h_final.data(), H(lay.score), T, C, NL);
      }
      break;
    case HeadKind::SequenceClassification:
      if (d_out) {
        for (int64_t s = 0; s < B; ++s) {
          const int64_t last = b.cu_seqlens[s + 1] - 1;
          ops::linear_backward(d_h + last * C, G(lay.score, head_base, head_), nullptr,
                               d_out + s * NL, acts.h_final.data() + last * C, H(lay.score),
                               1, C, NL);
        }
      }
      break;
  }
  rd.release(head_);
  if (!tied) ready(head_);
  const float* wn = rd.acquire(final_norm_);
  if (L > 0) rd.prefetch(layers_[L - 1]);
  float* d_x = zeroed(acts.d_x, T * C);
  ops::rmsnorm_backward(d_x, G(lay.final_norm, open(final_norm_), final_norm_), d_h, acts.x_final.data(),
                        rd.param(lay.final_norm, wn, final_norm_.begin), acts.rstd_final.data(), T, C);
  rd.release(final_norm_);
  ready(final_norm_);
  for (int64_t l = L - 1; l >= 0; --l) {
    const Range& r = layers_[l];
    const float* wl = rd.acquire(r);
    if (l > 0) rd.prefetch(layers_[l - 1]);
    layer_backward(static_cast<int>(l), b, acts.layers[l], acts, d_x, open(r), r.begin, wl, r.begin);
    rd.release(r);
    ready(r);
  }
  // The embedding's backward reads no weights.
  ops::embedding_backward(G(lay.embed, open(embed_), embed_), d_x, b.tokens.data(), T, C);
  ready(embed_);
}

}  // namespace verl::model
