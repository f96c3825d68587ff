// Causal grouped-query attention over packed variable-length sequences (no padding).
// Shapes: q[T,H,D], k[T,Hkv,D], v[T,Hkv,D], out[T,H,D], lse[T,H]; sequence b owns tokens
// [cu_seqlens[b], cu_seqlens[b+1]); query head h reads kv head h / (H/Hkv).
// Forward, for query row i of a sequence and keys j <= i of the same sequence:
//   s_ij = scale q_i.k_j,  lse_i = logsumexp_j s_ij,  p_ij = exp(s_ij - lse_i),  out_i = sum_j p_ij
//   v_j
// Backward (flash-attention style, from the saved lse and out; Dao et al. 2022, alg. 4):
//   D_i = d_out_i.out_i,  dp_ij = d_out_i.v_j,  ds_ij = p_ij (dp_ij - D_i)
//   d_q_i += scale sum_j ds_ij k_j,  d_k_j += scale sum_i ds_ij q_i,  d_v_j += sum_i p_ij d_out_i
// Forward overwrites out and lse (lse may be null); backward accumulates into d_q, d_k, d_v
// (null = skip). Memory per thread is one row of scores (O(T)), never a T x T matrix.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "ops/cpu/fast_math.h"
#include "ops/cpu/ops.h"

namespace verl::ops::cpu {

namespace {

inline float dot(const float* a, const float* b, int64_t D) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

inline void axpy(float* y, float a, const float* x, int64_t D) {
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) y[d] += a * x[d];
}

// s[j] -> exp(s[j] - m) in place for j < n; returns the sum. A plain function so the loop
// vectorises (fast_exp), which matters: there is one exp per (query, key) pair.
float exp_shifted(float* s, int64_t n, float m) {
  float l = 0.0f;
#pragma omp simd reduction(+ : l)
  for (int64_t j = 0; j < n; ++j) {
    const float e = detail::fast_exp(s[j] - m);
    s[j] = e;
    l += e;
  }
  return l;
}

void check_args(const int32_t* cu_seqlens, int64_t B, int64_t T, int64_t H, int64_t Hkv) {
  VERL_CHECK(Hkv > 0 && H % Hkv == 0, "attention: H={} is not a multiple of Hkv={}", H, Hkv);
  VERL_CHECK(cu_seqlens[0] == 0, "attention: cu_seqlens[0]={} must be 0", cu_seqlens[0]);
  for (int64_t b = 0; b < B; ++b) {
    VERL_CHECK(cu_seqlens[b + 1] >= cu_seqlens[b],
               "attention: cu_seqlens is not non-decreasing at sequence {} ({} > {})", b,
               cu_seqlens[b], cu_seqlens[b + 1]);
  }
  VERL_CHECK(cu_seqlens[B] == T, "attention: cu_seqlens[B={}]={} but T={}", B, cu_seqlens[B], T);
}

int64_t max_seqlen(const int32_t* cu_seqlens, int64_t B) {
  int64_t m = 0;
  for (int64_t b = 0; b < B; ++b) m = std::max<int64_t>(m, cu_seqlens[b + 1] - cu_seqlens[b]);
  return m;
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int32_t* cu_seqlens, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                       int64_t D, float scale) {
  check_args(cu_seqlens, B, T, H, Hkv);
  const int64_t rep = H / Hkv;
  const int64_t maxL = max_seqlen(cu_seqlens, B);

  // Work items: (sequence, head, block of query rows). Causal rows grow in cost, so blocks are
  // handed out dynamically, the costliest (last) blocks of each head first.
  constexpr int64_t kRows = 16;
  struct Task {
    int64_t b, h, i0, i1;
  };
  std::vector<Task> tasks;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t L = cu_seqlens[b + 1] - cu_seqlens[b];
    for (int64_t i0 = ((L - 1) / kRows) * kRows; L > 0 && i0 >= 0; i0 -= kRows) {
      for (int64_t h = 0; h < H; ++h) tasks.push_back({b, h, i0, std::min(L, i0 + kRows)});
    }
  }
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& x, const Task& y) { return x.i1 > y.i1; });

  const int64_t qs = H * D, ks = Hkv * D;  // token strides
