// libFuzzer target: a user's YAML config (src/config) loaded against the built-in schema
// (configs/ppo_trainer.yaml), then every key read back. The input is "OVERRIDE\nYAML": one
// key=value override, then the file. A malformed config, an unknown key or a value of the wrong
// type must end in verl::Error; a crash, a sanitizer report, a hang or another exception is a bug.
// Build and run: tools/fuzz/run.sh config (docs/design.md#fuzzing).
#include <cstdint>
#include <string>
#include <string_view>

#include "config/config.h"
#include "config/schema.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nl = in.find('\n');
  if (nl == std::string_view::npos) return 0;
  try {
    const verl::config::Config cfg = verl::config::load_config_string(
        std::string(in.substr(nl + 1)), "fuzz.yaml", {std::string(in.substr(0, nl))});
    for (const auto& k : verl::config::Schema::builtin()->keys()) {
      if (k.kind == verl::config::KeySpec::Kind::Leaf) (void)cfg.get<verl::config::Json>(k.path);
    }
  } catch (const verl::Error&) {
  }
  return 0;
}
