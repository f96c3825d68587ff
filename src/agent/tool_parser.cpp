// The Hermes tool-call parser (verl's HermesToolParser, vLLM's hermes_tool_parser): a non-greedy
// match of <tool_call>(.*?)</tool_call> over the decoded turn, each match read as JSON.
#include "agent/tool_parser.h"

#include "core/error.h"
#include "core/json_depth.h"

namespace verl::agent {

void check_tool_format(const std::string& format) {
  VERL_CHECK(format == "hermes",
             "actor_rollout_ref.rollout.multi_turn.format={}: verl.cpp reads tool calls in the "
             "hermes format only (Qwen2.5 / Qwen3 chat templates)",
             format);
}

ParsedTurn parse_hermes(std::string_view text) {
  static constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
  ParsedTurn turn;
  size_t at = 0;
  while (true) {
    const size_t open = text.find(kOpen, at);
    const size_t close = open == std::string_view::npos ? std::string_view::npos
                                                        : text.find(kClose, open + kOpen.size());
    if (close == std::string_view::npos) {
      turn.content += text.substr(at);
      break;
    }
    turn.content += text.substr(at, open - at);
    const std::string_view body = text.substr(open + kOpen.size(), close - open - kOpen.size());
    at = close + kClose.size();
    ParsedCall call;
    nlohmann::json j = json_depth_ok(body) ? nlohmann::json::parse(body, nullptr, false)
                                           : nlohmann::json(nlohmann::json::value_t::discarded);
    if (j.is_discarded()) {
      std::string head(body.substr(0, 200));
      call.error = fmt::format("the tool call is not valid JSON: {}", head);
    } else if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) {
      call.error = "the tool call has no string \"name\"";
    } else {
      call.name = j["name"].get<std::string>();
      nlohmann::json args = j.value("arguments", nlohmann::json::object());
      if (args.is_string()) {
        const std::string s = args.get<std::string>();
        nlohmann::json inner = json_depth_ok(s)
                                   ? nlohmann::json::parse(s, nullptr, false)
                                   : nlohmann::json(nlohmann::json::value_t::discarded);
        if (!inner.is_discarded()) args = inner;
      }
      if (!args.is_object()) {
        call.error = fmt::format("the arguments of '{}' are not a JSON object: {}", call.name,
                                 args.dump().substr(0, 200));
      } else {
        call.arguments = std::move(args);
      }
    }
    turn.calls.push_back(std::move(call));
  }
  return turn;
}

}  // namespace verl::agent
