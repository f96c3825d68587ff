// SFT: the loss mask covers exactly the assistant's tokens, a few steps from scratch lower the
// loss and write a loadable model, and a bad row names its file and line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../common/test_util.h"
#include "config/config.h"
#include "core/error.h"
#include "model/weights.h"
#include "trainer/sft.h"

namespace verl::trainer {
namespace {

namespace fs = std::filesystem;
const std::string kRoot = VERL_SOURCE_DIR;

TEST(Sft, LossMaskCoversTheAssistantTurnOnly) {
  tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(kRoot + "/assets/demo");
  nlohmann::json msgs = nlohmann::json::parse(
      R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 47 + 38?"},
          {"role": "assistant", "content": "47 + 38 = 85. #### 85"}])");
  SftExample ex = tokenize_chat(msgs, tok, "test");
  std::vector<int32_t> target;
  for (size_t i = 0; i < ex.tokens.size(); ++i)
    if (ex.loss_mask[i]) target.push_back(ex.tokens[i]);
  EXPECT_EQ(tok.decode(target, false), "47 + 38 = 85. #### 85<|im_end|>\n");
  // Everything before is the rendered prompt with the generation prompt.
  const size_t first =
      std::find(ex.loss_mask.begin(), ex.loss_mask.end(), 1) - ex.loss_mask.begin();
  std::vector<int32_t> prompt(ex.tokens.begin(), ex.tokens.begin() + first);
  EXPECT_EQ(prompt, tok.encode(tok.apply_chat_template(nlohmann::json(msgs.begin(), msgs.end() - 1),
                                                       true)));
}

TEST(Sft, FewStepsFromScratchLowerTheLossAndSaveAModel) {
  const test::TempDir scratch("test_sft");
  const fs::path& tmp = scratch.path();
  {  // a fresh model: the demo architecture, random weights
    model::Weights w =
        model::Weights::from_config(model::load_model_config(kRoot + "/assets/demo/model"));
    w.init_random(9, 0.02f);
    w.save((tmp / "init").string());
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      fs::copy_file(fs::path(kRoot) / "assets/demo" / f, tmp / "init" / f);
  }
  {  // 512 rows of the demo SFT set
    std::ifstream in(kRoot + "/assets/demo/sft.jsonl");
    std::ofstream out(tmp / "sft.jsonl");
    std::string line;
    for (int i = 0; i < 512 && std::getline(in, line); ++i) out << line << '\n';
  }
  config::LoadOptions lo;
  lo.defaults_path = kRoot + "/configs/sft_trainer.yaml";
  config::Config cfg = config::load_config(
      kRoot + "/configs/demo/sft.yaml",
      {"model.partial_pretrain=" + (tmp / "init").string(),
       "data.train_files=[" + (tmp / "sft.jsonl").string() + "]", "data.train_batch_size=32",
       "trainer.total_training_steps=12", "trainer.logger=[jsonl]",
       "trainer.default_local_dir=" + (tmp / "out").string()},
      lo);
  const std::string dir = run_sft(cfg);
  EXPECT_EQ(dir, (tmp / "out" / "global_step_12").string());
  std::ifstream f(tmp / "out" / "metrics.jsonl");
  std::vector<double> loss;
  std::string line;
  while (std::getline(f, line))
    loss.push_back(nlohmann::json::parse(line)["train/loss"].get<double>());
  ASSERT_EQ(loss.size(), 12u);
  EXPECT_LT(loss.back(), 0.6 * loss.front()) << loss.front() << " -> " << loss.back();
  model::Weights saved = model::Weights::load(dir);
  EXPECT_EQ(saved.layout.total, 854144);
}

TEST(Sft, BadRowNamesFileAndLine) {
  const test::TempDir scratch("test_sft_bad");
  const fs::path p = scratch / "bad.jsonl";
  std::ofstream(p)
      << R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})"
      << "\n"
      << R"({"conversation": []})"
      << "\n";
  tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(kRoot + "/assets/demo");
  const std::string msg = test::expected_error_of([&] { load_sft_examples(p.string(), tok, {}); });
  EXPECT_NE(msg.find(p.string() + ":2: missing \"messages\""), std::string::npos) << msg;
}

