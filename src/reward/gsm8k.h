// GSM8K scorer, as verl/utils/reward_score/gsm8k.py: the answer is the last "#### <number>" in
// the last 300 characters of the response (strict), or the last number there (flexible).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "reward/score.h"

namespace verl::reward {

enum class Gsm8kMethod { Strict, Flexible };

// strict: the last match of "#### (-?[0-9.,]+)" with ',' and '$' removed.
// flexible: the last match of "(-?[0-9.,]+)" that is not "" or "." (kept as written, commas too).
// Only the last 300 characters (code points) of the solution are searched, as verl clips them.
std::optional<std::string> gsm8k_extract_solution(std::string_view solution_str,
                                                  Gsm8kMethod method = Gsm8kMethod::Strict);

// score if the extracted answer equals ground_truth exactly (as strings), format_score if an answer
// was extracted but differs, 0 if none was found.
ScoreResult gsm8k_compute_score(std::string_view solution_str, std::string_view ground_truth,
                                Gsm8kMethod method = Gsm8kMethod::Strict, double format_score = 0.0,
                                double score = 1.0);

// The last `n` code points of a UTF-8 string (the whole string when shorter).
std::string_view utf8_last_chars(std::string_view s, size_t n);

}  // namespace verl::reward
