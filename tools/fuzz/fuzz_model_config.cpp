// libFuzzer target: an HF config.json (src/model/config.cpp) parsed into a ModelConfig and written
// back. A malformed or unsupported config must end in verl::Error; a crash, a sanitizer report, a
// hang or another exception is a bug. Build and run: tools/fuzz/run.sh model_config
// (docs/design.md#fuzzing).
#include <cstdint>
#include <string>

#include "core/error.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const verl::model::ModelConfig c = verl::model::parse_model_config(
        std::string(reinterpret_cast<const char*>(data), size), "config.json");
    (void)c;
  } catch (const verl::Error&) {
  }
  return 0;
}
