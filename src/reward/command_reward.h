// A reward function written by the user as a program (custom_reward_function.command): started
// once with /bin/sh -c, fed batches of JSON lines on its stdin, answering one JSON line per row on
// its stdout. Crashes, timeouts and malformed answers are reported per row.
//
// Protocol, one line each way per row (the program must flush after each answer or batch):
//   in:  {"index": i, "data_source": ..., "solution_str": ..., "ground_truth": ..., "extra_info":
//   ...}
//   out: {"index": i, "score": x}        (any order; i is the row's position in the batch)
//        {"index": i, "score": x, "acc": 1, "format": 0.5}   other numbers (booleans as 0/1) are
//        the row's extra info (verl's reward_extra_info: metrics, GDPO's reward components)
//        {"index": i, "error": "why"}    the row failed (a Python reward's exception)
// The program's stderr is passed through to ours.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

namespace verl::reward {

enum class OnError {
  Continue,  // failed rows score 0; a program that failed is restarted for the next batch
  Stop,      // throw an Error naming the first failed row and the cause
};
OnError parse_on_error(std::string_view s);  // "continue" | "stop"

struct CommandRewardConfig {
  std::string command;      // run as /bin/sh -c command
  double timeout_s = 60.0;  // per batch: all rows must be answered within this time
  OnError on_error = OnError::Continue;
};

struct RewardRow {
  std::string data_source;
  std::string solution_str;
  nlohmann::json ground_truth;
  nlohmann::json extra_info;  // null when absent
};

struct RowError {
  int64_t index = 0;  // the row's position in the batch
  std::string message;
};

struct CommandBatchResult {
  std::vector<double> scores;    // one per row; 0 for failed rows
  std::vector<RowError> errors;  // sorted by index; empty when every row was scored
  // The answers' other numeric keys, one value per row (NaN where a row's answer lacks the key or
  // the row failed).
  std::map<std::string, std::vector<double>> extras;
};

class CommandRewardFn {
 public:
  explicit CommandRewardFn(CommandRewardConfig cfg);
  ~CommandRewardFn();
  CommandRewardFn(const CommandRewardFn&) = delete;
  CommandRewardFn& operator=(const CommandRewardFn&) = delete;

  // Scores one batch. With on_error = Stop, any failed row throws (the program is restarted on
  // the next call); with Continue, failed rows are listed in `errors` and score 0.
  CommandBatchResult score(std::span<const RewardRow> rows);

  // How many times the program was started (1 after the first batch; more after restarts).
  int64_t starts() const { return starts_; }
  pid_t pid() const { return pid_; }
  const CommandRewardConfig& config() const { return cfg_; }

 private:
  void start();
  // Ends the program: SIGKILL to its process group, then reaps it. Returns how it ended.
  std::string kill_and_reap();
  // Waits up to `wait_ms` for the program to exit by itself, then kills it; describes how it ended.
  std::string reap(int wait_ms);
  void close_fds();

  CommandRewardConfig cfg_;
  pid_t pid_ = -1;
  int stdin_fd_ = -1;    // our end of the program's stdin (a socket: writes never raise SIGPIPE)
  int stdout_fd_ = -1;   // our end of the program's stdout
  std::string pending_;  // bytes read past the last complete line
  int64_t starts_ = 0;
};

}  // namespace verl::reward
