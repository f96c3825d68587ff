// DAPO's math scorer (verl/utils/reward_score/math_dapo.py, after lm-evaluation-harness's
// Minerva MATH check): the answer is the text after the last "Answer:" in the response's last 300
// characters, compared with the ground truth after both go through normalize_final_answer.
// Correct scores 1, anything else -1; acc says which.
#pragma once

#include <string>
#include <string_view>

#include "reward/score.h"

namespace verl::reward {

// verl's normalize_final_answer: the text after the last '='; its SUBSTITUTIONS and
// REMOVED_EXPRESSIONS tables applied in order; "$x$" kept from a line holding two '$'; \text{x},
// \textbf{x}, \overline{x} and \boxed{x} unwrapped; "\frac12" -> "\frac{1}{2}", "\sqrt3" ->
// "\sqrt{3}"; '$' dropped; "1,000" -> "1000" when only digits and commas remain; stripped.
// Python's regexes are reproduced per line (their '.' stops at '\n'), on code points.
std::string dapo_normalize_final_answer(std::string_view final_answer);

// The last match of (?i)Answer\s*:\s*([^\n]+) in `solution_str` (verl's answer_pattern, by
// re.findall), or "[INVALID]" when there is none.
std::string dapo_extract_answer(std::string_view solution_str);

// verl's compute_score (strict_box_verify=False): score 1.0 and acc when the normalised answer
// equals the normalised ground truth, else -1.0; pred is the normalised answer.
ScoreResult math_dapo_compute_score(std::string_view solution_str, std::string_view ground_truth);

}  // namespace verl::reward
