// A resolved, validated run configuration with verl's key names. load_config() layers the user's
// YAML file and command-line overrides (key=value, Hydra style) over configs/ppo_trainer.yaml,
// resolves ${...} interpolations and checks every value against the schema.
//
//   Config cfg = load_config("my_grpo.yaml", {"trainer.total_epochs=2",
//   "trainer.logger=[console]"}); int64_t epochs = cfg.get<int64_t>("trainer.total_epochs"); auto
//   mb = cfg.get<std::optional<int64_t>>("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu");
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "config/schema.h"

namespace verl::config {

struct LoadOptions {
  std::string defaults_path;  // empty: Schema::builtin() (configs/ppo_trainer.yaml)
};

class Config {
 public:
  // Every key at its default.
  explicit Config(std::shared_ptr<const Schema> schema);

  // Typed access. T is bool, int64_t, int, double, float, std::string, std::vector<std::string>,
  // std::vector<double>, std::vector<int64_t>, Json (any value, sections too), or std::optional of
  // one of those (nullopt for null). An unknown key, a null for a non-optional T or a value of
  // another type throws an Error naming the key. Aliases read their (first) target.
  template <typename T>
  T get(const std::string& key) const;

  bool has(const std::string& key) const;      // a known key (leaf, section or alias)
  bool is_null(const std::string& key) const;  // its value is null
  Json value(const std::string& key) const;    // a leaf's value or a section as an object
  std::string origin(
      const std::string& key) const;  // "defaults", "file.yaml:12", "command line ..."

  // Sets one key after loading (e.g. a value the trainer derives), checked like a command-line
  // override. Interpolations that referred to it are not recomputed.
  void set(const std::string& key, const Json& v, const std::string& origin = "program");

  // Every leaf as (path, JSON text) in schema order, for checking that the ranks of a job loaded
  // the same configuration; less the keys naming a file-system location (is_location_key), which
  // may differ per node (mount points, node-local copies). Reads nothing (see was_read).
  std::vector<std::pair<std::string, std::string>> rank_comparable_values() const;
  std::string to_yaml() const;  // resolved config; loading it back gives the same config
  Json to_json() const;         // nested object in file order
  const Schema& schema() const { return *schema_; }

  // Which leaves the program has read (get<>, value, is_null; an alias counts for its target, a
  // section for every leaf below it). Copies of a Config share one record, so a test can build a
  // trainer from a config and then list the supported keys that nothing read
  // (tests/trainer/test_config_reads.cpp). Printing (to_yaml, to_json) reads nothing.
  bool was_read(const std::string& key) const;
  std::vector<std::string> read_keys() const;  // leaf paths, file order
  void clear_reads() const;

 private:
  friend class Loader;
  size_t leaf_index(const std::string& key) const;  // follows aliases; throws if not a leaf
  Json raw_value(const std::string& key) const;     // value() without recording a read
  void mark_read(const std::string& key) const;
  [[noreturn]] void type_mismatch(const std::string& key, const char* wanted, const Json& v) const;

  std::shared_ptr<const Schema> schema_;
  std::vector<Json> values_;  // by schema key index (leaves only)
  std::vector<std::string> origins_;
  std::shared_ptr<std::atomic<bool>[]> read_;  // by schema key index; shared by copies
};

// Loads `path` (empty: defaults only; "-" is not special) and applies `overrides` in order.
// Accepted override forms: key=value, +key=value, ++key=value (the key must exist either way;
// inside a map-typed key such as model.override_config new sub-keys are allowed).
// All problems are reported together in one Error.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {},
                   const LoadOptions& opts = {});
// As load_config, with the user's YAML given as text (`name` is used in messages).
Config load_config_string(const std::string& yaml, const std::string& name,
                          const std::vector<std::string>& overrides = {},
                          const LoadOptions& opts = {});

// A key naming a file or directory (path, tokenizer, *_path, *_dir, *_file, *_files).
bool is_location_key(const std::string& path);

// Markdown reference of every key (docs/config.md is this output).
std::string docs_markdown(const Schema& schema);

// ------------------------------------------------------------------------------------------------

namespace detail_get {
template <typename T>
struct is_optional : std::false_type {};
template <typename T>
struct is_optional<std::optional<T>> : std::true_type {};
}  // namespace detail_get

template <typename T>
T Config::get(const std::string& key) const {
  if constexpr (std::is_same_v<T, Json>) {
    return value(key);
  } else if constexpr (detail_get::is_optional<T>::value) {
    Json v = value(key);
    if (v.is_null()) return std::nullopt;
    return get<typename T::value_type>(key);
  } else {
    Json v = value(key);
    if constexpr (std::is_same_v<T, bool>) {
      if (!v.is_boolean()) type_mismatch(key, "bool", v);
      return v.template get<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      if (!v.is_number_integer()) type_mismatch(key, "int", v);
      return static_cast<T>(v.template get<int64_t>());
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!v.is_number()) type_mismatch(key, "float", v);
      return static_cast<T>(v.template get<double>());
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!v.is_string()) type_mismatch(key, "string", v);
      return v.template get<std::string>();
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      if (!v.is_array()) type_mismatch(key, "list[string]", v);
      T out;
      for (const auto& e : v) {
        if (!e.is_string()) type_mismatch(key, "list[string]", v);
        out.push_back(e.template get<std::string>());
      }
      return out;
    } else if constexpr (std::is_same_v<T, std::vector<double>> ||
                         std::is_same_v<T, std::vector<int64_t>>) {
      constexpr bool ints = std::is_same_v<T, std::vector<int64_t>>;
      if (!v.is_array()) type_mismatch(key, ints ? "list[int]" : "list[number]", v);
      T out;
      for (const auto& e : v) {
        if (ints ? !e.is_number_integer() : !e.is_number())
          type_mismatch(key, ints ? "list[int]" : "list[number]", v);
        out.push_back(e.template get<typename T::value_type>());
      }
      return out;
    } else {
      static_assert(!sizeof(T), "Config::get: unsupported type");
    }
  }
}

}  // namespace verl::config
