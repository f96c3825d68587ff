// GPT-2's byte-level alphabet: every byte is shown as a printable code point so that BPE can work
// on text. Printable Latin-1 bytes map to themselves; the other 68 bytes (controls, space, DEL,
// NBSP, soft hyphen) map to U+0100 onwards in byte order (the `bytes_to_unicode` table of GPT-2).
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace verl::tokenizer {

class ByteLevelAlphabet {
 public:
  static const ByteLevelAlphabet& get() {
    static const ByteLevelAlphabet table;
    return table;
  }
  uint32_t char_of(uint8_t byte) const { return char_of_[byte]; }
  // The byte shown by code point cp, or -1 if cp is not in the alphabet.
  int byte_of(uint32_t cp) const { return cp < byte_of_.size() ? byte_of_[cp] : -1; }
  // The UTF-8 encoding of char_of(byte), precomputed for speed.
  const std::string& utf8_of(uint8_t byte) const { return utf8_of_[byte]; }

 private:
  ByteLevelAlphabet() {
    byte_of_.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      char_of_[b] = printable ? static_cast<uint32_t>(b) : next++;
      byte_of_[char_of_[b]] = b;
      std::string& s = utf8_of_[b];
      const uint32_t cp = char_of_[b];
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
    }
  }
  std::array<uint32_t, 256> char_of_{};
  std::array<int, 324> byte_of_{};  // the alphabet's code points are all below 256 + 68
  std::array<std::string, 256> utf8_of_;
};

}  // namespace verl::tokenizer
