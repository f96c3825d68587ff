// Token embedding lookup: out[t,:] = table[ids[t],:] with table [V,C], ids [T].
// Backward: d_table[ids[t],:] += d_out[t,:] (a scatter-add; repeated ids accumulate).
// Forward overwrites out; backward accumulates into d_table.
#include <algorithm>

#include "core/error.h"
#include "ops/cpu/ops.h"

namespace verl::ops::cpu {

void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t T, int64_t C,
                       int64_t V) {
  for (int64_t t = 0; t < T; ++t) {
    VERL_CHECK(ids[t] >= 0 && ids[t] < V,
               "embedding_forward: token id {} at position {} is outside the vocabulary [0, {})",
               ids[t], t, V);
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* src = table + static_cast<int64_t>(ids[t]) * C;
    std::copy(src, src + C, out + t * C);
  }
}

void embedding_backward(float* d_table, const float* d_out, const int32_t* ids, int64_t T,
                        int64_t C) {
  if (d_table == nullptr) return;
  for (int64_t t = 0; t < T; ++t) {
    VERL_CHECK(ids[t] >= 0, "embedding_backward: negative token id {} at position {}", ids[t], t);
  }
  // Parallel over column blocks, not tokens: two tokens with the same id would race on one row.
  // Every thread walks the tokens in order, so the sum is also independent of the thread count.
  constexpr int64_t kBlock = 64;
  const int64_t nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t c0 = blk * kBlock, c1 = std::min(C, c0 + kBlock);
    for (int64_t t = 0; t < T; ++t) {
      float* dst = d_table + static_cast<int64_t>(ids[t]) * C;
      const float* src = d_out + t * C;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

}  // namespace verl::ops::cpu
