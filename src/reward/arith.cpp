// The demo task's scorer: "#### n" or \boxed{n}, compared as integers with the ground truth.
#include "reward/arith.h"

#include "core/error.h"
#include "reward/gsm8k.h"
#include "reward/math_dataset.h"

namespace verl::reward {

std::optional<std::string> arith_extract_answer(std::string_view solution_str) {
  if (auto a = gsm8k_extract_solution(solution_str, Gsm8kMethod::Strict)) return a;
  if (auto boxed = last_boxed_only_string(solution_str)) return remove_boxed(*boxed);
  return std::nullopt;
}

std::optional<int64_t> arith_parse_integer(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  bool negative = false;
  if (!text.empty() && (text.front() == '-' || text.front() == '+')) {
    negative = text.front() == '-';
    text.remove_prefix(1);
  }
  int64_t v = 0;
  int digits = 0;
  for (char c : text) {
    if (c == ',') continue;
    if (c < '0' || c > '9') return std::nullopt;
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, c - '0', &v))
      return std::nullopt;
    ++digits;
  }
  if (digits == 0) return std::nullopt;
  return negative ? -v : v;
}

ScoreResult arith_compute_score(std::string_view solution_str, std::string_view ground_truth) {
  std::optional<int64_t> truth = arith_parse_integer(ground_truth);
  VERL_CHECK(truth.has_value(), "arith: ground_truth '{}' is not an integer", ground_truth);
  ScoreResult r;
  std::optional<std::string> answer = arith_extract_answer(solution_str);
  if (!answer) return r;
  r.pred = *answer;
  std::optional<int64_t> value = arith_parse_integer(*answer);
  r.acc = value.has_value() && *value == *truth;
  r.score = r.acc ? 1.0 : 0.0;
  return r;
}

}  // namespace verl::reward
