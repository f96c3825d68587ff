// Element types and host-side conversions between fp32 and the 16-bit formats.
// bf16 conversion rounds to nearest even (as torch does); NaN stays NaN.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace verl {

enum class DType : uint8_t { F32, BF16, F16, I32, I64, U8 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);  // safetensors spelling: "F32", "BF16", ...
// Parses the safetensors spelling; returns false for types we do not handle.
bool dtype_from_name(std::string_view s, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Converts n elements of type `src_type` at `src` into fp32 at `dst`.
void convert_to_f32(float* dst, const void* src, DType src_type, size_t n);
// Converts n fp32 elements into `dst_type` at `dst`.
void convert_from_f32(void* dst, DType dst_type, const float* src, size_t n);

}  // namespace verl
