// DAPO's math scorer (src/reward/math_dapo.h) against verl's math_dapo.py, case by case: the
// expected values are what verl's compute_score / normalize_final_answer return for these inputs
// (the findall of "Answer:", the 300-character clip, the substitution tables' quirks, the
// per-line regexes), plus the data_source routing of default_compute_score.
#include <gtest/gtest.h>

#include <string>

#include "reward/math_dapo.h"
#include "reward/score.h"

namespace verl::reward {
namespace {

struct DapoCase {
  std::string solution, ground_truth;
  double score;
  const char* pred;
};

TEST(MathDapo, ComputeScore) {
  const DapoCase cases[] = {
      {"So the result. Answer: 42", "42", 1, "42"},
      {"Answer: \\boxed{42}", "42", 1, "42"},
      {"answer : $\\frac12$", "\\frac{1}{2}", 1, "\\frac{1}{2}"},  // case-insensitive, \fracab
      {"Answer: 1,000", "1000", 1, "1000"},
      {"Answer: x = 5 units", "5", 1, "5"},       // after the last '=', units removed
      {"The answer is 5", "5", -1, "[INVALID]"},  // no "Answer:"
      {"Answer: 3\nAnswer: 4", "4", 1, "4"},      // the last match
      {"Answer: 3\nAnswer: 4", "3", -1, "4"},
      {"ANSWER: 10 degrees", "10", 1, "10"},
      {"Answer: a cat", "cat", 1, "cat"},                           // "a " is a substitution
      {"Answer: 7" + std::string(300, 'x'), "7", -1, "[INVALID]"},  // clipped to the last 300
      {std::string(400, 'y') + "Answer: 7", "7", 1, "7"},
      {"Answer:\n  12", "12", 1, "12"},  // \s* crosses the line break
      {"Answer:  \n", "", 1, ""},        // \s* gives a space back to [^\n]+
      {"Answer: \\text{(B)}", "(B)", 1, "(B)"},
      {"Answer: \\sqrt3", "\\sqrt{3}", 1, "\\sqrt{3}"},
      {"Answer: Answer: 9", "Answer:9", 1, "Answer:9"},  // one match takes the rest of the line
      {"Answer: $5$ dollars and $6$", "5", 1, "5"},      // the first $..$ pair
      {"Answer: 0.5", "\\frac{1}{2}", -1, "0.5"},        // no numeric equivalence
      {"Answer: \\boxed{\\frac{1}{2}} and }", "\\frac{1}{2}", -1, "\\frac{1}{2}}and"},  // greedy
      {"Answer: \\dfrac{1}{2}", "\\frac{1}{2}", -1, "\\dfrac{1}{2}"},
      {"Answer: 3.", "3", -1, "3."},
      {"Answer: 3.$", "3", 1, "3"},  // ".$" -> "$"
  };
  for (const DapoCase& c : cases) {
    const ScoreResult r = math_dapo_compute_score(c.solution, c.ground_truth);
    EXPECT_EQ(r.score, c.score) << c.solution.substr(0, 50) << " vs " << c.ground_truth;
    EXPECT_EQ(r.acc, c.score > 0) << c.solution.substr(0, 50);
    EXPECT_EQ(r.pred, c.pred) << c.solution.substr(0, 50);
    EXPECT_TRUE(r.is_dict);
  }
}

TEST(MathDapo, NormalizeFinalAnswer) {
  const std::pair<const char*, const char*> cases[] = {
      {"\\text{ab}\\text{c", "ab\\text{c"},  // an unclosed \text{ stays
      {"a\\boxed{x}y}z\nq}", "ax}yz\nq}"},   // \boxed{ to the last '}' of its line
      {"\\fracab\\frac{1}{2}", "\\frac{a}{b}\\frac{1}{2}"},
      {"frac\nab", "frac{\n}{a}b"},  // [^{] takes the newline, '.' the next character
      {"\\frac1", "\\frac1"},        // too short for (frac)([^{])(.)
      {"sqrt\n", "sqrt{\n}"},
      {"1,2,3", "123"},
      {" 12 ", "12"},
      {"x\n$a$b$\n$c", "x\na\nc"},  // per line
      {"\\text{m}", ""},            // -> \text{} -> removed
      {"5^\\circ", "5"},
  };
  for (const auto& [in, want] : cases) EXPECT_EQ(dapo_normalize_final_answer(in), want) << in;
}

TEST(MathDapo, Routing) {
  for (const char* ds :
       {"math_dapo", "math", "math_dapo_reasoning", "aime", "aime2024", "aime25"}) {
    const ScoreResult r = default_compute_score(ds, "Answer: 12", nlohmann::json("12"));
    EXPECT_EQ(r.score, 1.0) << ds;
    EXPECT_TRUE(r.is_dict) << ds;
    EXPECT_EQ(default_compute_score(ds, "Answer: 13", nlohmann::json(12)).score, -1.0) << ds;
  }
  // The MATH datasets keep verl's math scorer: the last \boxed{}, 1 or 0, a float (not a dict).
  const ScoreResult m =
      default_compute_score("DigitalLearningGmbH/MATH-lighteval", "so \\boxed{\\dfrac12}",
                            nlohmann::json("\\frac{1}{2}"));
  EXPECT_EQ(m.score, 1.0);
  EXPECT_FALSE(m.is_dict);
  EXPECT_EQ(
      default_compute_score("DigitalLearningGmbH/MATH-lighteval", "Answer: 3", nlohmann::json("3"))
          .score,
      0.0);
}

}  // namespace
}  // namespace verl::reward
