// The training state's storage: for a set of trainable parameters described by a flat layout
// (model::ParamLayout: a whole model's, or a LoRA adapter's few tensors), the fp32 master weights,
// the fp32 gradients and the AdamW moments, each one flat buffer in layout order, on the CPU or
// the GPU (optim/cuda/train_state.h, which also holds the bf16 compute copy and the offload). The
// update primitives (zero_grad, grad_sum_squares, adamw_update) run over this rank's shard, which
// a parallel strategy (optim/strategy.h: ZeRO) sets; the models never see it.
#pragma once

#include <cstdint>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "dist/communicator.h"
#include "model/weights.h"
#include "optim/adamw.h"

namespace verl::optim {

// The element range [begin, end) of the flat layout this rank updates, and what keeps only that
// range. Set by a ZeRO strategy; the whole layout otherwise.
struct ShardSpec {
  int64_t begin = 0, end = 0;
  // ZeRO over `world` ranks: rank r owns [r chunk, (r + 1) chunk) clipped to the layout (the last
  // padded). stage 1: the moments hold only the shard; 2: also the gradients; 3: also the master
  // weights. stage 0: nothing sharded.
  int64_t chunk = 0;
  int world = 1;
  int stage = 0;
  int64_t size() const { return end - begin; }
};

// The share of a GPU training state kept in pinned host memory (actor_offload_ratio; verl's
// fsdp_config.param_offload / optimizer_offload set one share to 1): the last elements of the
// layout's fp32 master weights (`params`) and of both AdamW moments (`optimizer`) live on the host
// and are streamed through the device in buckets of `bucket` elements during the optimizer step.
// The gradients and the bf16 compute copy stay on the device (every backward and forward reads
// them). The CPU state lives in host memory already.
struct OffloadConfig {
  double params = 0, optimizer = 0;  // 0..1
  int64_t bucket = int64_t{8} << 20;
  bool any() const { return params > 0 || optimizer > 0; }
};

class TrainState {
 public:
  virtual ~TrainState() = default;
  virtual Device device() const = 0;

  const model::ParamLayout& layout() const { return layout_; }
  int64_t numel() const { return layout_.total; }
  const ShardSpec& shard() const { return shard_; }
  // Whether this rank updates every element (no ZeRO sharding).
  bool whole() const { return shard_.begin == 0 && shard_.end == numel(); }
  // false: forward only (the reference policy): weights without gradients or optimizer state.
  bool trainable() const { return trainable_; }
  // AdamW updates applied (skipped non-finite steps excluded).
  int64_t steps() const { return steps_; }

  // The flat buffers, host pointers on the CPU and device pointers on the GPU (null when the state
  // is forward-only): master weights, gradients (accumulated by the model's backward), moments.
  // Sharded (ShardSpec::stage), a buffer holds the shard's elements only.
  virtual float* master() = 0;
  virtual float* grads() = 0;
  virtual float* exp_avg() = 0;
  virtual float* exp_avg_sq() = 0;
  // Where the gradients live for a collective (host memory, or the device and its stream), and a
  // wait for the work writing them (the GPU's enqueued backward).
  virtual dist::Place place() const { return dist::Place::host(); }
  virtual void synchronize() {}

  virtual void zero_grad() = 0;
  // Sum of squares of the gradients over this rank's shard (a global norm sums it over ranks).
  virtual double grad_sum_squares() = 0;
  // One AdamW update of the shard with gradients scaled by `grad_scale` (clipping), then steps()+1.
  virtual void adamw_update(const AdamWConfig& cfg, float lr, float grad_scale) = 0;
  // A digest of the master weights this rank holds: equal on ranks that hold equal weights.
  virtual uint64_t weights_digest() = 0;

  // ZeRO (set by a strategy, before training): keep only `spec`'s share of the buffers its stage
  // names. The state refuses what it cannot shard.
  virtual void set_shard(const ShardSpec& spec) {
    (void)spec;
    VERL_FAIL("internal: the {} training state keeps whole buffers", to_string(device()));
  }
  // Whether download_weights() holds every element now (ZeRO-3 holds only its shard between the
  // strategy's gathers).
  virtual bool has_full_weights() const { return true; }

