// Tests of RLDataset: verl-schema rows rendered with the real Qwen3 chat template, the overlong
// filter, the four truncation modes, and errors that name the file and line of a bad row.
#include <gtest/gtest.h>

#include "../common/test_util.h"
#include "config/config.h"
#include "core/error.h"
#include "data/rl_dataset.h"
#include "data_test_util.h"
#include "reward/score.h"

namespace verl::data {
namespace {

using testing::make_row;
using testing::qwen3;
using testing::ScratchDir;
using testing::to_jsonl;
using OJ = nlohmann::ordered_json;

std::vector<int32_t> reference_ids(const OJ& row, const std::string& key = "prompt") {
  return qwen3().encode(qwen3().apply_chat_template(row[key], true, OJ::object()));
}

// A message whose reference encoding is long: 40 repetitions of a short sentence.
std::string long_question() {
  std::string q;
  for (int i = 0; i < 40; ++i) q += "Natalia sold clips to 48 of her friends in April. ";
  return q;
}

TEST(RLDataset, RowsBecomeTemplatedTokenizedSamples) {
  ScratchDir dir;
  std::vector<OJ> rows = {make_row("What is 6 * 7?", "42"),
                          make_row("Add 2 and 3.", 5, "lighteval/MATH", true),
                          make_row("Übung: 10 / 4?", 2.5)};
  // A blank line in the middle: line numbers keep counting it.
  const std::string path =
      dir.write("train.jsonl", rows[0].dump() + "\n\n" + rows[1].dump() + "\n" + rows[2].dump());
  RLDataset ds = RLDataset::load({path}, qwen3(), DatasetOptions{});
  ASSERT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.stats().rows_read, 3);

