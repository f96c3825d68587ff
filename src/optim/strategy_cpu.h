// Data parallelism over the CPU storage (optim/train_state.h): the gradient buckets reduced while
// backward goes on (optim/grad_sync.h) with ZeRO stage 0, 1 or 2; ZeRO-3's weight shards gathered
// range by range for the model and whole for the rollout (optim/zero3.h); LightweightSync's
// messages and carry. Built by make_strategy (optim/strategy.h).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "optim/grad_sync.h"
#include "optim/strategy.h"
#include "optim/zero3.h"

namespace verl::optim {

class CpuDataParallel final : public Strategy {
 public:
  // Over `comm`'s ranks at ZeRO `stage` (1..3 narrow the storage to this rank's shard: the flat
  // layout cut into world_size equal ranges, the last padded), with LightweightSync when `lw` is
  // given (stage 0 or 1).
  CpuDataParallel(CpuTrainState& st, dist::Communicator& comm, int stage,
                  const std::optional<LightweightConfig>& lw);

  model::GradSink* grad_sink() override { return sync_.get(); }
  model::WeightSource* weight_source() override { return gather_.get(); }
  void prepare_backward(bool last_micro_batch) override {
    sync_->arm(last_micro_batch && sync_due());
  }
  void reduce_grads(dist::Communicator& comm) override;
  void gather_weights(dist::Communicator& comm) override;
  void gather_full_weights(int64_t bucket) override;
  void drop_full_weights() override;
  AdamWState download_optimizer_state() const override;
  size_t host_bytes() const override { return carry_.size() * sizeof(float); }
  size_t take_peak_gather_bytes() override { return gather_ ? gather_->take_peak_bytes() : 0; }
  void defer_grads() override;
  std::vector<float> download_carry() const override { return carry_; }
  void upload_carry(const std::vector<float>& carry, int64_t calls) override;

 private:
  CpuTrainState& cpu_;
  dist::Communicator& comm_;
  int64_t chunk_ = 0;  // elements per rank when sharded
  std::unique_ptr<GradSync> sync_;
  std::vector<float> carry_;            // LightweightSync: numel floats, or empty
  std::unique_ptr<ZeroGather> gather_;  // ZeRO-3
};

}  // namespace verl::optim
