#include "optim/train_state.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "dist/communicator.h"
#include "ops/cpu/ops.h"

namespace verl::optim {

void TrainState::check_upload(const std::vector<float>& weights, const AdamWState* opt) const {
  VERL_CHECK(static_cast<int64_t>(weights.size()) == numel(),
             "restore: {} weights for a model of {} parameters", weights.size(), numel());
  if (!trainable_ || opt == nullptr) return;
  VERL_CHECK(static_cast<int64_t>(opt->exp_avg.size()) == numel() &&
                 static_cast<int64_t>(opt->exp_avg_sq.size()) == numel(),
             "restore: optimizer moments of {} and {} floats for a model of {} parameters",
             opt->exp_avg.size(), opt->exp_avg_sq.size(), numel());
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

double CpuTrainState::grad_sum_squares() {
  require_trainable("grad_sum_squares");
  return ops::cpu::sum_squares(grads_.data() + shard_.begin, shard_.size());
}

void CpuTrainState::adamw_update(const AdamWConfig& cfg, float lr, float grad_scale) {
  require_trainable("adamw_update");
  ++steps_;
  opt_.step = steps_;
  const int64_t b = shard_.begin;
  ops::cpu::adamw_step(w_.data.data() + b, grads_.data() + b, opt_.exp_avg.data() + b,
                       opt_.exp_avg_sq.data() + b, shard_.size(), lr, cfg.beta1, cfg.beta2,
                       cfg.eps, cfg.weight_decay, steps_, grad_scale);
}

AdamWState CpuTrainState::download_optimizer_state() const {
  require_trainable("download_optimizer_state");
  return opt_;
}

void CpuTrainState::upload(const std::vector<float>& weights, const AdamWState* opt) {
  check_upload(weights, opt);
  w_.data = weights;  // the CPU model reads w_ through its reference
  if (trainable_ && opt != nullptr) {
    opt_ = *opt;
    steps_ = opt->step;
  }
}

}  // namespace verl::optim
