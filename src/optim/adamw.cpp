#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/timer.h"
#include "dist/communicator.h"
#include "optim/train_state.h"

namespace verl::optim {

float clip_scale(double norm, float grad_clip) {
  if (grad_clip <= 0) return 1.0f;
  return static_cast<float>(std::min(1.0, grad_clip / (norm + 1e-6)));
}

double AdamW::step(TrainState& state, float lr, dist::Communicator& comm) const {
  VERL_CHECK(state.trainable(), "AdamW::step: the state is forward-only (a reference policy)");
  // Data parallel: each rank's loss carries dp_size x the global normaliser (core_algos.h AggNorm),
  // so the gradient is the ranks' mean: their sum (all-reduced in place) divided by the world size,
  // a factor folded into the update's gradient scale rather than a pass of its own.
  const double world = comm.world_size();
  if (comm.distributed()) {  // all-reduce, or reduce-scatter (ZeRO); or what backward started
    Timer t;
    state.reduce_grads(comm);
    state.sync_stats().seconds += t.seconds();
  }
  double sq = state.grad_sum_squares();
  if (!state.whole()) sq = comm.sum(sq);  // each rank holds a shard's gradients
  const double norm = std::sqrt(sq) / world;
  if (!std::isfinite(norm)) return norm;  // every rank sees the same norm: all skip together
  state.adamw_update(cfg_, lr, clip_scale(norm, cfg_.grad_clip) / static_cast<float>(world));
  if (!state.whole()) state.gather_weights(comm);
  return norm;
}

}  // namespace verl::optim
