// Data parallelism over the GPU storage (optim/cuda/train_state.h), the CUDA side of
// optim/strategy.h: ZeRO stage 0 with each range the GPU backward finishes (grads_ready)
// all-reduced on the communicator's stream beside the rest of the backward, on the last
// micro-batch of a step; or LightweightSync, each finished range compressed on the compute stream
// (optim/cuda/sparse_sync.h) and its message all-gathered, the step decoding the W messages.
// ZeRO 1/2/3 on the GPU are refused by make_strategy (issue 43).
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
  CudaDataParallel(CudaTrainState& st, dist::Communicator& comm,
                   const std::optional<LightweightConfig>& lw);

  void prepare_backward(bool last_micro_batch) override { armed_ = last_micro_batch && sync_due(); }
  void grads_ready(int64_t begin, int64_t end) override;
  void reduce_grads(dist::Communicator& comm) override;
  void defer_grads() override;
  std::vector<float> download_carry() const override;
  void upload_carry(const std::vector<float>& carry, int64_t calls) override;

 private:
  void start_sparse(int64_t begin, int64_t end);
  void finish_sparse();

  CudaTrainState& gpu_;
  dist::Communicator& comm_;
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
