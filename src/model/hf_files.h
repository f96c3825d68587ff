// The non-weight files of an HF model directory, and the dtype names users give for saving.
#pragma once

#include <string>

#include "core/dtype.h"

namespace verl::model {

// Copies the tokenizer and generation files present in `from` (tokenizer.json,
// tokenizer_config.json, special_tokens_map.json, chat_template.jinja, vocab.json, merges.txt,
// generation_config.json) into the directory `to`, so a saved model loads on its own.
void copy_tokenizer_files(const std::string& from, const std::string& to);

// "float32" | "f32" | "bfloat16" | "bf16" | "float16" | "f16"; anything else is an Error naming
// `option` and the accepted values.
DType parse_save_dtype(const std::string& name, const std::string& option = "--dtype");

}  // namespace verl::model
