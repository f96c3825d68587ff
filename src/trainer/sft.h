// Supervised fine-tuning (verl's fsdp_sft_trainer on our engine): chat or prompt/response rows,
// loss on the assistant tokens only, packed token-budget micro-batches, AdamW with warmup and a
// cosine/constant schedule, HF model directories out. The tool that makes the demo's model.
#pragma once

#include <cstdint>
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
  int64_t max_length = 1024;
  std::string truncation = "error";  // error | left | right
};

// Reads JSONL or parquet rows and tokenizes them with the chat template; errors name the file and
// the line (JSONL) or row (parquet, counted from 1).
std::vector<SftExample> load_sft_examples(const std::string& path, const tokenizer::Tokenizer& tok,
                                          const SftDataOptions& opt);
// Tokens and assistant-token mask of one chat (the template rendered turn by turn); `where` names
// the row in errors.
SftExample tokenize_chat(const nlohmann::json& messages, const tokenizer::Tokenizer& tok,
                         const std::string& where);

// Runs SFT as configured (configs/sft_trainer.yaml keys), logging train/loss, train/lr,
// train/grad_norm, val/loss and perf/* to trainer.logger (console, jsonl, tensorboard) under
// trainer.default_local_dir; returns the directory of the final model.
std::string run_sft(const config::Config& cfg);

}  // namespace verl::trainer
