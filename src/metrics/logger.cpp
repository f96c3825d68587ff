// Console, JSONL and TensorBoard loggers, and the MultiLogger that builds them from verl's
// `trainer.logger` list.
#include "metrics/logger.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/json_depth.h"
#include "core/log.h"

namespace verl::metrics {

namespace fs = std::filesystem;

double unix_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string format_value(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{:.0f}", v);
  return fmt::format("{:.4g}", v);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  const int64_t h = s / 3600, m = (s / 60) % 60, sec = s % 60;
  if (h > 0) return fmt::format("{}:{:02d}:{:02d}", h, m, sec);
  return fmt::format("{:02d}:{:02d}", m, sec);
}

namespace {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void write_all(std::FILE* f, const std::string& s) {
  if (!s.empty()) std::fwrite(s.data(), 1, s.size(), f);
}

std::string_view section_of(std::string_view name) {
  const auto slash = name.find('/');
  return slash == std::string_view::npos ? std::string_view{} : name.substr(0, slash);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Console

ConsoleLogger::ConsoleLogger(const LoggerOptions& opts)
    : out_(opts.console_stream != nullptr ? opts.console_stream : stdout),
      total_(opts.total_steps),
      every_(std::max<int64_t>(1, opts.logging_steps)),
      columns_(std::max(1, opts.console_columns_per_row)),
      start_(steady_seconds()) {
  switch (opts.console_tty) {
    case LoggerOptions::Tty::Yes:
      tty_ = true;
      break;
    case LoggerOptions::Tty::No:
      tty_ = false;
      break;
    case LoggerOptions::Tty::Auto:
      tty_ = isatty(fileno(out_)) != 0;
      break;
  }
}

std::string ConsoleLogger::progress_line(int64_t step, const Metrics& m, double elapsed,
                                         int64_t steps_done) const {
  std::string line;
  if (total_ > 0) {
    constexpr int kBarWidth = 20;
    const double frac =
        std::clamp(static_cast<double>(step) / static_cast<double>(total_), 0.0, 1.0);
    const int filled = static_cast<int>(frac * kBarWidth);
    line = fmt::format("step {}/{} [{}{}] {:5.1f}%", step, total_, std::string(filled, '#'),
                       std::string(kBarWidth - filled, '.'), 100.0 * frac);
    line += " | elapsed " + format_duration(elapsed);
    if (steps_done > 0 && step < total_) {
      const double eta =
          elapsed / static_cast<double>(steps_done) * static_cast<double>(total_ - step);
      line += " eta " + format_duration(eta);
    }
  } else {
    line = fmt::format("step {} | elapsed {}", step, format_duration(elapsed));
  }
  const char* reward_key = m.contains("critic/score/mean")     ? "critic/score/mean"
                           : m.contains("critic/rewards/mean") ? "critic/rewards/mean"
                                                               : nullptr;
  if (reward_key != nullptr) line += " | reward " + format_value(m.get(reward_key));
  if (m.contains("response_length/mean")) {
    line += " | resp_len " + format_value(m.get("response_length/mean"));
  }
  const char* time_key = m.contains("timing_s/step")        ? "timing_s/step"
                         : m.contains("perf/time_per_step") ? "perf/time_per_step"
                                                            : nullptr;
  if (time_key != nullptr) line += fmt::format(" | step {:.2f}s", m.get(time_key));
  return line;
}

std::string ConsoleLogger::table(const Metrics& m) const {
  const auto names = sorted_names(m);
  std::vector<std::string> cells;
  cells.reserve(names.size());
  size_t width = 0;
  for (const auto& n : names) {
    cells.push_back(n + ": " + format_value(m.get(n)));
    width = std::max(width, cells.back().size());
  }
  std::string out;
  int in_row = 0;
  std::string_view prev_section;
  for (size_t i = 0; i < names.size(); ++i) {
    const auto section = section_of(names[i]);
    // A new section, or a full row, starts a new line.
    if (in_row > 0 && (in_row == columns_ || section != prev_section)) {
      while (!out.empty() && out.back() == ' ') out.pop_back();
      out += '\n';
      in_row = 0;
    }
    if (in_row == 0) out += "  ";
    out += cells[i];
    out += std::string(width - cells[i].size() + 2, ' ');
    ++in_row;
    prev_section = section;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  if (!out.empty()) out += '\n';
  return out;
}

void ConsoleLogger::log(int64_t step, const Metrics& metrics) {
  if (first_step_ < 0) first_step_ = step;
  const double elapsed = steady_seconds() - start_;
  const int64_t steps_done = step - first_step_ + 1;
  const bool on_schedule = (step % every_ == 0) || (total_ > 0 && step == total_);
  const std::string line = progress_line(step, metrics, elapsed, steps_done);
  std::string out;
  if (tty_) {
    // Redraw in place; "\x1b[K" clears what a longer previous line left on screen.
    out = "\r" + line + "\x1b[K";
    line_open_ = true;
    if (on_schedule) {
      out += '\n';
      out += table(metrics);
      line_open_ = false;
    }
  } else if (on_schedule) {
    out = line + '\n' + table(metrics);
  }
  write_all(out_, out);
  std::fflush(out_);
}

void ConsoleLogger::flush() {
  std::fflush(out_);
}

void ConsoleLogger::close() {
  if (tty_ && line_open_) {
    write_all(out_, "\n");
    line_open_ = false;
  }
  std::fflush(out_);
}

// ---------------------------------------------------------------------------------------------
// JSONL

namespace {

// Keeps the complete lines of an existing metrics.jsonl: a partial last line (the run was killed
// mid-write) is dropped, and on resume so are the steps that will be run again.
void repair_jsonl(const std::string& path, int64_t resume_step) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return;  // nothing to repair (or a device: not read)
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) return;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  in.close();
  std::string kept;
  size_t pos = 0, dropped = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) {  // partial last line
      ++dropped;
      break;
    }
    const std::string_view line(text.data() + pos, nl - pos);
    pos = nl + 1;
    bool keep = true;
    if (resume_step >= 0 && !line.empty()) {
      // A line nested past the bound is not one of ours: dropped like any other broken line.
      const auto j = json_depth_ok(line)
                         ? nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false)
                         : nlohmann::json(nlohmann::json::value_t::discarded);
      keep = j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
             j["step"].get<int64_t>() <= resume_step;
    }
    if (keep) {
      kept.append(line);
      kept += '\n';
    } else {
      ++dropped;
    }
  }
  if (dropped == 0) return;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << kept;
    out.flush();
    VERL_CHECK(out.good(), "jsonl: cannot rewrite '{}' (via '{}')", path, tmp);
  }
  fs::rename(tmp, path);
  if (resume_step >= 0) {
    log::info("jsonl: dropped {} line(s) of '{}' (a partial line, or steps after resume step {})",
              dropped, path, resume_step);
  } else {
    log::info("jsonl: dropped the partial last line of '{}' (the run was interrupted)", path);
  }
}

}  // namespace

