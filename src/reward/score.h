// Rule-based reward scoring: the result type every scorer returns and the registry that picks a
// scorer by the dataset's `data_source`, as verl's default_compute_score does
// (verl/utils/reward_score/__init__.py).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace verl::reward {

// What a scorer returns for one response. `score` is the reward; `acc` says whether the answer was
// judged correct (verl's "acc" metric; a format-only score is not correct); `pred` is the answer
// the scorer extracted ("" when none).
struct ScoreResult {
  double score = 0.0;
  bool acc = false;
  std::string pred;
  // verl's scorer returns a dict (math_dapo): its "acc" is reported as is; for the scorers that
  // return a float, verl's dapo reward manager reports the score itself as acc.
  bool is_dict = false;
};

// Scores `solution_str` (the decoded response) against `ground_truth` (the dataset row's
// reward_model.ground_truth: a string for gsm8k / math / arith, a number is taken as its decimal
// text; an object {"target", "numbers"} for countdown) with the scorer for `data_source`:
//   "openai/gsm8k"                                                   -> gsm8k (strict)
//   "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval",
//   "HuggingFaceH4/MATH-500"                                         -> math
//   "math_dapo", "math", "math_dapo_reasoning", "aime*"              -> math_dapo
//   "countdown"                                                      -> countdown
//   "arith"                                                          -> arith (our demo task)
// An unknown data_source throws an Error naming it and listing the known ones.
ScoreResult default_compute_score(std::string_view data_source, std::string_view solution_str,
                                  const nlohmann::json& ground_truth,
                                  const nlohmann::json& extra_info = nullptr);

// An Error when default_compute_score could not score a row of `data_source` with this
// ground_truth (an unknown data source, a ground_truth of the wrong shape): checked when a dataset
// loads, so a bad row fails before training. Every scorer reads its ground_truth before the
// response, so scoring an empty response checks exactly that.
void check_reward_inputs(std::string_view data_source, const nlohmann::json& ground_truth);

// The data sources default_compute_score knows, in the order above.
const std::vector<std::string>& known_data_sources();

// A ground truth given as a string, or a number rendered as its decimal text; else throws naming
// the scorer.
std::string ground_truth_text(const nlohmann::json& ground_truth, std::string_view scorer);

}  // namespace verl::reward
