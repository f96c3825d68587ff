// The training state's storage on the GPU (optim/train_state.h): fp32 master weights, gradients
// and AdamW moments as device buffers in the layout's order, plus the bf16 compute copy that the
// GPU model (model/cuda/transformer.h) and the GPU rollout runner (rollout/cuda/model_runner.h)
// read by pointer; the fused AdamW kernel updates the master weights and rewrites the bf16 copy in
// one pass. A forward-only state (the reference policy) keeps the bf16 copy alone. With an offload
// config (optim/train_state.h) the tail of the master weights and of the moments lives in pinned
// host memory and passes through device staging slots in buckets: copies up on one stream, the
// same AdamW kernel on the compute stream, copies down on a third, so the copies of one bucket
// overlap the update of the next; the result is bitwise the resident run's. Data parallelism is
// the strategy's (optim/cuda/strategy.h); ZeRO 1 and 2 narrow the moments (and stage 2 the
// gradients the update reads) to this rank's shard (set_shard).
#pragma once

#include <functional>
#include <vector>

#include "ops/cuda/device.h"
#include "ops/cuda/ops_cuda.h"
#include "optim/train_state.h"

namespace verl::optim::cuda {

class CudaTrainState final : public TrainState {
 public:
  // Uploads w.data (the bf16 copy rounded on the device from the fp32 master, or on the host for
  // a forward-only state). Work is enqueued on ctx.stream; the constructor waits for it.
  CudaTrainState(const ops::cuda::CudaContext& ctx, const model::Weights& w, bool trainable,
                 const OffloadConfig& offload = {});
  // A state over any flat layout (an adapter's), started at `init` (layout.total floats).
  CudaTrainState(const ops::cuda::CudaContext& ctx, const model::ParamLayout& layout,
                 const std::vector<float>& init, bool trainable, const OffloadConfig& offload = {});
  ~CudaTrainState() override;
  CudaTrainState(const CudaTrainState&) = delete;
  CudaTrainState& operator=(const CudaTrainState&) = delete;

  Device device() const override { return Device::Cuda; }
  // The device-resident part of each (all of it without offload).
  float* master() override { return master_.dev.data(); }
  // The whole gradient buffer the model's backward accumulates into (its pointer never changes:
  // the model keeps it). ZeRO-2's reduced shard is shard_grads().
  float* grads() override { return grads_.data(); }
  float* exp_avg() override { return m_.dev.data(); }
  float* exp_avg_sq() override { return v_.dev.data(); }
  // Collectives on the gradients run on the compute stream, after the enqueued backward.
  dist::Place place() const override { return dist::Place::device(ctx_.stream); }
  void synchronize() override;
  void zero_grad() override;
  uint64_t weights_digest() override;  // the bits of the master weights' sum of squares
  double grad_sum_squares() override;  // synchronises: the norm decides the clip scale
  void adamw_update(const AdamWConfig& cfg, float lr, float grad_scale) override;
  std::vector<float> download_weights() const override;
  AdamWState download_optimizer_state() const override;
  void upload(const std::vector<float>& weights, const AdamWState* opt) override;
  // ZeRO 1 and 2 (stage 3 and an offloaded state are refused by the strategy's factory): the
  // moments keep the shard's elements; the master weights and the gradient buffer stay whole,
  // padded to world x chunk so that the reduce-scatter and the all-gather run in place; stage 2
  // adds the shard's reduced gradients (chunk floats), which the update reads.
  void set_shard(const ShardSpec& spec) override;
  // The gradients the update and the norm read: the shard's elements of the whole buffer (stage 0
  // and 1), or stage 2's reduced shard (chunk floats for elements [rank chunk, ...)).
  float* shard_grads();
  // The bf16 compute copy rewritten from the whole master weights (after ZeRO's all-gather of the
  // updated shards), rounded as the update rounds: enqueued on the compute stream.
  void round_weights_bf16();

  // The bf16 compute copy, flat in layout order: what the model's forward/backward and the
  // rollout read (the buffer adamw_update writes; no copy). Null while asleep.
  const ops::cuda::bf16* weights_bf16() const { return wbf_.data(); }
  // A forward-only state with offload.params > 0 (the reference policy with verl's
  // ref.fsdp_config.param_offload) keeps its bf16 weights in pinned host memory: wake() brings
  // them to a fresh device buffer (weights_bf16() changes), sleep() frees it. It starts asleep.
  bool sleeps() const { return !trainable_ && offload_.params > 0; }
  void wake();
  void sleep();
  const ops::cuda::CudaContext& ctx() const { return ctx_; }
  // Device bytes held: weights, gradients, moments, offload staging.
  size_t device_bytes() const;
  // Pinned host bytes held: the offloaded master weights and moments.
  size_t host_bytes() const override;
  const OffloadConfig& offload() const { return offload_; }

 private:
  // A flat fp32 buffer whose elements [0, resident) are on the device and [resident, n) in pinned
  // host memory (resident = n without offload).
  struct SplitBuffer {
    ops::cuda::DeviceBuffer<float> dev;
    ops::cuda::PinnedBuffer<float> host;
    int64_t resident = 0;
    void allocate(int64_t n, int64_t resident_elems);
    size_t device_bytes() const { return dev.bytes(); }
    void upload(const std::vector<float>& x);  // synchronous (setup, resume)
    void zero(cudaStream_t stream);
    std::vector<float> download() const;  // synchronous; the caller drained the streams
  };
  // The offloaded elements of [begin, end) (those past some part's `resident`) bucket by bucket:
  // for each bucket, the host-resident pieces of the parts in `parts` (bits: 1 master, 2 exp_avg,
  // 4 exp_avg_sq) go up to a staging slot, fn(pointers to the bucket's master / exp_avg /
  // exp_avg_sq, first element, count) is enqueued on the compute stream, and with write_back the
  // pieces come home. The compute stream waits for every copy before its later work.
  using BucketFn = std::function<void(float* const* ptr, int64_t begin, int64_t n)>;
  void stream_offloaded(int64_t begin, int64_t end, unsigned parts, bool write_back,
                        const BucketFn& fn);
  // The first element some part keeps on the host (numel() without offload).
  int64_t first_offloaded() const;

  ops::cuda::CudaContext ctx_;
  OffloadConfig offload_;
  SplitBuffer master_, m_, v_;
  ops::cuda::DeviceBuffer<float> grads_;  // numel + kZeroSlack floats (the padding stays zero)
  ops::cuda::DeviceBuffer<float> shard_grads_;  // ZeRO-2: the shard's reduced gradients
  ops::cuda::DeviceBuffer<ops::cuda::bf16> wbf_;
  ops::cuda::PinnedBuffer<uint16_t> wbf_host_;  // a sleeping forward-only state's weights
  ops::cuda::DeviceBuffer<double> norm_;
  // Offload: the copy streams, the staging slots (kSlots x 3 parts x bucket floats) and each slot's
  // events (its pieces are up; the kernel and the copies home are done).
  static constexpr int kSlots = 3;
  // The gradient buffer's spare floats: ZeRO pads the layout to world x chunk, fewer than world
  // elements more, and the model keeps the buffer's address, so it is allocated padded once (for
  // up to this many ranks) rather than reallocated when a strategy shards it.
  static constexpr int64_t kZeroSlack = 4096;
  cudaStream_t up_ = nullptr, down_ = nullptr;
  ops::cuda::DeviceBuffer<float> stage_;
  cudaEvent_t up_done_[kSlots] = {}, slot_free_[kSlots] = {}, computed_[kSlots] = {};
};

}  // namespace verl::optim::cuda
