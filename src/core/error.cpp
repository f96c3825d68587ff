#include "core/error.h"

#include <cstring>

namespace verl::detail {

void throw_error(const char* file, int line, const std::string& msg) {
  // Keep only the path below src/ so messages stay short and stable across checkouts.
  const char* p = std::strstr(file, "src/");
  throw Error(fmt::format("{} [{}:{}]", msg, p ? p : file, line));
}

}  // namespace verl::detail
