// libFuzzer target: the rule-based scorers (src/reward/) on a response the policy wrote. A
// response is whatever the model generates, so every scorer must return a score for any bytes;
// a ground truth a dataset supplies must be scored or refused with verl::Error. A crash, a
// sanitizer report, a hang or another exception is a bug.
// Input: one byte choosing the data source, the ground truth up to the first NUL, the response.
// Build and run: tools/fuzz/run.sh reward (docs/design.md#fuzzing).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/error.h"
#include "reward/score.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto& sources = verl::reward::known_data_sources();
  std::string source = sources[data[0] % sources.size()];
  if (source == "aime*") source = "aime2024";
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t nul = rest.find('\0');
  const std::string_view truth =
      nul == std::string_view::npos ? std::string_view("42") : rest.substr(0, nul);
  const std::string_view response = nul == std::string_view::npos ? rest : rest.substr(nul + 1);
  // The ground truth as a dataset holds it: JSON when it parses (countdown's object, a number),
  // else the text itself, which must be UTF-8 as the JSONL and Parquet readers insist.
  nlohmann::json gt = nlohmann::json::parse(truth, nullptr, /*allow_exceptions=*/false);
  if (gt.is_discarded()) {
    gt = std::string(truth);
    try {
      (void)gt.dump();
    } catch (const nlohmann::json::exception&) {
      return 0;
    }
  }
  try {
    verl::reward::check_reward_inputs(source, gt);
  } catch (const verl::Error&) {
    return 0;  // refused when the dataset loads: never scored
  }
  // A ground truth that passed the load check must score every response without an error.
  const verl::reward::ScoreResult r = verl::reward::default_compute_score(source, response, gt);
  (void)r;
  return 0;
}
