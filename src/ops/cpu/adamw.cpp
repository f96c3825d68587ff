// One AdamW update (Loshchilov & Hutter 2019) over a flat buffer, matching torch.optim.AdamW:
//   g = grad * grad_scale;  p *= 1 - lr wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps).   step counts from 1.
// Updates param, m, v in place; grad is read only.
#include <cmath>

#include "core/error.h"
#include "ops/cpu/ops.h"

namespace verl::ops::cpu {

void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, int64_t step,
                float grad_scale) {
  VERL_CHECK(step >= 1, "adamw_step: step={} must count from 1", step);
  // Scalars in double as torch does (they are Python floats there), then used in fp32.
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step));
  const float step_size = static_cast<float>(static_cast<double>(lr) / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);
  const float one_m_b1 = 1.0f - beta1, one_m_b2 = 1.0f - beta2;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale;
    const float mi = beta1 * m[i] + one_m_b1 * g;
    const float vi = beta2 * v[i] + one_m_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    param[i] = param[i] * decay - step_size * mi / denom;
  }
}

}  // namespace verl::ops::cpu
