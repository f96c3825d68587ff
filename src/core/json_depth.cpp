#include "core/json_depth.h"

#include "core/error.h"

namespace verl {

bool json_depth_ok(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, a quote included
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

void check_json_depth(std::string_view text, std::string_view where) {
  VERL_CHECK(json_depth_ok(text), "{}: JSON nested more than {} levels deep", where, kMaxJsonDepth);
}

}  // namespace verl
