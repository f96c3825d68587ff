// `verl sft CONFIG [key=value ...]`: supervised fine-tuning with configs/sft_trainer.yaml's keys.
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "cli/io.h"
#include "config/config.h"
#include "core/error.h"
#include "core/log.h"
#include "dist/mpi_communicator.h"
#include "trainer/sft.h"

namespace verl::cli {
namespace {

namespace fs = std::filesystem;

struct Opts {
  std::vector<std::string> args;  // CONFIG then overrides, or overrides alone
  HydraConfigFlags hydra;
};

int run(const Opts& o) {
  auto [positional, overrides] = split_config_args(o.args);
  const std::string path =
      resolve_config_file(positional, o.hydra, {"sft_trainer", "sft_trainer_engine"});
  config::LoadOptions lo;
  lo.defaults_path =
      (fs::path(config::default_config_path()).parent_path() / "sft_trainer.yaml").string();
  config::Config cfg = load_run_config(path, overrides, lo);
  // As `verl train`: the default model is a placeholder; say so rather than fail on it.
  VERL_CHECK(
      !path.empty() || cfg.origin("model.partial_pretrain") != "defaults",
      "verl sft: no config file given, and model.partial_pretrain is the placeholder "
      "default {}; run `verl sft CONFIG.yaml [key=value ...]` or set the key (or model.path)",
      cfg.get<std::string>("model.partial_pretrain"));
  std::string final_dir;
  try {
    final_dir = trainer::run_sft(cfg);
  } catch (const std::exception& e) {
    dist::abort_job_on_error(e.what());  // a data-parallel job ends on every rank
    throw;
  }
  if (!final_dir.empty()) std::cout << "model: " << final_dir << "\n";  // rank 0 saves
  return 0;
}

Command reg("sft", "Supervised fine-tuning (verl's sft_trainer.yaml keys)",
            [](CLI::App& app) -> Action {
              auto o = std::make_shared<Opts>();
              app.add_option("args", o->args, "CONFIG.yaml and/or key=value overrides");
              add_hydra_flags(app, o->hydra);
              return [o] { return run(*o); };
            });

}  // namespace
}  // namespace verl::cli
