// UTF-8 helpers shared by the tokenizer and the Jinja interpreter: validation, code-point
// iteration, lossy conversion with the same replacement rule as Rust's String::from_utf8_lossy
// (one U+FFFD per maximal invalid subpart, which is also Python's errors="replace").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace verl::tokenizer {

inline constexpr size_t kUtf8Valid = static_cast<size_t>(-1);

// Byte offset of the first invalid or truncated sequence, or kUtf8Valid.
size_t find_invalid_utf8(std::string_view s);

// Length (1..4) of the valid sequence starting at s[pos], or 0 if it is invalid or truncated.
size_t utf8_sequence_length(std::string_view s, size_t pos);

// Decodes the code point at s[pos] and advances pos. The input must be valid UTF-8.
uint32_t next_code_point(std::string_view s, size_t& pos);

// Decodes the code point that ends at s[pos - 1] and moves pos back. The input must be valid.
uint32_t prev_code_point(std::string_view s, size_t& pos);

void append_utf8(std::string& out, uint32_t cp);

// Number of code points of a valid UTF-8 string.
size_t count_code_points(std::string_view s);

// Replaces each maximal invalid subpart with U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// Number of trailing bytes (0..3) that form the valid beginning of a sequence not yet complete:
// a streaming decoder holds them back until the next bytes arrive.
size_t incomplete_utf8_suffix(std::string_view s);

}  // namespace verl::tokenizer
