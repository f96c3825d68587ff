// A reward model of the demo's shape for the trainer tests (tests/trainer, tests/cuda):
// Qwen2ForSequenceClassification with one label, random weights, the demo's tokenizer files.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "core/file.h"
#include "core/rng.h"
#include "model/config.h"
#include "model/hf_files.h"
#include "model/weights.h"

namespace verl::test {

// Writes the model into `dir` (weights N(0, 0.05^2) from seed 5) and returns the directory.
inline std::string make_demo_reward_model(const std::filesystem::path& dir) {
  const std::string demo = std::string(VERL_SOURCE_DIR) + "/assets/demo/model";
  nlohmann::json c = nlohmann::json::parse(read_file(demo + "/config.json", "demo config"));
  c["architectures"] = {"Qwen2ForSequenceClassification"};
  c["num_labels"] = 1;
  model::Weights w =
      model::Weights::from_config(model::parse_model_config(c.dump(), "demo reward model"));
  Rng rng(5);
  for (float& x : w.data) x = 0.05f * rng.normal();
  w.save(dir.string());
  model::copy_tokenizer_files(demo, dir.string());
  return dir.string();
}

}  // namespace verl::test
