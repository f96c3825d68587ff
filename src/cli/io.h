// Shared plumbing of the subcommands: JSON-lines input from a file or stdin with the line named in
// errors, output to a file or stdout, and splitting `CONFIG key=value ...` arguments.
#pragma once

#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"

namespace verl::cli {

// config::load_config for a training run (`verl train`, `verl sft`). A rank other than 0 of a
// launched job loads it without printing the config's warnings: every rank loads the same
// configuration (the ranks check that at start), so rank 0's copy of each is enough.
config::Config load_run_config(const std::string& path, const std::vector<std::string>& overrides,
                               const config::LoadOptions& opts = {});

// Lines of `path` ("-": stdin), skipping blank ones. `option` names the flag in open errors.
class InputLines {
 public:
  InputLines(const std::string& path, const std::string& option = "--input");
  bool next(std::string& line);
  // "file:line" of the last line read, for error messages.
  std::string where() const;
  // The last line parsed as JSON; an Error naming file:line when it is not.
  nlohmann::json json(const std::string& line) const;
  int64_t lineno() const { return lineno_; }
  const std::string& source() const { return source_; }

 private:
  std::ifstream file_;
  std::istream* in_;
  std::string source_;
  int64_t lineno_ = 0;
};

// The non-empty array `j[key]` of an input line as token ids: integers in [0, vocab) (vocab <= 0:
// any id an int32 holds); errors name `where`, the key and the element.
std::vector<int32_t> token_ids(const nlohmann::json& j, const char* key, const std::string& where,
                               int64_t vocab);

// `path` ("-": stdout) opened for writing.
class Output {
 public:
  Output(const std::string& path, const std::string& option = "--output");
  std::ostream& stream() { return *out_; }

 private:
  std::ofstream file_;
  std::ostream* out_;
};

// `verl train CONFIG k=v ...`: the first argument without '=' is the config file (may be absent).
std::pair<std::string, std::vector<std::string>> split_config_args(
    const std::vector<std::string>& args);

// Hydra's way of naming the config, as verl's launch scripts write it: `--config-path DIR
// --config-name NAME` (or `--config-path=DIR`).
struct HydraConfigFlags {
  std::string path, name;
};
void add_hydra_flags(CLI::App& app, HydraConfigFlags& flags);
// The config file to load: `positional` (CONFIG), or DIR/NAME[.yaml] from the Hydra flags when that
// file exists, or "" (our defaults alone) when NAME is one of `builtin_names` (the defaults files
// verl ships, which ours mirror). Anything else is an error naming the flags.
std::string resolve_config_file(const std::string& positional, const HydraConfigFlags& flags,
                                const std::vector<std::string>& builtin_names);

}  // namespace verl::cli
