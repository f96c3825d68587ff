// Tests of the Python reward bridge (src/reward/python_reward.*): a scoring function in verl's
// form scored through the command protocol, its dict results as extras, a crash, a non-numeric
// score and a hang as per-row errors, and the start-up check's errors; plus the command
// protocol's extras and "error" answers (src/reward/command_reward.*).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "core/error.h"
#include "reward/command_reward.h"
#include "reward/python_reward.h"

namespace verl::reward {
namespace {

class PythonReward : public ::testing::Test {
 protected:
  std::string file(const std::string& name, const std::string& text) {
    const std::string p = (dir_.path() / name).string();
    std::ofstream(p) << text;
    return p;
  }
  CommandRewardFn make(const PythonRewardSpec& spec, double timeout_s = 20.0) {
    return CommandRewardFn({python_reward_command(spec), timeout_s, OnError::Continue});
  }
  static std::vector<RewardRow> rows(const std::vector<std::string>& answers) {
    std::vector<RewardRow> r(answers.size());
    for (size_t i = 0; i < answers.size(); ++i) {
      r[i].data_source = "arith";
      r[i].solution_str = answers[i];
      r[i].ground_truth = "42";
      r[i].extra_info = {{"index", static_cast<int>(i)}};
    }
    return r;
  }
  const test::TempDir dir_{"py_reward"};
};

// verl's form: keyword arguments, a dict with "score" and other numbers; prints go to stderr.
const char* kScorer = R"(
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    print("scoring", extra_info["index"])  # must not break the protocol
    right = solution_str.strip().endswith(ground_truth)
    return {"score": (1.0 if right else 0.0) + bonus, "format": 0.5 * extra_info["index"],
            "right": right, "note": "strings are not extras"}

def plain(data_source, solution_str, ground_truth, extra_info=None):
    return len(solution_str)

def fails(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "boom":
        raise RuntimeError("exploded on purpose")
    if solution_str == "text":
        return "not a number"
    if solution_str == "nan":
        return float("nan")
    return 1

def hangs(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "hang":
        import time
        time.sleep(60)
    return 1
)";

TEST_F(PythonReward, ScoresADictResultWithExtrasAndKwargs) {
  PythonRewardSpec spec{file("r.py", kScorer), "compute_score"};
  spec.kwargs = {{"bonus", 0.25}};
  check_python_reward(spec);
  CommandRewardFn fn = make(spec);
  CommandBatchResult r = fn.score(rows({"#### 42", "#### 41", "x 42"}));
  ASSERT_TRUE(r.errors.empty()) << r.errors[0].message;
  EXPECT_EQ(r.scores, (std::vector<double>{1.25, 0.25, 1.25}));
  ASSERT_EQ(r.extras.size(), 2u);  // format, right (booleans count; strings do not)
  EXPECT_EQ(r.extras.at("format"), (std::vector<double>{0.0, 0.5, 1.0}));
  EXPECT_EQ(r.extras.at("right"), (std::vector<double>{1.0, 0.0, 1.0}));
  // The process stays for the next batch.
  const pid_t pid = fn.pid();
  r = fn.score(rows({"42"}));
  EXPECT_EQ(r.scores, (std::vector<double>{1.25}));
  EXPECT_EQ(fn.pid(), pid);
}

TEST_F(PythonReward, APlainNumberIsAlsoTheAcc) {
  CommandRewardFn fn = make({file("r.py", kScorer), "plain"});
  CommandBatchResult r = fn.score(rows({"abc", "abcdefg"}));
  ASSERT_TRUE(r.errors.empty());
  EXPECT_EQ(r.scores, (std::vector<double>{3, 7}));
  EXPECT_EQ(r.extras.at("acc"), (std::vector<double>{3, 7}));
}

TEST_F(PythonReward, ARaisingOrNonNumericRowIsThatRowsError) {
  CommandRewardFn fn = make({file("r.py", kScorer), "fails"});
  CommandBatchResult r = fn.score(rows({"ok", "boom", "text", "nan", "ok"}));
  EXPECT_EQ(r.scores, (std::vector<double>{1, 0, 0, 0, 1}));
  ASSERT_EQ(r.errors.size(), 3u);
  EXPECT_EQ(r.errors[0].index, 1);
  EXPECT_NE(r.errors[0].message.find("RuntimeError: exploded on purpose"), std::string::npos)
      << r.errors[0].message;
  EXPECT_NE(r.errors[1].message.find("'not a number' is not a finite number"), std::string::npos)
      << r.errors[1].message;
  EXPECT_NE(r.errors[2].message.find("nan"), std::string::npos) << r.errors[2].message;
  EXPECT_TRUE(std::isnan(r.extras.at("acc")[1]));
  EXPECT_EQ(r.extras.at("acc")[4], 1.0);
}

TEST_F(PythonReward, AHangingFunctionTimesOut) {
  CommandRewardFn fn = make({file("r.py", kScorer), "hangs"}, 4.0);
  CommandBatchResult r = fn.score(rows({"ok", "hang"}));
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_EQ(r.errors[0].index, 1);
  EXPECT_NE(r.errors[0].message.find("timeout_s"), std::string::npos) << r.errors[0].message;
  EXPECT_EQ(r.scores[0], 1.0);
  // The killed program starts afresh for the next batch.
  r = fn.score(rows({"ok"}));
  EXPECT_TRUE(r.errors.empty());
  EXPECT_EQ(fn.starts(), 2);
}

TEST_F(PythonReward, TheStartupCheckNamesWhatIsWrong) {
  const std::string good = file("r.py", kScorer);
  EXPECT_NE(test::expected_error_of([&] {
              check_python_reward({good, "missing_fn"});
            }).find("has no function 'missing_fn'"),
            std::string::npos);
  const std::string broken = file("broken.py", "import not_a_module_anywhere\n");
  const std::string e1 = test::expected_error_of([&] {
    check_python_reward({broken, "compute_score"});
  });
  EXPECT_NE(e1.find("importing " + broken + " failed"), std::string::npos) << e1;
  EXPECT_NE(e1.find("not_a_module_anywhere"), std::string::npos) << e1;
  const std::string e2 = test::expected_error_of([&] {
    check_python_reward({(dir_.path() / "nope.py").string(), "compute_score"});
  });
  EXPECT_NE(e2.find("nope.py (function 'compute_score'): no such file"), std::string::npos) << e2;
  PythonRewardSpec no_python{good, "compute_score", "no-such-python-here"};
  const std::string e3 = test::expected_error_of([&] { check_python_reward(no_python); });
  EXPECT_NE(e3.find("cannot start the Python interpreter 'no-such-python-here'"), std::string::npos)
      << e3;
}

TEST_F(PythonReward, QuotesPathsWithSpacesAndQuotes) {
  const std::string p = file("it's a reward.py", kScorer);
  CommandRewardFn fn = make({p, "plain"});
  CommandBatchResult r = fn.score(rows({"abcd"}));
  ASSERT_TRUE(r.errors.empty()) << r.errors[0].message;
  EXPECT_EQ(r.scores, (std::vector<double>{4}));
}

}  // namespace
}  // namespace verl::reward
