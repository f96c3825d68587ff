// The flat training state of a model being trained (the actor, the critic), apart from the model
// that computes with it: fp32 master weights, fp32 gradients and the AdamW moments, each one flat
// buffer in the model's parameter layout (model::ParamLayout: the named views), on the CPU or the
// GPU. On the GPU it also holds the bf16 compute copy that the forward, the backward and the
// rollout read (optim/cuda/train_state.h). The shard spec says which element range this rank owns:
// the whole range today; ZeRO sharding narrows it without touching the models.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "model/grad_sink.h"
#include "model/weights.h"
#include "optim/adamw.h"
#include "optim/grad_sync.h"
#include "optim/sparse_sync.h"
#include "optim/zero3.h"

namespace verl::dist {
class Communicator;
}

namespace verl::optim {

// Elements [begin, end) of the flat layout that this rank keeps moments (and, later, master
// weights and gradients) for.
struct ShardSpec {
  int64_t begin = 0, end = 0;
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

  const model::ModelConfig& config() const { return config_; }
  const model::ParamLayout& layout() const { return layout_; }
  int64_t numel() const { return layout_.total; }
  const ShardSpec& shard() const { return shard_; }
  // Whether this rank holds every element (no ZeRO sharding).
  bool whole() const { return shard_.begin == 0 && shard_.end == numel(); }
  // false: forward only (the reference policy): weights without gradients or optimizer state.
  bool trainable() const { return trainable_; }
  // AdamW updates applied (skipped non-finite steps excluded).
  int64_t steps() const { return steps_; }

  // The flat buffers, host pointers on the CPU and device pointers on the GPU (null when the state
  // is forward-only): master weights, gradients (accumulated by the model's backward), moments.
  virtual float* master() = 0;
  virtual float* grads() = 0;
  virtual float* exp_avg() = 0;
  virtual float* exp_avg_sq() = 0;

