// `verl config`: prints the resolved configuration a run would use (defaults, then the given
// YAML file, then key=value overrides), so users can check a ported verl config before training.
// `--docs` prints the markdown reference of every key (docs/config.md).
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "cli/io.h"
#include "config/config.h"
#include "core/error.h"

namespace verl::cli {
namespace {

struct Opts {
  std::vector<std::string> args;
  bool docs = false, json = false;
  std::string defaults;
  HydraConfigFlags hydra;
};

int run(const Opts& o) {
  config::LoadOptions lo;
  lo.defaults_path = o.defaults;
  if (o.docs) {
    auto schema =
        o.defaults.empty() ? config::Schema::builtin() : config::Schema::from_file(o.defaults);
    std::cout << config::docs_markdown(*schema);
    return 0;
  }
  // The first argument without '=' is the config file (or Hydra's --config-path/--config-name,
  // as verl train and verl sft take them); everything else is an override.
  std::string positional;
  std::vector<std::string> overrides;
  for (size_t i = 0; i < o.args.size(); ++i) {
    const std::string& a = o.args[i];
    bool is_override = a.find('=') != std::string::npos || a.rfind("~", 0) == 0;
    if (!is_override && i == 0) {
      positional = a;
    } else {
      VERL_CHECK(is_override,
                 "argument '{}': expected key=value (only the first argument may be a config file)",
                 a);
      overrides.push_back(a);
    }
  }
  const bool sft = o.defaults.find("sft_trainer") != std::string::npos;
  const std::string path =
      resolve_config_file(positional, o.hydra,
                          sft ? std::vector<std::string>{"sft_trainer", "sft_trainer_engine"}
                              : std::vector<std::string>{"ppo_trainer", "_generated_ppo_trainer"});
  config::Config cfg = config::load_config(path, overrides, lo);
  if (o.json)
    std::cout << cfg.to_json().dump(2) << "\n";
  else
    std::cout << cfg.to_yaml();
  return 0;
}

Command reg("config",
            "Print the resolved configuration (defaults + CONFIG + key=value overrides), or --docs",
            [](CLI::App& app) -> Action {
              auto o = std::make_shared<Opts>();
              app.add_option("args", o->args, "[CONFIG.yaml] [key=value ...]");
              app.add_flag("--docs", o->docs, "print the markdown reference of every key");
              app.add_flag("--json", o->json, "print JSON instead of YAML");
              app.add_option("--defaults", o->defaults,
                             "defaults file (default: configs/ppo_trainer.yaml)");
              add_hydra_flags(app, o->hydra);
              return [o] { return run(*o); };
            });

}  // namespace
}  // namespace verl::cli
