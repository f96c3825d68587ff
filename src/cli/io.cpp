#include "cli/io.h"

#include <fmt/ranges.h>

#include <filesystem>

#include "core/error.h"
#include "core/file.h"
#include "core/json_depth.h"
#include "core/log.h"
#include "dist/launch.h"

namespace verl::cli {

InputLines::InputLines(const std::string& path, const std::string& option)
    : in_(&std::cin), source_(path == "-" ? "<stdin>" : path) {
  if (path != "-") {
    open_for_reading(file_, path, option);
    in_ = &file_;
  }
}

bool InputLines::next(std::string& line) {
  while (std::getline(*in_, line)) {
    ++lineno_;
    if (line.find_first_not_of(" \t\r") != std::string::npos) return true;
  }
  return false;
}

std::string InputLines::where() const {
  return fmt::format("{}:{}", source_, lineno_);
}

std::vector<int32_t> token_ids(const nlohmann::json& j, const char* key, const std::string& where,
                               int64_t vocab) {
  VERL_CHECK(j.contains(key) && j[key].is_array() && !j[key].empty(),
             "{}: \"{}\" must be a non-empty array of ids", where, key);
  const nlohmann::json& t = j[key];
  const int64_t limit = vocab > 0 ? vocab : int64_t{INT32_MAX} + 1;
  std::vector<int32_t> ids;
  ids.reserve(t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    VERL_CHECK(t[i].is_number_integer(), "{}: {}[{}] is not an integer: {}", where, key, i,
               t[i].dump());
    const int64_t id = t[i].get<int64_t>();
    if (vocab > 0) {
      VERL_CHECK(id >= 0 && id < limit, "{}: {}[{}] = {} is outside the vocabulary [0, {})", where,
                 key, i, id, vocab);
    } else {
      VERL_CHECK(id >= 0 && id < limit, "{}: {}[{}] = {} is not a token id", where, key, i, id);
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

nlohmann::json InputLines::json(const std::string& line) const {
  check_json_depth(line, where());
  try {
    return nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    VERL_FAIL("{}: not valid JSON: {}", where(), e.what());
  }
}

Output::Output(const std::string& path, const std::string& option) : out_(&std::cout) {
  if (path != "-") {
    file_.open(path);
    VERL_CHECK(file_.good(), "cannot open {} {}", option, path);
    out_ = &file_;
  }
}

std::pair<std::string, std::vector<std::string>> split_config_args(
    const std::vector<std::string>& args) {
  std::string path;
  std::vector<std::string> overrides;
  for (const auto& a : args) {
    if (path.empty() && overrides.empty() && a.find('=') == std::string::npos) {
      path = a;
    } else {
      overrides.push_back(a);
    }
  }
  return {path, overrides};
}

void add_hydra_flags(CLI::App& app, HydraConfigFlags& flags) {
  app.add_option("--config-path", flags.path,
                 "Hydra's config directory (verl launch scripts); with --config-name");
  app.add_option("--config-name", flags.name,
                 "Hydra's config name: DIR/NAME.yaml, or verl's own defaults name (ppo_trainer, "
                 "sft_trainer, sft_trainer_engine) for our defaults; verl's other names are "
                 "refused with a reason");
}

std::string resolve_config_file(const std::string& positional, const HydraConfigFlags& flags,
                                const std::vector<std::string>& builtin_names) {
  if (flags.name.empty()) {
    VERL_CHECK(flags.path.empty(), "--config-path {} needs --config-name (Hydra's pair)",
               flags.path);
    return positional;
  }
  VERL_CHECK(positional.empty(), "give either a CONFIG file ({}) or --config-name {}, not both",
             positional, flags.name);
  std::string name = flags.name;
  if (name.size() > 5 && name.substr(name.size() - 5) == ".yaml") name.resize(name.size() - 5);
  if (!flags.path.empty()) {
    const std::filesystem::path file = std::filesystem::path(flags.path) / (name + ".yaml");
    if (std::filesystem::exists(file)) return file.string();
  }
  for (const std::string& b : builtin_names) {
    if (name == b) return "";  // verl's defaults file: ours mirror it
  }
  // verl's other shipped config names, each refused with what to use instead.
  static const std::vector<std::pair<std::string, std::string>> others = {
      {"ppo_megatron_trainer",
       "Megatron-LM is not supported; verl.cpp trains with its own data-parallel engine: use "
       "--config-name ppo_trainer (verl train)"},
      {"_generated_ppo_megatron_trainer",
       "Megatron-LM is not supported: use --config-name ppo_trainer (verl train)"},
      {"ppo_torchtitan_trainer",
       "the torchtitan engine is not supported: use --config-name ppo_trainer (verl train)"},
      {"_generated_ppo_torchtitan_trainer",
       "the torchtitan engine is not supported: use --config-name ppo_trainer (verl train)"},
      {"ppo_veomni_trainer",
       "the VeOmni engine is not supported: use --config-name ppo_trainer (verl train)"},
      {"_generated_ppo_veomni_trainer",
       "the VeOmni engine is not supported: use --config-name ppo_trainer (verl train)"},
      {"dapo_trainer",
       "verl.cpp has no separate DAPO defaults: DAPO is ppo_trainer with "
       "reward_model.reward_manager=dapo, reward_model.overlong_buffer.* and "
       "algorithm.filter_groups.* (configs/examples/dapo_demo.yaml); use --config-name ppo_trainer "
       "(verl train) with those keys"},
      {"dapo_megatron_trainer",
       "DAPO's recipe and Megatron-LM are not supported: use --config-name ppo_trainer (verl "
       "train)"},
      {"ppo_trainer", "it is the RL trainer's config: run `verl train`"},
      {"_generated_ppo_trainer", "it is the RL trainer's config: run `verl train`"},
      {"sft_trainer", "it is the SFT trainer's config: run `verl sft`"},
      {"sft_trainer_engine", "it is the SFT trainer's config: run `verl sft`"},
      {"evaluation", "offline evaluation is `verl reward` over generated JSONL"},
      {"generation", "offline generation is `verl generate`"},
  };
  for (const auto& [other, why] : others) {
    if (name == other)
      VERL_FAIL("--config-name {}: verl's {} config is not supported here: {}", flags.name, other,
                why);
  }
  VERL_FAIL(
      "--config-name {}{}: no such config file, and it is not one of verl's defaults ({}); "
      "give the directory holding {}.yaml with --config-path, or the file as CONFIG",
      flags.name, flags.path.empty() ? "" : " with --config-path " + flags.path,
      fmt::join(builtin_names, ", "), name);
}

config::Config load_run_config(const std::string& path, const std::vector<std::string>& overrides,
                               const config::LoadOptions& opts) {
  const log::Level was = log::level();
  if (dist::detect_launch().rank != 0 && was < log::Level::Error) log::set_level(log::Level::Error);
  try {
    config::Config cfg = config::load_config(path, overrides, opts);
    log::set_level(was);
    return cfg;
  } catch (...) {
    log::set_level(was);
    throw;
  }
}

}  // namespace verl::cli