#pragma omp parallel
  {
    std::vector<float> srow(static_cast<size_t>(std::max<int64_t>(maxL, 1)));
    std::vector<float> acc(static_cast<size_t>(D));
#pragma omp for schedule(dynamic, 1)
    for (size_t ti = 0; ti < tasks.size(); ++ti) {
      const Task tk = tasks[ti];
      const int64_t s0 = cu_seqlens[tk.b];
      const int64_t g = tk.h / rep;
      const float* kb = k + s0 * ks + g * D;
      const float* vb = v + s0 * ks + g * D;
      for (int64_t i = tk.i0; i < tk.i1; ++i) {
        const float* qi = q + (s0 + i) * qs + tk.h * D;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          const float s = scale * dot(qi, kb + j * ks, D);
          srow[j] = s;
          m = std::max(m, s);
        }
        const float l = exp_shifted(srow.data(), i + 1, m);
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = 0; j <= i; ++j) axpy(acc.data(), srow[j], vb + j * ks, D);
        const float inv_l = 1.0f / l;
        float* oi = out + (s0 + i) * qs + tk.h * D;
        for (int64_t d = 0; d < D; ++d) oi[d] = acc[d] * inv_l;
        if (lse != nullptr) lse[(s0 + i) * H + tk.h] = m + std::log(l);
      }
    }
  }
}

void attention_backward(float* d_q, float* d_k, float* d_v, const float* d_out, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const int32_t* cu_seqlens, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                        int64_t D, float scale) {
  check_args(cu_seqlens, B, T, H, Hkv);
  if (d_q == nullptr && d_k == nullptr && d_v == nullptr) return;
  const int64_t rep = H / Hkv;

  // One work item per (sequence, kv head): the `rep` query heads that share a kv head all add
  // into the same d_k/d_v rows, so they run inside one item and no two threads touch one row.
  struct Task {
    int64_t b, g, L;
  };
  std::vector<Task> tasks;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t L = cu_seqlens[b + 1] - cu_seqlens[b];
    if (L > 0) {
      for (int64_t g = 0; g < Hkv; ++g) tasks.push_back({b, g, L});
    }
  }
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& x, const Task& y) { return x.L > y.L; });  // longest first

  const int64_t qs = H * D, ks = Hkv * D;
#pragma omp parallel
  {
    std::vector<float> dq_acc(static_cast<size_t>(D));
    std::vector<float> prow(static_cast<size_t>(std::max<int64_t>(max_seqlen(cu_seqlens, B), 1)));
#pragma omp for schedule(dynamic, 1)
    for (size_t ti = 0; ti < tasks.size(); ++ti) {
      const Task tk = tasks[ti];
      const int64_t s0 = cu_seqlens[tk.b];
      const float* kb = k + s0 * ks + tk.g * D;
      const float* vb = v + s0 * ks + tk.g * D;
      float* dkb = d_k != nullptr ? d_k + s0 * ks + tk.g * D : nullptr;
      float* dvb = d_v != nullptr ? d_v + s0 * ks + tk.g * D : nullptr;
      for (int64_t h = tk.g * rep; h < (tk.g + 1) * rep; ++h) {
        for (int64_t i = 0; i < tk.L; ++i) {
          const int64_t row = (s0 + i) * qs + h * D;
          const float* qi = q + row;
          const float* doi = d_out + row;
          const float Di = dot(doi, out + row, D);
          const float lse_i = lse[(s0 + i) * H + h];
          std::fill(dq_acc.begin(), dq_acc.end(), 0.0f);
          for (int64_t j = 0; j <= i; ++j) prow[j] = scale * dot(qi, kb + j * ks, D);
          exp_shifted(prow.data(), i + 1, lse_i);  // p_ij = exp(s_ij - lse_i)
          for (int64_t j = 0; j <= i; ++j) {
            const float* kj = kb + j * ks;
            const float p = prow[j];
            const float ds = p * (dot(doi, vb + j * ks, D) - Di);
            axpy(dq_acc.data(), ds, kj, D);
            if (dkb != nullptr) axpy(dkb + j * ks, scale * ds, qi, D);
            if (dvb != nullptr) axpy(dvb + j * ks, p, doi, D);
          }
          if (d_q != nullptr) axpy(d_q + row, scale, dq_acc.data(), D);
        }
      }
    }
  }
}

}  // namespace verl::ops::cpu
