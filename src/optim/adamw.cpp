#include "optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/fault.h"
#include "core/timer.h"
#include "dist/communicator.h"
#include "optim/strategy.h"
#include "optim/train_state.h"

namespace verl::optim {

float clip_scale(double norm, float grad_clip) {
  if (grad_clip <= 0) return 1.0f;
  return static_cast<float>(std::min(1.0, grad_clip / (norm + 1e-6)));
}

namespace {

// LightweightSync: the ranks must hold the same weights after every update (nothing exchanges
// them); a difference is an error naming the ranks, never a silent drift.
void check_same_weights(TrainState& state, dist::Communicator& comm) {
  // Tests nudge the last rank's weights (VERL_FAULT_INJECT=weights:<update>:perturb).
  if (comm.rank() == comm.world_size() - 1 &&
      fault_requested("weights", state.steps(), "perturb")) {
    std::vector<float> w = state.download_weights();
    w[0] += 1e-3f;
    state.upload(w, nullptr);
  }
  const auto mine = static_cast<int64_t>(state.weights_digest());
  std::vector<int64_t> all(static_cast<size_t>(comm.world_size()));
  comm.all_gather<int64_t>(std::span<const int64_t>(&mine, 1), all);
  for (int r = 1; r < comm.world_size(); ++r) {
    VERL_CHECK(
        all[r] == all[0],
        "LightweightSync: after optimizer update {} rank {}'s weights differ from rank 0's "
        "(digests {:016x} and {:016x}); the ranks diverged, stopping before they train apart",
        state.steps(), r, static_cast<uint64_t>(all[r]), static_cast<uint64_t>(all[0]));
  }
}

}  // namespace

double AdamW::step(TrainState& state, float lr, dist::Communicator& comm) const {
  AllReduceAtStep whole(state);
  return step(state, whole, lr, comm);
}

double AdamW::step(TrainState& state, Strategy& strategy, float lr,
                   dist::Communicator& comm) const {
  VERL_CHECK(state.trainable(), "AdamW::step: the state is forward-only (a reference policy)");
  VERL_CHECK(&strategy.state() == &state, "internal: AdamW::step over another state's strategy");
  const std::optional<LightweightConfig>& lw = strategy.lightweight();
  if (lw && !strategy.sync_due()) {  // an interval's step without a sync: its gradients wait
    strategy.defer_grads();
    strategy.count_sync_call(true);
    return 0.0;
  }
  // Data parallel: each rank's loss carries dp_size x the global normaliser (core_algos.h AggNorm),
  // so the gradient is the ranks' mean: their sum (all-reduced in place) divided by the world size,
  // a factor folded into the update's gradient scale rather than a pass of its own. LightweightSync
  // with an interval of k delivers k steps' gradients at once: their mean is the sum over k.
  const double world = comm.world_size() * static_cast<double>(lw ? lw->interval : 1);
  if (comm.distributed()) {  // all-reduce, or reduce-scatter (ZeRO); or what backward started
    Timer t;
    strategy.reduce_grads(comm);
    strategy.sync_stats().seconds += t.seconds();
  }
  strategy.count_sync_call(false);
  double sq = state.grad_sum_squares();
  if (!state.whole()) sq = comm.sum(sq);  // each rank holds a shard's gradients
  double norm = std::sqrt(sq) / world;
  // Tests make an update's norm NaN (VERL_FAULT_INJECT=grad_norm:<update>:nan) to reach the skip.
  if (fault_requested("grad_norm", state.steps(), "nan")) norm = std::nan("");
  if (!std::isfinite(norm)) return norm;  // every rank sees the same norm: all skip together
  strategy.drop_full_weights();           // ZeRO-3: a gathered whole copy is stale after the update
  state.adamw_update(cfg_, lr, clip_scale(norm, cfg_.grad_clip) / static_cast<float>(world));
  if (!state.whole()) strategy.gather_weights(comm);
  if (lw) check_same_weights(state, comm);
  return norm;
}

}  // namespace verl::optim
