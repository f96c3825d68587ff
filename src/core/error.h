// Errors with context. VERL_CHECK(cond, fmt, args...) throws verl::Error carrying the source
// location and a message that names the offending input (file, key, tensor, row).
// Only src/cli/ turns an Error into an exit code.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace verl {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace verl

// The message is formatted with fmt; the source location is appended for debugging.
#define VERL_FAIL(...) ::verl::detail::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__))

#define VERL_CHECK(cond, ...)   \
  do {                          \
    if (!(cond)) [[unlikely]] { \
      VERL_FAIL(__VA_ARGS__);   \
    }                           \
  } while (0)
