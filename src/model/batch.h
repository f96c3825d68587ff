// A packed batch: several token sequences concatenated with no padding, described by cu_seqlens
// (as flash-attention's varlen API). Positions restart at 0 in each sequence; the target of a
// token is the next token of the same sequence, -1 at the last token.
#pragma once

#include <cstdint>
#include <vector>

namespace verl::model {

struct PackedBatch {
  std::vector<int32_t> tokens;      // [T]
  std::vector<int32_t> cu_seqlens;  // [B+1], cu_seqlens[0] = 0
  std::vector<int32_t> positions;   // [T]
  std::vector<int32_t> targets;     // [T]
  // The rows whose log-prob and entropy the caller reads (strictly increasing, in [0, T)); empty:
  // every row. A hint for the LM head: the GPU model runs it on these rows only and writes 0 at
  // the others (a PPO pass reads only the positions that predict response tokens, about half of
  // a batch); the CPU model computes every row.
  std::vector<int32_t> head_rows;

  static PackedBatch from_sequences(const std::vector<std::vector<int32_t>>& seqs);
  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_seqs() const { return static_cast<int64_t>(cu_seqlens.size()) - 1; }
  int64_t seq_len(int64_t b) const { return cu_seqlens[b + 1] - cu_seqlens[b]; }
};

}  // namespace verl::model
