// `verl sft CONFIG [key=value ...]`: supervised fine-tuning with configs/sft_trainer.yaml's keys.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/io.h"
#include "config/config.h"
#include "core/error.h"
#include "core/log.h"
#include "trainer/sft.h"

namespace verl::cli {
namespace {

namespace fs = std::filesystem;

struct Opts {
  std::vector<std::string> args;  // CONFIG then overrides, or overrides alone
};

int run(const Opts& o) {
  auto [path, overrides] = split_config_args(o.args);
  config::LoadOptions lo;
  lo.defaults_path = (fs::path(config::default_config_path()).parent_path() / "sft_trainer.yaml").string();
  config::Config cfg = config::load_config(path, overrides, lo);
  const std::string out_dir = cfg.get<std::string>("trainer.default_local_dir");
  fs::create_directories(out_dir);
  std::vector<std::string> loggers = cfg.get<std::vector<std::string>>("trainer.logger");
  auto has = [&](const char* n) { return std::find(loggers.begin(), loggers.end(), n) != loggers.end(); };
  std::ofstream jsonl;
  if (has("jsonl") || has("file")) jsonl.open(out_dir + "/metrics.jsonl", std::ios::app);
  const int64_t every = cfg.get<int64_t>("trainer.logging_steps");
  trainer::MetricsSink sink = [&](int64_t step, const std::map<std::string, double>& m) {
    if (jsonl.is_open()) {
      nlohmann::json j = {{"step", step}};
      for (const auto& [k, v] : m) j[k] = v;
      jsonl << j.dump() << '\n' << std::flush;
    }
    if (has("console") && (step % every == 0 || step == 1)) {
      std::string line = fmt::format("step {}", step);
      for (const auto& [k, v] : m) line += fmt::format("  {} {:.4g}", k, v);
      std::cout << line << std::endl;
    }
  };
  std::string final_dir = trainer::run_sft(cfg, sink);
  std::cout << "model: " << final_dir << "\n";
  return 0;
}

Command reg("sft", "Supervised fine-tuning (verl's sft_trainer.yaml keys)", [](CLI::App& app) -> Action {
  auto o = std::make_shared<Opts>();
  app.add_option("args", o->args, "CONFIG.yaml and/or key=value overrides");
  return [o] { return run(*o); };
});

}  // namespace
}  // namespace verl::cli
