// `verl train CONFIG [key=value ...]`: PPO / GRPO training with verl's ppo_trainer.yaml keys.
#include <memory>

#include "cli/command.h"
#include "cli/io.h"
#include "config/config.h"
#include "dist/mpi_communicator.h"
#include "trainer/ppo_trainer.h"

namespace verl::cli {
namespace {

struct Opts {
  std::vector<std::string> args;
  HydraConfigFlags hydra;
};

int run(const Opts& o) {
  auto [positional, overrides] = split_config_args(o.args);
  const std::string path =
      resolve_config_file(positional, o.hydra, {"ppo_trainer", "_generated_ppo_trainer"});
  config::Config cfg = config::load_config(path, overrides);
  try {
    trainer::PpoTrainer trainer(cfg);
    trainer.fit();
  } catch (const std::exception& e) {
    dist::abort_job_on_error(e.what());  // a data-parallel job ends on every rank
    throw;
  }
  return 0;
}

Command reg("train", "PPO / GRPO training (verl's ppo_trainer.yaml keys; key=value overrides)",
            [](CLI::App& app) -> Action {
              auto o = std::make_shared<Opts>();
              app.add_option("args", o->args, "CONFIG.yaml and/or key=value overrides");
              add_hydra_flags(app, o->hydra);
              return [o] { return run(*o); };
            });

}  // namespace
}  // namespace verl::cli
