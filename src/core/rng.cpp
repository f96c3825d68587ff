#include "core/rng.h"

#include <cmath>

namespace verl {

std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t stream, uint64_t counter) {
  // Constants from the Random123 reference (Salmon et al. 2011, table 2).
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {c0, c1, c2, c3};
}

uint32_t Rng::next_u32() {
  auto block = philox4x32(seed_, stream_, offset_ >> 2);
  uint32_t v = block[offset_ & 3];
  ++offset_;
  return v;
}

double Rng::uniform_double() {
  uint64_t bits = next_u64() >> 11;
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);
}

float Rng::normal() {
  // Box-Muller on (0, 1] x [0, 1): u1 is shifted away from zero so log() stays finite.
  double u1 = 1.0 - uniform_double();
  double u2 = uniform_double();
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

uint64_t Rng::below(uint64_t n) {
  if (n <= 1) return 0;
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do {
    x = next_u64();
  } while (x >= limit);
  return x % n;
}

}  // namespace verl
