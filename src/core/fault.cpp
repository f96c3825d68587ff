#include "core/fault.h"

#include <csignal>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace verl {

void fault_point(const char* point, int64_t step) {
  static const char* spec = std::getenv("VERL_FAULT_INJECT");
  if (!spec) return;
  const std::string here = std::string(point) + ":" + std::to_string(step);
  if (spec == here) std::raise(SIGKILL);
  if (spec == here + ":stop") std::raise(SIGSTOP);  // a stuck rank: alive, never answering
  VERL_CHECK(spec != here + ":error", "injected fault at {} (VERL_FAULT_INJECT={})", here, spec);
}

bool fault_requested(const char* point, int64_t step, const char* mode) {
  static const char* spec = std::getenv("VERL_FAULT_INJECT");
  return spec != nullptr && spec == std::string(point) + ":" + std::to_string(step) + ":" + mode;
}

}  // namespace verl
