// Tool calls in a model's turn, as verl's tool parsers find them (multi_turn.format). Hermes, the
// format of the Qwen2.5 and Qwen3 chat templates: <tool_call>{"name": ..., "arguments": {...}}
// </tool_call>, any number of them, the rest of the text being the turn's content.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace verl::agent {

struct ParsedCall {
  std::string name;
  nlohmann::json arguments;  // an object when the call parsed
  std::string error;         // why the call could not be read ("" when it could)
};

struct ParsedTurn {
  std::string content;  // the text outside the tool-call blocks
  std::vector<ParsedCall> calls;
};

// multi_turn.format: "hermes" is the one verl.cpp reads; others are refused naming it.
void check_tool_format(const std::string& format);

// Every <tool_call>...</tool_call> block of `text`. A block that is not JSON, or has no string
// "name", or "arguments" that are not an object (a string holding a JSON object is read as that
// object, as OpenAI's API sends them) is a call with an error, which the model is told; an
// opening tag without its closing one is not a call (verl's).
ParsedTurn parse_hermes(std::string_view text);

}  // namespace verl::agent
