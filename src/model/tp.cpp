// Slicing a model for tensor-parallel generation (model/tp.h): rows of the column-parallel
// projections, columns of the row-parallel ones, rows of the vocabulary; the rest copied.
#include "model/tp.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace verl::model {
namespace {

// Copies rows [r0, r0 + n) of a [*, cols] matrix at `src` to row `d0` of one at `dst`.
void copy_rows(float* dst, int64_t d0, const float* src, int64_t r0, int64_t n, int64_t cols) {
  if (n > 0) std::memcpy(dst + d0 * cols, src + r0 * cols, sizeof(float) * n * cols);
}

// Copies columns [c0, c0 + n) of every row of a [rows, src_cols] matrix into a [rows, n] one.
void copy_cols(float* dst, const float* src, int64_t rows, int64_t src_cols, int64_t c0,
               int64_t n) {
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(dst + i * n, src + i * src_cols + c0, sizeof(float) * n);
}

}  // namespace

void check_tp_split(const ModelConfig& c, int size) {
  const std::string key = "actor_rollout_ref.rollout.tensor_model_parallel_size";
  VERL_CHECK(size >= 1, "{}={}: a group needs at least one rank", key, size);
  VERL_CHECK(c.head == HeadKind::CausalLM, "{}={}: only a causal LM generates, got {}", key, size,
             c.architecture);
  VERL_CHECK(c.num_attention_heads % size == 0 && c.num_key_value_heads % size == 0,
             "{}={} must divide num_attention_heads ({}) and num_key_value_heads ({}) of {}: each "
             "rank holds whole heads",
             key, size, c.num_attention_heads, c.num_key_value_heads, c.architecture);
  VERL_CHECK(c.intermediate_size % size == 0, "{}={} must divide intermediate_size ({}) of {}", key,
             size, c.intermediate_size, c.architecture);
}

TpSlice tp_slice(const Weights& full, int rank, int size) {
  const ModelConfig& c = full.config;
  check_tp_split(c, size);
  VERL_CHECK(rank >= 0 && rank < size,
             "actor_rollout_ref.rollout.tensor_model_parallel_size={}: rank {} is not in the group",
             size, rank);
  const int64_t C = c.hidden_size, D = c.head_dim, V = c.vocab_size, F = c.intermediate_size;
  const int64_t Hl = c.num_attention_heads / size, Hkvl = c.num_key_value_heads / size;
  const int64_t Fl = F / size, Vl = (V + size - 1) / size;

  ModelConfig lc = c;
  lc.num_attention_heads = Hl;
  lc.num_key_value_heads = Hkvl;
  lc.head_dim = D;
  lc.intermediate_size = Fl;
  lc.vocab_size = Vl;
  TpSlice s;
  s.rank = rank;
  s.size = size;
  s.vocab_size = V;
  s.vocab_begin = rank * Vl;
  s.weights = Weights::from_config(lc);
  Weights& w = s.weights;
  const ParamLayout &fl = full.layout, &sl = w.layout;

  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), qdl = Hl * D, kvdl = Hkvl * D;
  // q | k | v rows (or bias entries: cols = 1) of this rank's heads.
  auto qkv = [&](float* dst, const float* src, int64_t cols) {
    copy_rows(dst, 0, src, rank * qdl, qdl, cols);
    copy_rows(dst, qdl, src, qd + rank * kvdl, kvdl, cols);
    copy_rows(dst, qdl + kvdl, src, qd + kvd + rank * kvdl, kvdl, cols);
  };
  // gate | up rows of this rank's share of F.
  auto gu = [&](float* dst, const float* src, int64_t cols) {
    copy_rows(dst, 0, src, rank * Fl, Fl, cols);
    copy_rows(dst, Fl, src, F + rank * Fl, Fl, cols);
  };
  auto whole = [&](int dst, int src) {
    if (src >= 0) std::memcpy(w.param(dst), full.param(src), sizeof(float) * fl.params[src].numel);
  };
  auto vocab_rows = [&](int dst, int src) {
    copy_rows(w.param(dst), 0, full.param(src), s.vocab_begin,
              std::clamp<int64_t>(V - s.vocab_begin, 0, Vl), C);  // the rest stays zero padding
  };

  vocab_rows(sl.embed, fl.embed);
  for (size_t l = 0; l < fl.layers.size(); ++l) {
    const LayerParams &f = fl.layers[l], &d = sl.layers[l];
    whole(d.attn_norm, f.attn_norm);
    qkv(w.param(d.wqkv), full.param(f.wqkv), C);
    if (f.bqkv >= 0) qkv(w.param(d.bqkv), full.param(f.bqkv), 1);
    if (f.q_norm >= 0) whole(d.q_norm, f.q_norm);
    if (f.k_norm >= 0) whole(d.k_norm, f.k_norm);
    copy_cols(w.param(d.wo), full.param(f.wo), C, qd, rank * qdl, qdl);
    if (f.bo >= 0) whole(d.bo, f.bo);
    whole(d.mlp_norm, f.mlp_norm);
    gu(w.param(d.wgu), full.param(f.wgu), C);
    if (f.bgu >= 0) gu(w.param(d.bgu), full.param(f.bgu), 1);
    copy_cols(w.param(d.wdown), full.param(f.wdown), C, F, rank * Fl, Fl);
    if (f.bdown >= 0) whole(d.bdown, f.bdown);
  }
  whole(sl.final_norm, fl.final_norm);
  if (fl.lm_head >= 0) vocab_rows(sl.lm_head, fl.lm_head);
  return s;
}

}  // namespace verl::model
