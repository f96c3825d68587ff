// Subcommand registry of the `verl` program. Each src/cli/cmd_*.cpp registers one subcommand:
//
//   static verl::cli::Command reg("logprobs", "Per-token log-probs of a model", [](CLI::App& app) {
//     auto opts = std::make_shared<Opts>();
//     app.add_option("--model", opts->model)->required();
//     return [opts] { return run(*opts); };
//   });
//
// The setup function declares the options and returns the action run after parsing. Actions throw
// verl::Error on bad input; main() prints the message and returns exit code 1.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace verl::cli {

using Action = std::function<int()>;
using Setup = std::function<Action(CLI::App&)>;

struct Command {
  Command(std::string name, std::string description, Setup setup);
  std::string name, description;
  Setup setup;
};

const std::vector<const Command*>& commands();

}  // namespace verl::cli