  virtual void zero_grad() = 0;
  // Sums the gradients over the communicator's ranks, in place (data parallelism).
  virtual void all_reduce_grads(dist::Communicator& comm) = 0;
  // ZeRO-1 over `comm`'s ranks: this rank keeps the AdamW moments of its shard only (the flat
  // layout cut into world_size equal ranges, the last padded). reduce_grads then reduce-scatters
  // the gradients and gather_weights all-gathers the updated master weights; checkpoint copies
  // gather the moments (a collective: every rank calls them). The CUDA state refuses it for now.
  virtual void shard_optimizer_state(dist::Communicator& comm) {
    (void)comm;
    VERL_FAIL("zero_stage 1: the {} training state keeps whole optimizer state (not built yet)",
              to_string(device()));
  }
  // Data parallelism over `comm`'s ranks with ZeRO stage 0, 1 or 2 (optim/grad_sync.h): the
  // gradients are reduced in buckets while backward goes on (grad_sink()); 1 also shards the
  // moments (shard_optimizer_state), 2 also keeps only the shard's gradients. The CUDA state
  // takes stage 0 (one all-reduce of the whole buffer at the step) and refuses the others for now.
  virtual void enable_data_parallel(dist::Communicator& comm, int zero_stage) {
    (void)comm;
    VERL_CHECK(zero_stage == 0,
               "zero_stage {}: the {} training state keeps whole gradients and "
               "optimizer state (not built yet)",
               zero_stage, to_string(device()));
  }
  int zero_stage() const { return zero_stage_; }
  // ZeRO-3: where the model reads its weights range by range (null: the whole buffer, stages 0-2).
  virtual model::WeightSource* weight_source() { return nullptr; }
  // ZeRO-3's reshard (a collective): the whole weights gathered from the shards in buckets of
  // `bucket` elements, for the rollout and checkpoints, until drop_full_weights(). Other states
  // hold the whole weights always: nothing to do.
  virtual void gather_full_weights(int64_t bucket) { (void)bucket; }
  virtual void drop_full_weights() {}
  // Whether download_weights() / the model's weights() hold every element now.
  virtual bool has_full_weights() const { return true; }
  // ZeRO-3's weight gathers since the last take, then reset.
  GatherStats take_gather_stats() { return std::exchange(gather_stats_, GatherStats{}); }
  // Bytes of host memory this state's buffers hold now (weights, gradients, moments, carry; the
  // memory-per-phase metrics), and the most ZeRO-3's gather buffers held since the last call.
  virtual size_t host_bytes() const { return 0; }
  virtual size_t take_peak_gather_bytes() { return 0; }
  // Where the model's backward writes its gradients range by range (null: the whole buffer at
  // grads(), reduced at the step).
  virtual model::GradSink* grad_sink() { return nullptr; }
  // Before each backward: whether it is the last micro-batch before the optimizer step.
  virtual void prepare_backward(bool last_micro_batch) { (void)last_micro_batch; }
  // A model that writes the whole gradient buffer itself (the GPU model) reports here each range
  // [begin, end) its backward has finished enqueuing (model::cuda::GradReadyHook).
  virtual void grads_ready(int64_t begin, int64_t end) {
    (void)begin;
    (void)end;
  }
  // The step's gradient reduction: what backward started is waited for; otherwise all-reduce
  // (whole state) or reduce-scatter (sharded).
  virtual void reduce_grads(dist::Communicator& comm) { all_reduce_grads(comm); }
  // Gradient-sync cost since the last call (bytes sent, seconds spent), then reset.
  SyncStats take_sync_stats() { return std::exchange(sync_stats_, SyncStats{}); }
  SyncStats& sync_stats() { return sync_stats_; }
  // LightweightSync (optim/sparse_sync.h) in place of the dense reduction, after
  // enable_data_parallel (stage 0 or 1): each bucket's top-k entries of gradient plus carry, int8 /
  // bf16 / fp32, all-gathered. The carry (this rank's undelivered gradient: the error feedback and
  // the gradients of the interval's steps without a sync) is one more flat fp32 buffer.
  virtual void use_lightweight_sync(const LightweightConfig& cfg) {
    (void)cfg;
    VERL_FAIL("gradient_sync_method=lightweight: the {} training state has no data parallelism",
              to_string(device()));
  }
  const std::optional<LightweightConfig>& lightweight() const { return lw_; }
  // sync_interval_steps k: only every k-th optimizer step syncs and updates; the others add their
  // gradients to the carry (gradient accumulation over k steps, so every rank's weights stay the
  // same).
  bool sync_due() const { return !lw_ || (sync_calls_ + 1) % lw_->interval == 0; }
  int64_t sync_calls() const { return sync_calls_; }
  // Whether the optimizer step just taken only moved its gradients into the carry.
  bool step_deferred() const { return deferred_; }
  void count_sync_call(bool deferred) {
    ++sync_calls_;
    deferred_ = deferred;
  }
  // carry += gradients (a step without a sync).
  virtual void defer_grads() { VERL_FAIL("defer_grads: no LightweightSync carry"); }
  // The carry in layout order (empty without one) for checkpoints, and its restore with the count
  // of optimizer steps taken (the interval's phase).
  virtual std::vector<float> download_carry() const { return {}; }
  virtual void upload_carry(const std::vector<float>& carry, int64_t calls) {
    (void)carry;
    sync_calls_ = calls;
  }
  // A digest of the master weights: equal on ranks that hold equal weights.
  virtual uint64_t weights_digest() = 0;

  // After the update: the sharded state's all-gather of the master weights (else nothing).
  virtual void gather_weights(dist::Communicator& comm) { (void)comm; }
  // Sum of squares of the gradients over this rank's shard (a global norm sums it over ranks).
  virtual double grad_sum_squares() = 0;
  // One AdamW update of the shard with gradients scaled by `grad_scale` (clipping), then steps()+1.
  virtual void adamw_update(const AdamWConfig& cfg, float lr, float grad_scale) = 0;

  // Host copies for checkpoints and the CPU rollout: the fp32 weights in layout order (the master
  // copy, or the bf16 copy widened for a forward-only state on the GPU) and the AdamW state.
  virtual std::vector<float> download_weights() const = 0;
  virtual AdamWState download_optimizer_state() const = 0;
  // This rank's slice of the moments (shard() elements; the whole when not sharded): what a
  // sharded checkpoint writes, with no collective.
  virtual AdamWState download_optimizer_shard() const { return download_optimizer_state(); }
  // Resume: replaces the weights (layout order, numel() floats) and, when trainable, the moments
  // (numel() floats, or shard().size() for a sharded state: its slice) and the step count.
  virtual void upload(const std::vector<float>& weights, const AdamWState* opt) = 0;

