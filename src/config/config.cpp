// Loading a run configuration: defaults, then the user's YAML file, then command-line overrides,
// then ${...} resolution and the support checks; plus typed access and YAML/JSON output.
// Problems are collected and reported together so that porting a verl config takes one pass.
#include "config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "config/detail.h"
#include "core/error.h"
#include "core/file.h"
#include "core/log.h"

namespace verl::config {

using detail::Slot;

Config::Config(std::shared_ptr<const Schema> schema) : schema_(std::move(schema)) {
  const auto& keys = schema_->keys();
  values_.resize(keys.size());
  origins_.assign(keys.size(), "defaults");
  read_ = std::shared_ptr<std::atomic<bool>[]>(new std::atomic<bool>[keys.size()]());
  for (size_t i = 0; i < keys.size(); ++i)
    if (keys[i].is_leaf()) values_[i] = keys[i].default_value;
}

size_t Config::leaf_index(const std::string& key) const {
  const KeySpec& k = schema_->at(key);
  const KeySpec& leaf = k.is_alias() ? schema_->at(k.alias_of.front()) : k;
  VERL_CHECK(leaf.is_leaf(), "config key '{}' is a section, not a value; read it with get<Json>",
             key);
  return static_cast<size_t>(&leaf - schema_->keys().data());
}

bool Config::has(const std::string& key) const {
  return schema_->find(key) != nullptr;
}

Json Config::raw_value(const std::string& key) const {
  const KeySpec& k = schema_->at(key);
  if (k.is_section()) {
    Json o = Json::object();
    for (const auto& c : k.children) {
      const KeySpec& ck = schema_->at(c);
      if (ck.is_alias()) continue;
      o[c.substr(c.rfind('.') + 1)] = raw_value(c);
    }
    return o;
  }
  return values_[leaf_index(key)];
}

void Config::mark_read(const std::string& key) const {
  const KeySpec& k = schema_->at(key);
  if (k.is_section()) {
    for (const auto& c : k.children)
      if (!schema_->at(c).is_alias()) mark_read(c);
    return;
  }
  read_[leaf_index(key)].store(true, std::memory_order_relaxed);
}

Json Config::value(const std::string& key) const {
  Json v = raw_value(key);
  mark_read(key);
  return v;
}

bool Config::is_null(const std::string& key) const {
  return value(key).is_null();
}

bool Config::was_read(const std::string& key) const {
  return read_[leaf_index(key)].load(std::memory_order_relaxed);
}

std::vector<std::string> Config::read_keys() const {
  std::vector<std::string> out;
  const auto& keys = schema_->keys();
  for (size_t i = 0; i < keys.size(); ++i)
    if (keys[i].is_leaf() && read_[i].load(std::memory_order_relaxed)) out.push_back(keys[i].path);
  return out;
}

void Config::clear_reads() const {
  for (size_t i = 0; i < schema_->keys().size(); ++i)
    read_[i].store(false, std::memory_order_relaxed);
}

std::string Config::origin(const std::string& key) const {
  return origins_[leaf_index(key)];
}

void Config::type_mismatch(const std::string& key, const char* wanted, const Json& v) const {
  if (v.is_null())
    VERL_FAIL("config key '{}' is null; read it as std::optional<...> or set it (expected {})", key,
              wanted);
  const KeySpec& k = schema_->at(key);
  VERL_CHECK(!k.is_section(), "config key '{}' is a section, not a value; read it with get<Json>",
             key);
  VERL_FAIL("config key '{}' holds {} of type {}; it cannot be read as {}", key, detail::show(v),
            type_name(k.is_alias() ? schema_->at(k.alias_of.front()).type : k.type), wanted);
}

void Config::set(const std::string& key, const Json& v, const std::string& origin) {
  size_t i = leaf_index(key);
  const KeySpec& spec = schema_->keys()[i];
  try {
    Json c = detail::convert_json(v, spec, origin);
    detail::check_value(c, spec, origin);
    values_[i] = std::move(c);
    origins_[i] = origin;
  } catch (const detail::Issue& e) {
    VERL_FAIL("{}", e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// Loading

class Loader {
 public:
  explicit Loader(std::shared_ptr<const Schema> schema) : schema_(std::move(schema)) {
    const auto& keys = schema_->keys();
    slots_.resize(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!keys[i].is_leaf()) continue;
      // Defaults that interpolate stay pending so they follow what the user sets.
      if (detail::has_interpolation(keys[i].default_text)) {
        slots_[i].pending = true;
        slots_[i].interp = keys[i].default_text;
      } else {
        slots_[i].value = keys[i].default_value;
      }
      slots_[i].origin = "defaults";
    }
  }

  void merge_file_text(const std::string& text, const std::string& name) {
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      VERL_FAIL("{}:{}: not valid YAML: {}", name, e.mark.line + 1, e.msg);
    }
    if (!root.IsDefined() || root.IsNull()) return;  // an empty file changes nothing
    VERL_CHECK(root.IsMap(),
               "{}: a config file must be a mapping of sections (data:, trainer:, ...)", name);
    phase_.clear();
    merge_map(root, "",
              [&](const YAML::Node& k) { return fmt::format("{}:{}", name, k.Mark().line + 1); });
  }

  void apply_overrides(const std::vector<std::string>& overrides) {
    phase_.clear();
    for (const auto& o : overrides) apply_override(o);
  }

  Config finish() {
    detail::resolve_all(
        schema_->keys(),
        [&](const std::string& p) -> long {
          const KeySpec* k = schema_->find(p);
          return k ? static_cast<long>(k - schema_->keys().data()) : -1;
        },
        [&](const std::string& p) { return schema_->suggestion_text(p); }, slots_,
        [&](const std::string& m) { problems_.push_back(m); });
    check_support();
    if (!problems_.empty()) {
      VERL_FAIL("invalid configuration ({} problem{}):\n  - {}", problems_.size(),
                problems_.size() == 1 ? "" : "s", fmt::join(problems_, "\n  - "));
    }
    Config cfg(schema_);
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (!schema_->keys()[i].is_leaf()) continue;
      cfg.values_[i] = slots_[i].value;
      cfg.origins_[i] = slots_[i].origin;
    }
    return cfg;
  }

 private:
  using OriginFn = std::function<std::string(const YAML::Node& key)>;

  std::shared_ptr<const Schema> schema_;
  std::vector<Slot> slots_;
  std::vector<std::string> problems_;
  struct PhaseSet {
    std::string text, origin, written_as;
  };
  std::map<size_t, PhaseSet> phase_;  // leaves set by the current source

  size_t index(const KeySpec& k) const { return static_cast<size_t>(&k - schema_->keys().data()); }

  void merge_map(const YAML::Node& map, const std::string& prefix, const OriginFn& origin_of) {
    // YAML forbids a key twice in one mapping, yet yaml-cpp keeps both: the second would win
    // unseen (a pasted block overriding an earlier one), so it is a problem naming both places.
    std::map<std::string, std::string> seen;
    for (const auto& kv : map) {
      const std::string key = kv.first.Scalar();
      const std::string path = prefix.empty() ? key : prefix + "." + key;
      const std::string origin = origin_of(kv.first);
      if (auto [it, fresh] = seen.emplace(key, origin); !fresh) {
        problems_.push_back(
            fmt::format("{}: {} appears twice in one mapping (first at {}); keep one", origin, path,
                        it->second));
        continue;
      }
      if (key == "_target_") continue;  // a Python class name in verl's dataclass configs
      if (prefix.empty() && (key == "defaults" || key == "hydra")) {
        log::warn("{}: ignoring the top-level '{}' key (Hydra composition is not used by verl.cpp)",
                  origin, key);
        continue;
      }
      set_path(path, kv.second, origin, origin_of);
    }
  }

  void set_path(const std::string& path, const YAML::Node& v, const std::string& origin,
                const OriginFn& origin_of) {
    try {
      set_path_unguarded(path, v, origin, origin_of);
    } catch (const detail::TooLarge& e) {
      problems_.push_back(fmt::format("{}: {}: {}", origin, path, e.what()));
    }
  }

  void set_path_unguarded(const std::string& path, const YAML::Node& v, const std::string& origin,
                          const OriginFn& origin_of) {
    const KeySpec* spec = schema_->find(path);
    if (!spec) {
      if (set_inside_map(path, v, origin)) return;
      if (const KeySpec* open = open_ancestor(path)) {
        log::warn("{}: {} has no effect in verl.cpp ({}); ignored", origin, path,
                  open->reason.empty() ? open->doc : open->reason);
        return;
      }
      problems_.push_back(
          fmt::format("{}: unknown key '{}'.{}", origin, path, schema_->suggestion_text(path)));
      return;
    }
    if (spec->is_section() && spec->group && !v.IsMap()) {
      select_group(*spec, v, origin);
      return;
    }
    if (spec->is_section()) {
      if (v.IsMap()) {
        merge_map(v, path, origin_of);
      } else {
        std::vector<std::string> names;
        for (const auto& c : spec->children) names.push_back(c.substr(c.rfind('.') + 1));
        problems_.push_back(fmt::format(
            "{}: '{}' is a section (with keys {}); expected a mapping, got {}", origin, path,
            fmt::join(names, ", "), v.IsScalar() ? v.Scalar() : detail::show(detail::generic(v))));
      }
      return;
    }
    if (spec->is_alias()) {
      // An alias written as null is an unset older spelling (the defaults file lists each one as
      // null; a config saved by verl writes `warmup_style: null`): it leaves its target alone.
      if (v.IsNull() ||
          (v.IsScalar() && !detail::is_quoted(v) && (v.Scalar() == "null" || v.Scalar() == "~")))
        return;
      for (const auto& t : spec->alias_of)
        set_leaf(schema_->at(t), v, fmt::format("{} (as {})", origin, path), path);
      return;
    }
    if (v.IsScalar() && !detail::is_quoted(v) && v.Scalar() == "???") {
      // OmegaConf's "mandatory, not set yet"; verl.cpp has a default for every key.
      log::warn("{}: {} is ??? (a mandatory value in verl); using verl.cpp's default {}", origin,
                path, detail::show(spec->default_value));
      return;
    }
    set_leaf(*spec, v, origin, path);
  }

  // The nearest section above `path` that accepts unlisted keys (@open), or null.
  const KeySpec* open_ancestor(const std::string& path) const {
    for (std::string p = path; p.rfind('.') != std::string::npos;) {
      p = p.substr(0, p.rfind('.'));
      const KeySpec* k = schema_->find(p);
      if (k && k->is_section() && k->open) return k;
      if (k) return nullptr;
    }
    return nullptr;
  }

  // `engine=fsdp`: Hydra's choice of a config group's file for a section (@group). Ours has one
  // file per group, so a supported choice changes nothing; verl's other files are rejected by name.
  void select_group(const KeySpec& spec, const YAML::Node& v, const std::string& origin) {
    const std::string choice = v.IsScalar() ? v.Scalar() : detail::show(detail::generic(v));
    auto in = [&](const std::vector<std::string>& set) {
      return std::find(set.begin(), set.end(), choice) != set.end();
    };
    if (in(spec.choices)) return;
    if (in(spec.verl_choices)) {
      problems_.push_back(
          fmt::format("{}: {}={} selects verl's {} config group, which verl.cpp does not support; "
                      "supported: {}{}",
                      origin, spec.path, choice, choice, fmt::join(spec.choices, ", "),
                      spec.reason.empty() ? "" : " (" + spec.reason + ")"));
      return;
    }
    problems_.push_back(fmt::format(
        "{}: {}={}: '{}' is a section; write {}.KEY=VALUE, or choose its config group: {}", origin,
        spec.path, choice, spec.path, spec.path, fmt::join(spec.choices, ", ")));
  }

  // "model.override_config.rope_theta": a new sub-key inside a map-typed key.
  bool set_inside_map(const std::string& path, const YAML::Node& v, const std::string& origin) {
    std::string prefix = path;
    while (true) {
      size_t dot = prefix.rfind('.');
      if (dot == std::string::npos) return false;
      prefix = prefix.substr(0, dot);
      const KeySpec* k = schema_->find(prefix);
      if (!k) continue;
      if (!k->is_leaf() || k->type != Type::Map) return false;
      Slot& slot = slots_[index(*k)];
      if (slot.pending || !slot.value.is_object()) slot.value = Json::object();
      Json* node = &slot.value;
      std::string rest = path.substr(prefix.size() + 1);
      for (size_t start = 0;;) {
        size_t d = rest.find('.', start);
        std::string part = rest.substr(start, d - start);
        if (d == std::string::npos) {
          (*node)[part] = detail::generic(v);
          break;
        }
        if (!(*node)[part].is_object()) (*node)[part] = Json::object();
        node = &(*node)[part];
        start = d + 1;
      }
      slot.pending = false;
      slot.explicit_set = true;
      slot.origin = origin;
      return true;
    }
  }

  // JSON text of a value. YAML is UTF-8: a string that is not (a stray Latin-1 byte) would make
  // every later dump of the config throw (the checkpoint's copy, the logs), so it is refused here,
  // naming the key.
  static std::string utf8_text(const Json& v, const KeySpec& spec, const std::string& origin) {
    try {
      return v.dump();
    } catch (const nlohmann::json::type_error& e) {
      detail::raise(
          fmt::format("{}: {}: the value is not valid UTF-8 ({})", origin, spec.path, e.what()));
    }
  }

  void set_leaf(const KeySpec& spec, const YAML::Node& v, const std::string& origin,
                const std::string& written_as) {
    size_t i = index(spec);
    Slot& slot = slots_[i];
    std::string text;
    try {
      if (v.IsScalar() && detail::has_interpolation(v.Scalar())) {
        utf8_text(Json(v.Scalar()), spec, origin);
        text = v.Scalar();
        slot.pending = true;
        slot.interp = text;
        slot.value = nullptr;
      } else {
        Json c;
        if (spec.type == Type::Map && v.IsMap() && !slot.pending && slot.value.is_object()) {
          c = slot.value;  // maps merge key by key, as OmegaConf does
          c.merge_patch(detail::generic(v));
        } else {
          c = detail::convert_node(v, spec, origin);
        }
        detail::check_value(c, spec, origin);
        text = utf8_text(c, spec, origin);
        slot.pending = false;
        slot.value = std::move(c);
      }
    } catch (const detail::TooLarge& e) {
      problems_.push_back(fmt::format("{}: {}: {}", origin, spec.path, e.what()));
      return;
    } catch (const detail::Issue& e) {
      problems_.push_back(e.what());
      return;
    }
    // One source setting a key under two names (say save_steps and save_freq) must agree; the
    // same name given twice is an update (the last one wins, as in Hydra).
    auto prev = phase_.find(i);
    if (prev != phase_.end() && prev->second.written_as != written_as &&
        prev->second.text != text) {
      problems_.push_back(
          fmt::format("{}: {} is set twice with different values: {} at {}, and {} here", origin,
                      spec.path, prev->second.text, prev->second.origin, text));
    }
    phase_[i] = {text, origin, written_as};
    slot.explicit_set = true;
    slot.origin = origin;
  }

  void apply_override(const std::string& text) {
    const std::string origin = fmt::format("command line '{}'", text);
    std::string s = text;
    if (s.rfind("~", 0) == 0) {
      problems_.push_back(fmt::format(
          "{}: deleting keys (~key) is not supported; set the key to null or its default", origin));
      return;
    }
    if (s.rfind("++", 0) == 0)
      s = s.substr(2);
    else if (s.rfind("+", 0) == 0)
      s = s.substr(1);
    size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0) {
      problems_.push_back(
          fmt::format("{}: expected key=value, e.g. trainer.total_epochs=3", origin));
      return;
    }
    std::string key = s.substr(0, eq), val = s.substr(eq + 1);
    YAML::Node node;
    if (val.empty()) {
      node = YAML::Node(std::string());  // Hydra reads "key=" as the empty string
    } else {
      try {
        node = YAML::Load(val);
      } catch (const YAML::Exception& e) {
        problems_.push_back(fmt::format("{}: the value is not valid YAML: {}", origin, e.msg));
        return;
      }
    }
    set_path(key, node, origin, [&](const YAML::Node&) { return origin; });
  }

