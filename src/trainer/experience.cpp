#include "trainer/experience.h"

#include <utility>

namespace verl::trainer {

PackedResponses::PackedResponses(const Experience& exp, std::vector<int64_t> rows)
    : rows_(std::move(rows)), L_(exp.L) {
  std::vector<std::vector<int32_t>> seqs;
  seqs.reserve(rows_.size());
  for (int64_t b : rows_) {
    std::vector<int32_t> s = exp.sample[b]->prompt_ids;
    s.insert(s.end(), exp.response[b].begin(), exp.response[b].end());
    seqs.push_back(std::move(s));
  }
  batch_ = model::PackedBatch::from_sequences(seqs);
  base_.resize(rows_.size());
  len_.resize(rows_.size());
  for (size_t i = 0; i < rows_.size(); ++i) {
    const int64_t b = rows_[i];
    base_[i] = batch_.cu_seqlens[i] + static_cast<int64_t>(exp.sample[b]->prompt_ids.size()) - 1;
    len_[i] = static_cast<int64_t>(exp.response[b].size());
  }
}

std::vector<float> PackedResponses::gather(const std::vector<float>& packed) const {
  VERL_CHECK(static_cast<int64_t>(packed.size()) >= batch_.num_tokens(),
             "PackedResponses::gather: {} values for a micro-batch of {} tokens", packed.size(),
             batch_.num_tokens());
  std::vector<float> out(rows_.size() * static_cast<size_t>(L_), 0.0f);
  for (size_t i = 0; i < rows_.size(); ++i) {
    for (int64_t j = 0; j < len_[i]; ++j) out[i * L_ + j] = packed[base_[i] + j];
  }
  return out;
}

void PackedResponses::gather_into(const std::vector<float>& packed,
                                  std::vector<float>& matrix) const {
  VERL_CHECK(static_cast<int64_t>(packed.size()) >= batch_.num_tokens(),
             "PackedResponses::gather_into: {} values for a micro-batch of {} tokens",
             packed.size(), batch_.num_tokens());
  for (size_t i = 0; i < rows_.size(); ++i) {
    for (int64_t j = 0; j < len_[i]; ++j) matrix[rows_[i] * L_ + j] = packed[base_[i] + j];
  }
}

std::vector<float> PackedResponses::scatter(const std::vector<float>& per_row) const {
  if (per_row.empty()) return {};
  VERL_CHECK(per_row.size() == rows_.size() * static_cast<size_t>(L_),
             "PackedResponses::scatter: {} values for {} rows of {}", per_row.size(),
             rows_.size(), L_);
  std::vector<float> out(static_cast<size_t>(batch_.num_tokens()), 0.0f);
  for (size_t i = 0; i < rows_.size(); ++i) {
    for (int64_t j = 0; j < len_[i]; ++j) out[base_[i] + j] = per_row[i * L_ + j];
  }
  return out;
}

}  // namespace verl::trainer