// A chat row's tools and enable_thinking fields and data.apply_chat_template_kwargs reach the
// template (verl's MultiTurnSFTDataset), tools printed in the row's key order as Python would;
// nested prompt/response fields follow data.prompt_dict_keys / response_dict_keys.
TEST(Sft, RowFieldsAndTemplateVariablesReachTheTemplate) {
  tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(kRoot + "/assets/demo");
  tok.set_chat_template(
      "{%- if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n{% endif %}"
      "{%- if enable_thinking is defined %}[think={{ enable_thinking }}]\n{% endif %}"
      "{%- if tag is defined %}[{{ tag }}]\n{% endif %}"
      "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
      "test template");
  const test::TempDir scratch("test_sft_fields");
  const fs::path p = scratch / "fields.jsonl";
  const std::string chat =
      R"("messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])";
  std::ofstream(p)
      << "{" << chat
      << R"(, "tools": [{"name": "add", "description": "adds", "parameters": {"type": "object"}}], "enable_thinking": false})"
      << "\n{" << chat << R"(, "enable_thinking": null})"
      << "\n{" << chat << "}\n";
  SftDataOptions opt;
  opt.template_kwargs = {{"tag", "kw"}};
  opt.enable_thinking_default = true;
  const std::vector<SftExample> ex = load_sft_examples(p.string(), tok, opt);
  ASSERT_EQ(ex.size(), 3u);
  const std::string turns = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n";
  EXPECT_EQ(tok.decode(ex[0].tokens, false),
            "<tools>{\"name\": \"add\", \"description\": \"adds\", \"parameters\": {\"type\": "
            "\"object\"}}</tools>\n"
            "[think=False]\n[kw]\n" +
                turns);
  EXPECT_EQ(tok.decode(ex[1].tokens, false), "[kw]\n" + turns);  // null: no flag, not the default
  EXPECT_EQ(tok.decode(ex[2].tokens, false), "[think=True]\n[kw]\n" + turns);
  std::vector<int32_t> target;
  for (size_t i = 0; i < ex[0].tokens.size(); ++i)
    if (ex[0].loss_mask[i]) target.push_back(ex[0].tokens[i]);
  EXPECT_EQ(tok.decode(target, false), "yo<|im_end|>\n");

  std::ofstream(p) << "{" << chat << R"(, "enable_thinking": "no"})"
                   << "\n";
  std::string msg = test::expected_error_of([&] { load_sft_examples(p.string(), tok, opt); });
  EXPECT_NE(msg.find(p.string() + ":1: \"enable_thinking\" (data.enable_thinking_key) should be "
                                  "true, false or null, got \"no\""),
            std::string::npos)
      << msg;

  SftDataOptions flat;
  flat.multiturn = false;
  flat.prompt_key = "p";
  flat.response_key = "r";
  flat.prompt_dict_keys = {"q", "text"};
  flat.response_dict_keys = {"a"};
  std::ofstream(p) << R"({"p": {"q": {"text": "hi"}}, "r": {"a": "yo"}})"
                   << "\n"
                   << R"({"p": {"q": {}}, "r": {"a": "yo"}})"
                   << "\n";
  msg = test::expected_error_of([&] { load_sft_examples(p.string(), tok, flat); });
  EXPECT_NE(msg.find(p.string() + ":2: \"p.q\" has no key \"text\" (data.prompt_dict_keys)"),
            std::string::npos)
      << msg;
  std::ofstream(p) << R"({"p": {"q": {"text": "hi"}}, "r": {"a": "yo"}})"
                   << "\n";
  const std::vector<SftExample> nested = load_sft_examples(p.string(), tok, flat);
  ASSERT_EQ(nested.size(), 1u);
  EXPECT_EQ(tok.decode(nested[0].tokens, false), turns);
}

// model.tokenizer_path: a model directory without tokenizer files trains with the tokenizer named
// there, and the checkpoint gets its files (it loads on its own).
TEST(Sft, TokenizerPathServesAModelWithoutOne) {
  const test::TempDir scratch("test_sft_tokpath");
  const fs::path& tmp = scratch.path();
  model::Weights::load(kRoot + "/assets/demo/model").save((tmp / "bare").string());
  ASSERT_FALSE(fs::exists(tmp / "bare" / "tokenizer.json"));
  config::LoadOptions lo;
  lo.defaults_path = kRoot + "/configs/sft_trainer.yaml";
  config::Config cfg = config::load_config(
      kRoot + "/configs/demo/sft.yaml",
      {"model.partial_pretrain=" + (tmp / "bare").string(),
       "model.tokenizer_path=" + kRoot + "/assets/demo",
       "data.train_files=[" + kRoot + "/assets/demo/sft.jsonl]", "data.train_batch_size=8",
       "trainer.total_training_steps=1", "trainer.logger=[jsonl]", "trainer.device=cpu",
       "trainer.default_local_dir=" + (tmp / "out").string()},
      lo);
  const std::string dir = run_sft(cfg);
  EXPECT_TRUE(fs::exists(fs::path(dir) / "tokenizer.json"));
  EXPECT_EQ(tokenizer::Tokenizer::load(dir).encode("7 + 8"),
            tokenizer::Tokenizer::load(kRoot + "/assets/demo").encode("7 + 8"));
}

}  // namespace
}  // namespace verl::trainer
