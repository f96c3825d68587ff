// Entry point of the `verl` program: dispatches to the registered subcommands.
#include <cstdio>
#include <exception>
#include <map>
#include <new>
#include <string>

#include "cli/command.h"
#include "config/schema.h"
#include "core/error.h"
#include "core/signals.h"

namespace verl::cli {

static std::vector<const Command*>& registry() {
  static std::vector<const Command*> r;
  return r;
}

Command::Command(std::string n, std::string d, Setup s)
    : name(std::move(n)), description(std::move(d)), setup(std::move(s)) {
  registry().push_back(this);
}

const std::vector<const Command*>& commands() {
  return registry();
}

}  // namespace verl::cli

int main(int argc, char** argv) {
  CLI::App app{"verl.cpp: reinforcement-learning post-training for LLMs"};
  app.require_subcommand(1);
  std::map<CLI::App*, verl::cli::Action> actions;
  for (const verl::cli::Command* c : verl::cli::commands()) {
    CLI::App* sub = app.add_subcommand(c->name, c->description);
    actions[sub] = c->setup(*sub);
  }
  // CLI11 calls a mistyped subcommand an argument it did not expect; name it and the nearest one.
  if (argc > 1 && argv[1][0] != '-') {
    const std::string given = argv[1];
    std::string names, near;
    size_t best = 3;
    bool known = false;
    for (const verl::cli::Command* c : verl::cli::commands()) {
      known = known || c->name == given;
      names += (names.empty() ? "" : ", ") + c->name;
      if (const size_t d = verl::config::edit_distance(c->name, given); d < best) {
        best = d;
        near = c->name;
      }
    }
    if (!known) {
      std::fprintf(stderr,
                   "error: '%s' is not a verl subcommand%s; the subcommands: %s (verl --help)\n",
                   given.c_str(), near.empty() ? "" : (" (did you mean '" + near + "'?)").c_str(),
                   names.c_str());
      return 1;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  verl::install_stop_handlers();  // a signal also ends the programs a run started (core/signals.h)
  try {
    for (auto& [sub, action] : actions) {
      if (sub->parsed()) return action();
    }
  } catch (const verl::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    // A size from the config or a flag (a KV-cache budget, a batch, a sequence length) asked for
    // more host memory than the machine could give.
    std::fprintf(
        stderr,
        "error: out of host memory: an allocation failed (std::bad_alloc); lower the sizes "
        "the config or flags ask for (batch sizes, sequence lengths, KV-cache budget)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
