// The tool config loader, the argument check against a tool's OpenAI schema, and the three tools
// verl.cpp runs (the command tool, verl's GSM8K tool, the calculator).
#include "agent/tools.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <stdexcept>

#include "config/detail.h"
#include "core/error.h"
#include "core/json_depth.h"
#include "reward/gsm8k.h"

namespace verl::agent {
namespace {

constexpr const char* kCommand = "verl_cpp.command";
constexpr const char* kGsm8k = "verl.tools.gsm8k_tool.Gsm8kTool";
constexpr const char* kCalculator = "verl_cpp.calculator";

bool has_type(const nlohmann::json& v, const std::string& type) {
  if (type == "string") return v.is_string();
  if (type == "number") return v.is_number();
  if (type == "integer")
    return v.is_number_integer() ||
           (v.is_number_float() && std::trunc(v.get<double>()) == v.get<double>());
  if (type == "boolean") return v.is_boolean();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "null") return v.is_null();
  return true;  // a type we do not check
}

// Python's repr() of a str, as verl's f"{answer=}" prints it.
std::string py_repr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == q) {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  return out + q;
}

// Recursive descent over: expr = term (('+'|'-') term)*; term = factor (('*'|'/') factor)*;
// factor = ('+'|'-') factor | number | '(' expr ')'.
// The calculator's errors are shown to the model: plain messages, no source locations.
template <typename... Args>
void need(bool cond, fmt::format_string<Args...> f, Args&&... args) {
  if (!cond) throw std::invalid_argument(fmt::format(f, std::forward<Args>(args)...));
}

class Expr {
 public:
  explicit Expr(std::string_view s) : s_(s) {}
  double parse() {
    const double v = expr(0);
    skip();
    if (i_ != s_.size()) need(false, "unexpected '{}' at position {}", s_[i_], i_ + 1);
    return v;
  }

 private:
  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
  }
  double expr(int depth) {
    need(depth < 64, "the expression nests more than 64 levels");
    double v = term(depth);
    for (skip(); i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-'); skip()) {
      const char op = s_[i_++];
      const double r = term(depth);
      v = op == '+' ? v + r : v - r;
    }
    return v;
  }
  double term(int depth) {
    double v = factor(depth);
    for (skip(); i_ < s_.size() && (s_[i_] == '*' || s_[i_] == '/'); skip()) {
      const char op = s_[i_++];
      const double r = factor(depth);
      need(op == '*' || r != 0.0, "division by zero");
      v = op == '*' ? v * r : v / r;
    }
    return v;
  }
  double factor(int depth) {
    skip();
    need(i_ < s_.size(), "the expression ends where a number was expected");
    const char c = s_[i_];
    if (c == '+' || c == '-') {
      ++i_;
      need(depth < 64, "the expression nests more than 64 levels");
      const double v = factor(depth + 1);
      return c == '-' ? -v : v;
    }
    if (c == '(') {
      ++i_;
      const double v = expr(depth + 1);
      skip();
      need(i_ < s_.size() && s_[i_] == ')', "a '(' is not closed");
      ++i_;
      return v;
    }
    const size_t start = i_;
    while (i_ < s_.size() &&
           (std::isdigit(static_cast<unsigned char>(s_[i_])) || s_[i_] == '.' || s_[i_] == ','))
      ++i_;
    need(i_ > start, "unexpected '{}' at position {}", c, start + 1);
    std::string num;
    for (size_t k = start; k < i_; ++k)
      if (s_[k] != ',') num += s_[k];  // 1,234 as written in prose
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(num, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    need(used == num.size() && !num.empty(), "'{}' is not a number",
         std::string(s_.substr(start, i_ - start)));
    return v;
  }
  std::string_view s_;
  size_t i_ = 0;
};

std::string str_or(const nlohmann::json& cfg, const char* key, const std::string& fallback) {
  return cfg.is_object() && cfg.contains(key) && cfg[key].is_string() ? cfg[key].get<std::string>()
                                                                      : fallback;
}

}  // namespace

const std::vector<std::string>& known_tool_classes() {
  static const std::vector<std::string> k = {kCommand, kGsm8k, kCalculator};
  return k;
}

Tool::Tool(std::string class_name, nlohmann::json schema, const std::string& where)
    : class_name_(std::move(class_name)), schema_(std::move(schema)) {
  VERL_CHECK(schema_.is_object() && schema_.contains("function") && schema_["function"].is_object(),
             "{}: tool_schema must be an OpenAI function schema ({{type: function, function: "
             "{{name, description, parameters}}}})",
             where);
  const nlohmann::json& f = schema_["function"];
  VERL_CHECK(f.contains("name") && f["name"].is_string() && !f["name"].get<std::string>().empty(),
             "{}: tool_schema.function.name must be a non-empty string", where);
  name_ = f["name"].get<std::string>();
  if (f.contains("parameters"))
    VERL_CHECK(f["parameters"].is_object() || f["parameters"].is_null(),
               "{}: tool_schema.function.parameters of tool '{}' must be a JSON schema object",
               where, name_);
}