  const int64_t lines[] = {1, 3, 4};
  for (int64_t i = 0; i < 3; ++i) {
    Sample s = ds.get(i);
    EXPECT_EQ(s.index, i);
    EXPECT_EQ(s.line, lines[i]);
    EXPECT_EQ(s.file, path);
    EXPECT_EQ(s.raw_prompt, qwen3().apply_chat_template(rows[i]["prompt"], true, OJ::object()));
    EXPECT_EQ(s.prompt_ids, reference_ids(rows[i]));
    EXPECT_EQ(s.full_prompt_length, static_cast<int64_t>(s.prompt_ids.size()));
    EXPECT_EQ(s.messages, rows[i]["prompt"]);
    EXPECT_EQ(s.ability, "math");
    EXPECT_EQ(s.extra_info["split"], "train");
    EXPECT_EQ(s.reward_model["style"], "rule");
  }
  // The Qwen3 template ends with the assistant header, so generation continues the answer.
  EXPECT_NE(ds.get(0).raw_prompt.find("<|im_start|>assistant\n"), std::string::npos);
  EXPECT_NE(ds.get(1).raw_prompt.find("careful math tutor"), std::string::npos);
  EXPECT_EQ(ds.get(0).data_source, "openai/gsm8k");
  EXPECT_EQ(ds.get(1).data_source, "lighteval/MATH");
  // Ground truth as text, with the JSON kept.
  EXPECT_EQ(ds.get(0).ground_truth, "42");
  EXPECT_TRUE(ds.get(0).ground_truth_json.is_string());
  EXPECT_EQ(ds.get(1).ground_truth, "5");
  EXPECT_TRUE(ds.get(1).ground_truth_json.is_number_integer());
  EXPECT_EQ(ds.get(2).ground_truth, "2.5");
  EXPECT_EQ(ds.prompt_length(1), static_cast<int64_t>(reference_ids(rows[1]).size()));
}

TEST(RLDataset, SeveralFilesAndJsonArrays) {
  ScratchDir dir;
  const std::string a = dir.write("a.jsonl", to_jsonl({make_row("q0", "0"), make_row("q1", "1")}));
  OJ arr = OJ::array({make_row("q2", "2"), make_row("q3", "3"), make_row("q4", "4")});
  const std::string b = dir.write("b.json", arr.dump(2));
  RLDataset ds = RLDataset::load({a, b}, qwen3(), DatasetOptions{});
  ASSERT_EQ(ds.size(), 5);
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(ds.get(i).ground_truth, std::to_string(i));
  EXPECT_EQ(ds.get(1).file, a);
  EXPECT_EQ(ds.get(2).file, b);
  EXPECT_EQ(ds.get(4).line, 3);  // element number inside the array
}

TEST(RLDataset, CustomPromptAndRewardKeys) {
  OJ row = make_row("What is 1 + 1?", "2");
  row["question_chat"] = row["prompt"];
  row.erase("prompt");
  row["task"] = "arith";
  DatasetOptions opts;
  opts.prompt_key = "question_chat";
  opts.reward_fn_key = "task";
  RLDataset ds = RLDataset::from_rows({row}, "mem", qwen3(), opts);
  EXPECT_EQ(ds.get(0).data_source, "arith");
  EXPECT_EQ(ds.get(0).prompt_ids, reference_ids(row, "question_chat"));
}

TEST(RLDataset, FilterOverlongPromptsDropsAndCounts) {
  std::vector<OJ> rows = {make_row("short one", "1"), make_row(long_question(), "2"),
                          make_row("short two", "3"), make_row(long_question() + "again", "4")};
  const int64_t short_len = static_cast<int64_t>(reference_ids(rows[2]).size());
  const int64_t long_len = static_cast<int64_t>(reference_ids(rows[1]).size());
  ASSERT_LT(short_len, long_len);
  DatasetOptions opts;
  opts.filter_overlong_prompts = true;
  opts.max_prompt_length = short_len;  // a prompt of exactly the limit is kept (verl: <=)
  RLDataset ds = RLDataset::from_rows(rows, "mem", qwen3(), opts);
  ASSERT_EQ(ds.size(), 2);
  EXPECT_EQ(ds.stats().rows_filtered, 2);
  EXPECT_EQ(ds.get(0).ground_truth, "1");
  EXPECT_EQ(ds.get(1).ground_truth, "3");
  EXPECT_EQ(ds.get(1).index, 1);
  EXPECT_EQ(ds.get(1).line, 3);  // provenance survives filtering

  opts.filter_overlong_prompts = false;
  opts.truncation = Truncation::Left;
  EXPECT_EQ(RLDataset::from_rows(rows, "mem", qwen3(), opts).size(), 4);
}

TEST(RLDataset, MaxSamplesKeepsTheFirstRows) {
  std::vector<OJ> rows;
  for (int i = 0; i < 6; ++i) rows.push_back(make_row("q" + std::to_string(i), std::to_string(i)));
  DatasetOptions opts;
  opts.max_samples = 4;
  RLDataset ds = RLDataset::from_rows(rows, "mem", qwen3(), opts);
  ASSERT_EQ(ds.size(), 4);
  EXPECT_EQ(ds.stats().rows_capped, 2);
  EXPECT_EQ(ds.get(3).ground_truth, "3");
}

TEST(RLDataset, TruncationModes) {
  OJ row = make_row(long_question(), "7");
  const std::vector<int32_t> full = reference_ids(row);
  const int64_t max = 25;  // odd: middle keeps 12 from the start and 13 from the end
  ASSERT_GT(static_cast<int64_t>(full.size()), max);
  auto ids_with = [&](Truncation t) {
    DatasetOptions opts;
    opts.max_prompt_length = max;
    opts.truncation = t;
    return RLDataset::from_rows({row}, "mem", qwen3(), opts).get(0);
  };
  Sample left = ids_with(Truncation::Left);
  EXPECT_EQ(left.prompt_ids, std::vector<int32_t>(full.end() - max, full.end()));
  EXPECT_EQ(left.full_prompt_length, static_cast<int64_t>(full.size()));
  EXPECT_EQ(ids_with(Truncation::Right).prompt_ids,
            std::vector<int32_t>(full.begin(), full.begin() + max));
  std::vector<int32_t> middle(full.begin(), full.begin() + 12);
  middle.insert(middle.end(), full.end() - 13, full.end());
  EXPECT_EQ(ids_with(Truncation::Middle).prompt_ids, middle);

  // error: the row loads, and asking for it names the file, the line and the length.
  DatasetOptions opts;
  opts.max_prompt_length = max;
  RLDataset ds = RLDataset::from_rows({make_row("ok", "1"), row}, "train.jsonl", qwen3(), opts);
  EXPECT_NO_THROW(ds.get(0));
  const std::string msg = test::error_of([&] { ds.get(1); });
  EXPECT_NE(msg.find("train.jsonl:2"), std::string::npos) << msg;
  EXPECT_NE(msg.find(fmt::format("prompt length {}", full.size())), std::string::npos) << msg;
  EXPECT_NE(msg.find("max_prompt_length 25"), std::string::npos) << msg;
}

TEST(RLDataset, TruncatePromptEdgeCases) {
  std::vector<int32_t> ids = {1, 2, 3, 4, 5};
  EXPECT_EQ(truncate_prompt(ids, 5, Truncation::Error), ids);
  EXPECT_EQ(truncate_prompt(ids, 4, Truncation::Middle), (std::vector<int32_t>{1, 2, 4, 5}));
  EXPECT_EQ(truncate_prompt(ids, 1, Truncation::Middle),
            (std::vector<int32_t>{5}));  // 0 head, 1 tail
  EXPECT_EQ(truncate_prompt(ids, 2, Truncation::Left), (std::vector<int32_t>{4, 5}));
  EXPECT_THROW(truncate_prompt(ids, 4, Truncation::Error), Error);
  EXPECT_EQ(parse_truncation("middle"), Truncation::Middle);
  EXPECT_NE(test::error_of([] { parse_truncation("center"); }).find("error, left, right, middle"),
            std::string::npos);
}

// Each bad row sits on line 3 (after a good row and a blank line); the error names file:3 and the
// problem.
TEST(RLDataset, BadRowsNameFileAndLine) {
  ScratchDir dir;
  const std::string good = make_row("fine", "1").dump();
  auto row_without = [](const std::string& key) {
    OJ r = make_row("q", "1");
    r.erase(key);
    return r.dump();
  };
  OJ no_gt = make_row("q", "1");
  no_gt["reward_model"].erase("ground_truth");
  OJ null_gt = make_row("q", nullptr);
  OJ prompt_string = make_row("q", "1");
  prompt_string["prompt"] = "What is 2 + 2?";
  OJ no_role = make_row("q", "1");
  no_role["prompt"][0].erase("role");
  OJ no_content = make_row("q", "1");
  no_content["prompt"][0].erase("content");
  OJ empty_prompt = make_row("q", "1");
  empty_prompt["prompt"] = OJ::array();
  OJ bad_extra = make_row("q", "1");
  bad_extra["extra_info"] = "note";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"data_source\": \"x\", \"prompt\": [", "not valid JSON"},
      {"[1, 2, 3]", "must be a JSON object"},
      {row_without("prompt"), "no 'prompt' field"},
      {prompt_string.dump(), "must be a non-empty list of chat messages"},
      {empty_prompt.dump(), "an empty list"},
      {no_role.dump(), "prompt[0] needs a string 'role'"},
      {no_content.dump(), "prompt[0] needs a string 'content'"},
      {no_gt.dump(), "reward_model.ground_truth is missing"},
      {null_gt.dump(), "reward_model.ground_truth is missing"},
      {row_without("reward_model"), "'reward_model' object"},
      {row_without("data_source"), "'data_source' (data.reward_fn_key)"},
      {bad_extra.dump(), "'extra_info' must be an object"},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    const std::string path = dir.write(fmt::format("bad{}.jsonl", c),
                                       good + "\n\n" + cases[c].first + "\n" + good + "\n");
    const std::string msg =
        test::error_of([&] { RLDataset::load({path}, qwen3(), DatasetOptions{}); });
    EXPECT_NE(msg.find(path + ":3:"), std::string::npos) << "case " << c << ": " << msg;
    EXPECT_NE(msg.find(cases[c].second), std::string::npos) << "case " << c << ": " << msg;
  }
  // A reward-model row may leave ground_truth out.
  OJ model_row = no_gt;
  model_row["reward_model"]["style"] = "model";
  EXPECT_EQ(RLDataset::from_rows({model_row}, "mem", qwen3(), DatasetOptions{}).get(0).ground_truth,
            "");
}

