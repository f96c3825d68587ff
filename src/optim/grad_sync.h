// Data-parallel gradient reduction in buckets while backward goes on (DDP's and ZeRO's overlap):
// the model's backward hands each parameter range (a layer, the head, the final norm, the
// embedding; model/grad_sink.h) to this sink as soon as it is final, and the range's reduction
// starts at once, non-blocking, while the backward computes the next layer. Each range is one
// bucket; every rank starts the same buckets in the same (backward) order, so a run is
// reproducible bit for bit at a fixed world size.
//   stage 0: each bucket is all-reduced in the whole gradient buffer, on the last micro-batch of
//            an optimizer step (earlier micro-batches accumulate locally, as DDP's no_sync).
//   stage 1: each bucket is reduced to the rank(s) owning its elements (the contiguous ZeRO
//            shards [r chunk, (r + 1) chunk)), on the last micro-batch; together a reduce-scatter.
//   stage 2: the backward writes each range into a short-lived buffer of this sink; it is reduced
//            to its owners on every micro-batch and the owner adds its part into the shard's
//            gradients, the only gradients a rank keeps (ZeRO-2).
// LightweightSync (optim/sparse_sync.h, with stage 0 or 1): each bucket is compressed to its top-k
// entries (plus this rank's carry, the error feedback) and the messages are all-gathered; every
// rank decodes and adds them in rank order into the bucket, the sum over ranks as above.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "dist/communicator.h"
#include "model/grad_sink.h"
#include "optim/sparse_sync.h"

namespace verl::optim {

// Gradient-sync cost since the last take: bytes this rank sent (as the ring / reduce-scatter
// algorithms count them: an all-reduce of n bytes sends 2 (W-1)/W n, a reduction to owners
// (W-1)/W n) and seconds this rank spent starting and waiting for them (what backward did not
// hide).
struct SyncStats {
  double bytes = 0, seconds = 0;
  double dense_bytes = 0;  // what the dense all-reduce of the same buckets would have sent
  // What one rank sends when `n` fp32 elements are all-reduced, or reduced to their owners (a
  // reduce-scatter), over `world` ranks.
  void add_all_reduce(int world, int64_t n) {
    bytes += all_reduce_bytes(world, n);
    dense_bytes += all_reduce_bytes(world, n);
  }
  void add_reduce_to_owners(int world, int64_t n) {
    bytes += share(world) * 4.0 * static_cast<double>(n);
    dense_bytes += all_reduce_bytes(world, n);
  }
  // A ring all-gather of `message` bytes per rank, standing in for the all-reduce of n elements.
  void add_all_gather(int world, size_t message, int64_t n) {
    bytes += static_cast<double>(world - 1) * static_cast<double>(message);
    dense_bytes += all_reduce_bytes(world, n);
  }
  void add(const SyncStats& o) {
    bytes += o.bytes;
    seconds += o.seconds;
    dense_bytes += o.dense_bytes;
  }

 private:
  static double share(int world) { return static_cast<double>(world - 1) / world; }
  static double all_reduce_bytes(int world, int64_t n) {
    return 2 * share(world) * 4.0 * static_cast<double>(n);
  }
};

class GradSync final : public model::GradSink {
 public:
  // `grads`: the whole gradient buffer (stages 0 and 1, at least `numel` floats) or the shard's
  // (stage 2: `chunk` floats for elements [rank chunk, rank chunk + chunk)).
  GradSync(dist::Communicator& comm, int stage, int64_t numel, int64_t chunk, float* grads,
           SyncStats& stats);
  // LightweightSync over the whole gradient buffer (stages 0 and 1): `carry` (numel floats, or
  // null when there is neither error feedback nor an interval) is this rank's undelivered part.
  void use_lightweight(const LightweightConfig& cfg, float* carry);
  bool lightweight() const { return lw_.has_value(); }
  ~GradSync() override;

  // Whether the next backward's ranges are reduced as they complete (stages 0 and 1: the last
  // micro-batch before the optimizer step; stage 2 always reduces).
  void arm(bool last_micro_batch) { armed_ = stage_ == 2 || last_micro_batch; }
  float* open(int64_t begin, int64_t end) override;
  void ready(int64_t begin, int64_t end) override;
  // Waits for every started reduction and adds stage 2's sums into the shard. Returns whether any
  // was started since the last finish (else the caller reduces the whole buffer itself).
  bool finish();
  // LightweightSync of the whole buffer as one bucket, blocking (when backward started none).
  void sync_whole();

 private:
  struct Slot {  // stage 2: a range's short-lived gradient buffer
    std::vector<float> buf;
    int64_t begin = 0, end = 0;
    bool open = false;
    int pending = 0;  // reductions still reading or writing it
  };
  struct Op {
    std::unique_ptr<dist::PendingCollective> pending;
    int slot = -1;  // stage 2
    int64_t begin = 0, end = 0;
    int owner = -1;                            // stages 1 and 2
    std::vector<uint8_t>* gathered = nullptr;  // lightweight: every rank's message, rank-major
    SparseLayout layout{};                     // lightweight
  };
  void start(float* data, int64_t begin, int64_t end, int slot);
  void start_sparse(int64_t begin, int64_t end);
  void progress();        // tests every op; completes those at the front that are done
  void complete_front();  // waits for the oldest op and completes it
  int busy_slots() const;

  dist::Communicator& comm_;
  int stage_;
  int64_t numel_, chunk_;
  float* grads_;
  SyncStats& stats_;
  bool armed_ = false;
  bool started_ = false;
  std::vector<Slot> slots_;
  std::deque<Op> ops_;
  std::optional<LightweightConfig> lw_;
  float* carry_ = nullptr;
  std::map<int64_t, std::vector<uint8_t>> messages_;  // lightweight: by bucket start, reused
};

}  // namespace verl::optim