 protected:
  TrainState(const model::ModelConfig& cfg, const model::ParamLayout& layout, bool trainable)
      : config_(cfg), layout_(layout), shard_{0, layout.total}, trainable_(trainable) {}
  void check_upload(const std::vector<float>& weights, const AdamWState* opt) const;
  void require_trainable(const char* what) const;

  model::ModelConfig config_;
  model::ParamLayout layout_;
  ShardSpec shard_;
  bool trainable_;
  int64_t steps_ = 0;
  int zero_stage_ = 0;
  SyncStats sync_stats_;
  GatherStats gather_stats_;
  std::optional<LightweightConfig> lw_;
  int64_t sync_calls_ = 0;
  bool deferred_ = false;
};

// The CPU state: the master weights are a model::Weights the CPU model reads (weights()). ZeRO-3
// keeps only the shard's (master() is the shard then); weights() holds every element only
// between gather_full_weights() and drop_full_weights(), and the model reads through
// weight_source() otherwise.
class CpuTrainState final : public TrainState {
 public:
  CpuTrainState(model::Weights w, bool trainable);

  Device device() const override { return Device::Cpu; }
  float* master() override { return zero_stage_ == 3 ? shard_w_.data() : w_.data.data(); }
  model::WeightSource* weight_source() override { return gather_.get(); }
  void gather_full_weights(int64_t bucket) override;
  void drop_full_weights() override;
  bool has_full_weights() const override { return zero_stage_ != 3 || full_; }
  size_t host_bytes() const override;
  size_t take_peak_gather_bytes() override { return gather_ ? gather_->take_peak_bytes() : 0; }
  // The whole layout's gradients (padded to world x chunk when sharded); ZeRO-2: the shard's only.
  float* grads() override { return trainable_ ? grads_.data() : nullptr; }
  float* exp_avg() override { return trainable_ ? opt_.exp_avg.data() : nullptr; }  // the shard's
  float* exp_avg_sq() override { return trainable_ ? opt_.exp_avg_sq.data() : nullptr; }
  void zero_grad() override;
  void all_reduce_grads(dist::Communicator& comm) override;
  void shard_optimizer_state(dist::Communicator& comm) override;
  void enable_data_parallel(dist::Communicator& comm, int zero_stage) override;
  model::GradSink* grad_sink() override { return sync_.get(); }
  void prepare_backward(bool last_micro_batch) override {
    if (sync_) sync_->arm(last_micro_batch && sync_due());
  }
  void use_lightweight_sync(const LightweightConfig& cfg) override;
  void defer_grads() override;
  std::vector<float> download_carry() const override { return carry_; }
  void upload_carry(const std::vector<float>& carry, int64_t calls) override;
  uint64_t weights_digest() override;
  void reduce_grads(dist::Communicator& comm) override;
  void gather_weights(dist::Communicator& comm) override;
  double grad_sum_squares() override;
  void adamw_update(const AdamWConfig& cfg, float lr, float grad_scale) override;
  std::vector<float> download_weights() const override;
  AdamWState download_optimizer_state() const override;
  AdamWState download_optimizer_shard() const override {
    require_trainable("download_optimizer_shard");
    return opt_;
  }
  void upload(const std::vector<float>& weights, const AdamWState* opt) override;

  // The weights object the CPU model keeps a reference to (its data is master()).
  const model::Weights& weights() const { return w_; }
  const AdamWState& optimizer_state() const { return opt_; }

 private:
  model::Weights w_;
  std::vector<float> grads_;  // padded to world x chunk when sharded (the padding stays zero)
  AdamWState opt_;            // moments (of the shard only when sharded); opt_.step mirrors steps_
  dist::Communicator* shard_comm_ = nullptr;  // set by shard_optimizer_state
  int64_t chunk_ = 0;                         // elements per rank when sharded
  std::unique_ptr<GradSync> sync_;            // set by enable_data_parallel
  std::vector<float> carry_;                  // LightweightSync: numel floats, or empty
  std::vector<float> shard_w_;                // ZeRO-3: the shard's master weights (chunk floats)
  std::unique_ptr<ZeroGather> gather_;        // ZeRO-3
  bool full_ = false;                         // ZeRO-3: w_.data holds the gathered whole weights
  // The shard's gradients: grads_ from the shard's first element, or (ZeRO-2, 3) grads_ itself.
  float* shard_grads() { return zero_stage_ >= 2 ? grads_.data() : grads_.data() + shard_.begin; }
};

}  // namespace verl::optim
