// Edge-case tables for the rule-based scorers (src/reward/): GSM8K, MATH, countdown, arith and the
// data_source registry. The expected values follow verl's Python scorers case by case (regex
// findall order, the 300-character clip, strip_string's rules and its exception fallbacks).
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "reward/arith.h"
#include "reward/countdown.h"
#include "reward/gsm8k.h"
#include "reward/math_dataset.h"
#include "reward/score.h"

namespace verl::reward {
namespace {

// ---------------------------------------------------------------------------------------------
// GSM8K.

struct GsmCase {
  std::string solution;
  Gsm8kMethod method;
  const char* want;  // nullptr: no answer extracted
};

TEST(Gsm8k, Extraction) {
  const std::string pad(400, 'x');
  const GsmCase cases[] = {
      {"The answer is #### 72", Gsm8kMethod::Strict, "72"},
      {"#### 1,234", Gsm8kMethod::Strict, "1234"},       // commas removed
      {"#### $1,234", Gsm8kMethod::Strict, nullptr},     // '$' cannot follow "#### "
      {"#### 5 then #### 7", Gsm8kMethod::Strict, "7"},  // the last match wins
      {"#### 42" + pad, Gsm8kMethod::Strict, nullptr},   // clipped to the last 300 chars
      {pad + "#### 42", Gsm8kMethod::Strict, "42"},
      {"no answer here", Gsm8kMethod::Strict, nullptr},
      {"#### -3", Gsm8kMethod::Strict, "-3"},
      {"#### 3.50", Gsm8kMethod::Strict, "3.50"},  // kept as written
      {"####72", Gsm8kMethod::Strict, nullptr},    // the space is required
      {"#### 72.", Gsm8kMethod::Strict, "72."},
      {"#### - 3", Gsm8kMethod::Strict, nullptr},
      {"##### 8", Gsm8kMethod::Strict, "8"},
      {"#### 1,2,3 and #### -", Gsm8kMethod::Strict, "123"},
      {"I think 3 apples and 4, so 7.", Gsm8kMethod::Flexible, "7."},
      {"x = 1,000", Gsm8kMethod::Flexible, "1,000"},  // flexible keeps commas
      {"end .", Gsm8kMethod::Flexible, "."},          // only invalid matches: the first one
      {"nothing", Gsm8kMethod::Flexible, nullptr},
      {"-5 and -.", Gsm8kMethod::Flexible, "-."},
      {"a - 7", Gsm8kMethod::Flexible, "7"},
  };
  for (const GsmCase& c : cases) {
    std::optional<std::string> got = gsm8k_extract_solution(c.solution, c.method);
    if (c.want == nullptr) {
      EXPECT_FALSE(got.has_value()) << c.solution.substr(0, 40) << " -> " << got.value_or("");
    } else {
      ASSERT_TRUE(got.has_value()) << c.solution.substr(0, 40);
      EXPECT_EQ(*got, c.want) << c.solution.substr(0, 40);
    }
  }
}

TEST(Gsm8k, Scores) {
  EXPECT_EQ(gsm8k_compute_score("so #### 72", "72").score, 1.0);
  EXPECT_TRUE(gsm8k_compute_score("so #### 72", "72").acc);
  ScoreResult wrong = gsm8k_compute_score("so #### 71", "72");
  EXPECT_EQ(wrong.score, 0.0);
  EXPECT_FALSE(wrong.acc);
  EXPECT_EQ(wrong.pred, "71");
  // format_score for an extracted but wrong answer; nothing for no answer.
  EXPECT_EQ(gsm8k_compute_score("#### 3.50", "3.5", Gsm8kMethod::Strict, 0.1).score, 0.1);
  EXPECT_EQ(gsm8k_compute_score("3.5", "3.5", Gsm8kMethod::Strict, 0.1).score, 0.0);
  EXPECT_EQ(gsm8k_compute_score("#### 5 then #### 7", "5").score, 0.0);
  EXPECT_EQ(gsm8k_compute_score("#### -1,000,000", "-1000000").score, 1.0);
  // The clip counts characters, not bytes: 299 two-byte characters stay in the window.
  std::string accents;
  for (int i = 0; i < 299; ++i) accents += "\xC3\xA9";                  // U+00E9
  EXPECT_EQ(gsm8k_compute_score("#### 9 " + accents, "9").score, 0.0);  // "#### 9 " is cut
  EXPECT_EQ(utf8_last_chars(accents, 3), "\xC3\xA9\xC3\xA9\xC3\xA9");
}

// ---------------------------------------------------------------------------------------------
// MATH.

struct MathCase {
  std::string solution, truth;
  double want;
};

TEST(Math, Table) {
  const MathCase cases[] = {
      {"\\boxed{\\frac{1}{2}}", "\\frac12", 1},
      {"\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", 1},
      {"\\boxed{\\tfrac{3}{4}}", "3/4", 1},
      {"\\boxed{0.5}", "\\frac{1}{2}", 1},
      {"\\boxed{.5}", "\\frac12", 1},
      {"so \\boxed{\\sqrt{2}+\\frac{3}{4}} done", "\\sqrt2+\\frac34", 1},  // nested braces
      {"\\boxed{ 3 \\pi }", "3\\pi", 1},
      {"\\boxed{\\left( 1, 2 \\right)}", "(1,2)", 1},
      {"\\boxed{\\frac 1 2}", "\\frac12", 1},
      {"no box", "1", 0},
      {"\\boxed{3", "3", 0},                   // never closed
      {"\\boxed{2} then \\boxed{3}", "3", 1},  // the last box
      {"\\boxed 5$ dollars", "5", 1},          // "\boxed " form, up to '$'
      {"\\boxed{x = 5}", "5", 1},
      {"\\boxed{k=3}", "3", 1},
      {"\\boxed{abc=3}", "3", 0},  // left side longer than two characters
      {"\\boxed{a=b=3}", "3", 0},
      {"\\boxed{10\\%}", "10", 1},
      {"\\boxed{90^\\circ}", "90", 1},
      {"\\boxed{\\$5}", "5", 1},
      {"\\boxed{5\\text{ cm}}", "5", 1},
      {"\\boxed{3/4}", "\\frac{3}{4}", 1},
      {"\\boxed{03/4}", "\\frac{3}{4}", 0},  // not a canonical integer: left as is
      {"\\boxed{-0/1}", "\\frac{-0}{1}", 0},
      {"\\boxed{1,000}", "1000", 0},
      {"\\boxed{4}", "5", 0},
      {"\\boxed{\\frac{1}{2}}.", "0.5", 1},
      {"\\boxed{\\!5}", "5", 1},
      {"\\boxed{5\n}", "5", 1},
      {"\\boxed{\\infty}", "\\infty", 1},
      // strip_string raises (two "\text{ ", a bare "\sqrt"): raw comparison instead.
      {"\\boxed{\\text{ a}\\text{ b}}", "\\text{ a}\\text{ b}", 1},
      {"\\boxed{\\text{ a}\\text{ b}}", "\\text{ a}\\text{ c}", 0},
      {"\\boxed{\\sqrt}", "\\sqrt", 1},
      // Our one addition: verl extracts "\fbox{7}" but then fails to unbox it and scores 0.
      {"\\fbox{7}", "7", 1},
  };
  for (const MathCase& c : cases) {
    EXPECT_EQ(math_compute_score(c.solution, c.truth).score, c.want)
        << c.solution << " vs " << c.truth;
  }
}

TEST(Math, Pieces) {
  EXPECT_EQ(last_boxed_only_string("a \\boxed{x{y}z} b").value(), "\\boxed{x{y}z}");
  EXPECT_FALSE(last_boxed_only_string("nothing").has_value());
  EXPECT_EQ(remove_boxed("\\boxed{x{y}z}").value(), "x{y}z");
  EXPECT_FALSE(remove_boxed("\\boxed5").has_value());
  EXPECT_EQ(math_strip_string("\\left(\\dfrac12, .5\\right)").value(), "(\\frac{1}{2},0.5)");
  EXPECT_EQ(math_strip_string("\\sqrt3").value(), "\\sqrt{3}");
  EXPECT_EQ(math_strip_string("\\frac1{72}").value(), "\\frac{1}{72}");
  EXPECT_EQ(math_strip_string("-3/4").value(), "\\frac{-3}{4}");
  EXPECT_EQ(math_strip_string("").value(), "");
  ScoreResult r = math_compute_score("Thus \\boxed{\\dfrac{1}{2}}.", "0.5");
  EXPECT_EQ(r.pred, "\\dfrac{1}{2}");
  EXPECT_TRUE(r.acc);
}

// ---------------------------------------------------------------------------------------------
// Countdown.

TEST(Countdown, Arithmetic) {
  auto eq = [](const char* e, double want) {
    std::optional<double> v = evaluate_arithmetic(e);
    ASSERT_TRUE(v.has_value()) << e;
    EXPECT_DOUBLE_EQ(*v, want) << e;
  };
  eq("2*(3+4)", 14);
  eq("-2**2", -4);  // ** binds tighter than unary minus
  eq("2**-1", 0.5);
  eq("2**3**2", 512);  // right-associative
  eq("7//2", 3);
  eq("-7//2", -4);  // floor, not truncation
  eq("7.5//2", 3);
  eq("8/2*3", 12);
  eq("--3", 3);
  eq(".5+1.", 1.5);
  eq("00", 0);
  eq(" 1 +\t2 ", 3);
  for (const char* bad : {"1/0", "1//0", "0**-1", "()", "1 2", "(1)(2)", "007", "1.2.3", "2* *3",
                          "3 % 2", "2x3", "", "(", "1+", "(-8)**0.5", "."}) {
    EXPECT_FALSE(evaluate_arithmetic(bad).has_value()) << bad;
  }
  std::string deep = std::string(300, '(') + "1" + std::string(300, ')');
  EXPECT_FALSE(evaluate_arithmetic(deep).has_value());
  std::string ok = std::string(50, '(') + "1" + std::string(50, ')');
  EXPECT_EQ(evaluate_arithmetic(ok).value(), 1.0);
}

TEST(Countdown, Scores) {
  const nlohmann::json gt = {{"target", 14}, {"numbers", {2, 3, 4}}};
  auto score = [&](const std::string& s) { return countdown_compute_score(s, gt).score; };
  EXPECT_EQ(score("Assistant: let me think\n<answer>2*(3+4)</answer>"), 1.0);
  EXPECT_EQ(score("<|im_start|>assistant\nthinking\n<answer> 2 * (3 + 4) </answer>"), 1.0);
  EXPECT_EQ(score("<answer>2*(3+4)</answer>"), 1.0);      // no marker: the whole response (ours)
  EXPECT_EQ(score("<answer>2*(3+5)</answer>"), 0.1);      // wrong numbers
  EXPECT_EQ(score("<answer>2*(3+4)+2-2</answer>"), 0.1);  // numbers reused
  EXPECT_EQ(score("<answer>(2+3)*4</answer>"), 0.1);      // right numbers, wrong value
  EXPECT_EQ(score("<answer>2*(3+4</answer>"), 0.1);       // invalid expression
  EXPECT_EQ(score("<answer>2x(3+4)</answer>"), 0.1);      // invalid character
  EXPECT_EQ(score("<answer>2*(3+4)</answer>\nmore text"), 0.0);          // not on the last line
  EXPECT_EQ(score("<answer>1</answer> <answer>2*(3+4)</answer>"), 1.0);  // the last answer
  EXPECT_EQ(score("<answer>2*(3+4)</answer> <answer>1</answer>"), 0.1);
  EXPECT_EQ(score("no answer at all"), 0.0);
  EXPECT_EQ(score("Assistant: <answer>2*(3+4)"), 0.0);  // never closed
  // Division (exact in floating point within 1e-5) and division by zero.
  nlohmann::json div = {{"target", 12}, {"numbers", {8, 2, 3}}};
  EXPECT_EQ(countdown_compute_score("<answer>8/2*3</answer>", div).score, 1.0);
  nlohmann::json third = {{"target", 1}, {"numbers", {1, 3, 3}}};
  EXPECT_EQ(countdown_compute_score("<answer>1/3*3</answer>", third).score, 1.0);
  nlohmann::json zero = {{"target", 5}, {"numbers", {5, 0, 1}}};
  EXPECT_EQ(countdown_compute_score("<answer>5/0+1</answer>", zero).score, 0.1);
  // A ground truth given as a JSON string works; a malformed one is a clear error.
  EXPECT_EQ(countdown_compute_score("<answer>2*(3+4)</answer>", nlohmann::json(gt.dump())).score,
            1.0);
  EXPECT_THROW(countdown_compute_score("x", nlohmann::json{{"target", 3}}), Error);
  ScoreResult r = countdown_compute_score("<answer> 4*(3+2) </answer>", gt);
  EXPECT_EQ(r.pred, "4*(3+2)");
  EXPECT_FALSE(r.acc);
}

// ---------------------------------------------------------------------------------------------
// arith (our demo task) and the registry.

TEST(Arith, Scores) {
  EXPECT_EQ(arith_compute_score("3*14 = 42\n#### 42", "42").score, 1.0);
  EXPECT_EQ(arith_compute_score("so \\boxed{-7}", "-7").score, 1.0);
  EXPECT_EQ(arith_compute_score("#### 1,024", "1024").score, 1.0);
  EXPECT_EQ(arith_compute_score("#### 41", "42").score, 0.0);
  EXPECT_EQ(arith_compute_score("\\boxed{3.0}", "3").score, 0.0);
  EXPECT_EQ(arith_compute_score("the answer is 42", "42").score, 0.0);
  // "#### n" is preferred over a box.
  ScoreResult r = arith_compute_score("\\boxed{5} #### 6", "6");
  EXPECT_EQ(r.score, 1.0);
  EXPECT_EQ(r.pred, "6");
  EXPECT_THROW(arith_compute_score("#### 1", "one"), Error);
  EXPECT_EQ(arith_parse_integer(" -12 ").value(), -12);
  EXPECT_FALSE(arith_parse_integer("99999999999999999999").has_value());
}

TEST(Registry, ChoosesByDataSource) {
  EXPECT_EQ(default_compute_score("openai/gsm8k", "#### 18", "18").score, 1.0);
  EXPECT_EQ(default_compute_score("openai/gsm8k", "#### 18", 18).score, 1.0);  // number truth
  for (const char* src :
       {"lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"})
    EXPECT_EQ(default_compute_score(src, "\\boxed{\\dfrac12}", "\\frac{1}{2}").score, 1.0) << src;
  EXPECT_EQ(default_compute_score("countdown", "<answer>3+4</answer>",
                                  nlohmann::json{{"target", 7}, {"numbers", {3, 4}}})
                .score,
            1.0);
  EXPECT_EQ(default_compute_score("arith", "#### 12", "12").score, 1.0);
  try {
    default_compute_score("my/dataset", "x", "y");
    FAIL() << "an unknown data_source must throw";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'my/dataset'"), std::string::npos) << msg;
    for (const std::string& s : known_data_sources()) EXPECT_NE(msg.find(s), std::string::npos);
  }
  EXPECT_THROW(default_compute_score("openai/gsm8k", "#### 1", nlohmann::json::array()), Error);
}

}  // namespace
}  // namespace verl::reward
