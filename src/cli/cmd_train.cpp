// `verl train CONFIG [key=value ...]`: PPO / GRPO training with verl's ppo_trainer.yaml keys.
#include <memory>

#include "cli/command.h"
#include "cli/io.h"
#include "config/config.h"
#include "core/error.h"
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
  config::Config cfg = load_run_config(path, overrides);
  // verl's defaults name a model nobody has (~/models/deepseek-llm-7b-chat): without a config or a
  // model override that is the first thing to fail, so say what is missing instead.
  VERL_CHECK(
      !path.empty() || cfg.origin("actor_rollout_ref.model.path") != "defaults",
      "verl train: no config file given, and actor_rollout_ref.model.path is verl's "
      "placeholder default {}; run `verl train CONFIG.yaml [key=value ...]` (configs/demo.yaml "
      "is a small one) or set the key",
      cfg.get<std::string>("actor_rollout_ref.model.path"));
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
