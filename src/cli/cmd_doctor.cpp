// `verl doctor`: checks what a run needs from this machine (the build, GPUs, the CUDA libraries,
// MPI and the launcher, the interconnect, host memory, disk, BLAS threads), with --config a run's
// configuration against the pre-flight checklist, and with --run a finished run's GPU
// utilisation. One line per check: PASS, WARN or FAIL, what was found, and after "->" what to do
// (docs/doctor.md). Exit 1 when a check FAILs.
// The checks live in src/cli/doctor/.
#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include "cli/command.h"
#include "cli/doctor/doctor.h"
#include "config/config.h"
#include "core/error.h"

namespace verl::cli {
namespace {

struct Opts {
  std::string config, run, dir = ".";
  std::vector<std::string> overrides;
};

int run(const Opts& o) {
  // Inputs first, so a bad path or key is an error before any check runs.
  VERL_CHECK(!o.config.empty() || o.overrides.empty(),
             "key=value overrides ({} ...) apply to a config: give --config CONFIG",
             o.overrides[0]);
  for (const std::string& a : o.overrides) {
    VERL_CHECK(a.find('=') != std::string::npos || a.starts_with("~"),
               "argument '{}': expected key=value", a);
  }
  std::optional<config::Config> cfg;
  if (!o.config.empty()) cfg = config::load_config(o.config, o.overrides);
  std::optional<doctor::RunMetrics> finished;
  if (!o.run.empty()) finished = doctor::read_run(o.run);
  std::error_code ec;
  VERL_CHECK(std::filesystem::is_directory(o.dir, ec), "--dir {}: not a directory", o.dir);

  doctor::Report report;
  doctor::Machine m;
  m.cores = std::thread::hardware_concurrency();
  doctor::check_machine(report, m, o.dir);
  if (cfg) {
    std::string source = o.config;
    if (!o.overrides.empty()) source += fmt::format(" + {} override(s)", o.overrides.size());
    report.section();
    doctor::check_config(report, *cfg, source, m);
  }
  if (finished) {
    report.section();
    doctor::check_run(report, *finished);
  }
  report.print(std::cout, m.launch_ok ? m.launch.rank : 0);
  return report.failed() ? 1 : 0;
}

Command reg(
    "doctor",
    "Check this machine (and --config CONFIG, --run DIR) for what a run needs: PASS / WARN / FAIL",
    [](CLI::App& app) -> Action {
      auto o = std::make_shared<Opts>();
      app.add_option("--config", o->config,
                     "also check this run config against the pre-flight checklist");
      app.add_option("overrides", o->overrides, "key=value overrides of --config");
      app.add_option("--run", o->run,
                     "a finished run's directory (its metrics.jsonl): GPU utilisation");
      app.add_option("--dir", o->dir, "directory whose free disk space is checked (default .)");
      return [o] { return run(*o); };
    });

}  // namespace
}  // namespace verl::cli
