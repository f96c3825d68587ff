#include "model/generation_config.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/file.h"
#include "core/json_depth.h"

namespace verl::model {

std::vector<int32_t> generation_eos_ids(const std::string& model_dir, const ModelConfig& cfg,
                                        int32_t tokenizer_eos) {
  namespace fs = std::filesystem;
  std::set<int32_t> ids;
  for (int64_t e : cfg.eos_token_ids) ids.insert(static_cast<int32_t>(e));
  fs::path gen = fs::path(model_dir) / "generation_config.json";
  if (fs::exists(gen)) {
    const std::string text = read_file(gen.string(), "generation config");
    check_json_depth(text, gen.string());
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      VERL_FAIL("{}: not valid JSON: {}", gen.string(), e.what());
    }
    if (j.contains("eos_token_id")) {
      const auto& e = j["eos_token_id"];
      if (e.is_number_integer()) {
        ids.insert(e.get<int32_t>());
      } else if (e.is_array()) {
        for (const auto& x : e) {
          VERL_CHECK(x.is_number_integer(), "{}: eos_token_id must hold integers", gen.string());
          ids.insert(x.get<int32_t>());
        }
      } else {
        VERL_CHECK(e.is_null(), "{}: eos_token_id must be an integer or a list", gen.string());
      }
    }
  }
  if (tokenizer_eos >= 0) ids.insert(tokenizer_eos);
  return {ids.begin(), ids.end()};
}

}  // namespace verl::model
