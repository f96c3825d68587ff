// Scorer of our demo task "arith": the prompt asks for the value of a small integer arithmetic
// expression and the response must end its reasoning with "#### <integer>" (GSM8K style) or
// \boxed{<integer>}. Score 1 for the right integer, else 0.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "reward/score.h"

namespace verl::reward {

// The answer text: the strict GSM8K extraction ("#### n", last one, last 300 characters) when
// present, else the content of the last \boxed{...}; nullopt when neither is found.
std::optional<std::string> arith_extract_answer(std::string_view solution_str);

// Parses an integer answer: optional sign, ASCII digits, commas and surrounding spaces allowed
// ("-1,024"); nullopt for anything else (decimals included).
std::optional<int64_t> arith_parse_integer(std::string_view text);

// 1.0 when the extracted answer parses to the ground-truth integer, else 0.0. A ground truth that
// is not an integer throws (it is a dataset error, not a wrong answer).
ScoreResult arith_compute_score(std::string_view solution_str, std::string_view ground_truth);

}  // namespace verl::reward
