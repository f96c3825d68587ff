// verl's tool agent loop (verl/experimental/agent_loop/tool_agent_loop.py) over the engine's
// multi-turn mode: when a sample's assistant turn ends, its text is parsed for tool calls; the
// calls run on this loop's worker threads while the engine keeps decoding the other samples; the
// tool responses are rendered through the chat template (role "tool", then the assistant's
// generation prompt) and handed back as token ids, which the engine appends to the live sequence.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "agent/tool_parser.h"
#include "agent/tools.h"
#include "rollout/engine.h"

namespace verl::tokenizer {
class Tokenizer;
}

namespace verl::agent {

// actor_rollout_ref.rollout.multi_turn.* and agent.num_workers, read once by the trainer.
struct MultiTurnConfig {
  int64_t max_assistant_turns = 0;  // 0: no limit (verl's null)
  int64_t max_user_turns = 0;       // 0: no limit
  int64_t max_parallel_calls = 1;   // tool calls run per turn (the rest are dropped, as verl)
  int64_t max_tool_response_length = 256;  // characters (code points), as verl cuts them
  std::string tool_response_truncate_side = "middle";  // left | middle | right
  int64_t num_workers = 8;                             // threads running tool calls
};

// Cuts `text` to `max_chars` code points as verl does: "(truncated)..." + the end (left),
// the start + "...(truncated)" (right), or half of each around "...(truncated)..." (middle).
std::string truncate_tool_response(const std::string& text, int64_t max_chars,
                                   const std::string& side);

// One prompt of a generate() call.
struct AgentPrompt {
  bool tool_agent = true;  // the row's agent_name (or agent.default_agent_loop) is tool_agent
  nlohmann::json tools_kwargs = nlohmann::json::object();  // extra_info.tools_kwargs
};

// What one trajectory did (verl's num_turns = user turns + assistant turns + 1).
struct TrajectoryInfo {
  int32_t assistant_turns = 0, user_turns = 0;
  int32_t tool_calls = 0, tool_errors = 0;
  double tool_reward = 0.0;  // sum of the tools' own rewards (verl's tool_rewards)
  int64_t turn_start = 0;    // output index where the current assistant turn began
  int64_t reported = 0;      // output length at the last turn_ended()
  int32_t num_turns() const { return assistant_turns + user_turns + 1; }
};

struct ToolStats {
  int64_t calls = 0, errors = 0;
  double seconds = 0, max_seconds = 0;
};

class ToolAgentLoop final : public rollout::TurnHandler {
 public:
  // `chat_kwargs`: the chat template's extra variables (data.apply_chat_template_kwargs; the
  // tools' schemas are added as `tools`). The tokenizer and tools outlive the loop.
  ToolAgentLoop(const Toolbox& tools, const tokenizer::Tokenizer& tok, MultiTurnConfig cfg,
                nlohmann::ordered_json chat_kwargs);
  ~ToolAgentLoop() override;
  ToolAgentLoop(const ToolAgentLoop&) = delete;
  ToolAgentLoop& operator=(const ToolAgentLoop&) = delete;

  // Before each generate(): its prompts (request order) and samples per prompt.
  void begin(std::vector<AgentPrompt> prompts, int32_t n);

  void turn_ended(int64_t request, int32_t sample, std::span<const int32_t> output) override;
  void poll(std::vector<rollout::Continuation>& out, bool wait) override;
  // The engine finished the trajectory with `output_len` tokens: a last assistant turn cut by
  // the length limit (never reported as ended) counts as a turn, as verl counts it.
  void trajectory_done(int64_t request, int32_t sample, int64_t output_len);

  const TrajectoryInfo& info(int64_t request, int32_t sample) const {
    return infos_[static_cast<size_t>(request * n_ + sample)];
  }
  // Per tool name since begin(); unknown names and unreadable calls under "<invalid>".
  const std::map<std::string, ToolStats>& tool_stats() const { return stats_; }

  // The tokens that follow an assistant turn ended by `last_token`: the rest of the template's
  // end of that turn (what the model's stop token did not cover), the `tool_messages` rendered
  // as the chat template renders them after an assistant turn, and the next generation prompt.
  std::vector<int32_t> render_tool_turn(const nlohmann::ordered_json& tool_messages,
                                        int32_t last_token) const;

  // Runs one parsed call (the unknown-tool, bad-JSON and bad-argument errors included) and
  // returns the tool message's text after truncation; updates the trajectory's counts.
  std::string run_call(const ParsedCall& call, const nlohmann::json& tools_kwargs,
                       TrajectoryInfo& info);

 private:
  void worker();

  const Toolbox& tools_;
  const tokenizer::Tokenizer& tok_;
  MultiTurnConfig cfg_;
  nlohmann::ordered_json chat_kwargs_;
  std::vector<AgentPrompt> prompts_;
  int32_t n_ = 1;
  std::vector<TrajectoryInfo> infos_;
  std::map<std::string, ToolStats> stats_;  // under mu_

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<rollout::Continuation> done_;
  int64_t in_flight_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace verl::agent
