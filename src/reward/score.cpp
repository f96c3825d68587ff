// default_compute_score: the rule-based scorer chosen by data_source, as verl's registry.
#include "reward/score.h"

#include <fmt/ranges.h>

#include "core/error.h"
#include "reward/arith.h"
#include "reward/countdown.h"
#include "reward/gsm8k.h"
#include "reward/math_dapo.h"
#include "reward/math_dataset.h"

namespace verl::reward {

const std::vector<std::string>& known_data_sources() {
  static const std::vector<std::string> kSources = {"openai/gsm8k",
                                                    "lighteval/MATH",
                                                    "DigitalLearningGmbH/MATH-lighteval",
                                                    "HuggingFaceH4/MATH-500",
                                                    "math_dapo",
                                                    "math",
                                                    "math_dapo_reasoning",
                                                    "aime*",
                                                    "countdown",
                                                    "arith"};
  return kSources;
}

std::string ground_truth_text(const nlohmann::json& ground_truth, std::string_view scorer) {
  if (ground_truth.is_string()) return ground_truth.get<std::string>();
  if (ground_truth.is_number_integer() || ground_truth.is_number_unsigned())
    return ground_truth.dump();
  if (ground_truth.is_number_float()) return fmt::format("{}", ground_truth.get<double>());
  VERL_FAIL("{}: ground_truth must be a string (or a number), got {}", scorer, ground_truth.dump());
}

ScoreResult default_compute_score(std::string_view data_source, std::string_view solution_str,
                                  const nlohmann::json& ground_truth,
                                  const nlohmann::json& extra_info) {
  if (data_source == "openai/gsm8k")
    return gsm8k_compute_score(solution_str, ground_truth_text(ground_truth, "gsm8k"));
  if (data_source == "lighteval/MATH" || data_source == "DigitalLearningGmbH/MATH-lighteval" ||
      data_source == "HuggingFaceH4/MATH-500")
    return math_compute_score(solution_str, ground_truth_text(ground_truth, "math"));
  // verl routes "aime" and every name starting with it (aime2024, aime25...) to math_dapo.
  if (data_source == "math_dapo" || data_source == "math" || data_source == "math_dapo_reasoning" ||
      data_source.starts_with("aime"))
    return math_dapo_compute_score(solution_str, ground_truth_text(ground_truth, "math_dapo"));
  if (data_source == "countdown") return countdown_compute_score(solution_str, ground_truth);
  if (data_source == "arith")
    return arith_compute_score(solution_str, ground_truth_text(ground_truth, "arith"));
  VERL_FAIL(
      "no reward function for data_source '{}'; known data sources: {} (or score with a "
      "custom_reward_function command)",
      data_source, fmt::join(known_data_sources(), ", "));
}

void check_reward_inputs(std::string_view data_source, const nlohmann::json& ground_truth) {
  default_compute_score(data_source, "", ground_truth, nlohmann::json::object());
}

}  // namespace verl::reward
