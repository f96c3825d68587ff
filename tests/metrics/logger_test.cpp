// Tests of the console logger (plain lines off a terminal, '\r' redraws on one), metrics.jsonl
// (parseable lines, append on reopen, repair on resume) and MultiLogger's handling of verl names.
#include "metrics/logger.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../common/test_util.h"
#include "core/error.h"

using namespace verl::metrics;
namespace fs = std::filesystem;

namespace {

// A fresh directory (one per name) in this process's scratch directory, removed at exit.
fs::path fresh_dir(const std::string& name) {
  static const verl::test::TempDir scratch("met");
  const fs::path d = scratch / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read_stream(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
  return s;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string line;
  while (std::getline(ss, line)) out.push_back(line);
  return out;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

Metrics step_metrics(int step) {
  Metrics m;
  m.set("critic/score/mean", 0.5 + 0.01 * step);
  m.set("response_length/mean", 100 + step);
  m.set("actor/pg_loss", -0.125);
  m.set("actor/entropy", 1.5);
  m.set("timing_s/step", 2.0);
  m.set("timing_s/gen", 1.25);
  m.set("perf/throughput", 1234.5);
  return m;
}

}  // namespace

TEST(ConsoleLogger, PlainLinesOnlyOnLoggingStepsWhenNotATerminal) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  LoggerOptions o;
  o.console_stream = f;  // a file: isatty() is false
  o.total_steps = 10;
  o.logging_steps = 3;
  ConsoleLogger c(o);
  EXPECT_FALSE(c.is_tty());
  for (int step = 1; step <= 10; ++step) c.log(step, step_metrics(step));
  c.close();
  const std::string out = read_stream(f);
  std::fclose(f);
  EXPECT_EQ(out.find('\r'), std::string::npos);
  EXPECT_EQ(out.find('\x1b'), std::string::npos);
  std::vector<std::string> progress;
  for (const auto& l : lines_of(out)) {
    if (l.rfind("step ", 0) == 0) progress.push_back(l);
  }
  // Steps 3, 6, 9 (every logging_steps) and 10 (the last).
  ASSERT_EQ(progress.size(), 4u) << out;
  EXPECT_EQ(progress[0].rfind("step 3/10 ", 0), 0u) << progress[0];
  EXPECT_EQ(progress[1].rfind("step 6/10 ", 0), 0u);
  EXPECT_EQ(progress[2].rfind("step 9/10 ", 0), 0u);
  EXPECT_EQ(progress[3].rfind("step 10/10 ", 0), 0u);
  EXPECT_NE(progress[0].find("30.0%"), std::string::npos) << progress[0];
  EXPECT_NE(progress[0].find("reward 0.53"), std::string::npos) << progress[0];
  EXPECT_NE(progress[0].find("resp_len 103"), std::string::npos) << progress[0];
  EXPECT_NE(progress[0].find("step 2.00s"), std::string::npos) << progress[0];
  EXPECT_NE(progress[0].find("eta"), std::string::npos);
  EXPECT_EQ(progress[3].find("eta"), std::string::npos);  // nothing left at the last step
  // One table per printed step, each metric once.
  size_t tables = 0;
  for (size_t p = out.find("perf/throughput: 1234"); p != std::string::npos;
       p = out.find("perf/throughput: 1234", p + 1)) {
    ++tables;
  }
  EXPECT_EQ(tables, 4u);
}

TEST(ConsoleLogger, TerminalRedrawsInPlaceEveryStep) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  LoggerOptions o;
  o.console_stream = f;
  o.console_tty = LoggerOptions::Tty::Yes;
  o.total_steps = 4;
  o.logging_steps = 2;
  ConsoleLogger c(o);
  for (int step = 1; step <= 4; ++step) c.log(step, step_metrics(step));
  c.close();
  const std::string out = read_stream(f);
  std::fclose(f);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\r'), 4);  // one redraw per step
  EXPECT_NE(out.find("\rstep 1/4 "), std::string::npos);
  // Step 2's line is finished with a newline and followed by the table; step 3 redraws after it.
  const size_t s2 = out.find("\rstep 2/4 ");
  const size_t s3 = out.find("\rstep 3/4 ");
  ASSERT_NE(s2, std::string::npos);
  ASSERT_NE(s3, std::string::npos);
  EXPECT_NE(out.substr(s2, s3 - s2).find("actor/entropy: 1.5"), std::string::npos);
  EXPECT_EQ(out.back(), '\n');
}

TEST(ConsoleLogger, TableIsInSectionOrderAndGrouped) {
  LoggerOptions o;
  o.console_columns_per_row = 2;
  std::FILE* f = std::tmpfile();
  o.console_stream = f;
  ConsoleLogger c(o);
  Metrics m = step_metrics(1);
  m.set("actor/lr", 1e-6);
  const auto lines = lines_of(c.table(m));
  std::fclose(f);
  // actor has 3 entries -> 2 lines at 2 per row; each other section starts its own line.
  ASSERT_EQ(lines.size(), 6u) << c.table(m);
  EXPECT_NE(lines[0].find("actor/entropy: 1.5"), std::string::npos);
  EXPECT_NE(lines[0].find("actor/lr: 1e-06"), std::string::npos);
  EXPECT_NE(lines[1].find("actor/pg_loss: -0.125"), std::string::npos);
  EXPECT_NE(lines[2].find("critic/score/mean"), std::string::npos);
  EXPECT_NE(lines[3].find("response_length/mean: 101"), std::string::npos);
  EXPECT_NE(lines[4].find("timing_s/gen: 1.25"), std::string::npos);
  EXPECT_NE(lines[4].find("timing_s/step: 2"), std::string::npos);
  EXPECT_NE(lines[5].find("perf/throughput"), std::string::npos);
}

