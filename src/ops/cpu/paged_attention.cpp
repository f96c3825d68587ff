// Causal GQA attention of a rollout step's new tokens over the paged KV cache, forward only.
// Shapes: q[T,H,D], out[T,H,D]; k_cache, v_cache [num_blocks, block_size, Hkv, D]. Token t of
// item b (cu_seqlens) attends to its sequence's keys j = 0..positions[t], key j living at slot
// block_tables[b*W + j/block_size]*block_size + j%block_size. Query head h reads kv head h/(H/Hkv).
// Batch invariance: each (t, h) row is one fixed sequence of float ops in key order (pass 1: scores
// and their max; pass 2: exp, sum, weighted values), so it does not depend on how tokens are
// grouped into steps. ops/cuda's paged attention is tested against this op.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/buffer.h"
#include "ops/cpu/ops.h"

namespace verl::ops::cpu {

void paged_attention_forward(float* out, const float* q, const float* k_cache, const float* v_cache,
                             const int32_t* block_tables, int64_t W, const int32_t* cu_seqlens,
                             const int32_t* positions, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                             int64_t D, int64_t block_size, float scale) {
  const int64_t group = H / Hkv, bs = block_size, ts = Hkv * D;
  int64_t max_keys = 0;
  for (int64_t t = 0; t < T; ++t) max_keys = std::max<int64_t>(max_keys, positions[t] + 1);
#pragma omp parallel
  {
    // One row of scores per thread, kept between calls (it grows to the longest context seen).
    static thread_local std::vector<float> scores;
    float* sc = grow(scores, max_keys);
#pragma omp for collapse(2) schedule(dynamic, 4)
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        // The item whose new tokens include t: the last b with cu_seqlens[b] <= t.
        const int64_t item = std::upper_bound(cu_seqlens, cu_seqlens + B + 1, t) - cu_seqlens - 1;
        const int32_t* table = block_tables + item * W;
        const int64_t n_keys = positions[t] + 1;
        const int64_t g = h / group;
        const float* qv = q + (t * H + h) * D;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n_keys; ++j) {
          const float* kv = k_cache + (table[j / bs] * bs + j % bs) * ts + g * D;
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
          const float* vv = v_cache + (table[j / bs] * bs + j % bs) * ts + g * D;
          const float p = sc[j] * inv;
          for (int64_t d = 0; d < D; ++d) o[d] += p * vv[d];
        }
      }
    }
  }
}

}  // namespace verl::ops::cpu
