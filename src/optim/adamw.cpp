#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "dist/communicator.h"
#include "optim/train_state.h"

namespace verl::optim {

float clip_scale(double norm, float grad_clip) {
  if (grad_clip <= 0) return 1.0f;
  return static_cast<float>(std::min(1.0, grad_clip / (norm + 1e-6)));
}

double AdamW::step(TrainState& state, float lr, dist::Communicator& comm) const {
  VERL_CHECK(state.trainable(), "AdamW::step: the state is forward-only (a reference policy)");
  if (comm.world_size() > 1) {
    VERL_CHECK(state.whole(), "AdamW::step: sharded training states are not supported yet");
    state.all_reduce_grads(comm);
  }
  double sq = state.grad_sum_squares();
  if (!state.whole()) sq = comm.sum(sq);  // each rank holds a shard's gradients
  const double norm = std::sqrt(sq);
  if (!std::isfinite(norm)) return norm;
  state.adamw_update(cfg_, lr, clip_scale(norm, cfg_.grad_clip));
  return norm;
}

}  // namespace verl::optim
