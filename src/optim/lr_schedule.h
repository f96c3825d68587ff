// Learning-rate schedules as verl builds them (verl/utils/torch_functional.py:
// get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup), as a multiplier of the base
// lr at a given optimizer step (0-based, the value torch's LambdaLR uses for that step).
#pragma once

#include <cstdint>
#include <string>

namespace verl::optim {

struct LrSchedule {
  std::string type = "constant";  // constant | cosine
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_ratio = 0.0;  // cosine floor
  double num_cycles = 0.5;    // cosine: 0.5 = half a cosine from 1 down to min_lr_ratio

  // warmup_steps from verl's pair of keys: lr_warmup_steps when > 0, else ratio * total.
  static int64_t resolve_warmup(int64_t lr_warmup_steps, double ratio, int64_t total);
  double multiplier(int64_t step) const;
};

}  // namespace verl::optim