  // A verl key we do not support must stay at its default; one we ignore gets a warning.
  void check_support() {
    const auto& keys = schema_->keys();
    for (size_t i = 0; i < keys.size(); ++i) {
      const KeySpec& k = keys[i];
      const Slot& slot = slots_[i];
      if (!k.is_leaf() || !slot.explicit_set || k.support == Support::Supported) continue;
      if (slot.pending || slot.value == k.default_value) continue;
      if (k.support == Support::Unsupported) {
        problems_.push_back(fmt::format(
            "{}: {} is a verl key that verl.cpp does not support yet ({}); remove it or "
            "leave it at its default ({}), got {}",
            slot.origin, k.path, k.reason.empty() ? k.doc : k.reason, detail::show(k.default_value),
            detail::show(slot.value)));
      } else {
        log::warn("{}: {} = {} has no effect in verl.cpp ({}); ignored", slot.origin, k.path,
                  detail::show(slot.value), k.reason.empty() ? k.doc : k.reason);
      }
    }
  }
};

Config load_config_string(const std::string& yaml, const std::string& name,
                          const std::vector<std::string>& overrides, const LoadOptions& opts) {
  auto schema =
      opts.defaults_path.empty() ? Schema::builtin() : Schema::from_file(opts.defaults_path);
  Loader loader(schema);
  loader.merge_file_text(yaml, name);
  loader.apply_overrides(overrides);
  return loader.finish();
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   const LoadOptions& opts) {
  std::string text;
  if (!path.empty()) text = read_file(path, "config file");
  return load_config_string(text, path, overrides, opts);
}

