// The CPU decoder's ops (backend.h) over ops/cpu: which kernel each context runs. The training
// context must stay on linear_forward / attention_forward (the golden HF tests pin them) and the
// rollout on linear_forward_invariant / paged_attention_forward (bitwise batch invariance).
#include "model/cpu/backend.h"

#include <algorithm>
#include <cmath>
#include <span>

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

void Backend::project(float* y, const float* x, const float* w, const float* b, int64_t T,
                      int64_t K, int64_t N) const {
  if (paged_) {
    ops::linear_forward_invariant(y, x, w, b, T, K, N);
  } else {
    ops::linear_forward(y, x, w, b, T, K, N);
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
  project(gu, xn, w.wgu, w.bgu, T, C, 2 * F);
  dump(gu, "gate_up", layer, {T, 2 * F});
  ops::swiglu_forward(act, gu, T, F);
  dump(act, "act", layer, {T, F});
  project(out, act, w.wdown, w.bdown, T, F, C);
}

void Backend::norm_backward(float* d_x, float* d_w, const float* d_y, const float* x,
                            const float* w, const float* rstd, int64_t rows, int64_t n) const {
  ops::rmsnorm_backward(d_x, d_w, d_y, x, w, rstd, rows, n);
}

void Backend::project_backward(float* d_x, float* d_w, float* d_b, const float* d_y, const float* x,
                               const float* w, int64_t T, int64_t K, int64_t N) const {
  VERL_CHECK(!paged_, "the rollout's forward has no backward");
  ops::linear_backward(d_x, d_w, d_b, d_y, x, w, T, K, N);
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
  project_backward(d_act, g.wdown, g.bdown, d_out, act, w.wdown, T, F, C);
  ops::swiglu_backward(d_gu, d_act, gu, T, F);
  project_backward(d_xn, g.wgu, g.bgu, d_gu, xn, w.wgu, T, C, 2 * F);
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
