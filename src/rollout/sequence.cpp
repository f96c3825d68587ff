// Sequence and SamplingParams: validation, token appends, names of statuses and finish reasons.
#include "rollout/sequence.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace verl::rollout {

void SamplingParams::validate() const {
  VERL_CHECK(std::isfinite(temperature) && temperature >= 0.0f,
             "sampling param temperature must be >= 0, got {}", temperature);
  VERL_CHECK(top_k >= -1, "sampling param top_k must be -1 (off), 0 (off) or positive, got {}",
             top_k);
  VERL_CHECK(top_p > 0.0f && top_p <= 1.0f, "sampling param top_p must be in (0, 1], got {}",
             top_p);
  VERL_CHECK(max_tokens >= 1, "sampling param max_tokens must be >= 1, got {}", max_tokens);
}

bool SamplingParams::is_stop_token(int32_t token) const {
  return std::find(stop_token_ids.begin(), stop_token_ids.end(), token) != stop_token_ids.end();
}

std::string_view to_string(SequenceStatus s) {
  switch (s) {
    case SequenceStatus::Waiting:
      return "waiting";
    case SequenceStatus::Running:
      return "running";
    case SequenceStatus::Finished:
      return "finished";
    case SequenceStatus::Paused:
      return "paused";
  }
  return "unknown";
}

std::string_view to_string(FinishReason r) {
  switch (r) {
    case FinishReason::None:
      return "";
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::StopString:
      return "stop_string";
    case FinishReason::Abort:
      return "abort";
  }
  return "unknown";
}

Sequence::Sequence(int64_t id, std::vector<int32_t> prompt, SamplingParams params, int64_t group_id,
                   int32_t index_in_group)
    : id_(id),
      group_id_(group_id < 0 ? id : group_id),
      index_in_group_(index_in_group),
      params_(std::move(params)),
      tokens_(std::move(prompt)),
      num_prompt_(static_cast<int64_t>(tokens_.size())) {
  VERL_CHECK(num_prompt_ > 0, "sequence {}: the prompt is empty", id_);
  VERL_CHECK(index_in_group_ >= 0, "sequence {}: index_in_group must be >= 0, got {}", id_,
             index_in_group_);
  params_.validate();
  rng_stream_ = (static_cast<uint64_t>(group_id_) << 32) | static_cast<uint32_t>(index_in_group_);
  // Reserve the whole generation up front so appends in the decode loop never reallocate.
  tokens_.reserve(tokens_.size() + static_cast<size_t>(params_.max_tokens));
  if (params_.logprobs) logprobs_.reserve(static_cast<size_t>(params_.max_tokens));
  generated_.reserve(static_cast<size_t>(params_.max_tokens));
}

void Sequence::append_token(int32_t token, float logprob) {
  tokens_.push_back(token);
  if (params_.logprobs) logprobs_.push_back(logprob);
  generated_.push_back(1);
}

void Sequence::append_context(std::span<const int32_t> tokens) {
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  if (params_.logprobs) logprobs_.insert(logprobs_.end(), tokens.size(), 0.0f);
  generated_.insert(generated_.end(), tokens.size(), 0);
}

}  // namespace verl::rollout
