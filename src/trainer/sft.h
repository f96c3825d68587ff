// Supervised fine-tuning (verl's fsdp_sft_trainer on our engine): chat or prompt/response rows,
// loss on the assistant tokens only, packed token-budget micro-batches, AdamW with warmup and a
// cosine/constant schedule, HF model directories out. The tool that makes the demo's model.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "tokenizer/tokenizer.h"

namespace verl::trainer {

struct SftExample {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> loss_mask;  // 1 where the token is a training target (an assistant token)
};

struct SftDataOptions {
  bool multiturn = true;
  std::string messages_key = "messages", prompt_key = "question", response_key = "answer";
  // Paths into nested prompt/response fields (data.prompt_dict_keys, data.response_dict_keys).
  std::vector<std::string> prompt_dict_keys, response_dict_keys;
  int64_t max_length = 1024;
  std::string truncation = "error";  // error | left | right
  // Chat-template variables: for every row; chat rows add their tools and enable_thinking fields
  // (or enable_thinking_default when a row has no such field), as verl's MultiTurnSFTDataset does.
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  std::string tools_key = "tools", enable_thinking_key = "enable_thinking";
  std::optional<bool> enable_thinking_default;
};

// Reads JSONL or parquet rows and tokenizes them with the chat template; errors name the file and
// the line (JSONL) or row (parquet, counted from 1).
std::vector<SftExample> load_sft_examples(const std::string& path, const tokenizer::Tokenizer& tok,
                                          const SftDataOptions& opt);
// Tokens and assistant-token mask of one chat (the template rendered turn by turn, with the
// template variables `extra`); `where` names the row in errors. Insertion-ordered JSON: a dict that
// the template prints (`tojson` of tools or tool-call arguments) keeps the row's key order, as in
// Python.
SftExample tokenize_chat(const nlohmann::ordered_json& messages, const tokenizer::Tokenizer& tok,
                         const std::string& where,
                         const nlohmann::ordered_json& extra = nlohmann::ordered_json::object());

// Runs SFT as configured (configs/sft_trainer.yaml keys), logging train/loss, train/lr,
// train/grad_norm, val/loss and perf/* to trainer.logger (console, jsonl, tensorboard) under
// trainer.default_local_dir; returns the directory of the final model.
std::string run_sft(const config::Config& cfg);

}  // namespace verl::trainer
