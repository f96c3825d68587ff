// Tests of CommandRewardFn (src/reward/command_reward.*) with small /bin/sh and python3 programs
// written to a temporary directory: scoring, out-of-order answers, a persistent process across
// batches, large batches, and each failure (crash, timeout, garbage, missing score, wrong index)
// under on_error = continue and stop.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "core/error.h"
#include "reward/command_reward.h"

namespace verl::reward {
namespace {

namespace fs = std::filesystem;

class CommandReward : public ::testing::Test {
 protected:
  // Writes a script and returns its path.
  std::string script(const std::string& name, const std::string& text) {
    fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }

  std::string py(const std::string& name, const std::string& body) {
    return "python3 " + script(name, "import json, sys\n" + body);
  }

  static std::vector<RewardRow> rows(int n, int base = 0) {
    std::vector<RewardRow> r(n);
    for (int i = 0; i < n; ++i) {
      r[i].data_source = "test";
      r[i].solution_str = std::string(i + 1, 'a');
      r[i].ground_truth = std::to_string(base + i);
      r[i].extra_info = {{"split", "train"}};
    }
    return r;
  }

  const test::TempDir dir_{"cmd_reward"};  // one per test: gtest makes a fixture per test
};

// Answers each row with score = len(solution_str) + int(ground_truth) / 100, echoing extra_info.
const char* kEcho = R"(
for line in sys.stdin:
    row = json.loads(line)
    assert row["data_source"] == "test" and row["extra_info"]["split"] == "train"
    s = len(row["solution_str"]) + int(row["ground_truth"]) / 100
    print(json.dumps({"index": row["index"], "score": s}), flush=True)
)";

TEST_F(CommandReward, ScoresAndKeepsTheProcessAcrossBatches) {
  CommandRewardFn fn({py("echo.py", kEcho), 10.0, OnError::Stop});
  CommandBatchResult r = fn.score(rows(3));
  EXPECT_TRUE(r.errors.empty());
  ASSERT_EQ(r.scores.size(), 3u);
  EXPECT_DOUBLE_EQ(r.scores[0], 1.00);
  EXPECT_DOUBLE_EQ(r.scores[1], 2.01);
  EXPECT_DOUBLE_EQ(r.scores[2], 3.02);
  pid_t first = fn.pid();
  r = fn.score(rows(2, 50));
  ASSERT_EQ(r.scores.size(), 2u);
  EXPECT_DOUBLE_EQ(r.scores[0], 1.50);
  EXPECT_DOUBLE_EQ(r.scores[1], 2.51);
  EXPECT_EQ(fn.pid(), first);
  EXPECT_EQ(fn.starts(), 1);
  EXPECT_TRUE(fn.score({}).scores.empty());
}

TEST_F(CommandReward, OutOfOrderAnswersAreMatchedByIndex) {
  // Reads pairs of rows and answers them in reverse; scores = 10 * index.
  std::string cmd = py("rev.py", R"(
pending = []
for line in sys.stdin:
    pending.append(json.loads(line))
    if len(pending) == 2:
        for row in reversed(pending):
            print(json.dumps({"index": row["index"], "score": 10 * row["index"]}), flush=True)
        pending = []
)");
  CommandRewardFn fn({cmd, 10.0, OnError::Stop});
  CommandBatchResult r = fn.score(rows(4));
  EXPECT_EQ(r.scores, (std::vector<double>{0, 10, 20, 30}));
}

TEST_F(CommandReward, LargeBatchDoesNotDeadlock) {
  // 3000 rows of 2 KB each: far more than a pipe buffer in both directions at once.
  std::vector<RewardRow> big(3000);
  for (size_t i = 0; i < big.size(); ++i) {
    big[i].data_source = "test";
    big[i].solution_str = std::string(2048, 'z');
    big[i].ground_truth = std::to_string(i);
    big[i].extra_info = {{"split", "train"}};
  }
  CommandRewardFn fn({py("echo.py", kEcho), 60.0, OnError::Stop});
  CommandBatchResult r = fn.score(big);
  ASSERT_EQ(r.scores.size(), big.size());
  EXPECT_DOUBLE_EQ(r.scores[0], 2048.0);
  EXPECT_DOUBLE_EQ(r.scores[2999], 2048 + 29.99);
}

TEST_F(CommandReward, ShellProgram) {
  // A plain shell loop: every row scores 1.
  std::string cmd = "sh " + script("ones.sh", R"(i=0
while read -r line; do
  echo "{\"index\": $i, \"score\": 1}"
  i=$((i+1))
done
)");
  CommandRewardFn fn({cmd, 10.0, OnError::Stop});
  EXPECT_EQ(fn.score(rows(3)).scores, (std::vector<double>{1, 1, 1}));
}

TEST_F(CommandReward, CrashIsReportedPerRowAndRestarts) {
  // Answers the first row of each batch, then exits with status 3.
  std::string cmd = py("crash.py", R"(
row = json.loads(sys.stdin.readline())
print(json.dumps({"index": row["index"], "score": 0.5}), flush=True)
sys.exit(3)
)");
  CommandRewardFn fn({cmd, 10.0, OnError::Continue});
  CommandBatchResult r = fn.score(rows(3));
  EXPECT_EQ(r.scores, (std::vector<double>{0.5, 0, 0}));
  ASSERT_EQ(r.errors.size(), 2u);
  EXPECT_EQ(r.errors[0].index, 1);
  EXPECT_EQ(r.errors[1].index, 2);
  EXPECT_NE(r.errors[0].message.find("exited with status 3"), std::string::npos)
      << r.errors[0].message;
  // The next batch runs on a fresh program.
  r = fn.score(rows(2));
  EXPECT_EQ(fn.starts(), 2);
  EXPECT_EQ(r.scores[0], 0.5);
  EXPECT_EQ(r.errors.size(), 1u);

  CommandRewardFn stop({cmd, 10.0, OnError::Stop});
  try {
    stop.score(rows(3));
    FAIL() << "on_error = stop must throw";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("row 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("exited with status 3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1 more rows failed"), std::string::npos) << msg;
  }
}

TEST_F(CommandReward, TimeoutKillsTheProgram) {
  // Reads its input and never answers.
  std::string cmd = "sh " + script("slow.sh", "cat > /dev/null\n");
  CommandRewardFn fn({cmd, 0.3, OnError::Continue});
  CommandBatchResult r = fn.score(rows(2));
  EXPECT_EQ(r.scores, (std::vector<double>{0, 0}));
  ASSERT_EQ(r.errors.size(), 2u);
  EXPECT_NE(r.errors[1].message.find("timeout_s = 0.3"), std::string::npos) << r.errors[1].message;
  EXPECT_EQ(fn.pid(), -1);  // killed and reaped
  fn.score(rows(1));
  EXPECT_EQ(fn.starts(), 2);
}

TEST_F(CommandReward, GarbageOutput) {
  std::string cmd = py("garbage.py", R"(
for line in sys.stdin:
    print("the score is high", flush=True)
)");
  CommandRewardFn fn({cmd, 10.0, OnError::Continue});
  CommandBatchResult r = fn.score(rows(2));
  ASSERT_EQ(r.errors.size(), 2u);
  EXPECT_NE(r.errors[0].message.find("not JSON"), std::string::npos) << r.errors[0].message;
  EXPECT_NE(r.errors[0].message.find("the score is high"), std::string::npos);

  CommandRewardFn stop({cmd, 10.0, OnError::Stop});
  EXPECT_THROW(stop.score(rows(2)), Error);
}

TEST_F(CommandReward, MissingScoreAndWrongIndex) {
  // Row 0 gets no score; then an answer for an index outside the batch.
  std::string cmd = py("bad.py", R"(
for line in sys.stdin:
    row = json.loads(line)
    if row["index"] == 0:
        print(json.dumps({"index": 0, "value": 1}), flush=True)
    elif row["index"] == 1:
        print(json.dumps({"index": 1, "score": 0.75}), flush=True)
    else:
        print(json.dumps({"index": 99, "score": 1}), flush=True)
)");
  CommandRewardFn fn({cmd, 10.0, OnError::Continue});
  CommandBatchResult r = fn.score(rows(3));
  EXPECT_EQ(r.scores, (std::vector<double>{0, 0.75, 0}));
  ASSERT_EQ(r.errors.size(), 2u);
  EXPECT_EQ(r.errors[0].index, 0);
  EXPECT_NE(r.errors[0].message.find("no numeric \"score\""), std::string::npos)
      << r.errors[0].message;
  EXPECT_EQ(r.errors[1].index, 2);
  EXPECT_NE(r.errors[1].message.find("index 99"), std::string::npos) << r.errors[1].message;
}

// A score beyond 1e9 fails its row: 1e308 used to pass, become inf as a float32 reward, and turn
// the whole step's advantages into NaN (every update skipped, rc 0).
TEST_F(CommandReward, HugeScoresFailTheirRow) {
  std::string cmd = py("huge.py", R"(
for line in sys.stdin:
    row = json.loads(line)
    print(json.dumps({"index": row["index"], "score": [1e308, -2e9, 1e9, -0.5][row["index"]]}), flush=True)
)");
  CommandRewardFn fn({cmd, 10.0, OnError::Continue});
  CommandBatchResult r = fn.score(rows(4));
  EXPECT_EQ(r.scores, (std::vector<double>{0, 0, 1e9, -0.5}));
  ASSERT_EQ(r.errors.size(), 2u);
  EXPECT_EQ(r.errors[0].index, 0);
  EXPECT_NE(r.errors[0].message.find("the score 1e+308 is outside [-1e+09, 1e+09]"),
            std::string::npos)
      << r.errors[0].message;
  EXPECT_EQ(r.errors[1].index, 1);
}

TEST_F(CommandReward, BadConfig) {
  EXPECT_THROW(CommandRewardFn({"", 1.0, OnError::Stop}), Error);
  EXPECT_THROW(CommandRewardFn({"true", 0.0, OnError::Stop}), Error);
  EXPECT_EQ(parse_on_error("continue"), OnError::Continue);
  EXPECT_THROW(parse_on_error("ignore"), Error);
  // A command that does not exist: the shell exits 127 at once.
  CommandRewardFn fn({"/nonexistent/reward-program", 10.0, OnError::Continue});
  CommandBatchResult r = fn.score(rows(1));
  ASSERT_EQ(r.errors.size(), 1u);
  EXPECT_NE(r.errors[0].message.find("status 127"), std::string::npos) << r.errors[0].message;
}

}  // namespace
}  // namespace verl::reward
