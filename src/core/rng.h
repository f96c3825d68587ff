// Counter-based random numbers: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy
// as 1, 2, 3", SC 2011). A draw is a pure function of (seed, stream, counter), so any consumer
// (a sampler slot, a weight initialiser, a data shuffle) can be replayed exactly from its seed.
#pragma once

#include <array>
#include <cstdint>

namespace verl {

// One Philox4x32-10 block: key = seed, counter = (counter, stream).
std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t stream, uint64_t counter);

// Maps 32 random bits to a float in [0, 1) with 24 bits of resolution.
inline float u32_to_unit_float(uint32_t x) {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

// A sequential generator over one (seed, stream). Its whole state is (seed, stream, offset),
// so saving `offset()` and restoring with `set_offset` resumes the exact sequence.
class Rng {
 public:
  Rng(uint64_t seed = 0, uint64_t stream = 0) : seed_(seed), stream_(stream) {}

  uint32_t next_u32();
  uint64_t next_u64() { return (static_cast<uint64_t>(next_u32()) << 32) | next_u32(); }
  float uniform() { return u32_to_unit_float(next_u32()); }  // [0, 1)
  double uniform_double();                                   // [0, 1), 53 bits
  float normal();                                            // standard normal (Box-Muller)
  // Uniform integer in [0, n) without modulo bias.
  uint64_t below(uint64_t n);

  uint64_t seed() const { return seed_; }
  uint64_t stream() const { return stream_; }
  uint64_t offset() const { return offset_; }  // number of u32 drawn so far
  void set_offset(uint64_t off) { offset_ = off; }

 private:
  uint64_t seed_, stream_;
  uint64_t offset_ = 0;
};

}  // namespace verl
