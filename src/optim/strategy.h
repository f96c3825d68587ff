// The parallel strategy composed onto a training state's storage (optim/train_state.h): how the
// gradients of the data-parallel ranks meet (one all-reduce at the step; buckets reduced while
// backward goes on, with ZeRO 0/1/2, optim/grad_sync.h; LightweightSync's top-k messages,
// optim/sparse_sync.h), whether the storage keeps only a shard (ZeRO 1/2/3, which sets its
// ShardSpec) and where the model reads sharded weights (ZeRO-3's gathers, optim/zero3.h). The
// model and the update loop call this interface; AdamW::step runs over the storage and it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "dist/communicator.h"
#include "model/grad_sink.h"
#include "model/weight_source.h"
#include "optim/adamw.h"
#include "optim/grad_sync.h"
#include "optim/sparse_sync.h"
#include "optim/train_state.h"
#include "optim/zero3.h"

namespace verl::optim {

class Strategy {
 public:
  virtual ~Strategy() = default;
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  TrainState& state() { return st_; }
  int zero_stage() const { return st_.shard().stage; }

  // Where the model's backward writes its gradients range by range (null: the whole buffer at
  // state().grads(), reduced at the step).
  virtual model::GradSink* grad_sink() { return nullptr; }
  // ZeRO-3: where the model reads its weights range by range (null: the whole buffer).
  virtual model::WeightSource* weight_source() { return nullptr; }
  // Before each backward: whether it is the last micro-batch before the optimizer step.
  virtual void prepare_backward(bool last_micro_batch) { (void)last_micro_batch; }
  // A model that writes the whole gradient buffer itself (the GPU model) reports here each range
  // [begin, end) its backward has finished enqueuing (model::cuda::GradReadyHook).
  virtual void grads_ready(int64_t begin, int64_t end) {
    (void)begin;
    (void)end;
  }
  // The step's gradient reduction over `comm`'s ranks (called when comm is distributed): what
  // backward started is waited for; otherwise the whole buffer is all-reduced (or reduce-scattered
  // to the shards).
  virtual void reduce_grads(dist::Communicator& comm) = 0;
  // After the update of a sharded state: the all-gather of the master weights (else nothing).
  virtual void gather_weights(dist::Communicator& comm) { (void)comm; }
  // ZeRO-3's reshard (a collective): the whole weights gathered from the shards in buckets of
  // `bucket` elements, for the rollout and checkpoints, until drop_full_weights(). Other strategies
  // leave the whole weights in place: nothing to do.
  virtual void gather_full_weights(int64_t bucket) { (void)bucket; }
  virtual void drop_full_weights() {}
  // The whole AdamW state in layout order (checkpoints): the storage's, or the shards' gathered
  // (a collective: every rank calls it).
  virtual AdamWState download_optimizer_state() const { return st_.download_optimizer_state(); }
  // Host bytes the strategy holds beside the storage (LightweightSync's carry), and the most
  // ZeRO-3's gather buffers held since the last call.
  virtual size_t host_bytes() const { return 0; }
  virtual size_t take_peak_gather_bytes() { return 0; }

  // Gradient-sync cost since the last call (bytes sent, seconds spent), then reset.
  SyncStats take_sync_stats() { return std::exchange(sync_stats_, SyncStats{}); }
  SyncStats& sync_stats() { return sync_stats_; }
  // ZeRO-3's weight gathers since the last take, then reset.
  GatherStats take_gather_stats() { return std::exchange(gather_stats_, GatherStats{}); }

  // LightweightSync (optim/sparse_sync.h) in place of the dense reduction: each bucket's top-k
  // entries of gradient plus carry, all-gathered. The carry (this rank's undelivered gradient: the
  // error feedback and the gradients of the interval's steps without a sync) is one more flat fp32
  // buffer that the strategy keeps.
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

 protected:
  explicit Strategy(TrainState& st) : st_(st) {}
  // A ZeRO strategy's download_optimizer_state: this rank's shard of the moments (`chunk`
  // elements at rank x chunk) all-gathered on the host into the whole layout's (a collective).
  AdamWState gather_sharded_moments(int64_t chunk, dist::Communicator& comm) const;

  TrainState& st_;
  SyncStats sync_stats_;
  GatherStats gather_stats_;
  std::optional<LightweightConfig> lw_;
  int64_t sync_calls_ = 0;
  bool deferred_ = false;
};

// The strategy of a state without data parallelism, or of one whose ranks all-reduce the whole
// gradient buffer at the optimizer step (on either device): no overlap, no sharding.
class AllReduceAtStep final : public Strategy {
 public:
  explicit AllReduceAtStep(TrainState& st) : Strategy(st) {}
  void reduce_grads(dist::Communicator& comm) override;
};

// Sums the whole gradient buffer of `st` over `comm`'s ranks in place, counted in `stats`.
void all_reduce_whole_grads(TrainState& st, dist::Communicator& comm, SyncStats& stats);

// What a trained model's data parallelism asks for (the worker's keys, read once).
struct StrategyConfig {
  int zero_stage = 0;                            // 0..3
  std::optional<LightweightConfig> lightweight;  // trainer.gradient_sync_method=lightweight
  // The zero_stage key's name, for errors (the actor's or the critic's).
  std::string zero_stage_key = "actor_rollout_ref.actor.zero_stage";
};

// The strategy for `st` over `comm`: one rank without a distributed communicator gets
// AllReduceAtStep (nothing to sync); otherwise data parallelism on st's device with buckets
// reduced during backward, ZeRO at cfg.zero_stage (one rank has nothing to shard: stage 0) and
// LightweightSync when asked. A combination the device has no strategy for is refused, naming the
// keys (on the GPU: ZeRO-3, and ZeRO with an offloaded state).
std::unique_ptr<Strategy> make_strategy(TrainState& st, dist::Communicator& comm,
                                        const StrategyConfig& cfg);

namespace detail {
// The GPU's data-parallel strategy lives in optim/cuda (which links this library, not the other
// way round): a CUDA state registers its builder when it is made.
// `stage` is the ZeRO stage make_strategy settled on (0 for one rank); `cfg` names the keys.
using DataParallelBuilder = std::unique_ptr<Strategy> (*)(TrainState& st, dist::Communicator& comm,
                                                          int stage, const StrategyConfig& cfg);
void register_data_parallel(Device device, DataParallelBuilder build);
}  // namespace detail

}  // namespace verl::optim