TEST(RLDataset, FileProblems) {
  ScratchDir dir;
  EXPECT_NE(test::error_of([&] {
              RLDataset::load({"/nonexistent/x.jsonl"}, qwen3(), DatasetOptions{});
            }).find("cannot open dataset file /nonexistent/x.jsonl"),
            std::string::npos);
  // A directory is not read as an empty file, and an empty file is named (not blamed on a batch
  // size).
  std::string msg0 =
      test::error_of([&] { RLDataset::load({dir.path()}, qwen3(), DatasetOptions{}); });
  EXPECT_NE(msg0.find(dir.path() + ": it is a directory"), std::string::npos) << msg0;
  const std::string empty = dir.write("empty.jsonl", "\n");
  msg0 = test::error_of([&] { RLDataset::load({empty}, qwen3(), DatasetOptions{}); });
  EXPECT_NE(msg0.find("data: " + empty + " hold(s) no rows"), std::string::npos) << msg0;
  const std::string parquet = dir.write("train.parquet", "PAR1");
  const std::string msg =
      test::error_of([&] { RLDataset::load({parquet}, qwen3(), DatasetOptions{}); });
  // Parquet is read now (tests/data/test_parquet.cpp); a 4-byte file is named as too short.
  EXPECT_NE(msg.find(parquet + ": 4 bytes is too short for a parquet file"), std::string::npos)
      << msg;
  if (const char* home = std::getenv("HOME")) {
    EXPECT_EQ(expand_user("~/d/x.jsonl"), std::string(home) + "/d/x.jsonl");
  }
  EXPECT_EQ(expand_user("a/~/b"), "a/~/b");
  const std::string obj = dir.write("x.json", make_row("q", "1").dump());
  EXPECT_NE(test::error_of([&] {
              RLDataset::load({obj}, qwen3(), DatasetOptions{});
            }).find("must be an array"),
            std::string::npos);
}

