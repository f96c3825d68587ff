// Rotary position embedding, HF "rotate_half" layout, in place on x[T, nh, D]:
//   a = pos[t] * inv_freq[i] (i < D/2),  x'[i] = x[i] cos a - x[i+D/2] sin a,
//                                        x'[i+D/2] = x[i+D/2] cos a + x[i] sin a.
// The rotation is orthogonal, so the backward is the rotation by -a applied to the gradient.
// Both overwrite their buffer. The angle is formed in fp32 as HF does (pos.float() * inv_freq).
#include <cmath>
#include <vector>

#include "ops/cpu/ops.h"

namespace verl::ops::cpu {

namespace {

// sign = +1 rotates by a, -1 by -a. cos/sin are computed once per token, shared by all heads.
void rope_apply(float* x, const int32_t* pos, const float* inv_freq, int64_t T, int64_t nh,
                int64_t D, float sign) {
  const int64_t half = D / 2;
#pragma omp parallel
  {
    std::vector<float> cs(static_cast<size_t>(2 * half));
    float* cosv = cs.data();
    float* sinv = cs.data() + half;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; ++t) {
      const float p = static_cast<float>(pos[t]);
      for (int64_t i = 0; i < half; ++i) {
        const float a = p * inv_freq[i];
        cosv[i] = std::cos(a);
        sinv[i] = sign * std::sin(a);
      }
      for (int64_t h = 0; h < nh; ++h) {
        float* xr = x + (t * nh + h) * D;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = xr[i], x2 = xr[i + half];
          xr[i] = x1 * cosv[i] - x2 * sinv[i];
          xr[i + half] = x2 * cosv[i] + x1 * sinv[i];
        }
      }
    }
  }
}

}  // namespace

void rope_forward(float* x, const int32_t* pos, const float* inv_freq, int64_t T, int64_t nh,
                  int64_t D) {
  rope_apply(x, pos, inv_freq, T, nh, D, 1.0f);
}

void rope_backward(float* d_x, const int32_t* pos, const float* inv_freq, int64_t T, int64_t nh,
                   int64_t D) {
  rope_apply(d_x, pos, inv_freq, T, nh, D, -1.0f);
}

}  // namespace verl::ops::cpu
