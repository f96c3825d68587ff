// Data parallelism over the GPU storage (optim/cuda/train_state.h), the CUDA side of
// optim/strategy.h: ZeRO stage 0 with each range the GPU backward finishes (grads_ready)
// all-reduced on the communicator's stream beside the rest of the backward, on the last
// micro-batch of a step; or LightweightSync, each finished range compressed on the compute stream
// (optim/cuda/sparse_sync.h) and its message all-gathered, the step decoding the W messages.
//   ZeRO-1: the moments are the shard's; at the step the whole (padded) gradient buffer is
//           reduce-scattered in place, each rank updates its shard, and the fp32 master weights
//           are all-gathered in place and rounded to the bf16 copy (the update's own rounding, so
//           every rank's bf16 copy is the bits one process would hold).
//   ZeRO-2: + each range backward finishes is reduced on every micro-batch (all-reduced on the
//           compute stream: the communicators have no device reduce-to-root, and a range's shares
//           of the owners are unequal for a reduce-scatter), the owner adds its part into the
//           shard's gradients and the range is zeroed for the next micro-batch. The GPU model
//           accumulates into the whole buffer, so the gradients' memory is stage 1's plus a shard;
//           dropping the whole buffer needs the model to write range buffers (ZeRO-3's hook).
// ZeRO-3 and ZeRO with an offloaded state are refused by make_strategy, naming the keys.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "ops/cuda/device.h"
#include "optim/cuda/train_state.h"
#include "optim/strategy.h"

namespace verl::optim::cuda {

class CudaDataParallel final : public Strategy {
 public:
  // ZeRO at `stage` 0, 1 or 2 (1 and 2 shard the storage: the layout cut into world_size equal
  // ranges, the last padded), with LightweightSync when `lw` is given (stage 0 or 1).
  CudaDataParallel(CudaTrainState& st, dist::Communicator& comm, int stage,
                   const std::optional<LightweightConfig>& lw);

  void prepare_backward(bool last_micro_batch) override { armed_ = last_micro_batch && sync_due(); }
  void grads_ready(int64_t begin, int64_t end) override;
  void reduce_grads(dist::Communicator& comm) override;
  void gather_weights(dist::Communicator& comm) override;
  AdamWState download_optimizer_state() const override;
  void defer_grads() override;
  std::vector<float> download_carry() const override;
  void upload_carry(const std::vector<float>& carry, int64_t calls) override;

 private:
  void start_sparse(int64_t begin, int64_t end);
  void finish_sparse();
  // ZeRO-2: range [begin, end) summed over the ranks; this rank's part added to its shard.
  void reduce_range(int64_t begin, int64_t end);

  CudaTrainState& gpu_;
  dist::Communicator& comm_;
  int64_t chunk_ = 0;  // elements per rank when sharded
  bool armed_ = false, started_ = false;
  std::deque<std::unique_ptr<dist::PendingCollective>> pending_;  // this step's started buckets
  // LightweightSync: the carry (numel floats, or none), the compression scratch, each bucket's
  // gathered messages (by its first element; kept across steps) and this step's buckets.
  ops::cuda::DeviceBuffer<float> carry_;
  ops::cuda::DeviceBuffer<uint8_t> scratch_;
  std::map<int64_t, ops::cuda::DeviceBuffer<uint8_t>> messages_;
  struct SparseBucket {
    int64_t begin = 0, end = 0;
    SparseLayout layout;
  };
  std::vector<SparseBucket> sparse_;
};

// Registers CudaDataParallel as make_strategy's builder for trainer.device=cuda (every CUDA state
// calls it when it is made).
void register_cuda_data_parallel();

}  // namespace verl::optim::cuda
