// The configuration schema: every known key with its type, default, allowed values and support
// status. It is built from the defaults file (configs/ppo_trainer.yaml) itself: types come from
// the default values and documentation and annotations from the comment on each key's line.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace verl::config {

using Json = nlohmann::ordered_json;

enum class Type { Bool, Int, Float, String, StringList, NumberList, Map };

// How verl.cpp treats a key that verl has.
enum class Support {
  Supported,    // read and honoured
  Ignored,      // a verl key with no effect here: a non-default value logs a warning
  Unsupported,  // a verl key we do not support yet: a non-default value is an error
};

const char* type_name(Type t);  // "int", "list[string]", ...
const char* support_name(Support s);

// One key of the schema: a leaf (it holds a value), a section (it holds keys) or an alias (another
// name for one or more leaves).
struct KeySpec {
  std::string path;  // full dotted path, e.g. "actor_rollout_ref.rollout.temperature"
  enum class Kind { Leaf, Section, Alias } kind = Kind::Leaf;
  Type type = Type::String;
  bool nullable = false;
  Support support = Support::Supported;
  bool ours = false;  // a verl.cpp key that verl does not have
  // A key naming one of verl's Hydra config groups (`model_engine=dp`, SFT's `engine=fsdp`): a
  // leaf (top-level allowed) or a section that also takes a choice as a plain value.
  bool group = false;
  // A section that accepts keys it does not list (verl's Ray and launcher settings, whose keys are
  // open-ended): an unknown key below it is ignored with a warning.
  bool open = false;
  std::string reason;        // why a key is not supported or has no effect, and what to use instead
  std::string doc;           // the one-line description
  std::string default_text;  // the default as written in the file (may hold ${...})
  Json default_value;        // the default with interpolations resolved (defaults alone)
  std::vector<std::string> choices;          // allowed values (elements for lists); empty: any
  std::vector<std::string> verl_choices;     // values verl has and we reject by name
  std::vector<std::string> ignored_choices;  // list elements dropped with a warning
  std::optional<double> min, max;            // numeric bounds, inclusive unless marked below
  bool min_exclusive = false, max_exclusive = false;  // @range: (lo..hi) excludes lo / hi
  std::vector<std::string> alias_of;                  // Alias: the leaves it sets
  std::vector<std::string> children;                  // Section: direct child paths, in file order
  int line = 0;                                       // 1-based line in the defaults file

  bool is_leaf() const { return kind == Kind::Leaf; }
  bool is_section() const { return kind == Kind::Section; }
  bool is_alias() const { return kind == Kind::Alias; }
};

class Schema {
 public:
  // Parses and checks a defaults file; an error names the file, the line and the key.
  static std::shared_ptr<const Schema> from_file(const std::string& path);
  static std::shared_ptr<const Schema> from_string(const std::string& text,
                                                   const std::string& name);

  // The schema of configs/ppo_trainer.yaml, found by default_config_path(); parsed once.
  static std::shared_ptr<const Schema> builtin();

  const KeySpec* find(const std::string& path) const;
  const KeySpec& at(const std::string& path) const;  // throws naming the key, with a suggestion
  const std::vector<KeySpec>& keys() const { return keys_; }  // file order, sections included
  const std::vector<std::string>& top_level() const { return top_; }
  const std::string& source() const { return source_; }

  // Closest known keys to a mistyped one: by edit distance over full dotted paths, then by the
  // last path component. Empty when nothing is close.
  std::vector<std::string> suggest(const std::string& unknown) const;
  // " Did you mean 'x'?" or " Keys under 'trainer': a, b, ..." or "" (ready to append to a
  // message).
  std::string suggestion_text(const std::string& unknown) const;

 private:
  std::vector<KeySpec> keys_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<std::string> top_;
  std::string source_;
  friend class SchemaBuilder;
};

// Where configs/ppo_trainer.yaml is: $VERL_CONFIG_DEFAULTS, else next to the executable
// (<exe>/../../configs, <exe>/../configs, <exe>/../share/verl/configs), else the source tree,
// else ./configs. Throws listing the places tried.
std::string default_config_path();

// Levenshtein distance (exposed for tests).
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace verl::config
