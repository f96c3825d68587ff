// Countdown scorer, as verl/utils/reward_score/countdown.py (from TinyZero): the response's last
// line holds an equation in <answer>...</answer> that must use exactly the given numbers and
// evaluate to the target. The equation is evaluated by a small parser with Python's arithmetic
// semantics (+ - * / // **, parentheses, unary signs), never by eval.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "reward/score.h"

namespace verl::reward {

// The text after the first "Assistant:" or "<|im_start|>assistant" marker (the whole text when
// neither is present: verl returns None there because TinyZero scored prompt + response, while we
// score the response alone), then its last line, then the content of the last
// <answer>...</answer> there, stripped of surrounding whitespace.
std::optional<std::string> countdown_extract_solution(std::string_view solution_str);

// The integers (runs of ASCII digits) in the equation, sorted, equal to the sorted available
// numbers: each used exactly once.
bool countdown_validate_equation(std::string_view equation, std::vector<double> available);

// Evaluates an expression of numbers, + - * / // **, parentheses and spaces with Python's rules
// (int vs float, ** binding tighter than unary minus and right-associative, floor division).
// nullopt for a character outside that set, a syntax error, or a division by zero.
std::optional<double> evaluate_arithmetic(std::string_view expr);

// 0 without an <answer>; format_score when the equation uses other numbers, does not evaluate or
// misses the target; score when |value - target| < 1e-5. ground_truth is {"target": t,
// "numbers": [...]} (an object, or a string holding one).
ScoreResult countdown_compute_score(std::string_view solution_str,
                                    const nlohmann::json& ground_truth, double format_score = 0.1,
                                    double score = 1.0);

}  // namespace verl::reward
