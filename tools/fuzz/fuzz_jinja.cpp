// libFuzzer target: the chat-template interpreter (src/tokenizer/jinja*) parsing and rendering
// arbitrary template source with a conversation. A template that is malformed, outside the subset
// or over the render bounds must end in verl::Error; a crash, a sanitizer report, a hang or another
// exception is a bug. Build and run: tools/fuzz/run.sh jinja (docs/design.md#fuzzing).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/error.h"
#include "tokenizer/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json context = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "What is 47 + 38?"},
      {"role": "assistant", "content": "47 + 38 = 85. #### 85",
       "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 47, "b": 38}}}]},
      {"role": "tool", "content": "85"},
      {"role": "user", "content": [{"type": "text", "text": "and 9 * 7?"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "enable_thinking": false,
    "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"
  })");
  try {
    verl::tokenizer::jinja::Template t(std::string_view(reinterpret_cast<const char*>(data), size),
                                       "fuzz");
    (void)t.render(context);
  } catch (const verl::Error&) {
  }
  return 0;
}
