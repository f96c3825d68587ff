// Forward of one scheduled step over the paged KV cache, on CPU. Per layer: the same projections,
// norms and RoPE as model/transformer.cpp, then the new tokens' K/V are written to their slots and
// each new token attends over its sequence's cached keys 0..pos, read through the block table.
#include "rollout/model_runner.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/buffer.h"
#include "core/error.h"
#include "ops/cpu/ops.h"

namespace verl::rollout {
namespace ops = verl::ops::cpu;
KVCache::KVCache(const model::ModelConfig& cfg, int32_t num_blocks, int32_t block_size)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      token_stride_(cfg.num_key_value_heads * cfg.head_dim),
      layer_stride_(static_cast<int64_t>(num_blocks) * block_size * token_stride_),
      num_layers_(cfg.num_hidden_layers) {
  VERL_CHECK(num_blocks > 0 && block_size > 0, "KV cache needs blocks: {} blocks of {} tokens",
             num_blocks, block_size);
  k_.assign(static_cast<size_t>(layer_stride_ * num_layers_), 0.0f);
  v_.assign(static_cast<size_t>(layer_stride_ * num_layers_), 0.0f);
}

void KVCache::copy_block(int32_t src, int32_t dst) {
  const int64_t n = block_size_ * token_stride_;
  for (int64_t l = 0; l < num_layers_; ++l) {
    std::memcpy(k(l) + dst * n, k(l) + src * n, n * sizeof(float));
    std::memcpy(v(l) + dst * n, v(l) + src * n, n * sizeof(float));
  }
}

CpuModelRunner::CpuModelRunner(const model::Weights& weights, KVCache& cache)
    : w_(weights), cache_(cache), inv_freq_(model::rope_inv_freq(weights.config)) {
  VERL_CHECK(weights.config.head == model::HeadKind::CausalLM,
             "the rollout needs a causal LM, got {}", weights.config.architecture);
  scores_.resize(static_cast<size_t>(omp_get_max_threads()));
}

// Attention of every new token over its sequence's keys [0, pos], in key order, one query head at
// a time: two passes (max, then exp-sum and weighted values) so the result does not depend on how
// tokens are grouped into steps.
void CpuModelRunner::attention(int64_t layer, const ScheduledBatch& b, const float* q, float* out) {
  const model::ModelConfig& c = w_.config;
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  const int64_t group = H / Hkv, bs = cache_.block_size(), ts = cache_.token_stride();
  const int64_t W = b.max_blocks_per_seq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const float* K = cache_.k(layer);
  const float* V = cache_.v(layer);
  const int64_t T = b.num_tokens();
  for (auto& s : scores_) grow(s, b.max_context_len);
  // Map each token to its item (sequence of this step).
  std::vector<int32_t>& item_of = item_of_;
  item_of.resize(static_cast<size_t>(T));
  for (int32_t i = 0; i < b.num_seqs(); ++i) {
    for (int32_t t = b.cu_seqlens[i]; t < b.cu_seqlens[i + 1]; ++t) item_of[t] = i;
  }
#pragma omp parallel for collapse(2) schedule(dynamic, 4)
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      float* sc = scores_[omp_get_thread_num()].data();
      const int32_t* table = b.block_tables.data() + item_of[t] * W;
      const int64_t n_keys = b.positions[t] + 1;
      const int64_t g = h / group;
      const float* qv = q + (t * H + h) * D;
      float mx = -INFINITY;
      for (int64_t j = 0; j < n_keys; ++j) {
        const float* kv = K + (table[j / bs] * bs + j % bs) * ts + g * D;
        float s = 0.0f;
        for (int64_t d = 0; d < D; ++d) s += qv[d] * kv[d];
        s *= scale;
        sc[j] = s;
        mx = std::max(mx, s);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < n_keys; ++j) {
        sc[j] = std::exp(sc[j] - mx);
        sum += sc[j];
      }
      float* o = out + (t * H + h) * D;
      std::fill(o, o + D, 0.0f);
      const float inv = 1.0f / sum;
      for (int64_t j = 0; j < n_keys; ++j) {
        const float* vv = V + (table[j / bs] * bs + j % bs) * ts + g * D;
        const float p = sc[j] * inv;
        for (int64_t d = 0; d < D; ++d) o[d] += p * vv[d];
      }
    }
  }
}

