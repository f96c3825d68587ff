#include "optim/train_state.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "dist/communicator.h"
#include "ops/cpu/ops.h"

namespace verl::optim {

void TrainState::check_upload(const std::vector<float>& weights, const AdamWState* opt) const {
  VERL_CHECK(static_cast<int64_t>(weights.size()) == numel(),
             "restore: {} weights for a model of {} parameters", weights.size(), numel());
  if (!trainable_ || opt == nullptr) return;
  const auto m = static_cast<int64_t>(opt->exp_avg.size());
  VERL_CHECK(
      (m == numel() || (!whole() && m == shard_.size())) &&
          static_cast<int64_t>(opt->exp_avg_sq.size()) == m,
      "restore: optimizer moments of {} and {} floats for a model of {} parameters (shard {})",
      opt->exp_avg.size(), opt->exp_avg_sq.size(), numel(), shard_.size());
  VERL_CHECK(opt->step >= 0, "restore: a negative optimizer step count {}", opt->step);
}

void TrainState::require_trainable(const char* what) const {
  VERL_CHECK(trainable_, "TrainState::{}: this state is forward-only (the reference policy)", what);
}

CpuTrainState::CpuTrainState(model::Weights w, bool trainable)
    : TrainState(w.config, w.layout, trainable), w_(std::move(w)) {
  VERL_CHECK(static_cast<int64_t>(w_.data.size()) == w_.layout.total,
             "CpuTrainState: {} weights for a layout of {}", w_.data.size(), w_.layout.total);
  if (trainable_) {
    grads_.assign(w_.data.size(), 0.0f);
    opt_.exp_avg.assign(w_.data.size(), 0.0f);
    opt_.exp_avg_sq.assign(w_.data.size(), 0.0f);
  }
}

void CpuTrainState::zero_grad() {
  require_trainable("zero_grad");
  std::fill(grads_.begin(), grads_.end(), 0.0f);
}

void CpuTrainState::all_reduce_grads(dist::Communicator& comm) {
  require_trainable("all_reduce_grads");
  comm.all_reduce(std::span<float>(grads_), dist::ReduceOp::Sum);
}

void CpuTrainState::shard_optimizer_state(dist::Communicator& comm) {
  require_trainable("shard_optimizer_state");
  const int64_t world = comm.world_size(), n = numel();
  chunk_ = (n + world - 1) / world;
  shard_ = ShardSpec{std::min(n, comm.rank() * chunk_), std::min(n, (comm.rank() + 1) * chunk_)};
  shard_comm_ = &comm;
  grads_.assign(static_cast<size_t>(chunk_ * world), 0.0f);
  // Moments of the shard only (a fresh state: resume uploads the checkpoint's slice after this).
  opt_.exp_avg.assign(static_cast<size_t>(shard_.size()), 0.0f);
  opt_.exp_avg_sq.assign(static_cast<size_t>(shard_.size()), 0.0f);
}

void CpuTrainState::enable_data_parallel(dist::Communicator& comm, int zero_stage) {
  require_trainable("enable_data_parallel");
  VERL_CHECK(zero_stage >= 0 && zero_stage <= 3, "zero_stage {}: 0, 1, 2 or 3", zero_stage);
  if (zero_stage >= 1) shard_optimizer_state(comm);
  zero_stage_ = zero_stage;
  if (zero_stage >= 2) grads_.assign(static_cast<size_t>(chunk_), 0.0f);  // the shard's only
  // The gradients of stage 3 go as stage 2's: each range reduced to its owners as backward ends it.
  sync_ = std::make_unique<GradSync>(comm, std::min(zero_stage, 2), numel(), chunk_, grads_.data(),
                                     sync_stats_);
  if (zero_stage == 3) {
    // The shard's master weights (padded to the chunk); the whole copy goes.
    shard_w_.assign(static_cast<size_t>(chunk_), 0.0f);
    std::copy(w_.data.begin() + shard_.begin, w_.data.begin() + shard_.end, shard_w_.begin());
    w_.data = std::vector<float>{};
    gather_ = std::make_unique<ZeroGather>(comm, numel(), chunk_, shard_w_.data(), gather_stats_);
  }
}

void CpuTrainState::gather_full_weights(int64_t bucket) {
  if (zero_stage_ != 3 || full_) return;
  w_.data.assign(static_cast<size_t>(numel()), 0.0f);
  gather_->gather_all(w_.data.data(), bucket);
  gather_->read_full(w_.data.data());
  full_ = true;
}

void CpuTrainState::drop_full_weights() {
  if (zero_stage_ != 3 || !full_) return;
  gather_->read_full(nullptr);
  w_.data = std::vector<float>{};
  full_ = false;
}

std::vector<float> CpuTrainState::download_weights() const {
  VERL_CHECK(has_full_weights(),
             "internal: the ZeRO-3 weights are sharded; gather_full_weights first");
  return w_.data;
}

size_t CpuTrainState::host_bytes() const {
  const size_t floats = w_.data.size() + shard_w_.size() + grads_.size() + opt_.exp_avg.size() +
                        opt_.exp_avg_sq.size() + carry_.size();
  return floats * sizeof(float);
}

void CpuTrainState::use_lightweight_sync(const LightweightConfig& cfg) {
  require_trainable("use_lightweight_sync");
  VERL_CHECK(sync_ != nullptr, "use_lightweight_sync: enable_data_parallel first");
  check_lightweight_config(cfg);
  lw_ = cfg;
  const bool carry = cfg.needs_carry();
  carry_.assign(carry ? static_cast<size_t>(numel()) : 0, 0.0f);
  sync_->use_lightweight(cfg, carry ? carry_.data() : nullptr);
}

void CpuTrainState::defer_grads() {
  VERL_CHECK(!carry_.empty(), "defer_grads: no LightweightSync carry");
  for (int64_t i = 0; i < numel(); ++i) carry_[i] += grads_[i];
}

void CpuTrainState::upload_carry(const std::vector<float>& carry, int64_t calls) {
  VERL_CHECK(carry.empty() || carry_.empty() || static_cast<int64_t>(carry.size()) == numel(),
             "restore: a LightweightSync carry of {} floats for a model of {} parameters",
             carry.size(), numel());
  if (!carry_.empty()) {
    if (carry.empty())
      std::fill(carry_.begin(), carry_.end(), 0.0f);
    else
      carry_ = carry;
  }
  sync_calls_ = calls;
}

uint64_t CpuTrainState::weights_digest() {
  // FNV-1a over the weights' bits (ZeRO-3: the shard's).
  uint64_t h = 1469598103934665603ull;
  for (float x : zero_stage_ == 3 ? shard_w_ : w_.data) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    h = (h ^ bits) * 1099511628211ull;
  }
  return h;
}