  // Host copies for checkpoints and the CPU rollout: the fp32 weights in layout order (the master
  // copy, or the bf16 copy widened for a forward-only state on the GPU) and this rank's AdamW
  // state (its shard's moments when sharded: what a sharded checkpoint writes, no collective).
  virtual std::vector<float> download_weights() const = 0;
  virtual AdamWState download_optimizer_state() const = 0;
  // Resume: replaces the weights (layout order, numel() floats) and, when trainable, the moments
  // (numel() floats, or shard().size() for a sharded state: its slice) and the step count.
  virtual void upload(const std::vector<float>& weights, const AdamWState* opt) = 0;
  // Bytes of host memory the buffers hold now (the memory-per-phase metrics).
  virtual size_t host_bytes() const { return 0; }

 protected:
  TrainState(const model::ParamLayout& layout, bool trainable)
      : layout_(layout), shard_{0, layout.total}, trainable_(trainable) {}
  void check_upload(const std::vector<float>& weights, const AdamWState* opt) const;
  void require_trainable(const char* what) const;

  model::ParamLayout layout_;
  ShardSpec shard_;
  bool trainable_;
  int64_t steps_ = 0;
};

// The CPU state: the master weights are a model::Weights the CPU model reads (weights()); a
// layout that is not a whole model's (an adapter's) leaves its config empty. ZeRO-3 keeps only the
// shard's weights (master() is the shard then); weights() holds every element only while a
// strategy has handed the gathered copy over (hold_full_weights).
class CpuTrainState final : public TrainState {
 public:
  CpuTrainState(model::Weights w, bool trainable);
  // A state over any flat layout, started at `init` (layout.total floats).
  CpuTrainState(const model::ParamLayout& layout, std::vector<float> init, bool trainable);

  Device device() const override { return Device::Cpu; }
  float* master() override { return shard_.stage == 3 ? shard_w_.data() : w_.data.data(); }
  // The whole layout's gradients (padded to world x chunk at stage 1); stage 2, 3: the shard's.
  float* grads() override { return trainable_ ? grads_.data() : nullptr; }
  float* exp_avg() override { return trainable_ ? opt_.exp_avg.data() : nullptr; }  // the shard's
  float* exp_avg_sq() override { return trainable_ ? opt_.exp_avg_sq.data() : nullptr; }
  // Floats in the gradient buffer (numel, world x chunk or chunk, as the stage says).
  int64_t grads_size() const { return static_cast<int64_t>(grads_.size()); }
  void zero_grad() override;
  double grad_sum_squares() override;
  void adamw_update(const AdamWConfig& cfg, float lr, float grad_scale) override;
  uint64_t weights_digest() override;
  void set_shard(const ShardSpec& spec) override;
  bool has_full_weights() const override { return shard_.stage != 3 || full_; }
  // ZeRO-3: the whole weights a strategy gathered become weights() (returns their data) until
  // release_full_weights().
  const float* hold_full_weights(std::vector<float> full);
  void release_full_weights();
  std::vector<float> download_weights() const override;
  AdamWState download_optimizer_state() const override;
  void upload(const std::vector<float>& weights, const AdamWState* opt) override;
  size_t host_bytes() const override;

  // The weights object the CPU model keeps a reference to (its data is master()).
  const model::Weights& weights() const { return w_; }
  const AdamWState& optimizer_state() const { return opt_; }

 private:
  model::Weights w_;
  std::vector<float> grads_;  // padded to world x chunk when sharded (the padding stays zero)
  AdamWState opt_;            // moments (of the shard only when sharded); opt_.step mirrors steps_
  std::vector<float> shard_w_;  // ZeRO-3: the shard's master weights (chunk floats)
  bool full_ = false;           // ZeRO-3: w_.data holds the gathered whole weights
  // The shard's gradients: grads_ from the shard's first element, or (stage 2, 3) grads_ itself.
  float* shard_grads() { return shard_.stage >= 2 ? grads_.data() : grads_.data() + shard_.begin; }
};

}  // namespace verl::optim
