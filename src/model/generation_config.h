// Stop ids of a model directory: generation_config.json's eos_token_id (an int or a list) together
// with config.json's, as HF generate uses them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace verl::model {

// Sorted, unique. Add the tokenizer's eos id too (tokenizer_config.json's eos_token).
std::vector<int32_t> generation_eos_ids(const std::string& model_dir, const ModelConfig& cfg,
                                        int32_t tokenizer_eos = -1);

}  // namespace verl::model
