// SwiGLU activation of HF LlamaMLP on the fused gate|up projection gu[T, 2F]:
//   out[t,f] = silu(g) * u,  g = gu[t,f], u = gu[t,F+f], silu(g) = g * sigmoid(g).
// Backward, with s = sigmoid(g):  d_g += d_out * u * s * (1 + g (1 - s));  d_u += d_out * silu(g).
// Forward overwrites out[T,F]; backward accumulates into d_gu[T,2F].
#include <cmath>

#include "ops/cpu/ops.h"

namespace verl::ops::cpu {

void swiglu_forward(float* out, const float* gu, int64_t T, int64_t F) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gu + t * 2 * F;
    const float* u = g + F;
    float* o = out + t * F;
    for (int64_t f = 0; f < F; ++f) {
      const float s = 1.0f / (1.0f + std::exp(-g[f]));
      o[f] = g[f] * s * u[f];
    }
  }
}

void swiglu_backward(float* d_gu, const float* d_out, const float* gu, int64_t T, int64_t F) {
  if (d_gu == nullptr) return;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* g = gu + t * 2 * F;
    const float* u = g + F;
    const float* dout = d_out + t * F;
    float* dg = d_gu + t * 2 * F;
    float* du = dg + F;
    for (int64_t f = 0; f < F; ++f) {
      const float s = 1.0f / (1.0f + std::exp(-g[f]));
      const float silu = g[f] * s;
      dg[f] += dout[f] * u[f] * s * (1.0f + g[f] * (1.0f - s));
      du[f] += dout[f] * silu;
    }
  }
}

}  // namespace verl::ops::cpu
