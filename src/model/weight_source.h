// Where a forward or backward reads its weights, range by range (the same ranges as the gradient
// sink: the embedding, each layer's parameters, the final norm, the head). Without a source the
// model reads the whole flat buffer it was built over; with one, ZeRO-3 (optim/zero3.h) gathers
// each range from the ranks that own its elements just before it is used and frees it after, with
// the next range's gather already under way while the current one computes.
#pragma once

#include <cstdint>

namespace verl::model {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The weights of elements [begin, end): element i at p[i - begin], valid until release().
  // Every rank acquires the same ranges in the same order (the gather may be a collective).
  virtual const float* acquire(int64_t begin, int64_t end) = 0;
  // A hint that [begin, end) is acquired next: its gather may start now.
  virtual void prefetch(int64_t begin, int64_t end) = 0;
  virtual void release(int64_t begin, int64_t end) = 0;
};

}  // namespace verl::model
