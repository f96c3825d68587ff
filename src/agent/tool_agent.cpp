// ToolAgentLoop: the turn logic of verl's ToolAgentLoop (turn limits, tool-call extraction, tool
// errors as messages the model reads, response truncation) with the calls run on worker threads,
// and the tool turn's tokens taken from the chat template's own rendering so that the trajectory
// equals the template's rendering of the same conversation.
#include "agent/tool_agent.h"

#include <chrono>

#include "agent/tool_parser.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace verl::agent {
namespace {

// Byte offset of the code point `k` of `s` (s.size() past the end).
size_t utf8_offset(const std::string& s, int64_t k) {
  size_t i = 0;
  for (int64_t c = 0; c < k && i < s.size(); ++c) {
    ++i;
    while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
  }
  return i;
}

int64_t utf8_length(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

constexpr const char* kMark = "\x1fverl.cpp-assistant\x1f";

}  // namespace

std::string truncate_tool_response(const std::string& text, int64_t max_chars,
                                   const std::string& side) {
  const int64_t len = utf8_length(text);
  if (len <= max_chars) return text;
  if (side == "left") return "(truncated)..." + text.substr(utf8_offset(text, len - max_chars));
  if (side == "right") return text.substr(0, utf8_offset(text, max_chars)) + "...(truncated)";
  const int64_t half = max_chars / 2;
  return text.substr(0, utf8_offset(text, half)) + "...(truncated)..." +
         text.substr(utf8_offset(text, len - half));
}

ToolAgentLoop::ToolAgentLoop(const Toolbox& tools, const tokenizer::Tokenizer& tok,
                             MultiTurnConfig cfg, nlohmann::ordered_json chat_kwargs)
    : tools_(tools), tok_(tok), cfg_(std::move(cfg)), chat_kwargs_(std::move(chat_kwargs)) {
  const std::string k = "actor_rollout_ref.rollout.multi_turn.";
  VERL_CHECK(cfg_.max_parallel_calls >= 1, "{}max_parallel_calls must be >= 1, got {}", k,
             cfg_.max_parallel_calls);
  VERL_CHECK(cfg_.max_tool_response_length >= 1, "{}max_tool_response_length must be >= 1, got {}",
             k, cfg_.max_tool_response_length);
  VERL_CHECK(cfg_.tool_response_truncate_side == "left" ||
                 cfg_.tool_response_truncate_side == "middle" ||
                 cfg_.tool_response_truncate_side == "right",
             "{}tool_response_truncate_side must be left, middle or right, got '{}'", k,
             cfg_.tool_response_truncate_side);
  VERL_CHECK(cfg_.max_assistant_turns >= 0 && cfg_.max_user_turns >= 0,
             "{}max_assistant_turns and max_user_turns must be >= 1 or null", k);
  VERL_CHECK(tok_.has_chat_template(),
             "multi_turn.enable: the tokenizer has no chat template to render tool turns with");
  if (!chat_kwargs_.is_object()) chat_kwargs_ = nlohmann::ordered_json::object();
  if (!tools_.empty()) chat_kwargs_["tools"] = tools_.schemas();
  const int64_t threads = std::max<int64_t>(1, cfg_.num_workers);
  for (int64_t i = 0; i < threads; ++i) threads_.emplace_back([this] { worker(); });
  // A template that cannot render a tool turn after an assistant turn fails here, at start.
  render_tool_turn(nlohmann::ordered_json::array({{{"role", "tool"}, {"content", "x"}}}),
                   tok_.eos_token_id());
}

ToolAgentLoop::~ToolAgentLoop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    jobs_.clear();
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ToolAgentLoop::begin(std::vector<AgentPrompt> prompts, int32_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  VERL_CHECK(in_flight_ == 0, "agent loop: begin() while {} tool calls are still running",
             in_flight_);
  prompts_ = std::move(prompts);
  n_ = n;
  infos_.assign(prompts_.size() * static_cast<size_t>(n), TrajectoryInfo{});
  done_.clear();
  stats_.clear();
}

void ToolAgentLoop::worker() {
  while (true) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (stopping_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

std::vector<int32_t> ToolAgentLoop::render_tool_turn(const nlohmann::ordered_json& tool_messages,
                                                     int32_t last_token) const {
  // Rendered after an assistant turn whose content is a marker, the text past the marker is
  // what follows the model's content: the template's end of that turn, the tool turn and the
  // generation prompt. (Not a difference of two renderings: Qwen3's template renders the last
  // assistant turn differently from an earlier one.)
  nlohmann::ordered_json convo = nlohmann::ordered_json::array(
      {{{"role", "user"}, {"content", "?"}}, {{"role", "assistant"}, {"content", kMark}}});
  for (const auto& m : tool_messages) convo.push_back(m);
  const std::string text = tok_.apply_chat_template(convo, true, chat_kwargs_);
  const size_t mark = text.rfind(kMark);
  VERL_CHECK(mark != std::string::npos,
             "multi_turn: the chat template does not render an assistant turn's content as "
             "written, so a tool response cannot be appended token-in/token-out");
  std::string rest = text.substr(mark + std::string_view(kMark).size());
  // The model's stop token wrote the first part of the turn's end (Qwen: "<|im_end|>").
  const std::string stop = tok_.decode({last_token}, false);
  if (!stop.empty() && rest.compare(0, stop.size(), stop) == 0) rest.erase(0, stop.size());
  return tok_.encode(rest);
}

std::string ToolAgentLoop::run_call(const ParsedCall& call, const nlohmann::json& tools_kwargs,
                                    TrajectoryInfo& info) {
  using Clock = std::chrono::steady_clock;
  ++info.tool_calls;
  Tool* tool = call.error.empty() ? tools_.find(call.name) : nullptr;
  ToolResponse r;
  double seconds = 0;
  if (!call.error.empty()) {
    r = {fmt::format("Error: {}", call.error), 0.0, true};
  } else if (tool == nullptr) {
    std::string names;
    for (const auto& nm : tools_.names()) names += (names.empty() ? "'" : ", '") + nm + "'";
    r = {fmt::format("Unknown function '{}'. Available tools: [{}]", call.name, names), 0.0, true};
  } else if (std::string why = tool->check_arguments(call.arguments); !why.empty()) {
    r = {fmt::format("Invalid arguments for '{}': {}", call.name, why), 0.0, true};
  } else {
    const nlohmann::json kw = tools_kwargs.is_object() && tools_kwargs.contains(call.name)
                                  ? tools_kwargs[call.name]
                                  : nlohmann::json::object();
    const auto t0 = Clock::now();
    try {
      r = tool->call(call.arguments, kw);
    } catch (const std::exception& e) {
      r = {fmt::format("Error executing tool '{}': {}", call.name, e.what()), 0.0, true};
    }
    seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  info.tool_errors += r.error ? 1 : 0;
  info.tool_reward += r.reward;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ToolStats& s = stats_[tool ? call.name : "<invalid>"];
    ++s.calls;
    s.errors += r.error ? 1 : 0;
    s.seconds += seconds;
    s.max_seconds = std::max(s.max_seconds, seconds);
  }
  return truncate_tool_response(r.text, cfg_.max_tool_response_length,
                                cfg_.tool_response_truncate_side);
}

void ToolAgentLoop::turn_ended(int64_t request, int32_t sample, std::span<const int32_t> output) {
  VERL_CHECK(
      request >= 0 && request < static_cast<int64_t>(prompts_.size()) && sample >= 0 && sample < n_,
      "agent loop: a turn of request {} sample {}, outside begin()'s {} x {}", request, sample,
      prompts_.size(), n_);
  TrajectoryInfo& info = infos_[static_cast<size_t>(request * n_ + sample)];
  ++info.assistant_turns;
  info.reported = static_cast<int64_t>(output.size());
  rollout::Continuation end{request, sample, {}, true};
  auto finish = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    done_.push_back(end);
  };
  const AgentPrompt& p = prompts_[static_cast<size_t>(request)];
  if (!p.tool_agent ||
      (cfg_.max_assistant_turns > 0 && info.assistant_turns >= cfg_.max_assistant_turns) ||
      (cfg_.max_user_turns > 0 && info.user_turns >= cfg_.max_user_turns))
    return finish();
  const std::vector<int32_t> turn(output.begin() + info.turn_start, output.end());
  ParsedTurn parsed = parse_hermes(tok_.decode(turn, false));
  if (parsed.calls.empty()) return finish();
  if (static_cast<int64_t>(parsed.calls.size()) > cfg_.max_parallel_calls)
    parsed.calls.resize(static_cast<size_t>(cfg_.max_parallel_calls));
  const int32_t last = output.back();
  const int64_t out_len = static_cast<int64_t>(output.size());
  std::lock_guard<std::mutex> lock(mu_);
  ++in_flight_;
  jobs_.push_back([this, request, sample, last, out_len, calls = std::move(parsed.calls)] {
    TrajectoryInfo& info = infos_[static_cast<size_t>(request * n_ + sample)];
    rollout::Continuation k{request, sample, {}, false};
    try {
      nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
      for (const ParsedCall& c : calls)
        msgs.push_back(
            {{"role", "tool"},
             {"content", run_call(c, prompts_[static_cast<size_t>(request)].tools_kwargs, info)}});
      k.append = render_tool_turn(msgs, last);
      ++info.user_turns;
      info.turn_start = out_len + static_cast<int64_t>(k.append.size());
    } catch (const std::exception& e) {
      // Rendering cannot fail after the check at start; if it does, the trajectory ends here.
      k.end = true;
      k.append.clear();
    }
    std::lock_guard<std::mutex> lock(mu_);
    done_.push_back(std::move(k));
    --in_flight_;
    done_cv_.notify_all();
  });
  work_cv_.notify_one();
}

void ToolAgentLoop::trajectory_done(int64_t request, int32_t sample, int64_t output_len) {
  TrajectoryInfo& info = infos_[static_cast<size_t>(request * n_ + sample)];
  if (output_len > info.reported) ++info.assistant_turns;
  info.reported = output_len;
}

void ToolAgentLoop::poll(std::vector<rollout::Continuation>& out, bool wait) {
  std::unique_lock<std::mutex> lock(mu_);
  if (wait) {
    VERL_CHECK(!done_.empty() || in_flight_ > 0,
               "agent loop: the engine waits for a continuation but no tool call is running");
    done_cv_.wait(lock, [&] { return !done_.empty(); });
  }
  for (auto& k : done_) out.push_back(std::move(k));
  done_.clear();
}

}  // namespace verl::agent