// With the trainer's scorer check, a row no built-in scorer can score fails at load, naming
// file:line.
TEST(RLDataset, RewardInputsAreCheckedAtLoad) {
  ScratchDir dir;
  DatasetOptions opts;
  opts.check_reward_inputs = [](const std::string& ds, const nlohmann::json& gt) {
    reward::check_reward_inputs(ds, gt);
  };
  const std::string good = make_row("q", "1").dump();
  const std::string bad_gt =
      dir.write("gt.jsonl", good + "\n" + make_row("q", OJ::array({1, 2})).dump() + "\n");
  std::string msg = test::error_of([&] { RLDataset::load({bad_gt}, qwen3(), opts); });
  EXPECT_NE(msg.find(bad_gt + ":2: gsm8k: ground_truth must be a string"), std::string::npos)
      << msg;
  const std::string bad_src =
      dir.write("src.jsonl", make_row("q", "1", "my/unknown").dump() + "\n");
  msg = test::error_of([&] { RLDataset::load({bad_src}, qwen3(), opts); });
  EXPECT_NE(msg.find(bad_src + ":1: no reward function for data_source 'my/unknown'"),
            std::string::npos)
      << msg;
  // Without the check (a reward command scores its own rows) the same rows load.
  EXPECT_EQ(RLDataset::load({bad_src}, qwen3(), DatasetOptions{}).size(), 1);
}

TEST(RLDataset, OptionsFromConfig) {
  config::Config cfg = config::load_config(
      "", {"data.max_prompt_length=77", "data.truncation=middle",
           "data.filter_overlong_prompts=true", "data.prompt_key=chat", "data.val_max_samples=9",
           "data.apply_chat_template_kwargs={enable_thinking: false}"});
  DatasetOptions o = DatasetOptions::from_config(cfg);
  EXPECT_EQ(o.max_prompt_length, 77);
  EXPECT_EQ(o.truncation, Truncation::Middle);
  EXPECT_TRUE(o.filter_overlong_prompts);
  EXPECT_EQ(o.prompt_key, "chat");
  EXPECT_EQ(o.reward_fn_key, "data_source");
  EXPECT_EQ(o.max_samples, -1);
  EXPECT_EQ(DatasetOptions::from_config(cfg, true).max_samples, 9);
  EXPECT_EQ(o.chat_template_kwargs["enable_thinking"], false);

  // Whole datasets from the config's file lists.
  ScratchDir dir;
  const std::string train =
      dir.write("t.jsonl", to_jsonl({make_row("a", "1"), make_row("b", "2")}));
  const std::string val = dir.write("v.jsonl", to_jsonl({make_row("c", "3")}));
  config::Config files = config::load_config(
      "", {"data.train_files=[" + train + "," + train + "]", "data.val_files=" + val});
  EXPECT_EQ(RLDataset::from_config(files, qwen3()).size(), 4);
  EXPECT_EQ(RLDataset::from_config(files, qwen3(), true).get(0).ground_truth, "3");

  // The template variable reaches the template: Qwen3 writes an empty think block without thinking.
  OJ row = make_row("hi", "1");
  DatasetOptions plain;
  DatasetOptions nothink;
  nothink.chat_template_kwargs = {{"enable_thinking", false}};
  const std::string a = RLDataset::from_rows({row}, "mem", qwen3(), plain).get(0).raw_prompt;
  const std::string b = RLDataset::from_rows({row}, "mem", qwen3(), nothink).get(0).raw_prompt;
  EXPECT_EQ(a.find("<think>"), std::string::npos);
  EXPECT_NE(b.find("<think>\n\n</think>"), std::string::npos) << b;
}

}  // namespace
}  // namespace verl::data
