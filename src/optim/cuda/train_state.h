// The training state on the GPU (optim/train_state.h): fp32 master weights, gradients and AdamW
// moments as device buffers in the layout's order, plus the bf16 compute copy that the GPU model
// (model/cuda/transformer.h) and the GPU rollout runner (rollout/cuda/model_runner.h) read by
// pointer; the fused AdamW kernel updates the master weights and rewrites the bf16 copy in one
// pass. A forward-only state (the reference policy) keeps the bf16 copy alone.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "ops/cuda/device.h"
#include "ops/cuda/ops_cuda.h"
#include "optim/sparse_sync.h"
#include "optim/train_state.h"

namespace verl::optim::cuda {

class CudaTrainState final : public TrainState {
 public:
  // Uploads w.data (the bf16 copy rounded on the device from the fp32 master, or on the host for
  // a forward-only state). Work is enqueued on ctx.stream; the constructor waits for it.
  CudaTrainState(const ops::cuda::CudaContext& ctx, const model::Weights& w, bool trainable);

  Device device() const override { return Device::Cuda; }
  float* master() override { return master_.data(); }
  float* grads() override { return grads_.data(); }
  float* exp_avg() override { return m_.data(); }
  float* exp_avg_sq() override { return v_.data(); }
  void zero_grad() override;
  void all_reduce_grads(dist::Communicator& comm) override;
  // Stage 0 only: each range the GPU backward finishes (grads_ready) is all-reduced on the
  // communicator's stream beside the rest of the backward, on the last micro-batch of a step.
  void enable_data_parallel(dist::Communicator& comm, int zero_stage) override;
  void prepare_backward(bool last_micro_batch) override {
    armed_ = dp_ != nullptr && last_micro_batch && sync_due();
  }
  // LightweightSync: each finished range is compressed on the compute stream (sparse_sync.h) and
  // its message all-gathered on the communicator's stream; the step decodes the W messages.
  void use_lightweight_sync(const LightweightConfig& cfg) override;
  void defer_grads() override;
  std::vector<float> download_carry() const override;
  void upload_carry(const std::vector<float>& carry, int64_t calls) override;
  uint64_t weights_digest() override;  // the bits of the master weights' sum of squares
  void grads_ready(int64_t begin, int64_t end) override;
  void reduce_grads(dist::Communicator& comm) override;
  double grad_sum_squares() override;  // synchronises: the norm decides the clip scale
  void adamw_update(const AdamWConfig& cfg, float lr, float grad_scale) override;
  std::vector<float> download_weights() const override;
  AdamWState download_optimizer_state() const override;
  void upload(const std::vector<float>& weights, const AdamWState* opt) override;

  // The bf16 compute copy, flat in layout order: what the model's forward/backward and the
  // rollout read (the buffer adamw_update writes; no copy).
  const ops::cuda::bf16* weights_bf16() const { return wbf_.data(); }
  const ops::cuda::CudaContext& ctx() const { return ctx_; }
  // Device bytes held: weights, gradients, moments.
  size_t device_bytes() const;

 private:
  ops::cuda::CudaContext ctx_;
  ops::cuda::DeviceBuffer<float> master_, grads_, m_, v_;
  ops::cuda::DeviceBuffer<ops::cuda::bf16> wbf_;
  ops::cuda::DeviceBuffer<double> norm_;
  dist::Communicator* dp_ = nullptr;  // set by enable_data_parallel
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
  void start_sparse(int64_t begin, int64_t end);
  void finish_sparse();
};

}  // namespace verl::optim::cuda