void CpuTrainState::reduce_grads(dist::Communicator& comm) {
  // The buckets backward started (stage 2: every micro-batch's) complete here.
  if (sync_ && (sync_->finish() || zero_stage_ >= 2)) return;
  if (sync_ && sync_->lightweight()) return sync_->sync_whole();
  if (shard_comm_ == nullptr) {
    sync_stats_.add_all_reduce(comm.world_size(), static_cast<int64_t>(grads_.size()));
    return all_reduce_grads(comm);
  }
  sync_stats_.add_reduce_to_owners(comm.world_size(), static_cast<int64_t>(grads_.size()));
  // This rank's block of the padded buffer receives the sum over ranks (in place).
  comm.reduce_scatter(grads_.data(), grads_.data() + comm.rank() * chunk_,
                      static_cast<size_t>(chunk_), dist::DataType::F32, dist::ReduceOp::Sum);
}

void CpuTrainState::gather_weights(dist::Communicator& comm) {
  if (shard_comm_ == nullptr || zero_stage_ == 3) return;  // ZeRO-3 gathers as the model reads
  std::vector<float> all(static_cast<size_t>(chunk_ * comm.world_size()), 0.0f);
  std::copy(w_.data.begin() + shard_.begin, w_.data.begin() + shard_.end,
            all.begin() + comm.rank() * chunk_);
  comm.all_gather(all.data() + comm.rank() * chunk_, all.data(), static_cast<size_t>(chunk_),
                  dist::DataType::F32);
  std::copy(all.begin(), all.begin() + numel(), w_.data.begin());
}

double CpuTrainState::grad_sum_squares() {
  require_trainable("grad_sum_squares");
  return ops::cpu::sum_squares(shard_grads(), shard_.size());
}

void CpuTrainState::adamw_update(const AdamWConfig& cfg, float lr, float grad_scale) {
  require_trainable("adamw_update");
  ++steps_;
  opt_.step = steps_;
  drop_full_weights();  // ZeRO-3: a gathered whole copy is stale after the update
  const int64_t b = shard_.begin;
  const int64_t m = shard_comm_ ? 0 : b;  // sharded moments start at the shard
  float* w = zero_stage_ == 3 ? shard_w_.data() : w_.data.data() + b;
  ops::cpu::adamw_step(w, shard_grads(), opt_.exp_avg.data() + m, opt_.exp_avg_sq.data() + m,
                       shard_.size(), lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, steps_,
                       grad_scale);
}

AdamWState CpuTrainState::download_optimizer_state() const {
  require_trainable("download_optimizer_state");
  if (shard_comm_ == nullptr) return opt_;
  // Sharded: every rank's moments, gathered (a collective).
  dist::Communicator& comm = *shard_comm_;
  AdamWState whole;
  whole.step = opt_.step;
  for (auto [mine, out] :
       {std::pair{&opt_.exp_avg, &whole.exp_avg}, std::pair{&opt_.exp_avg_sq, &whole.exp_avg_sq}}) {
    std::vector<float> all(static_cast<size_t>(chunk_ * comm.world_size()), 0.0f);
    std::copy(mine->begin(), mine->end(), all.begin() + comm.rank() * chunk_);
    comm.all_gather(all.data() + comm.rank() * chunk_, all.data(), static_cast<size_t>(chunk_),
                    dist::DataType::F32);
    all.resize(static_cast<size_t>(numel()));
    *out = std::move(all);
  }
  return whole;
}

void CpuTrainState::upload(const std::vector<float>& weights, const AdamWState* opt) {
  check_upload(weights, opt);
  if (zero_stage_ == 3) {  // the shard's slice; a gathered whole copy would be stale
    drop_full_weights();
    std::copy(weights.begin() + shard_.begin, weights.begin() + shard_.end, shard_w_.begin());
  } else {
    w_.data = weights;  // the CPU model reads w_ through its reference
  }
  if (trainable_ && opt != nullptr) {
    if (shard_comm_ == nullptr) {
      opt_ = *opt;
    } else if (static_cast<int64_t>(opt->exp_avg.size()) == shard_.size() &&
               shard_.size() != numel()) {
      opt_ = *opt;  // the slice itself
    } else {        // keep this rank's slice of the checkpoint's whole moments
      opt_.exp_avg.assign(opt->exp_avg.begin() + shard_.begin, opt->exp_avg.begin() + shard_.end);
      opt_.exp_avg_sq.assign(opt->exp_avg_sq.begin() + shard_.begin,
                             opt->exp_avg_sq.begin() + shard_.end);
      opt_.step = opt->step;
    }
    steps_ = opt->step;
  }
}

}  // namespace verl::optim
