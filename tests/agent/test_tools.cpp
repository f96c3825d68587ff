// The agent loop's tools and parser: Hermes tool calls as Qwen writes them, the schema check,
// verl's GSM8K tool text and rewards, the calculator, the tool config YAML (verl's GSM8K one
// loads, a Python class is refused by name), and hostile command tools: each a clear per-call
// error, none leaving a process behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "../common/test_util.h"
#include "agent/tool_agent.h"
#include "agent/tool_parser.h"
#include "agent/tools.h"
#include "core/signals.h"

namespace verl::agent {
namespace {

const std::string kFixtures = std::string(VERL_SOURCE_DIR) + "/tests/fixtures/";

nlohmann::json schema(const std::string& name, nlohmann::json params) {
  return {{"type", "function"},
          {"function", {{"name", name}, {"description", "d"}, {"parameters", std::move(params)}}}};
}

nlohmann::json answer_params() {
  return {{"type", "object"},
          {"properties", {{"answer", {{"type", "string"}}}}},
          {"required", {"answer"}}};
}

TEST(Hermes, CallsAndContentAsQwenWritesThem) {
  const ParsedTurn t = parse_hermes(
      "Let me check.\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expression\": "
      "\"2*3\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": "
      "1}\"}\n</tool_call><|im_end|>");
  ASSERT_EQ(t.calls.size(), 2u);
  EXPECT_EQ(t.calls[0].name, "calc");
  EXPECT_EQ(t.calls[0].arguments, nlohmann::json({{"expression", "2*3"}}));
  EXPECT_EQ(t.calls[0].error, "");
  EXPECT_EQ(t.calls[1].arguments, nlohmann::json({{"x", 1}}));  // a JSON string read as the object
  EXPECT_EQ(t.content, "Let me check.\n\n<|im_end|>");
}

TEST(Hermes, BadCallsBecomeErrorsAndUnclosedTagsNoCalls) {
  const ParsedTurn t = parse_hermes(
      "<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call><tool_call>{\"arguments\": "
      "{}}</tool_call><tool_call>{\"name\": \"g\", \"arguments\": [1]}</tool_call>");
  ASSERT_EQ(t.calls.size(), 3u);
  EXPECT_NE(t.calls[0].error.find("not valid JSON"), std::string::npos);
  EXPECT_NE(t.calls[1].error.find("no string \"name\""), std::string::npos);
  EXPECT_NE(t.calls[2].error.find("not a JSON object"), std::string::npos);
  EXPECT_TRUE(parse_hermes("<tool_call>{\"name\": \"f\"}").calls.empty());
  EXPECT_TRUE(parse_hermes("no calls").calls.empty());
  EXPECT_NE(test::error_of([] { check_tool_format("llama3_json"); }).find("hermes"),
            std::string::npos);
}

TEST(Tools, ArgumentsAreCheckedAgainstTheSchema) {
  Gsm8kTool tool("verl.tools.gsm8k_tool.Gsm8kTool", schema("calc_gsm8k_reward", answer_params()),
                 "t");
  EXPECT_EQ(tool.check_arguments({{"answer", "3"}}), "");
  EXPECT_NE(tool.check_arguments({{"answer", 3}}).find("must be of type string"),
            std::string::npos);
  EXPECT_NE(tool.check_arguments(nlohmann::json::object()).find("'answer' is missing"),
            std::string::npos);
  EXPECT_NE(tool.check_arguments(nlohmann::json::array()).find("JSON object"), std::string::npos);
}

TEST(Tools, Gsm8kToolAsVerls) {
  Gsm8kTool tool("verl.tools.gsm8k_tool.Gsm8kTool", schema("calc_gsm8k_reward", answer_params()),
                 "t");
  const nlohmann::json kw = {{"create_kwargs", {{"ground_truth", "72"}}}};
  ToolResponse r = tool.call({{"answer", "72"}}, kw);
  EXPECT_EQ(r.text, "Current parsed answer='72' reward=1.0");
  EXPECT_EQ(r.reward, 0.0);
  r = tool.call({{"answer", "#### 71"}}, kw);
  EXPECT_EQ(r.text, "Current parsed answer='#### 71' reward=0.0");
  EXPECT_EQ(r.reward, -0.05);
  EXPECT_FALSE(r.error);
}

TEST(Tools, Calculator) {
  EXPECT_EQ(evaluate_expression("12*(3+4) - 10/4"), 81.5);
  EXPECT_EQ(format_number(evaluate_expression("48271 * 9377")), "452637167");
  EXPECT_EQ(format_number(evaluate_expression("-(2+3)*-2")), "10");
  CalculatorTool calc("verl_cpp.calculator", schema("calculator", nlohmann::json::object()), "t");
  EXPECT_EQ(calc.call({{"expression", "1,234 + 1"}}, {}).text, "1235");
  const ToolResponse bad = calc.call({{"expression", "2 +"}}, {});
  EXPECT_TRUE(bad.error);
  EXPECT_EQ(bad.text, "Error: the expression ends where a number was expected");
  EXPECT_EQ(calc.call({{"expression", "1/0"}}, {}).text, "Error: division by zero");
  EXPECT_EQ(calc.call({{"expression", "(1"}}, {}).text, "Error: a '(' is not closed");
}

TEST(ToolConfig, VerlsGsm8kToolConfigLoadsAndPythonClassesAreRefused) {
  const Toolbox box =
      Toolbox::load(kFixtures + "verl_scripts/multiturn/config/tool_config/gsm8k_tool_config.yaml");
  ASSERT_EQ(box.tools().size(), 1u);
  EXPECT_EQ(box.tools()[0]->name(), "calc_gsm8k_reward");
  EXPECT_NE(dynamic_cast<Gsm8kTool*>(box.find("calc_gsm8k_reward")), nullptr);
  EXPECT_EQ(box.schemas()[0]["function"]["parameters"]["required"][0], "answer");

  const nlohmann::json py = {{"tools",
                              {{{"class_name", "verl.tools.search_tool.SearchTool"},
                                {"config", {{"retrieval_service_url", "http://x"}}},
                                {"tool_schema", schema("search", nlohmann::json::object())}}}}};
  const std::string msg = test::error_of([&] { Toolbox::from_json(py, "cfg.yaml"); });
  EXPECT_NE(msg.find("cfg.yaml: tools[0]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'verl.tools.search_tool.SearchTool' is a Python tool class"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("verl_cpp.command"), std::string::npos) << msg;
  const nlohmann::json no_cmd = {{"tools",
                                  {{{"class_name", "verl_cpp.command"},
                                    {"tool_schema", schema("t", nlohmann::json::object())}}}}};
  EXPECT_NE(test::error_of([&] { Toolbox::from_json(no_cmd, "c"); }).find("config.command"),
            std::string::npos);
}

// A process id is gone (or a zombie nobody waits for) within 2 s.
bool process_gone(pid_t pid) {
  for (int i = 0; i < 200; ++i) {
    if (kill(pid, 0) != 0) return true;
    std::ifstream st("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(st, line);
    const size_t close = line.rfind(')');
    if (close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z')
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

pid_t read_pid(const std::string& path) {
  std::ifstream f(path);
  pid_t pid = -1;
  f >> pid;
  return pid;
}

class CommandTools : public ::testing::Test {
 protected:
  std::unique_ptr<CommandTool> tool(const std::string& command, double timeout_s = 5.0) {
    const nlohmann::json cfg = {{"command", command},
                                {"timeout_s", timeout_s},
                                {"max_output_bytes", 65536},
                                {"cpu_seconds", 5},
                                {"memory_mb", 512}};
    return std::make_unique<CommandTool>("verl_cpp.command", schema("t", nlohmann::json::object()),
                                         cfg, "test");
  }
  test::TempDir dir_{"agent_tools"};
};

TEST_F(CommandTools, AnswersAndSeesTheRequest) {
  // The program echoes the request it read back as the text.
  auto t = tool(
      "read line; printf '{\"text\": %s, \"reward\": 0.5}' \"$(printf '%s' \"$line\" | "
      "sed 's/\\\\/\\\\\\\\/g; s/\"/\\\\\"/g; s/^/\"/; s/$/\"/')\"");
  const ToolResponse r = t->call({{"x", 1}}, {{"k", "v"}});
  ASSERT_FALSE(r.error) << r.text;
  EXPECT_EQ(
      nlohmann::json::parse(r.text),
      nlohmann::json({{"name", "t"}, {"arguments", {{"x", 1}}}, {"tools_kwargs", {{"k", "v"}}}}));
  EXPECT_EQ(r.reward, 0.5);
}

TEST_F(CommandTools, HostileProgramsAreClearPerCallErrors) {
  struct Case {
    std::string command, expect;
    double timeout_s = 5.0;
  };
  const std::vector<Case> cases = {
      {"echo 'this is not json'", "not a JSON object: 'this is not json'"},
      {"sleep 30", "no answer within 0.5 s (killed)", 0.5},
      {"kill -SEGV $$", "killed by signal 11"},
      {"echo oops >&2; exit 3", "exited with status 3 (stderr: oops)"},
      {"head -c 100000000 /dev/zero", "printed more than 65536 bytes (killed)"},
      {"echo '{\"error\": \"no such city\"}'", "Error executing tool 't': no such city"},
      {"echo '{\"txt\": 1}'", "without a string \"text\""},
      {"while :; do :; done", "no answer within 0.7 s", 0.7},
  };
  for (const Case& c : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    const ToolResponse r = tool(c.command, c.timeout_s)->call(nlohmann::json::object(), {});
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(r.error) << c.command;
    EXPECT_NE(r.text.find(c.expect), std::string::npos) << c.command << " -> " << r.text;
    EXPECT_LT(s, 4.0) << c.command;
  }
}

TEST_F(CommandTools, ChildrenForkedInTheBackgroundDieWithTheCall) {
  const std::string pidfile = dir_.str() + "/child.pid";
  auto t = tool("sleep 1000 & echo $! > " + pidfile + "; echo '{\"text\": \"done\"}'");
  const auto t0 = std::chrono::steady_clock::now();
  const ToolResponse r = t->call(nlohmann::json::object(), {});
  EXPECT_FALSE(r.error) << r.text;
  EXPECT_EQ(r.text, "done");
  // The background child held stdout open: the call did not wait for it.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  const pid_t child = read_pid(pidfile);
  ASSERT_GT(child, 0);
  EXPECT_TRUE(process_gone(child));
}

// A run ended by SIGTERM or SIGINT takes its running tool programs with it.
TEST_F(CommandTools, ToolProcessesDieWithTheRunOnSigtermAndSigint) {
  for (int sig : {SIGTERM, SIGINT}) {
    const std::string pidfile = dir_.str() + "/tool" + std::to_string(sig) + ".pid";
    const pid_t run = fork();
    ASSERT_GE(run, 0);
    if (run == 0) {
      install_stop_handlers();
      auto t = tool("echo $$ > " + pidfile + "; sleep 1000", 100);
      t->call(nlohmann::json::object(), {});
      _exit(0);
    }
    pid_t tool_pid = -1;
    for (int i = 0; i < 500 && tool_pid <= 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      tool_pid = read_pid(pidfile);
    }
    ASSERT_GT(tool_pid, 0);
    kill(run, sig);
    int status = 0;
    waitpid(run, &status, 0);
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << status;
    EXPECT_TRUE(process_gone(tool_pid)) << "signal " << sig;
  }
}

TEST(ToolResponse, TruncatedAsVerlCutsThem) {
  EXPECT_EQ(truncate_tool_response("abcdefghij", 4, "left"), "(truncated)...ghij");
  EXPECT_EQ(truncate_tool_response("abcdefghij", 4, "right"), "abcd...(truncated)");
  EXPECT_EQ(truncate_tool_response("abcdefghij", 4, "middle"), "ab...(truncated)...ij");
  EXPECT_EQ(truncate_tool_response("abcd", 4, "middle"), "abcd");
  // Code points, not bytes.
  EXPECT_EQ(truncate_tool_response("ééééé", 2, "right"), "éé...(truncated)");
}

}  // namespace
}  // namespace verl::agent
