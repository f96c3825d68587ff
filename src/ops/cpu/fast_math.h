// Branch-free expf that the compiler vectorises inside `#pragma omp simd` loops (libm's expf is a
// call per element). Range reduction x = n ln2 + r with ln2 split in two for exactness, then the
// degree-6 minimax polynomial of Cephes expf for e^r on |r| <= ln2/2, scaled by 2^n through the
// exponent bits. Max relative error ~2 ulp on [-87, 88]; inputs are clamped to
// [-87.3, 88.7], so -inf gives ~1e-38, not 0.
#pragma once

#include <bit>
#include <cstdint>

namespace verl::ops::cpu::detail {

// Maps a float's bits to an int32 that orders like the float (negatives have their magnitude bits
// flipped). The map is its own inverse. Clamping in this integer domain avoids float compares,
// which GCC will not if-convert (and so not vectorise) under the default -ftrapping-math.
constexpr int32_t float_order_key(int32_t bits) {
  return bits ^ ((bits >> 31) & 0x7FFFFFFF);
}

inline float fast_exp(float x) {
  constexpr int32_t lo = float_order_key(std::bit_cast<int32_t>(-87.3f));
  constexpr int32_t hi = float_order_key(std::bit_cast<int32_t>(88.7f));
  int32_t key = float_order_key(std::bit_cast<int32_t>(x));
  key = key < lo ? lo : key;  // -inf -> -87.3
  key = key > hi ? hi : key;
  x = std::bit_cast<float>(float_order_key(key));
  // Round x / ln2 to nearest by the 1.5 * 2^23 trick (exact for |n| < 2^22).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693359375f;  // ln2 high part, exact product
  r = r - n * -2.12194440e-4f;     // ln2 low part
  const float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r2 + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

}  // namespace verl::ops::cpu::detail
