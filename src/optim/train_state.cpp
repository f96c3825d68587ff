// The CPU storage of the training state (optim/train_state.h): host vectors in layout order, the
// master weights being the model::Weights the CPU model reads; a ZeRO strategy narrows them to the
// shard (set_shard).
#include "optim/train_state.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/error.h"
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
    : TrainState(w.layout, trainable), w_(std::move(w)) {
  VERL_CHECK(static_cast<int64_t>(w_.data.size()) == w_.layout.total,
             "CpuTrainState: {} weights for a layout of {}", w_.data.size(), w_.layout.total);
  if (trainable_) {
    grads_.assign(w_.data.size(), 0.0f);
    opt_.exp_avg.assign(w_.data.size(), 0.0f);
    opt_.exp_avg_sq.assign(w_.data.size(), 0.0f);
  }
}

CpuTrainState::CpuTrainState(const model::ParamLayout& layout, std::vector<float> init,
                             bool trainable)
    : CpuTrainState(model::Weights{model::ModelConfig{}, layout, std::move(init)}, trainable) {}

void CpuTrainState::zero_grad() {
  require_trainable("zero_grad");
  std::fill(grads_.begin(), grads_.end(), 0.0f);
}

void CpuTrainState::set_shard(const ShardSpec& spec) {
  require_trainable("set_shard");
  VERL_CHECK(shard_.stage == 0, "internal: the training state is sharded already");
  VERL_CHECK(spec.stage >= 1 && spec.stage <= 3 && spec.chunk > 0 &&
                 spec.chunk * spec.world >= numel() && spec.begin <= spec.end &&
                 spec.end <= numel(),
             "internal: a ZeRO-{} shard [{}, {}) of chunks of {} x {} ranks for {} elements",
             spec.stage, spec.begin, spec.end, spec.chunk, spec.world, numel());
  shard_ = spec;
  // Stage 1 keeps the whole gradients (padded to world x chunk for the reduce-scatter), 2 and 3
  // the shard's; moments of the shard only (a fresh state: resume uploads its slice after this).
  grads_.assign(static_cast<size_t>(spec.stage >= 2 ? spec.chunk : spec.chunk * spec.world), 0.0f);
  opt_.exp_avg.assign(static_cast<size_t>(spec.size()), 0.0f);
  opt_.exp_avg_sq.assign(static_cast<size_t>(spec.size()), 0.0f);
  if (spec.stage == 3) {
    // The shard's master weights (padded to the chunk); the whole copy goes.
    shard_w_.assign(static_cast<size_t>(spec.chunk), 0.0f);
    std::copy(w_.data.begin() + spec.begin, w_.data.begin() + spec.end, shard_w_.begin());
    w_.data = std::vector<float>{};
  }
}

const float* CpuTrainState::hold_full_weights(std::vector<float> full) {
  VERL_CHECK(shard_.stage == 3 && static_cast<int64_t>(full.size()) == numel(),
             "internal: {} gathered weights for a ZeRO-{} state of {}", full.size(), shard_.stage,
             numel());
  w_.data = std::move(full);
  full_ = true;
  return w_.data.data();
}

void CpuTrainState::release_full_weights() {
  if (!full_) return;
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
                        opt_.exp_avg_sq.size();
  return floats * sizeof(float);
}

uint64_t CpuTrainState::weights_digest() {
  // FNV-1a over the weights' bits (ZeRO-3: the shard's).
  uint64_t h = 1469598103934665603ull;
  for (float x : shard_.stage == 3 ? shard_w_ : w_.data) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    h = (h ^ bits) * 1099511628211ull;
  }
  return h;
}

double CpuTrainState::grad_sum_squares() {
  require_trainable("grad_sum_squares");
  return ops::cpu::sum_squares(shard_grads(), shard_.size());
}

void CpuTrainState::adamw_update(const AdamWConfig& cfg, float lr, float grad_scale) {
  require_trainable("adamw_update");
  // ZeRO-3: a gathered whole copy would go stale; the strategy drops it before the update.
  VERL_CHECK(!full_, "internal: a ZeRO-3 update while the gathered weights are held");
  ++steps_;
  opt_.step = steps_;
  const int64_t b = shard_.begin;
  const int64_t m = shard_.stage >= 1 ? 0 : b;  // sharded moments start at the shard
  float* w = shard_.stage == 3 ? shard_w_.data() : w_.data.data() + b;
  ops::cpu::adamw_step(w, shard_grads(), opt_.exp_avg.data() + m, opt_.exp_avg_sq.data() + m,
                       shard_.size(), lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, steps_,
                       grad_scale);
}

AdamWState CpuTrainState::download_optimizer_state() const {
  require_trainable("download_optimizer_state");
  return opt_;
}

void CpuTrainState::upload(const std::vector<float>& weights, const AdamWState* opt) {
  check_upload(weights, opt);
  if (shard_.stage == 3) {  // the shard's slice; a gathered whole copy would be stale
    VERL_CHECK(!full_, "internal: a ZeRO-3 restore while the gathered weights are held");
    std::copy(weights.begin() + shard_.begin, weights.begin() + shard_.end, shard_w_.begin());
  } else {
    w_.data = weights;  // the CPU model reads w_ through its reference
  }
  if (trainable_ && opt != nullptr) {
    if (shard_.stage == 0) {
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
