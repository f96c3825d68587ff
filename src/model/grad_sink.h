// Where a backward writes its parameter gradients, range by range: a layer's parameters, the
// final norm, the head, the embedding (contiguous element ranges of the flat layout, in backward
// order). Without a sink the backward accumulates into one whole-layout buffer; with one, data
// parallelism can start reducing a range as soon as it is final (while backward goes on) and ZeRO-2
// can hand out short-lived buffers for ranges it does not keep.
#pragma once

#include <cstdint>

namespace verl::model {

class GradSink {
 public:
  virtual ~GradSink() = default;
  // A view the backward accumulates into for elements [begin, end): element i is at p[i - begin].
  // Opening a range that is still open returns the same view (a tied LM head and embedding write
  // one range at the start and the end of backward).
  virtual float* open(int64_t begin, int64_t end) = 0;
  // The backward has finished writing [begin, end) for this micro-batch.
  virtual void ready(int64_t begin, int64_t end) = 0;
};

}  // namespace verl::model