TEST(Format, ValuesAndDurations) {
  EXPECT_EQ(format_value(3.0), "3");
  EXPECT_EQ(format_value(0.123456), "0.1235");
  EXPECT_EQ(format_value(-2.5e-7), "-2.5e-07");
  EXPECT_EQ(format_value(std::nan("")), "nan");
  EXPECT_EQ(format_duration(65), "01:05");
  EXPECT_EQ(format_duration(3725), "1:02:05");
}

TEST(JsonlLogger, LinesParseAndAppendOnReopen) {
  const fs::path dir = fresh_dir("jsonl_append");
  const std::string path = (dir / "metrics.jsonl").string();
  {
    JsonlLogger j(path);
    for (int step = 1; step <= 3; ++step) j.log(step, step_metrics(step));
    // Flushed every step: the lines are on disk before close.
    EXPECT_EQ(lines_of(slurp(path)).size(), 3u);
  }
  {
    JsonlLogger j(path);
    Metrics m = step_metrics(4);
    m.set("actor/kl_loss", std::nan(""));
    j.log(4, m);
  }
  const auto lines = lines_of(slurp(path));
  ASSERT_EQ(lines.size(), 4u);
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto j = nlohmann::ordered_json::parse(lines[i]);
    EXPECT_EQ(j["step"].get<int64_t>(), static_cast<int64_t>(i + 1));
    EXPECT_EQ(j.begin().key(), "step");  // step first, as verl's file logger
    EXPECT_DOUBLE_EQ(j["critic/score/mean"].get<double>(), 0.5 + 0.01 * (i + 1));
    EXPECT_DOUBLE_EQ(j["timing_s/gen"].get<double>(), 1.25);
  }
  EXPECT_TRUE(nlohmann::json::parse(lines[3])["actor/kl_loss"].is_null());
  fs::remove_all(dir);
}

// A full disk: fwrite only buffers, the failure shows in the flush, and the step's log() must say
// so (naming the file) rather than leave metrics.jsonl empty and let the run succeed.
TEST(JsonlLogger, FullDiskIsAnErrorNamingTheFile) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const fs::path dir = fresh_dir("jsonl_full");
  const std::string path = (dir / "metrics.jsonl").string();
  fs::create_symlink("/dev/full", path);
  JsonlLogger j(path);
  try {
    j.log(1, step_metrics(1));
    FAIL() << "log() on a full disk did not fail";
  } catch (const verl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("jsonl: write to '" + path + "' failed"),
              std::string::npos)
        << e.what();
  }
  MultiLogger multi;
  multi.add("jsonl", std::make_unique<JsonlLogger>(path));
  EXPECT_THROW(multi.log(1, step_metrics(1)), verl::Error);
  fs::remove_all(dir);
}

TEST(JsonlLogger, ResumeDropsPartialLineAndStepsToBeRerun) {
  const fs::path dir = fresh_dir("jsonl_resume");
  const std::string path = (dir / "metrics.jsonl").string();
  {
    JsonlLogger j(path);
    for (int step = 1; step <= 5; ++step) j.log(step, step_metrics(step));
  }
  {  // the run was killed while writing step 6
    std::ofstream out(path, std::ios::app | std::ios::binary);
    out << "{\"step\": 6, \"critic/sc";
  }
  {  // resumed from the checkpoint of step 3: steps 4 and 5 will run again
    JsonlLogger j(path, /*resume_step=*/3);
    j.log(4, step_metrics(4));
  }
  const auto lines = lines_of(slurp(path));
  ASSERT_EQ(lines.size(), 4u) << slurp(path);
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(nlohmann::json::parse(lines[i])["step"].get<int64_t>(), static_cast<int64_t>(i + 1));
  }
  // Without a resume step, only the partial line goes.
  {
    std::ofstream out(path, std::ios::app | std::ios::binary);
    out << "{\"step\": 5, \"x";
  }
  { JsonlLogger j(path); }
  EXPECT_EQ(lines_of(slurp(path)).size(), 4u);
  fs::remove_all(dir);
}

TEST(MultiLogger, BuildsFromVerlNamesAndSkipsUnavailable) {
  const fs::path dir = fresh_dir("multi");
  std::FILE* f = std::tmpfile();
  LoggerOptions o;
  o.experiment_dir = dir.string();
  o.console_stream = f;
  {
    MultiLogger ml({"console", "file", "jsonl", "wandb", "tensorboard", "swanlab", "nonsense"}, o);
    const std::vector<std::string> active = {"console", "jsonl", "tensorboard"};
    const std::vector<std::string> skipped = {"wandb", "swanlab", "nonsense"};
    EXPECT_EQ(ml.active(), active);
    EXPECT_EQ(ml.skipped(), skipped);
    ml.log(1, step_metrics(1));
    ml.log(2, step_metrics(2));
    ml.close();
  }
  EXPECT_EQ(lines_of(slurp(dir / "metrics.jsonl")).size(), 2u);  // "file" and "jsonl": one file
  const auto tb = list_tfevents((dir / "tensorboard").string());
  ASSERT_EQ(tb.size(), 1u);
  EXPECT_EQ(read_tfevents(tb[0]).scalars.size(), 2 * step_metrics(1).size());
  EXPECT_NE(read_stream(f).find("step 2"), std::string::npos);
  std::fclose(f);
  fs::remove_all(dir);
}
