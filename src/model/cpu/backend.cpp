// The CPU decoder's ops (backend.h) over ops/cpu: which kernel each context runs. The training
// context must stay on linear_forward / attention_forward (the golden HF tests pin them) and the
// rollout on linear_forward_invariant / paged_attention_forward (bitwise batch invariance).
#include "model/cpu/backend.h"

#include <algorithm>
#include <cmath>
#include <span>

#include "core/buffer.h"
#include "core/dump.h"
#include "core/error.h"
#include "ops/cpu/ops.h"

namespace verl::model::cpu {
namespace ops = verl::ops::cpu;

Backend Backend::training(const ModelConfig& c, const float* inv_freq) {
  return Backend(c, inv_freq);
}

Backend Backend::rollout(const ModelConfig& c, const float* inv_freq, const PagedKv& kv) {
  Backend b(c, inv_freq);
  b.paged_ = true;
  b.kv_ = kv;
  return b;
}

void Backend::norm(float* y, float* rstd, const float* x, const float* w, int64_t rows,
                   int64_t n) const {
  ops::rmsnorm_forward(y, rstd, x, w, rows, n, static_cast<float>(c_.rms_norm_eps));
}

template <class P>
void attach_lora(LayerTensors<P>& t, const LoraWeights& lora, int l, P base) {
  auto add = [&](LoraProjection<P>& p, LoraTarget target) {
    const int i = static_cast<int>(target);
    const int ia = lora.a[static_cast<size_t>(l)][i], ib = lora.b[static_cast<size_t>(l)][i];
    if (ia < 0) return;
    auto& s = p.seg[static_cast<size_t>(p.count++)];
    s.a = base + lora.layout.params[ia].offset;
    s.b = base + lora.layout.params[ib].offset;
    s.col0 = lora.base_row0(target);
    s.cols = lora.out_features(target);
    p.r = lora.rank();
    p.scale = lora.scale();
  };
  add(t.lora_qkv, LoraTarget::Q);
  add(t.lora_qkv, LoraTarget::K);
  add(t.lora_qkv, LoraTarget::V);
  add(t.lora_o, LoraTarget::O);
  add(t.lora_gu, LoraTarget::Gate);
  add(t.lora_gu, LoraTarget::Up);
  add(t.lora_down, LoraTarget::Down);
}
template void attach_lora(LayerTensors<const float*>&, const LoraWeights&, int, const float*);
template void attach_lora(LayerTensors<float*>&, const LoraWeights&, int, float*);

void Backend::project(float* y, const float* x, const float* w, const float* b, int64_t T,
                      int64_t K, int64_t N, const LoraProjection<const float*>& lora) const {
  // The training context's matmul, or the rollout's batch-invariant one (so the adapters keep
  // the rollout batch-invariant too).
  auto matmul = [&](float* out, const float* in, const float* m, const float* bias, int64_t k,
                    int64_t n) {
    if (paged_) {
      ops::linear_forward_invariant(out, in, m, bias, T, k, n);
    } else {
      ops::linear_forward(out, in, m, bias, T, k, n);
    }
  };
  matmul(y, x, w, b, K, N);
  if (lora.count == 0 || T <= 0) return;
  // PEFT: result = base(x) + lora_B(lora_A(x)) * scaling, per segment.
  const int64_t r = lora.r;
  for (int s = 0; s < lora.count; ++s) {
    const auto& seg = lora.seg[static_cast<size_t>(s)];
    float* xa = grow(lora_scratch_, T * (r + seg.cols));
    float* xab = xa + T * r;
    matmul(xa, x, seg.a, nullptr, K, r);
    matmul(xab, xa, seg.b, nullptr, r, seg.cols);
    for (int64_t t = 0; t < T; ++t) {
      float* yr = y + t * N + seg.col0;
      const float* d = xab + t * seg.cols;
      for (int64_t j = 0; j < seg.cols; ++j) yr[j] += d[j] * lora.scale;
    }
  }
}

void Backend::rope(float* x, const Tokens& t, int64_t heads) const {
  ops::rope_forward(x, t.positions, inv_freq_, t.T, heads, c_.head_dim);
}

void Backend::attention(int64_t layer, float* out, float* lse, const float* q, const float* k,
                        const float* v, const Tokens& t) const {
  const int64_t H = c_.num_attention_heads, Hkv = c_.num_key_value_heads, D = c_.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  if (!paged_) {
    ops::attention_forward(out, lse, q, k, v, t.cu_seqlens, t.B, t.T, H, Hkv, D, scale);
    return;
  }
  // The new tokens' keys and values go to their slots first: each token then reads its own.
  const int64_t kvd = c_.kv_dim();
  float* Kc = kv_.k + layer * kv_.layer_stride;
  float* Vc = kv_.v + layer * kv_.layer_stride;
  for (int64_t i = 0; i < t.T; ++i) {
    const int64_t slot = kv_.slot_mapping[i];
    std::copy(k + i * kvd, k + (i + 1) * kvd, Kc + slot * kvd);
    std::copy(v + i * kvd, v + (i + 1) * kvd, Vc + slot * kvd);
  }
  ops::paged_attention_forward(out, q, Kc, Vc, kv_.block_tables, kv_.max_blocks_per_seq,
                               t.cu_seqlens, t.positions, t.B, t.T, H, Hkv, D, kv_.block_size,
                               scale);
}

void Backend::ffn(int64_t layer, float* out, float* gu, float* act, const float* xn,
                  const LayerWeights& w, int64_t T) const {
  const int64_t C = c_.hidden_size, F = c_.intermediate_size;
  project(gu, xn, w.wgu, w.bgu, T, C, 2 * F, w.lora_gu);
  dump(gu, "gate_up", layer, {T, 2 * F});
  ops::swiglu_forward(act, gu, T, F);
  dump(act, "act", layer, {T, F});
  project(out, act, w.wdown, w.bdown, T, F, C, w.lora_down);
}

void Backend::norm_backward(float* d_x, float* d_w, const float* d_y, const float* x,
                            const float* w, const float* rstd, int64_t rows, int64_t n) const {
  ops::rmsnorm_backward(d_x, d_w, d_y, x, w, rstd, rows, n);
}

void Backend::project_backward(float* d_x, float* d_w, float* d_b, const float* d_y, const float* x,
                               const float* w, int64_t T, int64_t K, int64_t N,
                               const LoraProjection<const float*>& lora,
                               const LoraProjection<float*>& d_lora) const {
  VERL_CHECK(!paged_, "the rollout's forward has no backward");
  ops::linear_backward(d_x, d_w, d_b, d_y, x, w, T, K, N);
  if (lora.count == 0 || T <= 0) return;
  VERL_CHECK(d_lora.count == 0 || d_lora.count == lora.count,
             "project_backward: {} adapter gradients for {} adapters", d_lora.count, lora.count);
  // With g = scale * d_y[:, segment] and xa = x A^T (recomputed, not kept):
  //   d_B += g^T xa;  d_xa = g B;  d_A += d_xa^T x;  d_x += d_xa A.
  const int64_t r = lora.r;
  for (int s = 0; s < lora.count; ++s) {
    const auto& seg = lora.seg[static_cast<size_t>(s)];
    float* d_a = d_lora.count ? d_lora.seg[static_cast<size_t>(s)].a : nullptr;
    float* d_b_lora = d_lora.count ? d_lora.seg[static_cast<size_t>(s)].b : nullptr;
    if (d_x == nullptr && d_a == nullptr && d_b_lora == nullptr) continue;
    float* xa = grow(lora_scratch_, T * (2 * r + seg.cols));
    float* d_xa = xa + T * r;
    float* g = d_xa + T * r;
    ops::linear_forward(xa, x, seg.a, nullptr, T, K, r);
    for (int64_t t = 0; t < T; ++t) {
      const float* dy = d_y + t * N + seg.col0;
      float* gr = g + t * seg.cols;
      for (int64_t j = 0; j < seg.cols; ++j) gr[j] = dy[j] * lora.scale;
    }
    std::fill(d_xa, d_xa + T * r, 0.0f);
    ops::linear_backward(d_xa, d_b_lora, nullptr, g, xa, seg.b, T, r, seg.cols);
    ops::linear_backward(d_x, d_a, nullptr, d_xa, x, seg.a, T, K, r);
  }
}

void Backend::rope_backward(float* d_x, const Tokens& t, int64_t heads) const {
  ops::rope_backward(d_x, t.positions, inv_freq_, t.T, heads, c_.head_dim);
}

void Backend::attention_backward(float* d_q, float* d_k, float* d_v, const float* d_out,
                                 const float* q, const float* k, const float* v, const float* out,
                                 const float* lse, const Tokens& t) const {
  VERL_CHECK(!paged_, "the rollout's forward has no backward");
  const int64_t D = c_.head_dim;
  ops::attention_backward(d_q, d_k, d_v, d_out, q, k, v, out, lse, t.cu_seqlens, t.B, t.T,
                          c_.num_attention_heads, c_.num_key_value_heads, D,
                          1.0f / std::sqrt(float(D)));
}

void Backend::ffn_backward(float* d_xn, const LayerGrads& g, const float* d_out, const float* xn,
                           const float* gu, const float* act, const LayerWeights& w, float* scratch,
                           int64_t T) const {
  const int64_t C = c_.hidden_size, F = c_.intermediate_size;
  float* d_act = scratch;  // [T, F], then d_gu [T, 2F]; zeroed by the caller
  float* d_gu = d_act + T * F;
  project_backward(d_act, g.wdown, g.bdown, d_out, act, w.wdown, T, F, C, w.lora_down, g.lora_down);
  ops::swiglu_backward(d_gu, d_act, gu, T, F);
  project_backward(d_xn, g.wgu, g.bgu, d_gu, xn, w.wgu, T, C, 2 * F, w.lora_gu, g.lora_gu);
}

void Backend::dump(const float* x, std::string_view name, int64_t layer,
                   std::initializer_list<int64_t> shape) const {
  if (paged_ || !verl::dump::enabled()) return;
  const std::span<const int64_t> s(shape.begin(), shape.size());
  if (layer < 0) {
    verl::dump::tensor("cpu", name, x, s);
  } else {
    verl::dump::tensor("cpu", fmt::format("L{}.{}", layer, name), x, s);
  }
}

}  // namespace verl::model::cpu
