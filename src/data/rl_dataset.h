// Prompt datasets in verl's schema (verl/utils/dataset/rl_dataset.py, RLHFDataset), read from
// JSONL or Parquet files: every row is validated when the dataset loads, and a row becomes a Sample
// (chat template applied, tokenized, truncated by data.truncation) when it is asked for.
//
//   auto ds = RLDataset::load({"gsm8k/train.jsonl"}, tok, DatasetOptions::from_config(cfg));
//   Sample s = ds.get(0);  // s.prompt_ids == tok.encode(tok.apply_chat_template(messages, true))
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace verl::config {
class Config;
}
namespace verl::tokenizer {
class Tokenizer;
}

namespace verl::data {

// What happens to a prompt longer than max_prompt_length (verl's data.truncation).
enum class Truncation {
  Error,   // an Error naming the file, the line and the length
  Left,    // keep the last max_prompt_length tokens
  Right,   // keep the first max_prompt_length tokens
  Middle,  // keep the first max/2 and the last max - max/2 tokens
};
Truncation parse_truncation(const std::string& name);  // "error" | "left" | "right" | "middle"
const char* truncation_name(Truncation t);
// Shortens ids to max_len as `mode` says (verl's rules); Error mode throws when ids are too long.
std::vector<int32_t> truncate_prompt(std::vector<int32_t> ids, int64_t max_len, Truncation mode);

struct DatasetOptions {
  std::string prompt_key = "prompt";          // data.prompt_key
  std::string reward_fn_key = "data_source";  // data.reward_fn_key
  int64_t max_prompt_length = 512;            // data.max_prompt_length
  bool filter_overlong_prompts = false;       // data.filter_overlong_prompts
  Truncation truncation = Truncation::Error;  // data.truncation
  int64_t max_samples = -1;                   // data.train_max_samples / val_max_samples (-1: all)
  // Extra chat-template variables (data.apply_chat_template_kwargs), e.g. {"enable_thinking":
  // false}.
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  // Called on every row as it loads with (data_source, ground_truth); an Error it throws is raised
  // with the row's file:line. The trainer passes its reward scorer's check (data does not know
  // them).
  std::function<void(const std::string&, const nlohmann::json&)> check_reward_inputs;

  // The data.* keys of a config; `validation` picks val_max_samples instead of train_max_samples.
  static DatasetOptions from_config(const config::Config& cfg, bool validation = false);
};

// One prompt ready for the rollout.
struct Sample {
  int64_t index = 0;  // position in the dataset (0-based, over all files, after filtering)
  std::string file;   // where the row came from
  int64_t line = 0;   // its 1-based line in that file (element number for a .json array)
  std::vector<int32_t> prompt_ids;   // templated and tokenized, after truncation
  int64_t full_prompt_length = 0;    // tokens before truncation
  std::string raw_prompt;            // the templated prompt text (before tokenization)
  nlohmann::ordered_json messages;   // the chat messages of the row (verl's raw_prompt / raw_chat)
  std::string data_source;           // the row's reward_fn_key field: selects the reward function
  std::string ability;               // "" when the row has none
  std::string ground_truth;          // reward_model.ground_truth as text (numbers printed as JSON)
  nlohmann::json ground_truth_json;  // reward_model.ground_truth as written
  nlohmann::json reward_model;       // the whole reward_model object (style, ground_truth, ...)
  nlohmann::json extra_info;         // {} when the row has none
  std::string agent_name;            // the row's agent loop ("" when it names none)
};

struct DatasetStats {
  int64_t rows_read = 0;      // valid rows in all files
  int64_t rows_filtered = 0;  // dropped by filter_overlong_prompts
  int64_t rows_capped = 0;    // dropped by max_samples
};

class RLDataset {
 public:
  // Reads every file (JSONL: one object per line, blank lines skipped; `.json`: one array of
  // objects) and validates every row. With filter_overlong_prompts, every prompt is rendered and
  // tokenized here and those longer than max_prompt_length are dropped (counted and logged).
  // `tok` must outlive the dataset. Paths may start with "~/".
  static RLDataset load(const std::vector<std::string>& files, const tokenizer::Tokenizer& tok,
                        const DatasetOptions& opts);
  // data.train_files (or data.val_files when `validation`) with DatasetOptions::from_config.
  static RLDataset from_config(const config::Config& cfg, const tokenizer::Tokenizer& tok,
                               bool validation = false);
  // The same from rows already in memory; `name` stands for the file in messages.
  static RLDataset from_rows(const std::vector<nlohmann::ordered_json>& rows,
                             const std::string& name, const tokenizer::Tokenizer& tok,
                             const DatasetOptions& opts);

  int64_t size() const { return static_cast<int64_t>(rows_.size()); }
  // Renders, tokenizes and truncates row i. Thread-safe (several loader threads call it).
  // With truncation = error, a prompt over the limit throws an Error naming file, line, length.
  Sample get(int64_t i) const;
  // Token count of row i's templated prompt before truncation (renders and tokenizes it).
  int64_t prompt_length(int64_t i) const;

  const DatasetStats& stats() const { return stats_; }
  const DatasetOptions& options() const { return opts_; }
  const tokenizer::Tokenizer& tokenizer() const { return *tok_; }

 private:
  struct Row {
    std::string file;  // index into files_ would save memory; rows are few enough
    int64_t line = 0;
    nlohmann::ordered_json messages;
    std::string data_source, ability;
    nlohmann::json reward_model, ground_truth, extra_info;
    std::string agent_name;
  };
  RLDataset(const tokenizer::Tokenizer& tok, const DatasetOptions& opts)
      : tok_(&tok), opts_(opts) {}
  void add_row(const nlohmann::ordered_json& row, const std::string& file, int64_t line);
  void finish();  // filter and cap
  std::string render(const Row& r) const;

  const tokenizer::Tokenizer* tok_;
  DatasetOptions opts_;
  std::vector<Row> rows_;
  DatasetStats stats_;
};

// Expands a leading "~/" with $HOME.
std::string expand_user(const std::string& path);

}  // namespace verl::data