std::string Tool::check_arguments(const nlohmann::json& args) const {
  if (!args.is_object())
    return fmt::format("the arguments must be a JSON object, got {}", args.dump());
  const nlohmann::json& f = schema_["function"];
  if (!f.contains("parameters") || !f["parameters"].is_object()) return "";
  const nlohmann::json& p = f["parameters"];
  const nlohmann::json props = p.value("properties", nlohmann::json::object());
  if (p.contains("required") && p["required"].is_array()) {
    for (const auto& r : p["required"])
      if (r.is_string() && !args.contains(r.get<std::string>()))
        return fmt::format("the required argument '{}' is missing", r.get<std::string>());
  }
  for (const auto& [key, val] : args.items()) {
    if (!props.is_object() || !props.contains(key)) {
      if (p.contains("additionalProperties") && p["additionalProperties"] == false)
        return fmt::format("'{}' is not an argument of {}", key, name_);
      continue;
    }
    const nlohmann::json& spec = props[key];
    if (spec.contains("type") && spec["type"].is_string()) {
      const std::string type = spec["type"].get<std::string>();
      if (!has_type(val, type))
        return fmt::format("the argument '{}' must be of type {}, got {}", key, type, val.dump());
    }
    if (spec.contains("enum") && spec["enum"].is_array()) {
      bool found = false;
      for (const auto& e : spec["enum"]) found = found || e == val;
      if (!found)
        return fmt::format("the argument '{}' must be one of {}, got {}", key, spec["enum"].dump(),
                           val.dump());
    }
  }
  return "";
}

CommandTool::CommandTool(std::string class_name, nlohmann::json schema,
                         const nlohmann::json& config, const std::string& where)
    : Tool(std::move(class_name), std::move(schema), where) {
  command_ = str_or(config, "command", "");
  VERL_CHECK(!command_.empty(),
             "{}: tool '{}' ({}) needs config.command: the program to run (/bin/sh -c), which "
             "reads one JSON request on stdin and prints one JSON reply",
             where, name(), kCommand);
  auto num = [&](const char* key, double fallback, double lo) {
    if (!config.contains(key)) return fallback;
    VERL_CHECK(config[key].is_number() && config[key].get<double>() >= lo,
               "{}: tool '{}' config.{} must be a number >= {}, got {}", where, name(), key, lo,
               config[key].dump());
    return config[key].get<double>();
  };
  limits_.timeout_s = num("timeout_s", 30.0, 1e-3);
  limits_.cpu_seconds = static_cast<int64_t>(num("cpu_seconds", 30, 0));
  limits_.memory_mb = static_cast<int64_t>(num("memory_mb", 4096, 0));
  limits_.max_output_bytes = static_cast<int64_t>(num("max_output_bytes", 1 << 20, 1));
}

ToolResponse CommandTool::call(const nlohmann::json& args, const nlohmann::json& kwargs) {
  const nlohmann::json request = {{"name", name()}, {"arguments", args}, {"tools_kwargs", kwargs}};
  const ProgramResult r = run_program(
      command_, request.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
      limits_);
  auto fail = [&](const std::string& why) {
    std::string err = r.err;
    while (!err.empty() && (err.back() == '\n' || err.back() == ' ')) err.pop_back();
    if (err.size() > 300) err = "..." + err.substr(err.size() - 300);
    return ToolResponse{fmt::format("Error executing tool '{}': the tool program {}{}", name(), why,
                                    err.empty() ? "" : " (stderr: " + err + ")"),
                        0.0, true};
  };
  if (!r.ok) return fail(r.failure);
  std::string_view out = r.out;
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r' || out.back() == ' '))
    out.remove_suffix(1);
  if (!json_depth_ok(out)) return fail("printed JSON nested too deep");
  const nlohmann::json reply = nlohmann::json::parse(out, nullptr, false);
  std::string head(out.substr(0, 120));
  if (reply.is_discarded() || !reply.is_object())
    return fail(fmt::format("printed something that is not a JSON object: '{}{}'", head,
                            out.size() > 120 ? "..." : ""));
  if (reply.contains("error")) {
    const auto& e = reply["error"];
    return ToolResponse{fmt::format("Error executing tool '{}': {}", name(),
                                    e.is_string() ? e.get<std::string>() : e.dump()),
                        0.0, true};
  }
  if (!reply.contains("text") || !reply["text"].is_string())
    return fail(fmt::format("answered without a string \"text\": '{}'", head));
  ToolResponse res{reply["text"].get<std::string>(), 0.0, false};
  if (reply.contains("reward")) {
    if (!reply["reward"].is_number() || !std::isfinite(reply["reward"].get<double>()))
      return fail(fmt::format("answered a \"reward\" that is not a finite number: '{}'", head));
    res.reward = reply["reward"].get<double>();
  }
  return res;
}

