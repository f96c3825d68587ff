// Tensor parallelism for the rollout (Megatron-LM / vLLM style): rank t of T holds a slice of the
// model whose config has H/T query heads, Hkv/T kv heads, F/T MLP rows and ceil(V/T) vocabulary
// rows, so the decoder runs on it unchanged apart from the reductions (model/cpu/decoder.h).
#pragma once

#include <cstdint>

#include "model/weights.h"

namespace verl::model {

// The collectives of one tensor-parallel group, as the decoder needs them. The model layer knows
// no communicator library: the caller adapts its own (trainer/rollout_worker.h wraps a
// dist::Communicator).
class TpGroup {
 public:
  virtual ~TpGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // x[i] becomes the sum over the group's ranks of x[i], identical on every rank. In place.
  virtual void all_reduce_sum(float* x, int64_t n) = 0;
  // recv [size * n], rank-major: block j is rank j's send [n].
  virtual void all_gather(const float* send, float* recv, int64_t n) = 0;
};

// Rank `rank`'s slice of a model split `size` ways:
//   column-parallel (rows, by heads): wqkv's q heads [r*H/T, (r+1)*H/T) and kv heads
//     [r*Hkv/T, (r+1)*Hkv/T), bqkv likewise; wgu's gate and up rows [r*F/T, (r+1)*F/T), bgu;
//   row-parallel (columns): wo's columns of the rank's q heads, wdown's of its F/T rows; their
//     biases bo and bdown stay whole and the decoder adds them once, after the all-reduce;
//   vocabulary-parallel: the embedding and the LM head rows [r*Vr, (r+1)*Vr) with
//     Vr = ceil(V/T); the last rank's rows past V are zero padding, never looked up, and their
//     logits are dropped by the gather; a tied head stays tied (the same rows);
//   replicated: the norms (attention, MLP, q/k, final).
struct TpSlice {
  Weights weights;  // config: heads/T, kv heads/T, intermediate/T, vocab Vr; head_dim explicit
  int rank = 0, size = 1;
  int64_t vocab_size = 0;   // the whole model's V
  int64_t vocab_begin = 0;  // rank * Vr: the first vocabulary row this rank holds
};

// Throws, naming actor_rollout_ref.rollout.tensor_model_parallel_size and the head counts, when
// `c` cannot be split `size` ways: the query or kv heads or the MLP width do not divide by it, or
// it is no causal LM.
void check_tp_split(const ModelConfig& c, int size);

// The causal-LM slice of `full` for rank `rank` of `size` ranks (check_tp_split first).
TpSlice tp_slice(const Weights& full, int rank, int size);

// The decoder's view of tensor parallelism for a step: the group and the whole vocabulary.
struct TpContext {
  TpGroup* group = nullptr;
  int64_t vocab_size = 0;   // the whole model's V (logits come back [rows, V])
  int64_t vocab_begin = 0;  // this rank's first vocabulary row
};

inline TpContext tp_context(const TpSlice& s, TpGroup& group) {
  return {&group, s.vocab_size, s.vocab_begin};
}

}  // namespace verl::model
