// MATH-dataset scorer, as verl/utils/reward_score/math.py (itself Hendrycks et al.'s MATH
// evaluation): the answer is the content of the last \boxed{...}, compared with the ground truth
// after both are normalised by strip_string.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "reward/score.h"

namespace verl::reward {

// Python's str.replace(from, to) (from non-empty): every non-overlapping occurrence, left to
// right. The MATH and DAPO normalisations are written in terms of it.
std::string replace_all(std::string_view s, std::string_view from, std::string_view to);

// The last "\boxed{...}" (balanced braces) of `s`, or "\boxed <text>" up to the next '$' when the
// text contains "\boxed " anywhere, or else the last "\fbox{...}"; nullopt when none is closed.
std::optional<std::string> last_boxed_only_string(std::string_view s);

// "\boxed{x}" -> "x", "\boxed x" -> "x", and (our addition: verl raises here and scores 0)
// "\fbox{x}" -> "x"; nullopt when `boxed` has none of these forms.
std::optional<std::string> remove_boxed(std::string_view boxed);

// verl's strip_string: drops line breaks, "\!", "\left", "\right", "^{\circ}", "\$", "\%",
// units after "\text{ ", spaces and a short "x =" prefix; doubles "\\" -> "\"; tfrac/dfrac ->
// frac; adds the leading zero of ".5"; fixes "\sqrt3" -> "\sqrt{3}", "\frac12" -> "\frac{1}{2}",
// "0.5" -> "\frac{1}{2}" and "a/b" (integers) -> "\frac{a}{b}". nullopt where verl's version
// raises (then is_equiv falls back to comparing the raw strings).
std::optional<std::string> math_strip_string(std::string_view s);

// strip_string(a) == strip_string(b), or a == b when either normalisation fails.
bool math_is_equiv(std::string_view a, std::string_view b);

// 1.0 when the last boxed answer is equivalent to ground_truth, else 0.0.
ScoreResult math_compute_score(std::string_view solution_str, std::string_view ground_truth);

}  // namespace verl::reward