void CpuModelRunner::run(const ScheduledBatch& b, std::vector<float>& logits) {
  const model::ModelConfig& c = w_.config;
  const model::ParamLayout& lay = w_.layout;
  auto W = [&](int i) { return i >= 0 ? w_.param(i) : nullptr; };
  const int64_t T = b.num_tokens(), C = c.hidden_size, F = c.intermediate_size, V = c.vocab_size;
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), Q3 = qd + 2 * kvd;
  const float eps = static_cast<float>(c.rms_norm_eps);
  for (const BlockCopy& cp : b.block_copies) cache_.copy_block(cp.src, cp.dst);
  const int64_t S = b.num_samples();
  logits.resize(static_cast<size_t>(S * V));
  if (T == 0) {
    VERL_CHECK(S == 0, "a step with no tokens cannot sample");
    return;
  }

  float* x = grow(x_, T * C);
  ops::embedding_forward(x, b.input_ids.data(), w_.param(lay.embed), T, C, V);
  float* xn = grow(xn_, T * C);
  float* rstd = grow(rstd_, T);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const model::LayerParams& p = lay.layers[l];
    ops::rmsnorm_forward(xn, rstd, x, W(p.attn_norm), T, C, eps);
    float* qkv = grow(qkv_, T * Q3);
    ops::linear_forward_invariant(qkv, xn, W(p.wqkv), W(p.bqkv), T, C, Q3);
    float* q = grow(q_, T * qd);
    float* k = grow(k_, T * kvd);
    float* v = grow(v_, T * kvd);
    for (int64_t t = 0; t < T; ++t) {
      const float* row = qkv + t * Q3;
      std::copy(row, row + qd, q + t * qd);
      std::copy(row + qd, row + qd + kvd, k + t * kvd);
      std::copy(row + qd + kvd, row + Q3, v + t * kvd);
    }
    if (c.qk_norm) {
      float* tmp = grow(tmp_, T * std::max(qd, kvd));
      float* rh = grow(rstd_h_, T * H);
      std::copy(q, q + T * qd, tmp);
      ops::rmsnorm_forward(q, rh, tmp, W(p.q_norm), T * H, D, eps);
      std::copy(k, k + T * kvd, tmp);
      ops::rmsnorm_forward(k, rh, tmp, W(p.k_norm), T * Hkv, D, eps);
    }
    ops::rope_forward(q, b.positions.data(), inv_freq_.data(), T, H, D);
    ops::rope_forward(k, b.positions.data(), inv_freq_.data(), T, Hkv, D);
    float* Kc = cache_.k(l);
    float* Vc = cache_.v(l);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t slot = b.slot_mapping[t];
      std::copy(k + t * kvd, k + (t + 1) * kvd, Kc + slot * kvd);
      std::copy(v + t * kvd, v + (t + 1) * kvd, Vc + slot * kvd);
    }
    float* att = grow(att_, T * qd);
    attention(l, b, q, att);
    float* o = grow(tmp_, T * C);
    ops::linear_forward_invariant(o, att, W(p.wo), W(p.bo), T, qd, C);
    for (int64_t i = 0; i < T * C; ++i) x[i] += o[i];
    ops::rmsnorm_forward(xn, rstd, x, W(p.mlp_norm), T, C, eps);
    float* gu = grow(gu_, T * 2 * F);
    ops::linear_forward_invariant(gu, xn, W(p.wgu), W(p.bgu), T, C, 2 * F);
    float* act = grow(act_, T * F);
    ops::swiglu_forward(act, gu, T, F);
    ops::linear_forward_invariant(o, act, W(p.wdown), W(p.bdown), T, F, C);
    for (int64_t i = 0; i < T * C; ++i) x[i] += o[i];
  }
  if (S == 0) return;
  // Final norm and LM head only for the rows that sample.
  float* rows = grow(h_rows_, S * C);
  for (int64_t s = 0; s < S; ++s) {
    const int64_t t = b.sample_token_indices[s];
    std::copy(x + t * C, x + (t + 1) * C, rows + s * C);
  }
  float* hn = grow(xn_, S * C);
  ops::rmsnorm_forward(hn, grow(rstd_, S), rows, w_.param(lay.final_norm), S, C, eps);
  ops::linear_forward_invariant(logits.data(), hn, w_.lm_head(), nullptr, S, C, V);
}

}  // namespace verl::rollout
