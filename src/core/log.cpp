#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace verl::log {
namespace {

Level level_from_env() {
  const char* s = std::getenv("VERL_LOG_LEVEL");
  if (!s) return Level::Info;
  if (!std::strcmp(s, "debug")) return Level::Debug;
  if (!std::strcmp(s, "warn")) return Level::Warn;
  if (!std::strcmp(s, "error")) return Level::Error;
  return Level::Info;
}

std::atomic<int>& current() {
  static std::atomic<int> l{static_cast<int>(level_from_env())};
  return l;
}

}  // namespace

Level level() {
  return static_cast<Level>(current().load(std::memory_order_relaxed));
}
void set_level(Level l) {
  current().store(static_cast<int>(l));
}

void write(Level l, const std::string& msg) {
  static std::mutex mu;
  static const char* names[] = {"debug", "info", "warn", "error"};
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[verl %s] %s\n", names[static_cast<int>(l)], msg.c_str());
}

}  // namespace verl::log
