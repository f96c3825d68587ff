// Tools of the agent loop, configured as verl's tool config YAML (actor_rollout_ref.rollout.
// multi_turn.tool_config_path): `tools:` entries of class_name, config and tool_schema (an OpenAI
// function schema). verl's classes are Python; verl.cpp runs its own under their names:
//   verl_cpp.command                  a user program: one JSON request on stdin
//                                     {"name", "arguments", "tools_kwargs"}, one JSON reply on
//                                     stdout {"text": ..., "reward": x} or {"error": ...}
//   verl.tools.gsm8k_tool.Gsm8kTool   verl's GSM8K answer check (built in)
//   verl_cpp.calculator               + - * / ( ) over numbers (the tool demo)
// Any other class_name is refused when the file loads, naming it and these.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/subprocess.h"

namespace verl::agent {

// What a call gives back: the text the model sees as the tool's turn, the tool's own reward
// (verl's tool_reward), and whether the call failed (the text then says why).
struct ToolResponse {
  std::string text;
  double reward = 0.0;
  bool error = false;
};

class Tool {
 public:
  // `schema`: {"type": "function", "function": {"name", "description", "parameters"}}.
  Tool(std::string class_name, nlohmann::json schema, const std::string& where);
  virtual ~Tool() = default;

  const std::string& name() const { return name_; }
  const std::string& class_name() const { return class_name_; }
  const nlohmann::json& schema() const { return schema_; }

  // Why `args` break the schema's parameters ("" when they fit): an object, every required
  // property present, each property of its declared type (and in its enum when one is given),
  // none undeclared when additionalProperties is false.
  std::string check_arguments(const nlohmann::json& args) const;

  // Runs the call; `kwargs`: the row's extra_info.tools_kwargs[name] (create_kwargs, ...).
  // Thread-safe: calls of different trajectories run at once. Failures are responses, not throws.
  virtual ToolResponse call(const nlohmann::json& args, const nlohmann::json& kwargs) = 0;

 private:
  std::string class_name_, name_;
  nlohmann::json schema_;
};

// verl_cpp.command's config: command (required), timeout_s, cpu_seconds, memory_mb,
// max_output_bytes.
class CommandTool final : public Tool {
 public:
  CommandTool(std::string class_name, nlohmann::json schema, const nlohmann::json& config,
              const std::string& where);
  ToolResponse call(const nlohmann::json& args, const nlohmann::json& kwargs) override;

 private:
  std::string command_;
  ProgramLimits limits_;
};

// verl.tools.gsm8k_tool.Gsm8kTool: "answer" scored against create_kwargs.ground_truth with the
// flexible GSM8K rule; text "Current parsed answer='..' reward=1.0", tool reward 0 for a correct
// answer and -0.05 otherwise (verl's, with a fresh instance per call as its tool agent loop makes).
class Gsm8kTool final : public Tool {
 public:
  using Tool::Tool;
  ToolResponse call(const nlohmann::json& args, const nlohmann::json& kwargs) override;
};

// verl_cpp.calculator: {"expression": "12*(3+4)"} -> "84".
class CalculatorTool final : public Tool {
 public:
  using Tool::Tool;
  ToolResponse call(const nlohmann::json& args, const nlohmann::json& kwargs) override;
};

// Evaluates + - * / and parentheses over decimal numbers; std::invalid_argument says what is
// wrong (the model reads it).
double evaluate_expression(std::string_view expr);
// The calculator's text of a value: integers exactly (up to 2^53), others with 10 digits.
std::string format_number(double v);

class Toolbox {
 public:
  Toolbox() = default;
  // Reads a verl tool config YAML; errors name the file, the entry and the key.
  static Toolbox load(const std::string& path);
  // The same from its parsed contents (`where` names it in errors).
  static Toolbox from_json(const nlohmann::json& config, const std::string& where);

  void add(std::unique_ptr<Tool> tool);
  Tool* find(const std::string& name) const;  // null when there is none
  const std::vector<std::unique_ptr<Tool>>& tools() const { return tools_; }
  std::vector<std::string> names() const;
  // The tool_schema list, as the chat template's `tools` variable.
  nlohmann::ordered_json schemas() const;
  bool empty() const { return tools_.empty(); }

 private:
  std::vector<std::unique_ptr<Tool>> tools_;
};

// The class_names verl.cpp runs, for messages.
const std::vector<std::string>& known_tool_classes();

}  // namespace verl::agent
