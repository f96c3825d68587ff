#include "core/fault.h"

#include <csignal>
#include <cstdlib>
#include <string>

namespace verl {

void fault_point(const char* point, int64_t step) {
  static const char* spec = std::getenv("VERL_FAULT_INJECT");
  if (!spec) return;
  const std::string at = std::string(point) + ":" + std::to_string(step);
  if (spec == at) std::raise(SIGKILL);
  if (spec == at + ":stop") std::raise(SIGSTOP);  // a stuck rank: alive, never answering
}

}  // namespace verl
