// `verl reward`: scores JSON lines {"data_source", "solution_str", "ground_truth", "extra_info"?}
// with the built-in rule scorers (chosen by data_source, as verl's default_compute_score) or with
// a user's reward program (--command), writing one line per input: {"score", "acc", "pred"} from
// the scorers, {"score"} (plus "error" for a failed row) from a command.
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/io.h"
#include "core/error.h"
#include "core/json_depth.h"
#include "core/log.h"
#include "reward/command_reward.h"
#include "reward/score.h"

namespace verl::cli {
namespace {

struct Opts {
  std::string input = "-", output = "-", command, on_error = "stop";
  double timeout_s = 60.0;
  int64_t batch_size = 256;
};

reward::RewardRow parse_row(const std::string& line, const std::string& src, int64_t lineno) {
  check_json_depth(line, fmt::format("{}:{}", src, lineno));
  nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  VERL_CHECK(!j.is_discarded(), "{}:{}: not valid JSON", src, lineno);
  VERL_CHECK(j.is_object(), "{}:{}: expected a JSON object", src, lineno);
  for (const char* key : {"data_source", "solution_str"})
    VERL_CHECK(j.contains(key) && j[key].is_string(), "{}:{}: \"{}\" must be a string", src, lineno,
               key);
  VERL_CHECK(j.contains("ground_truth"), "{}:{}: \"ground_truth\" is missing", src, lineno);
  reward::RewardRow row;
  row.data_source = j["data_source"].get<std::string>();
  row.solution_str = j["solution_str"].get<std::string>();
  row.ground_truth = j["ground_truth"];
  if (j.contains("extra_info")) row.extra_info = j["extra_info"];
  return row;
}

int run(const Opts& o) {
  VERL_CHECK(o.batch_size > 0, "--batch-size must be > 0, got {}", o.batch_size);
  InputLines in(o.input);
  const std::string& src = in.source();
  Output output(o.output);
  std::ostream& out = output.stream();

  std::unique_ptr<reward::CommandRewardFn> fn;
  if (!o.command.empty()) {
    reward::CommandRewardConfig cfg;
    cfg.command = o.command;
    cfg.timeout_s = o.timeout_s;
    cfg.on_error = reward::parse_on_error(o.on_error);
    fn = std::make_unique<reward::CommandRewardFn>(cfg);
  }

  std::vector<reward::RewardRow> batch;
  std::vector<int64_t> batch_lines;
  auto flush = [&] {
    if (batch.empty()) return;
    reward::CommandBatchResult r;
    try {
      r = fn->score(batch);
    } catch (const Error& e) {
      VERL_FAIL("{}: lines {}-{} (rows are numbered from 0 in the batch): {}", src,
                batch_lines.front(), batch_lines.back(), e.what());
    }
    if (!r.errors.empty()) {
      const reward::RowError& first = r.errors.front();
      log::warn(
          "{}: lines {}-{}: the reward command failed {} of {} rows, which score 0 (each has an "
          "\"error\" "
          "in the output); the first, line {}: {}",
          src, batch_lines.front(), batch_lines.back(), r.errors.size(), batch.size(),
          batch_lines[first.index], first.message);
    }
    size_t e = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
      nlohmann::json j = {{"score", r.scores[i]}};
      if (e < r.errors.size() && r.errors[e].index == static_cast<int64_t>(i))
        j["error"] = fmt::format("{}:{}: {}", src, batch_lines[i], r.errors[e++].message);
      out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    }
    out.flush();
    batch.clear();
    batch_lines.clear();
  };

  std::string line;
  while (in.next(line)) {
    const int64_t lineno = in.lineno();
    reward::RewardRow row = parse_row(line, src, lineno);
    if (fn) {
      batch.push_back(std::move(row));
      batch_lines.push_back(lineno);
      if (static_cast<int64_t>(batch.size()) >= o.batch_size) flush();
      continue;
    }
    reward::ScoreResult s;
    try {
      s = reward::default_compute_score(row.data_source, row.solution_str, row.ground_truth,
                                        row.extra_info);
    } catch (const Error& e) {
      VERL_FAIL("{}:{}: {}", src, lineno, e.what());
    }
    nlohmann::json j = {{"score", s.score}, {"acc", s.acc}, {"pred", s.pred}};
    out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  }
  if (fn) flush();
  return 0;
}

Command reg("reward", "Score responses with the rule-based scorers or a reward command",
            [](CLI::App& app) -> Action {
              auto o = std::make_shared<Opts>();
              app.add_option("--input", o->input,
                             "JSONL of {data_source, solution_str, ground_truth, extra_info?}, "
                             "- for stdin");
              app.add_option("--output", o->output, "output JSONL file, - for stdout");
              app.add_option("--command", o->command,
                             "score with this program (/bin/sh -c) instead of the built-in "
                             "scorers (custom_reward_function.command)");
              app.add_option("--timeout", o->timeout_s, "seconds per batch for --command");
              app.add_option("--on-error", o->on_error,
                             "continue (failed rows score 0) | stop (exit with the error)");
              app.add_option("--batch-size", o->batch_size, "rows per batch for --command");
              return [o] { return run(*o); };
            });

}  // namespace
}  // namespace verl::cli
