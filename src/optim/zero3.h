// ZeRO-3's weight gathers on the host: the fp32 weights are sharded like the optimizer state (rank
// r holds elements [r chunk, (r + 1) chunk) of the flat layout), and each range a forward or
// backward reads (a layer, the embedding, the final norm, the head) is all-gathered from the ranks
// owning parts of it just before it is used, into a buffer freed right after; the next range's
// gather is started (non-blocking) before the current range computes, so the two overlap. For the
// rollout the whole weights are gathered once in buckets (the reshard) and read in place until
// they are dropped again.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "dist/communicator.h"
#include "model/weight_source.h"

namespace verl::optim {

// What the gathers cost this rank: bytes it sent (its share of each range, to the other W-1 ranks)
// and seconds it waited for gathers (what compute did not hide).
struct GatherStats {
  double bytes = 0, seconds = 0;
  int64_t gathers = 0;
};

class ZeroGather final : public model::WeightSource {
 public:
  // `shard`: this rank's chunk of the weights (elements [rank chunk, min(numel, (rank + 1)
  // chunk))), read at each gather (the optimizer updates it in place between passes).
  ZeroGather(dist::Communicator& comm, int64_t numel, int64_t chunk, const float* shard,
             GatherStats& stats);
  ~ZeroGather() override;

  const float* acquire(int64_t begin, int64_t end) override;
  void prefetch(int64_t begin, int64_t end) override;
  void release(int64_t begin, int64_t end) override;

  // The reshard: every element gathered into `out` (numel floats) in buckets of at most `bucket`
  // elements, each bucket's gather started while the previous one completes. A collective.
  void gather_all(float* out, int64_t bucket);
  // While `full` is set (the reshard's buffer), acquire reads it in place with no collective.
  void read_full(const float* full) { full_ = full; }
  // Bytes of gather buffers alive now and at most since the last take (memory accounting).
  size_t live_bytes() const { return live_bytes_; }
  size_t take_peak_bytes();

 private:
  struct Buffer {
    std::vector<float> data;
    std::vector<size_t> counts, displs;  // read by the collective until it completes
    std::unique_ptr<dist::PendingCollective> pending;
  };
  Buffer& start(int64_t begin, int64_t end, float* out);
  void wait(Buffer& b);

  dist::Communicator& comm_;
  int64_t numel_, chunk_;
  const float* shard_;
  GatherStats& stats_;
  const float* full_ = nullptr;
  std::map<std::pair<int64_t, int64_t>, Buffer> buffers_;  // by range
  size_t live_bytes_ = 0, peak_bytes_ = 0;
};

}  // namespace verl::optim
