// Metric loggers selected by verl's `trainer.logger` list: console (progress line + metric table),
// jsonl / file (metrics.jsonl, one line per step), tensorboard (event files written by hand).
// Backends verl knows but we do not have (wandb, swanlab, mlflow, ...) are skipped with a warning.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "metrics/metrics.h"
#include "metrics/tfevents.h"

namespace verl::metrics {

class Logger {
 public:
  virtual ~Logger() = default;
  virtual void log(int64_t step, const Metrics& metrics) = 0;
  virtual void flush() {}
  // Flushes and releases files; later log() calls are errors or no-ops depending on the backend.
  virtual void close() {}
};

struct LoggerOptions {
  std::string experiment_dir = ".";  // metrics.jsonl goes here
  std::string tensorboard_dir;       // empty: <experiment_dir>/tensorboard (verl: $TENSORBOARD_DIR)
  int64_t total_steps = 0;           // for the progress bar and ETA; 0: unknown
  int64_t logging_steps = 1;         // console: table (and plain line) every this many steps
  // jsonl on resume: lines with a step above this are dropped before appending (they belong to
  // steps that will be run again); -1 keeps every existing line.
  int64_t resume_step = -1;
  // Console only: where to write (nullptr: stdout) and whether it is a terminal (Auto: isatty).
  std::FILE* console_stream = nullptr;
  enum class Tty { Auto, Yes, No } console_tty = Tty::Auto;
  int console_columns_per_row = 3;  // metric table entries per line
};

// Progress bar and metric table. On a terminal the progress line is redrawn in place with '\r'
// every step; elsewhere (a file, a pipe, a cluster log) one plain line is printed every
// `logging_steps` steps and on the last step, so logs stay readable. The table follows the line
// on the same steps, in verl's section order.
class ConsoleLogger : public Logger {
 public:
  explicit ConsoleLogger(const LoggerOptions& opts);
  void log(int64_t step, const Metrics& metrics) override;
  void flush() override;
  void close() override;
  bool is_tty() const { return tty_; }

  // The progress line's text without '\r' (exposed for tests); elapsed is seconds since the
  // first logged step began, steps_done the number of steps logged so far.
  std::string progress_line(int64_t step, const Metrics& m, double elapsed,
                            int64_t steps_done) const;
  // The metric table (multi-line, ends with '\n').
  std::string table(const Metrics& m) const;

 private:
  std::FILE* out_;
  bool tty_;
  bool line_open_ = false;  // a '\r' progress line is on screen without its newline
  int64_t total_;
  int64_t every_;
  int columns_;
  double start_ = -1.0;
  int64_t first_step_ = -1;
  double last_time_ = -1.0;
};

// metrics.jsonl: `{"step": N, "<name>": value, ...}` per step, flushed at once so a killed run
// keeps its lines; opened in append mode so a resumed run continues the same file. Non-finite
// values are written as null.
class JsonlLogger : public Logger {
 public:
  // `path` is the file itself; see LoggerOptions::resume_step.
  explicit JsonlLogger(const std::string& path, int64_t resume_step = -1);
  ~JsonlLogger() override;
  void log(int64_t step, const Metrics& metrics) override;
  void flush() override;
  void close() override;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// TensorBoard scalars: one event per metric, tag = metric name, flushed every step.
class TensorBoardLogger : public Logger {
 public:
  explicit TensorBoardLogger(const std::string& dir);
  void log(int64_t step, const Metrics& metrics) override;
  void flush() override;
  void close() override;
  const std::string& path() const { return writer_.path(); }

 private:
  TfEventsWriter writer_;
};

// Fans each call out to the loggers named in `trainer.logger`.
class MultiLogger : public Logger {
 public:
  MultiLogger() = default;
  // Names: console, jsonl (or file), tensorboard. verl names we lack (wandb, swanlab, mlflow,
  // vemlp_wandb, clearml, trackio, ...) and unknown names are skipped with a warning.
  MultiLogger(const std::vector<std::string>& names, const LoggerOptions& opts);
  ~MultiLogger() override;
  void add(std::string name, std::unique_ptr<Logger> logger);
  void log(int64_t step, const Metrics& metrics) override;
  void flush() override;
  void close() override;
  // Backends actually active, in order (jsonl for "file").
  const std::vector<std::string>& active() const { return names_; }
  // Names that were asked for but skipped.
  const std::vector<std::string>& skipped() const { return skipped_; }

 private:
  std::vector<std::string> names_;
  std::vector<std::string> skipped_;
  std::vector<std::unique_ptr<Logger>> loggers_;
};

// Seconds since the Unix epoch (TensorBoard's wall_time).
double unix_time_now();
// A metric value for humans: integers without a fraction, others with 4 significant digits.
std::string format_value(double v);
// "1:02:03" / "02:03".
std::string format_duration(double seconds);

}  // namespace verl::metrics
