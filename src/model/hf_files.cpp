#include "model/hf_files.h"

#include <filesystem>

#include "core/error.h"

namespace verl::model {

void copy_tokenizer_files(const std::string& from, const std::string& to) {
  namespace fs = std::filesystem;
  if (fs::weakly_canonical(from) == fs::weakly_canonical(to)) return;
  for (const char* name :
       {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
        "vocab.json", "merges.txt", "generation_config.json"}) {
    fs::path src = fs::path(from) / name;
    if (fs::exists(src))
      fs::copy_file(src, fs::path(to) / name, fs::copy_options::overwrite_existing);
  }
}

DType parse_save_dtype(const std::string& name, const std::string& option) {
  if (name == "float32" || name == "f32") return DType::F32;
  if (name == "bfloat16" || name == "bf16") return DType::BF16;
  if (name == "float16" || name == "f16") return DType::F16;
  VERL_FAIL("{} must be float32, bfloat16 or float16, got '{}'", option, name);
}

}  // namespace verl::model
