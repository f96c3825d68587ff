// The one optimizer: AdamW (torch.optim.AdamW) with torch.nn.utils.clip_grad_norm_ over a flat
// TrainState on either device and the parallel strategy composed onto it (optim/strategy.h), as
// verl's FSDP workers run it: gradients summed over the data-parallel ranks, one global L2 norm,
// clipping folded into the update, a non-finite norm skips the step, the learning rate from the
// schedule.
#pragma once

#include <cstdint>
#include <vector>

#include "optim/lr_schedule.h"

namespace verl::dist {
class Communicator;
}

namespace verl::optim {

class TrainState;
class Strategy;

struct AdamWConfig {
  float lr = 1e-6f;  // verl's actor default
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  float grad_clip = 1.0f;  // max global L2 norm; <= 0 disables clipping
};

// AdamW's state in the parameters' flat layout: what a checkpoint saves and restores, whichever
// device ran the optimizer.
struct AdamWState {
  std::vector<float> exp_avg, exp_avg_sq;  // first and second moments
  int64_t step = 0;                        // updates applied (skipped non-finite steps excluded)
};

class AdamW {
 public:
  explicit AdamW(AdamWConfig cfg, LrSchedule schedule = {}) : cfg_(cfg), schedule_(schedule) {}

  // The learning rate of optimizer step `global_step` (0-based): cfg.lr x the schedule.
  float lr_at(int64_t global_step) const {
    return static_cast<float>(cfg_.lr * schedule_.multiplier(global_step));
  }
  // Sums the state's gradients over `comm`'s ranks as `strategy` does (whole, bucketed, sharded,
  // compressed), takes the global norm, clips to cfg.grad_clip and applies one update of the
  // state's shard with learning rate `lr`. Returns the norm before clipping; a non-finite norm
  // skips the update (as verl does) and is returned as is.
  double step(TrainState& state, Strategy& strategy, float lr, dist::Communicator& comm) const;
  // The same with the whole gradient all-reduced at the step (optim::AllReduceAtStep).
  double step(TrainState& state, float lr, dist::Communicator& comm) const;

  const AdamWConfig& config() const { return cfg_; }
  const LrSchedule& schedule() const { return schedule_; }

 private:
  AdamWConfig cfg_;
  LrSchedule schedule_;
};

// clip_grad_norm_'s factor: max_norm / (norm + 1e-6) when that is below one, else 1.
float clip_scale(double norm, float grad_clip);

}  // namespace verl::optim
