// Token sampler of the rollout engine: greedy, or temperature + top-k + top-p sampling, one row
// of logits per token to draw. Each draw uses one Philox block keyed by (request seed, sequence
// stream, tokens generated so far), so a rollout replays exactly and a sequence's tokens do not
// depend on what else shares its batch. The reported log-prob is over the full vocabulary at
// the sampling temperature (what the trainer recomputes), not over the truncated distribution.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "rollout/sequence.h"

namespace verl::rollout {

// What one logits row is sampled with.
struct SampleRow {
  const SamplingParams* params;
  uint64_t stream;   // Philox stream: Sequence::rng_stream()
  uint64_t counter;  // Philox counter: tokens the sequence generated before this one
};
inline SampleRow sample_row_for(const Sequence& seq) {
  return {&seq.params(), seq.rng_stream(), static_cast<uint64_t>(seq.num_output_tokens())};
}

struct SampleResult {
  int32_t token;
  float logprob;  // log softmax(logits / T)[token] over all V tokens; T = 1 when greedy
};

class Sampler {
 public:
  explicit Sampler(int32_t vocab_size);
  int32_t vocab_size() const { return vocab_; }

  // logits: [rows.size(), V] row-major fp32. Writes tokens[i] and logprobs[i] (logprobs may be
  // null). Rows run in parallel; scratch buffers are owned here, so nothing is allocated.
  void sample(const float* logits, std::span<const SampleRow> rows, int32_t* tokens,
              float* logprobs);
  // The same for the sequences of a scheduled batch: row i belongs to seqs[i].
  void sample(const float* logits, std::span<Sequence* const> seqs, int32_t* tokens,
              float* logprobs);
  // One row (single-threaded convenience for tests and tools).
  SampleResult sample_one(std::span<const float> logits, const SampleRow& row);

 private:
  template <typename F>
  void run_rows(int64_t n, F&& fn);  // fn(row, thread) over rows in parallel

  int32_t vocab_;
  // Per-thread scratch: unnormalised probabilities and a candidate index permutation.
  std::vector<std::vector<float>> weights_;
  std::vector<std::vector<int32_t>> order_;
};

}  // namespace verl::rollout