// ---------------------------------------------------------------------------------------------
// Output

namespace {

// A string that YAML would read back as something else (number, bool, null, ...) is quoted.
bool needs_quotes(const std::string& s) {
  if (s.empty() || detail::is_null_text(s) || detail::parse_bool(s) || detail::parse_int(s) ||
      detail::parse_float(s))
    return true;
  static const std::vector<std::string> yaml11 = {"yes", "no",  "on", "off", "y",   "n",
                                                  "Yes", "No",  "On", "Off", "YES", "NO",
                                                  "ON",  "OFF", "Y",  "N"};
  if (std::find(yaml11.begin(), yaml11.end(), s) != yaml11.end()) return true;
  if (std::string("-?:,[]{}#&*!|>'\"%@`").find(s[0]) != std::string::npos) return true;
  if (s.find(": ") != std::string::npos || s.find(" #") != std::string::npos) return true;
  return s.front() == ' ' || s.back() == ' ' || s.back() == ':' ||
         s.find('\n') != std::string::npos;
}

void emit(YAML::Emitter& out, const Json& v) {
  if (v.is_null()) {
    out << YAML::Null;
  } else if (v.is_boolean()) {
    out << v.get<bool>();
  } else if (v.is_number()) {
    out << detail::scalar_text(v);
  } else if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    if (needs_quotes(s))
      out << YAML::DoubleQuoted << s;
    else
      out << s;
  } else if (v.is_array()) {
    bool flat = std::all_of(v.begin(), v.end(), [](const Json& e) { return e.is_primitive(); });
    out << (flat ? YAML::Flow : YAML::Block) << YAML::BeginSeq;
    for (const auto& e : v) emit(out, e);
    out << YAML::EndSeq;
  } else {
    if (v.empty()) {
      out << YAML::Flow << YAML::BeginMap << YAML::EndMap;
      return;
    }
    out << YAML::Block << YAML::BeginMap;
    for (auto it = v.begin(); it != v.end(); ++it) {
      out << YAML::Key << it.key() << YAML::Value;
      emit(out, it.value());
    }
    out << YAML::EndMap;
  }
}

}  // namespace

