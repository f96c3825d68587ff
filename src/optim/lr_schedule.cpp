#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace verl::optim {

int64_t LrSchedule::resolve_warmup(int64_t lr_warmup_steps, double ratio, int64_t total) {
  return lr_warmup_steps > 0 ? lr_warmup_steps : static_cast<int64_t>(ratio * total);
}

double LrSchedule::multiplier(int64_t step) const {
  if (type == "constant") {
    if (step < warmup_steps) return double(step) / double(std::max<int64_t>(1, warmup_steps));
    return 1.0;
  }
  VERL_CHECK(type == "cosine", "lr schedule '{}' is not supported (constant, cosine)", type);
  if (step < warmup_steps) {
    return min_lr_ratio +
           (1.0 - min_lr_ratio) * double(step) / double(std::max<int64_t>(1, warmup_steps));
  }
  double progress =
      double(step - warmup_steps) / double(std::max<int64_t>(1, total_steps - warmup_steps));
  double x = std::cos(M_PI * num_cycles * 2.0 * progress);
  return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + x);
}

}  // namespace verl::optim
