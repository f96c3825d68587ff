#include "trainer/optimizer.h"

#include <algorithm>
#include <cmath>

#include "ops/cpu/ops.h"

namespace verl::trainer {

AdamW::AdamW(int64_t n, AdamWConfig cfg) : cfg_(cfg) {
  s_.exp_avg.assign(static_cast<size_t>(n), 0.0f);
  s_.exp_avg_sq.assign(static_cast<size_t>(n), 0.0f);
}

double AdamW::step(float* params, const float* grads, float lr) {
  const int64_t n = static_cast<int64_t>(s_.exp_avg.size());
  double norm = std::sqrt(ops::cpu::sum_squares(grads, n));
  if (!std::isfinite(norm)) return norm;
  // clip_grad_norm_: scale = max_norm / (norm + 1e-6), applied only when it is below one.
  float scale = 1.0f;
  if (cfg_.grad_clip > 0) scale = static_cast<float>(std::min(1.0, cfg_.grad_clip / (norm + 1e-6)));
  ++s_.step;
  ops::cpu::adamw_step(params, grads, s_.exp_avg.data(), s_.exp_avg_sq.data(), n, lr, cfg_.beta1, cfg_.beta2,
                       cfg_.eps, cfg_.weight_decay, s_.step, scale);
  return norm;
}

}  // namespace verl::trainer
