#include "core/fault.h"

#include <csignal>
#include <cstdlib>
#include <string>

namespace verl {

void fault_point(const char* point, int64_t step) {
  static const char* spec = std::getenv("VERL_FAULT_INJECT");
  if (!spec) return;
  if (std::string(spec) == std::string(point) + ":" + std::to_string(step)) std::raise(SIGKILL);
}

}  // namespace verl
