// One generation request as the rollout engine sees it: the prompt, the tokens generated so far
// with their log-probs, the sampling parameters, and the state the scheduler and block manager
// keep for it (status, paged-KV block table, how many tokens already have KV written).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace verl::rollout {

// Per-request sampling knobs, named as in verl's rollout config / vLLM's SamplingParams.
struct SamplingParams {
  float temperature = 1.0f;             // 0 = greedy
  int32_t top_k = -1;                   // -1 or 0 = off; >= vocab size is also off
  float top_p = 1.0f;                   // 1 = off; must be in (0, 1]
  int32_t max_tokens = 16;              // generated tokens at most (>= 1)
  bool ignore_eos = false;              // when true, stop_token_ids do not end the sequence
  std::vector<int32_t> stop_token_ids;  // the EOS ids of the tokenizer / generation config
  uint64_t seed = 0;                    // Philox key of the sampler; see sampler.h
  bool logprobs = true;                 // record the sampled token's log-prob
  // Synthetic response lengths (benchmarks and tests: the trainer's rollout.length_dist): reaching
  // max_tokens ends the sample as its EOS would ("stop"), not as a cut ("length"). The tokens are
  // the model's own samples, so their log-probs stay the ones the trainer recomputes.
  bool stop_at_max_tokens = false;

  // Throws verl::Error naming the bad field and its value.
  void validate() const;
  bool is_stop_token(int32_t token) const;
};

// Paused: a multi-turn sample whose turn ended; it keeps its KV blocks while its tool runs.
enum class SequenceStatus : uint8_t { Waiting, Running, Finished, Paused };

// Why a sequence finished. Stop strings are matched by the engine (it owns the tokenizer); it
// sets StopString itself. New reasons go at the end so stored values stay meaningful.
enum class FinishReason : uint8_t { None, Stop, Length, StopString, Abort };

std::string_view to_string(SequenceStatus s);
std::string_view to_string(FinishReason r);  // "stop", "length", "stop_string", "abort", ""

class Sequence {
 public:
  // group_id: the prompt this sample came from (defaults to id); index_in_group: which of the
  // n samples of that prompt it is. Together they name the sampler's Philox stream.
  Sequence(int64_t id, std::vector<int32_t> prompt, SamplingParams params, int64_t group_id = -1,
           int32_t index_in_group = 0);

  int64_t id() const { return id_; }
  int64_t group_id() const { return group_id_; }
  int32_t index_in_group() const { return index_in_group_; }
  const SamplingParams& params() const { return params_; }

  // Philox stream of this sequence's draws: (group_id << 32) | index_in_group, so the samples of
  // one prompt differ from each other and from every other prompt's even under one shared seed.
  uint64_t rng_stream() const { return rng_stream_; }
  void set_rng_stream(uint64_t s) { rng_stream_ = s; }

  // Tokens: the prompt followed by the generated output.
  std::span<const int32_t> token_ids() const { return tokens_; }
  std::span<const int32_t> prompt_tokens() const {
    return {tokens_.data(), static_cast<size_t>(num_prompt_)};
  }
  std::span<const int32_t> output_tokens() const {
    return {tokens_.data() + num_prompt_, tokens_.size() - static_cast<size_t>(num_prompt_)};
  }
  std::span<const float> output_logprobs() const { return logprobs_; }
  // 1 where the output token was sampled by the model, 0 where it was appended (a tool's or a
  // user's turn in a multi-turn rollout); one entry per output token.
  std::span<const uint8_t> output_generated() const { return generated_; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t num_prompt_tokens() const { return num_prompt_; }
  int64_t num_output_tokens() const { return num_tokens() - num_prompt_; }
  int32_t last_token() const { return tokens_.back(); }

  // Appends a generated token (and its log-prob when params().logprobs).
  void append_token(int32_t token, float logprob);
  // Appends tokens the model did not sample (a tool response rendered by the chat template): they
  // join the output with log-prob 0 and generated 0, and their KV is computed by the next prefill
  // chunk; the KV already computed stays (the agent loop's token-in/token-out).
  void append_context(std::span<const int32_t> tokens);

  // --- State owned by the scheduler and block manager; read-only for everyone else. ---
  SequenceStatus status = SequenceStatus::Waiting;
  FinishReason finish_reason = FinishReason::None;
  // Physical KV block of each logical block: position p lives in block_table[p / block_size].
  std::vector<int32_t> block_table;
  // Tokens whose KV is already in the cache (positions [0, num_computed_tokens)).
  int64_t num_computed_tokens = 0;
  int32_t num_preemptions = 0;
  // Multi-turn: a stop token pauses the sequence (status Paused, blocks kept) instead of ending it.
  bool pause_on_stop = false;

 private:
  int64_t id_, group_id_;
  int32_t index_in_group_;
  SamplingParams params_;
  uint64_t rng_stream_;
  std::vector<int32_t> tokens_;
  int64_t num_prompt_;
  std::vector<float> logprobs_;
  std::vector<uint8_t> generated_;
};

}  // namespace verl::rollout
