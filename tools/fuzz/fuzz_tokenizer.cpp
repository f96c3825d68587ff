// libFuzzer target: a tokenizer built from arbitrary tokenizer.json text (src/tokenizer), then
// encoding and decoding a text with it. The input is "TEXT\nTOKENIZER_JSON". Malformed or
// unsupported tokenizer files must end in verl::Error; a crash, a sanitizer report, a hang or
// another exception is a bug. Build and run: tools/fuzz/run.sh tokenizer (docs/design.md#fuzzing).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nl = in.find('\n');
  if (nl == std::string_view::npos) return 0;
  const std::string_view text = in.substr(0, nl);
  nlohmann::json tj = nlohmann::json::parse(in.substr(nl + 1), nullptr, /*allow_exceptions=*/false);
  if (tj.is_discarded()) return 0;  // not JSON: the file reader's error, not the tokenizer's
  try {
    const verl::tokenizer::Tokenizer t =
        verl::tokenizer::Tokenizer::from_json(tj, nlohmann::json::object(), "tokenizer.json");
    if (verl::tokenizer::find_invalid_utf8(text) != verl::tokenizer::kUtf8Valid)
      return 0;  // encode() wants UTF-8
    const std::vector<int32_t> ids = t.encode(text);
    (void)t.decode(ids, false);
    (void)t.decode(ids, true);
  } catch (const verl::Error&) {
  }
  return 0;
}
