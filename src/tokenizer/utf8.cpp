// UTF-8 validation and conversion (see utf8.h). The ranges of valid second bytes follow the
// Unicode standard's table 3-7 (well-formed UTF-8 byte sequences).
#include "tokenizer/utf8.h"

namespace verl::tokenizer {

namespace {

// Expected length of a sequence from its lead byte, and the valid range of its second byte.
struct Lead {
  uint8_t len, lo, hi;
};

Lead lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};  // excludes surrogates
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // up to U+10FFFF
  return {0, 0, 0};
}

// Number of bytes from pos that belong to a (possibly truncated) valid prefix of a sequence;
// `complete` tells whether the whole sequence is there.
size_t valid_prefix(std::string_view s, size_t pos, bool& complete) {
  const Lead l = lead_info(static_cast<uint8_t>(s[pos]));
  complete = false;
  if (l.len == 0) return 0;
  if (l.len == 1) {
    complete = true;
    return 1;
  }
  size_t n = 1;
  for (; n < l.len; ++n) {
    if (pos + n >= s.size()) return n;
    const uint8_t c = static_cast<uint8_t>(s[pos + n]);
    const bool ok = n == 1 ? (c >= l.lo && c <= l.hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) return n;
  }
  complete = true;
  return n;
}

}  // namespace

size_t utf8_sequence_length(std::string_view s, size_t pos) {
  bool complete = false;
  const size_t n = valid_prefix(s, pos, complete);
  return complete ? n : 0;
}

size_t find_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // Fast path over ASCII, eight bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= s.size()) break;
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = utf8_sequence_length(s, i);
    if (n == 0) return i;
    i += n;
  }
  return kUtf8Valid;
}

uint32_t next_code_point(std::string_view s, size_t& pos) {
  const uint8_t b = static_cast<uint8_t>(s[pos]);
  if (b < 0x80) {
    ++pos;
    return b;
  }
  if (b < 0xE0) {
    const uint32_t cp = ((b & 0x1Fu) << 6) | (static_cast<uint8_t>(s[pos + 1]) & 0x3Fu);
    pos += 2;
    return cp;
  }
  if (b < 0xF0) {
    const uint32_t cp = ((b & 0x0Fu) << 12) | ((static_cast<uint8_t>(s[pos + 1]) & 0x3Fu) << 6) |
                        (static_cast<uint8_t>(s[pos + 2]) & 0x3Fu);
    pos += 3;
    return cp;
  }
  const uint32_t cp = ((b & 0x07u) << 18) | ((static_cast<uint8_t>(s[pos + 1]) & 0x3Fu) << 12) |
                      ((static_cast<uint8_t>(s[pos + 2]) & 0x3Fu) << 6) |
                      (static_cast<uint8_t>(s[pos + 3]) & 0x3Fu);
  pos += 4;
  return cp;
}

uint32_t prev_code_point(std::string_view s, size_t& pos) {
  size_t start = pos - 1;
  while (start > 0 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
  size_t p = start;
  const uint32_t cp = next_code_point(s, p);
  pos = start;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t count_code_points(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  return n;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    bool complete = false;
    const size_t n = valid_prefix(bytes, i, complete);
    if (complete) {
      out.append(bytes.data() + i, n);
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD for the maximal invalid subpart
      i += n == 0 ? 1 : n;
    }
  }
  return out;
}

size_t incomplete_utf8_suffix(std::string_view s) {
  // A sequence is at most 4 bytes, so only the last 3 bytes can start an unfinished one.
  const size_t first = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t start = first; start < s.size(); ++start) {
    const uint8_t b = static_cast<uint8_t>(s[start]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: not a start
    bool complete = false;
    const size_t n = valid_prefix(s, start, complete);
    if (!complete && n > 0 && start + n == s.size()) return n;
  }
  return 0;
}

}  // namespace verl::tokenizer