JsonlLogger::JsonlLogger(const std::string& path, int64_t resume_step) : path_(path) {
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    VERL_CHECK(!ec, "jsonl: cannot create directory '{}': {}", parent.string(), ec.message());
  }
  repair_jsonl(path, resume_step);
  file_ = std::fopen(path.c_str(), "ab");
  VERL_CHECK(file_ != nullptr, "jsonl: cannot open '{}' for appending", path);
}

JsonlLogger::~JsonlLogger() {
  try {
    close();
  } catch (...) {
    // Destructors must not throw; close() explicitly to see errors.
  }
}

void JsonlLogger::log(int64_t step, const Metrics& metrics) {
  VERL_CHECK(file_ != nullptr, "jsonl: '{}' is closed", path_);
  nlohmann::ordered_json j;
  j["step"] = step;
  for (const auto& [k, v] : metrics) {
    if (std::isfinite(v)) {
      j[k] = v;
    } else {
      j[k] = nullptr;
    }
  }
  std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  line += '\n';
  // fwrite only buffers: a full disk shows in the flush, which happens every step so that a killed
  // run keeps every finished step.
  VERL_CHECK(
      std::fwrite(line.data(), 1, line.size(), file_) == line.size() && std::fflush(file_) == 0,
      "jsonl: write to '{}' failed: {}", path_, std::strerror(errno));
}

