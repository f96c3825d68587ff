#include "model/batch.h"

#include "core/error.h"

namespace verl::model {

PackedBatch PackedBatch::from_sequences(const std::vector<std::vector<int32_t>>& seqs) {
  PackedBatch b;
  b.cu_seqlens.push_back(0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto& seq = seqs[s];
    VERL_CHECK(!seq.empty(), "sequence {} of the batch is empty", s);
    for (size_t i = 0; i < seq.size(); ++i) {
      b.tokens.push_back(seq[i]);
      b.positions.push_back(static_cast<int32_t>(i));
      b.targets.push_back(i + 1 < seq.size() ? seq[i + 1] : -1);
    }
    b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
  }
  return b;
}

}  // namespace verl::model