ToolResponse Gsm8kTool::call(const nlohmann::json& args, const nlohmann::json& kwargs) {
  std::string answer;
  if (args.contains("answer"))
    answer = args["answer"].is_string() ? args["answer"].get<std::string>() : args["answer"].dump();
  std::string ground_truth;
  const nlohmann::json gt =
      kwargs.is_object() && kwargs.contains("create_kwargs") && kwargs["create_kwargs"].is_object()
          ? kwargs["create_kwargs"].value("ground_truth", nlohmann::json())
          : nlohmann::json();
  ground_truth = gt.is_string() ? gt.get<std::string>() : gt.is_null() ? "" : gt.dump();
  const std::string response = answer.rfind("#### ", 0) == 0 ? answer : "#### " + answer;
  const double reward =
      reward::gsm8k_compute_score(response, ground_truth, reward::Gsm8kMethod::Flexible, 0.0, 1.0)
          .score;
  return ToolResponse{fmt::format("Current parsed answer={} reward={}", py_repr(answer),
                                  reward > 0 ? "1.0" : "0.0"),
                      reward > 0 ? 0.0 : -0.05, false};
}

double evaluate_expression(std::string_view expr) {
  need(expr.size() <= 1000, "the expression is longer than 1000 characters");
  return Expr(expr).parse();
}

std::string format_number(double v) {
  if (std::isfinite(v) && std::trunc(v) == v && std::fabs(v) <= 9007199254740992.0)
    return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{:.10g}", v);
}

ToolResponse CalculatorTool::call(const nlohmann::json& args, const nlohmann::json&) {
  const std::string expr = args.value("expression", std::string());
  try {
    const double v = evaluate_expression(expr);
    if (!std::isfinite(v)) return {"Error: the result is not a finite number", 0.0, true};
    return {format_number(v), 0.0, false};
  } catch (const std::invalid_argument& e) {
    return {fmt::format("Error: {}", e.what()), 0.0, true};
  }
}

void Toolbox::add(std::unique_ptr<Tool> tool) {
  VERL_CHECK(find(tool->name()) == nullptr, "two tools are named '{}'", tool->name());
  tools_.push_back(std::move(tool));
}

Tool* Toolbox::find(const std::string& name) const {
  for (const auto& t : tools_)
    if (t->name() == name) return t.get();
  return nullptr;
}

std::vector<std::string> Toolbox::names() const {
  std::vector<std::string> out;
  for (const auto& t : tools_) out.push_back(t->name());
  return out;
}

nlohmann::ordered_json Toolbox::schemas() const {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& t : tools_) out.push_back(nlohmann::ordered_json::parse(t->schema().dump()));
  return out;
}

Toolbox Toolbox::from_json(const nlohmann::json& config, const std::string& where) {
  VERL_CHECK(config.is_object() && config.contains("tools") && config["tools"].is_array(),
             "{}: a tool config is a mapping with a `tools:` list (verl's format)", where);
  Toolbox box;
  const auto& list = config["tools"];
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = fmt::format("{}: tools[{}]", where, i);
    const nlohmann::json& e = list[i];
    VERL_CHECK(e.is_object() && e.contains("class_name") && e["class_name"].is_string(),
               "{}: an entry needs a string class_name", at);
    VERL_CHECK(e.contains("tool_schema"), "{}: an entry needs a tool_schema", at);
    const std::string cls = e["class_name"].get<std::string>();
    const nlohmann::json cfg = e.value("config", nlohmann::json::object());
    VERL_CHECK(cfg.is_object() || cfg.is_null(), "{}: config must be a mapping", at);
    const nlohmann::json schema = e["tool_schema"];
    std::unique_ptr<Tool> tool;
    if (cls == kCommand) {
      tool = std::make_unique<CommandTool>(cls, schema,
                                           cfg.is_null() ? nlohmann::json::object() : cfg, at);
    } else if (cls == kGsm8k) {
      tool = std::make_unique<Gsm8kTool>(cls, schema, at);
    } else if (cls == kCalculator) {
      tool = std::make_unique<CalculatorTool>(cls, schema, at);
    } else {
      VERL_FAIL(
          "{}: class_name '{}' is a Python tool class, which verl.cpp cannot run. Use class_name: "
          "{} with config.command: a program that reads one JSON request "
          "{{\"name\", \"arguments\", \"tools_kwargs\"}} on stdin and prints {{\"text\": ...}} "
          "(docs/agent.md), or a built-in: {}, {}",
          at, cls, kCommand, kGsm8k, kCalculator);
    }
    VERL_CHECK(box.find(tool->name()) == nullptr, "{}: a second tool named '{}'", at, tool->name());
    box.add(std::move(tool));
  }
  return box;
}

Toolbox Toolbox::load(const std::string& path) {
  VERL_CHECK(std::filesystem::is_regular_file(path),
             "actor_rollout_ref.rollout.multi_turn.tool_config_path: no file '{}'", path);
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    VERL_FAIL("tool config {}: not valid YAML: {}", path, e.what());
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(config::detail::generic(root).dump());
  } catch (const std::exception& e) {
    VERL_FAIL("tool config {}: {}", path, e.what());
  }
  return from_json(j, "tool config " + path);
}

}  // namespace verl::agent