void JsonlLogger::flush() {
  VERL_CHECK(file_ == nullptr || std::fflush(file_) == 0, "jsonl: write to '{}' failed: {}", path_,
             std::strerror(errno));
}

void JsonlLogger::close() {
  if (file_ == nullptr) return;
  std::FILE* f = file_;
  file_ = nullptr;
  VERL_CHECK(std::fclose(f) == 0, "jsonl: write to '{}' failed: {}", path_, std::strerror(errno));
}

// ---------------------------------------------------------------------------------------------
// TensorBoard

TensorBoardLogger::TensorBoardLogger(const std::string& dir) : writer_(dir) {}

void TensorBoardLogger::log(int64_t step, const Metrics& metrics) {
  const double wall = unix_time_now();
  for (const auto& [k, v] : metrics) writer_.add_scalar(step, k, static_cast<float>(v), wall);
  writer_.flush();
}

void TensorBoardLogger::flush() {
  writer_.flush();
}

void TensorBoardLogger::close() {
  writer_.close();
}

// ---------------------------------------------------------------------------------------------
// MultiLogger

MultiLogger::MultiLogger(const std::vector<std::string>& names, const LoggerOptions& opts) {
  // Backends verl supports that need Python services we do not have.
  static const std::vector<std::string> kVerlOnly = {"wandb",   "swanlab", "mlflow",  "vemlp_wandb",
                                                     "clearml", "trackio", "neptune", "comet"};
  for (const auto& raw : names) {
    std::string name = raw;
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (name == "file") name = "jsonl";
    if (std::find(names_.begin(), names_.end(), name) != names_.end()) continue;
    if (name == "console") {
      add(name, std::make_unique<ConsoleLogger>(opts));
    } else if (name == "jsonl") {
      add(name, std::make_unique<JsonlLogger>(
                    (fs::path(opts.experiment_dir) / "metrics.jsonl").string(), opts.resume_step));
    } else if (name == "tensorboard") {
      const std::string dir = opts.tensorboard_dir.empty()
                                  ? (fs::path(opts.experiment_dir) / "tensorboard").string()
                                  : opts.tensorboard_dir;
      add(name, std::make_unique<TensorBoardLogger>(dir));
    } else {
      skipped_.push_back(raw);
      if (std::find(kVerlOnly.begin(), kVerlOnly.end(), name) != kVerlOnly.end()) {
        log::warn(
            "trainer.logger: '{}' is not available in verl.cpp and is skipped "
            "(available: console, jsonl/file, tensorboard)",
            raw);
      } else {
        log::warn(
            "trainer.logger: unknown logger '{}' skipped "
            "(available: console, jsonl/file, tensorboard)",
            raw);
      }
    }
  }
}

MultiLogger::~MultiLogger() {
  try {
    close();
  } catch (...) {
    // Destructors must not throw; close() explicitly to see errors.
  }
}

void MultiLogger::add(std::string name, std::unique_ptr<Logger> logger) {
  VERL_CHECK(logger != nullptr, "MultiLogger: null logger '{}'", name);
  names_.push_back(std::move(name));
  loggers_.push_back(std::move(logger));
}

void MultiLogger::log(int64_t step, const Metrics& metrics) {
  for (auto& l : loggers_) l->log(step, metrics);
}

void MultiLogger::flush() {
  for (auto& l : loggers_) l->flush();
}

void MultiLogger::close() {
  for (auto& l : loggers_) l->close();
}

}  // namespace verl::metrics
