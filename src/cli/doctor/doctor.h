// `verl doctor` in parts (the subcommand itself is src/cli/cmd_doctor.cpp): the PASS / WARN / FAIL
// report, the machine's checks, a run config's pre-flight checklist (--config) and a finished
// run's GPU utilisation (--run). docs/doctor.md lists every check.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "config/config.h"
#include "dist/launch.h"

namespace verl::cli::doctor {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
inline constexpr const char* kCpuRun = "training runs on the CPU (trainer.device=cpu)";

// ------------------------------------------------------------------------------------------------
// The report (report.cpp)

enum class Status { Pass, Warn, Fail };

struct Check {
  Status status;
  std::string name, found, advice;  // advice: what to do, for WARN and FAIL
};

class Report {
 public:
  void pass(std::string name, std::string found) {
    add(Status::Pass, std::move(name), std::move(found), "");
  }
  void warn(std::string name, std::string found, std::string advice) {
    add(Status::Warn, std::move(name), std::move(found), std::move(advice));
  }
  void fail(std::string name, std::string found, std::string advice) {
    add(Status::Fail, std::move(name), std::move(found), std::move(advice));
  }
  // Checks added from here on align their names apart from the ones before (the machine's short
  // names, the config's keys).
  void section() { sections_.push_back(checks_.size()); }
  bool failed() const {
    return std::any_of(checks_.begin(), checks_.end(),
                       [](const Check& c) { return c.status == Status::Fail; });
  }
  // Names padded to one column per section. Under a launcher the ranks other than 0 print only
  // their FAILs (tagged with the rank): their other lines repeat rank 0's.
  void print(std::ostream& out, int rank) const;

 private:
  void add(Status s, std::string name, std::string found, std::string advice) {
    checks_.push_back({s, std::move(name), std::move(found), std::move(advice)});
  }
  std::vector<Check> checks_;
  std::vector<size_t> sections_;  // indices into checks_ where a section starts
};

// What the machine checks found, for the config checks.
struct Machine {
  int gpus = 0;
  double gpu_memory = 0;  // bytes of the smallest GPU
  unsigned cores = 0;
  dist::LaunchInfo launch;
  bool launch_ok = true;
  int local_ranks = 1;  // ranks of this launch on this node
};

std::string gib(double bytes);
// GiB, or MiB under one GiB (a tiny model's state).
std::string size_of(double bytes);
// An Error's message without the "[src/file.cpp:line]" it ends with.
std::string message_of(const std::exception& e);
std::string env_or(const char* name, const std::string& fallback);
// A thread or rank count from the environment: nullopt when unset, -1 when not a positive number.
// OMP_NUM_THREADS may list one count per nesting level ("8,1"); the first is the outer one.
std::optional<int64_t> env_count(const char* name);
std::optional<std::string> first_line(const std::filesystem::path& p);

// ------------------------------------------------------------------------------------------------
// The machine (machine_checks.cpp): the build, GPUs, driver, CUDA libraries, MPI and the launcher,
// the link between ranks, the interconnect, host memory, the disk at `dir`, BLAS threads. Fills `m`
// for the config checks.
void check_machine(Report& r, Machine& m, const std::string& dir);

// ------------------------------------------------------------------------------------------------
// A run's configuration against the pre-flight checklist (config_checks.cpp); `source` names it.
void check_config(Report& r, const config::Config& cfg, const std::string& source,
                  const Machine& m);

// ------------------------------------------------------------------------------------------------
// A finished run (run_checks.cpp): its metrics.jsonl, read before any check runs.
struct RunMetrics {
  std::string path;
  std::vector<double> gpu_util;                 // perf/gpu_util_mean of each line that has it
  std::map<std::string, double> stage_seconds;  // timing_s/<stage> summed over steps
  double step_seconds = 0;                      // timing_s/step summed
};
RunMetrics read_run(const std::string& dir);
void check_run(Report& r, const RunMetrics& run);

}  // namespace verl::cli::doctor