bool is_location_key(const std::string& path) {
  const std::string name = path.substr(path.rfind('.') + 1);
  auto ends = [&](std::string_view tail) {
    return name.size() >= tail.size() &&
           name.compare(name.size() - tail.size(), tail.size(), tail.data(), tail.size()) == 0;
  };
  return name == "path" || name == "tokenizer" || name == "input_tokenizer" || ends("_path") ||
         ends("_dir") || ends("_file") || ends("_files");
}

std::vector<std::pair<std::string, std::string>> Config::rank_comparable_values() const {
  std::vector<std::pair<std::string, std::string>> out;
  const auto& keys = schema_->keys();
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!keys[i].is_leaf() || is_location_key(keys[i].path)) continue;
    out.emplace_back(keys[i].path, values_[i].dump());
  }
  return out;
}

Json Config::to_json() const {
  Json root = Json::object();
  for (const auto& top : schema_->top_level()) root[top] = raw_value(top);
  return root;
}

std::string Config::to_yaml() const {
  YAML::Emitter out;
  out.SetNullFormat(YAML::LowerNull);
  out.SetBoolFormat(YAML::TrueFalseBool);
  out.SetBoolFormat(YAML::LowerCase);
  out << YAML::BeginMap;
  for (const auto& top : schema_->top_level()) {
    out << YAML::Key << top << YAML::Value;
    emit(out, raw_value(top));
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace verl::config
