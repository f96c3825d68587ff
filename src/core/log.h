// Minimal leveled logging to stderr. Level from VERL_LOG_LEVEL (debug|info|warn|error) or
// set_level.
#pragma once

#include <fmt/format.h>

namespace verl::log {

enum class Level { Debug = 0, Info = 1, Warn = 2, Error = 3 };

Level level();
void set_level(Level l);
void write(Level l, const std::string& msg);

template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::Debug) write(Level::Debug, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::Info) write(Level::Info, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::Warn) write(Level::Warn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::Error, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace verl::log
