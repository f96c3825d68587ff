// Builds the schema from the defaults file: walks the YAML tree for keys and default values and
// reads each key's line for its comment (documentation plus @annotations), so the file and the
// schema cannot drift apart. Also: key lookup, did-you-mean suggestions, finding the file.
#include "config/schema.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "config/detail.h"
#include "core/error.h"

namespace verl::config {

const char* type_name(Type t) {
  switch (t) {
    case Type::Bool:
      return "bool";
    case Type::Int:
      return "int";
    case Type::Float:
      return "float";
    case Type::String:
      return "string";
    case Type::StringList:
      return "list[string]";
    case Type::NumberList:
      return "list[number]";
    case Type::Map:
      return "map";
  }
  return "?";
}

const char* support_name(Support s) {
  switch (s) {
    case Support::Supported:
      return "supported";
    case Support::Ignored:
      return "ignored";
    case Support::Unsupported:
      return "unsupported";
  }
  return "?";
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) {
    if (!trim(cur).empty()) out.push_back(trim(cur));
  }
  return out;
}

std::string last_component(const std::string& path) {
  size_t dot = path.rfind('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

std::string parent_of(const std::string& path) {
  size_t dot = path.rfind('.');
  return dot == std::string::npos ? "" : path.substr(0, dot);
}

// The comment of a YAML line: text after a '#' that starts the line or follows a blank, outside
// quotes.
std::string line_comment(const std::string& line) {
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#' && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t')) {
      return trim(line.substr(i + 1));
    }
  }
  return "";
}

struct Annotations {
  std::string doc;
  std::optional<Type> type;
  bool nullable = false, ours = false, group = false, open = false;
  std::string reason;
  std::optional<Support> support;
  std::vector<std::string> choices, verl_choices, ignored_choices, alias_of;
  std::optional<double> min, max;
  bool min_exclusive = false, max_exclusive = false;
};

std::optional<Type> parse_type(const std::string& s) {
  for (Type t : {Type::Bool, Type::Int, Type::Float, Type::String, Type::StringList,
                 Type::NumberList, Type::Map})
    if (s == type_name(t)) return t;
  return std::nullopt;
}

Annotations parse_annotations(const std::string& comment, const std::string& where) {
  Annotations a;
  size_t at = comment.rfind('@', 0) == 0 ? 0 : comment.find(" @");
  a.doc = trim(comment.substr(0, at));
  if (at == std::string::npos) return a;
  std::vector<std::string> tokens;
  {
    std::istringstream in(comment.substr(at));
    for (std::string t; in >> t;) tokens.push_back(t);
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string tok = tokens[i];
    VERL_CHECK(tok[0] == '@', "{}: expected an @annotation in the comment, got '{}'", where, tok);
    std::string name = tok.substr(1), value;
    size_t colon = name.find(':');
    if (colon != std::string::npos) {
      value = name.substr(colon + 1);
      name = name.substr(0, colon);
      if (value.empty()) {
        VERL_CHECK(i + 1 < tokens.size(), "{}: @{} needs a value", where, name);
        value = tokens[++i];
      }
    }
    auto need = [&] {
      VERL_CHECK(!value.empty(), "{}: @{} needs a value (@{}: ...)", where, name, name);
    };
    if (name == "reason") {
      // The rest of the comment up to the next @annotation.
      while (i + 1 < tokens.size() && tokens[i + 1][0] != '@')
        value += (value.empty() ? "" : " ") + tokens[++i];
      need();
      a.reason = value;
    } else if (name == "group") {
      a.group = true;
    } else if (name == "open") {
      a.open = true;
    } else if (name == "type") {
      need();
      a.type = parse_type(value);
      VERL_CHECK(
          a.type,
          "{}: @type: {} is not one of bool, int, float, string, list[string], list[number], map",
          where, value);
    } else if (name == "nullable") {
      a.nullable = true;
    } else if (name == "ours") {
      a.ours = true;
    } else if (name == "unsupported") {
      a.support = Support::Unsupported;
    } else if (name == "ignored") {
      a.support = Support::Ignored;
    } else if (name == "choices") {
      need();
      a.choices = split(value, '|');
    } else if (name == "verl_choices") {
      need();
      a.verl_choices = split(value, '|');
    } else if (name == "ignored_choices") {
      need();
      a.ignored_choices = split(value, '|');
    } else if (name == "alias") {
      need();
      a.alias_of = split(value, ',');
    } else if (name == "range") {
      need();
      // lo..hi with inclusive bounds; a '(' before lo or a ')' after hi excludes that bound
      // (`(0..1` is 0 < x <= 1).
      std::string range = value;
      if (!range.empty() && range.front() == '(') {
        a.min_exclusive = true;
        range.erase(0, 1);
      }
      if (!range.empty() && range.back() == ')') {
        a.max_exclusive = true;
        range.pop_back();
      }
      size_t dd = range.find("..");
      VERL_CHECK(dd != std::string::npos,
                 "{}: @range: {} must be lo..hi (either side may be empty)", where, value);
      std::string lo = range.substr(0, dd), hi = range.substr(dd + 2);
      VERL_CHECK((!a.min_exclusive || !lo.empty()) && (!a.max_exclusive || !hi.empty()),
                 "{}: @range: {} excludes a bound it does not give", where, value);
      if (!lo.empty()) a.min = detail::parse_float(lo);
      if (!hi.empty()) a.max = detail::parse_float(hi);
      VERL_CHECK((lo.empty() || a.min) && (hi.empty() || a.max),
                 "{}: @range: {} has a bound that is not a number", where, value);
    } else {
      VERL_FAIL(
          "{}: unknown annotation @{}; known: type, nullable, choices, verl_choices, "
          "ignored_choices, range, "
          "unsupported, ignored, alias, ours, reason, group, open",
          where, name);
    }
  }
  return a;
}

}  // namespace

class SchemaBuilder {
 public:
  SchemaBuilder(Schema& s, std::string name) : s_(s), name_(std::move(name)) {}

  void build(const std::string& text) {
    s_.source_ = name_;
    std::istringstream in(text);
    for (std::string l; std::getline(in, l);) lines_.push_back(l);
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      VERL_FAIL("{}:{}: not valid YAML: {}", name_, e.mark.line + 1, e.msg);
    }
    VERL_CHECK(root.IsMap(), "{}: the defaults file must be a mapping of sections", name_);
    walk(root, "", Support::Supported, false, "");
    infer_interpolated_types();
    resolve_defaults();
    check_aliases();
  }

 private:
  Schema& s_;
  std::string name_;
  std::vector<std::string> lines_;
  std::vector<detail::Slot> slots_;

  std::string where(int line, const std::string& path) const {
    return fmt::format("{}:{}: {}", name_, line, path);
  }

  size_t add(KeySpec spec, detail::Slot slot) {
    VERL_CHECK(!s_.index_.count(spec.path), "{}:{}: key {} is defined twice", name_, spec.line,
               spec.path);
    size_t i = s_.keys_.size();
    s_.index_[spec.path] = i;
    s_.keys_.push_back(std::move(spec));
    slots_.push_back(std::move(slot));
    return i;
  }

  // `inherited_reason`: a section's @reason applies to the keys below it that give none.
  void walk(const YAML::Node& map, const std::string& prefix, Support inherited,
            bool inherited_ours, const std::string& inherited_reason) {
    for (const auto& kv : map) {
      const std::string key = kv.first.Scalar();
      const std::string path = prefix.empty() ? key : prefix + "." + key;
      const int line = static_cast<int>(kv.first.Mark().line) + 1;
      const std::string at = where(line, path);
      std::string comment = line >= 1 && line <= static_cast<int>(lines_.size())
                                ? line_comment(lines_[line - 1])
                                : "";
      Annotations a = parse_annotations(comment, at);
      VERL_CHECK(!a.doc.empty(),
                 "{}: every key needs a one-line description in a comment on its line", at);

      KeySpec spec;
      spec.path = path;
      spec.line = line;
      spec.doc = a.doc;
      spec.support = a.support.value_or(inherited);
      spec.ours = a.ours || inherited_ours;
      spec.group = a.group;
      spec.reason = a.reason.empty() ? inherited_reason : a.reason;
      const YAML::Node& v = kv.second;

      if (v.IsMap() && v.size() > 0 && !a.type) {
        VERL_CHECK((a.group || (a.choices.empty() && a.verl_choices.empty())) &&
                       a.alias_of.empty() && !a.min && !a.max,
                   "{}: a section takes only @unsupported, @ignored, @ours, @open, @reason and "
                   "(with @group) "
                   "@choices/@verl_choices",
                   at);
        VERL_CHECK(!a.open || spec.support == Support::Ignored,
                   "{}: an @open section must be @ignored", at);
        spec.kind = KeySpec::Kind::Section;
        spec.open = a.open;
        spec.choices = a.choices;
        spec.verl_choices = a.verl_choices;
        if (prefix.empty())
          s_.top_.push_back(path);
        else
          s_.keys_[s_.index_.at(prefix)].children.push_back(path);
        add(spec, {});
        walk(v, path, spec.support, spec.ours, a.reason.empty() ? inherited_reason : a.reason);
        continue;
      }
      // Top-level values exist in verl too (model_engine, the older SFT's
      // ulysses_sequence_parallel_size).
      if (prefix.empty())
        s_.top_.push_back(path);
      else
        s_.keys_[s_.index_.at(prefix)].children.push_back(path);

      if (!a.alias_of.empty()) {
        VERL_CHECK(v.IsNull(), "{}: an alias has no value of its own; write null", at);
        spec.kind = KeySpec::Kind::Alias;
        spec.alias_of = a.alias_of;
        spec.default_text = "null";
        add(spec, {});
        continue;
      }

      spec.kind = KeySpec::Kind::Leaf;
      spec.choices = a.choices;
      spec.verl_choices = a.verl_choices;
      spec.ignored_choices = a.ignored_choices;
      spec.min = a.min;
      spec.max = a.max;
      spec.min_exclusive = a.min_exclusive;
      spec.max_exclusive = a.max_exclusive;
      spec.nullable = a.nullable || v.IsNull();
      detail::Slot slot;
      slot.origin = fmt::format("{}:{}", name_, line);
      if (v.IsScalar() && detail::has_interpolation(v.Scalar())) {
        spec.default_text = v.Scalar();
        slot.pending = true;
        slot.interp = v.Scalar();
        if (a.type) spec.type = *a.type;
        annotated_.push_back(a.type.has_value());
        pending_type_.push_back(s_.keys_.size());
        add(spec, slot);
        continue;
      }
      if (a.type) {
        spec.type = *a.type;
      } else {
        auto t = infer_type(v);
        VERL_CHECK(t, "{}: cannot infer the type from the default {}; add @type: ...", at,
                   v.IsNull() ? "null" : "[]");
        spec.type = *t;
      }
      spec.default_text = v.IsScalar() ? v.Scalar() : detail::show(detail::generic(v));
      if (v.IsNull()) spec.default_text = "null";
      try {
        slot.value = detail::convert_node(v, spec, slot.origin);
      } catch (const detail::Issue& e) {
        VERL_FAIL("{} (the default does not match the key's type)", e.what());
      }
      add(spec, slot);
    }
  }

  static std::optional<Type> infer_type(const YAML::Node& v) {
    if (v.IsNull()) return std::nullopt;
    if (v.IsMap()) return Type::Map;
    if (v.IsSequence()) {
      if (v.size() == 0) return std::nullopt;
      bool numbers = true;
      for (const auto& e : v) numbers = numbers && e.IsScalar() && detail::parse_float(e.Scalar());
      return numbers ? Type::NumberList : Type::StringList;
    }
    if (detail::is_quoted(v)) return Type::String;
    const std::string& s = v.Scalar();
    if (detail::parse_bool(s)) return Type::Bool;
    if (detail::parse_int(s)) return Type::Int;
    if (detail::parse_float(s)) return Type::Float;
    return Type::String;
  }

  // A default like ${data.max_prompt_length} takes the type of the key it names (unless @type
  // says otherwise) and may be null when that key may be.
  void infer_interpolated_types() {
    std::vector<size_t> todo = pending_type_;
    std::vector<char> known(s_.keys_.size(), 1), annotated(s_.keys_.size(), 0);
    for (size_t j = 0; j < todo.size(); ++j) {
      known[todo[j]] = 0;
      annotated[todo[j]] = annotated_[j];
    }
    bool progress = true;
    while (!todo.empty() && progress) {
      progress = false;
      std::vector<size_t> next;
      for (size_t i : todo) {
        KeySpec& spec = s_.keys_[i];
        auto inner = detail::whole_interpolation(spec.default_text);
        if (annotated[i]) {
          if (!inner || !s_.index_.count(detail::parse_ref(*inner, spec.path).path)) {
            known[i] = progress = true;
            continue;
          }
        }
        if (!inner) {  // text around the interpolation: a string
          spec.type = Type::String;
          known[i] = progress = true;
          continue;
        }
        detail::RefExpr r = detail::parse_ref(*inner, spec.path);
        auto it = s_.index_.find(r.path);
        if (it != s_.index_.end() && s_.keys_[it->second].is_alias())
          it = s_.index_.find(s_.keys_[it->second].alias_of[0]);
        if (it != s_.index_.end() && s_.keys_[it->second].is_leaf()) {
          if (!known[it->second]) {
            next.push_back(i);
            continue;
          }
          if (!annotated[i]) spec.type = s_.keys_[it->second].type;
          spec.nullable = spec.nullable || s_.keys_[it->second].nullable;
          known[i] = progress = true;
          continue;
        }
        if (r.select && r.fallback) {
          Json fb = detail::generic(YAML::Load(*r.fallback));
          if (fb.is_boolean())
            spec.type = Type::Bool;
          else if (fb.is_number_integer())
            spec.type = Type::Int;
          else if (fb.is_number())
            spec.type = Type::Float;
          else if (fb.is_string())
            spec.type = Type::String;
          else
            next.push_back(i);
          if (!fb.is_null()) {
            known[i] = progress = true;
            continue;
          }
          continue;
        }
        VERL_FAIL("{}: cannot infer the type of {} from {}; add @type: ...",
                  where(spec.line, spec.path), spec.path, spec.default_text);
      }
      todo = next;
    }
    for (size_t i : todo) {
      VERL_FAIL("{}: cannot infer the type from {} (a cycle or a null default); add @type: ...",
                where(s_.keys_[i].line, s_.keys_[i].path), s_.keys_[i].default_text);
    }
  }

  void resolve_defaults() {
    std::vector<std::string> problems;
    detail::resolve_all(
        s_.keys_,
        [&](const std::string& p) -> long {
          auto it = s_.index_.find(p);
          return it == s_.index_.end() ? -1 : static_cast<long>(it->second);
        },
        [&](const std::string& p) { return s_.suggestion_text(p); }, slots_,
        [&](const std::string& m) { problems.push_back(m); });
    VERL_CHECK(problems.empty(), "{}", fmt::join(problems, "\n"));
    for (size_t i = 0; i < s_.keys_.size(); ++i) {
      KeySpec& k = s_.keys_[i];
      if (!k.is_leaf()) continue;
      k.default_value = slots_[i].value;
      try {
        detail::check_value(k.default_value, k, slots_[i].origin);
      } catch (const detail::Issue& e) {
        VERL_FAIL("{} (the default breaks the key's own annotations)", e.what());
      }
      if (!k.verl_choices.empty() || !k.ignored_choices.empty()) {
        VERL_CHECK(!k.choices.empty(), "{}: @verl_choices/@ignored_choices need @choices too",
                   where(k.line, k.path));
      }
      VERL_CHECK(k.ignored_choices.empty() || k.type == Type::StringList,
                 "{}: @ignored_choices is only for list[string] keys", where(k.line, k.path));
      VERL_CHECK(!(k.min || k.max) || k.type == Type::Int || k.type == Type::Float,
                 "{}: @range is only for int and float keys", where(k.line, k.path));
    }
  }

  void check_aliases() {
    for (auto& k : s_.keys_) {
      if (!k.is_alias()) continue;
      const KeySpec* first = nullptr;
      for (const auto& t : k.alias_of) {
        const KeySpec* target = s_.find(t);
        VERL_CHECK(target && target->is_leaf(),
                   "{}: @alias names {}, which is not a key with a value", where(k.line, k.path),
                   t);
        VERL_CHECK(!first || first->type == target->type,
                   "{}: the targets of an alias must share one type", where(k.line, k.path));
        first = target;
      }
      k.type = first->type;
      k.nullable = first->nullable;
    }
  }

  std::vector<size_t> pending_type_;  // keys whose default interpolates
  std::vector<bool> annotated_;       // ... and whether @type gave their type
};

std::shared_ptr<const Schema> Schema::from_string(const std::string& text,
                                                  const std::string& name) {
  auto s = std::make_shared<Schema>();
  SchemaBuilder(*s, name).build(text);
  return s;
}

std::shared_ptr<const Schema> Schema::from_file(const std::string& path) {
  std::ifstream f(path);
  VERL_CHECK(f.good(), "cannot open the config defaults file {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return from_string(ss.str(), path);
}

std::shared_ptr<const Schema> Schema::builtin() {
  static std::mutex mu;
  static std::shared_ptr<const Schema> schema;
  std::lock_guard<std::mutex> lock(mu);
  if (!schema) schema = from_file(default_config_path());
  return schema;
}

const KeySpec* Schema::find(const std::string& path) const {
  auto it = index_.find(path);
  return it == index_.end() ? nullptr : &keys_[it->second];
}

const KeySpec& Schema::at(const std::string& path) const {
  const KeySpec* k = find(path);
  if (!k) VERL_FAIL("unknown config key '{}'.{}", path, suggestion_text(path));
  return *k;
}

std::vector<std::string> Schema::suggest(const std::string& unknown) const {
  // 1. A known key that ends with what was written ("rollout.n" -> "actor_rollout_ref.rollout.n").
  std::vector<std::string> out;
  for (const auto& k : keys_) {
    if (k.path.size() > unknown.size() &&
        k.path.compare(k.path.size() - unknown.size(), unknown.size(), unknown) == 0 &&
        k.path[k.path.size() - unknown.size() - 1] == '.')
      out.push_back(k.path);
  }
  if (!out.empty()) {
    if (out.size() > 4) out.resize(4);
    return out;
  }
  // 2. The closest full path, when it is close (typos).
  size_t best = std::string::npos;
  for (const auto& k : keys_) best = std::min(best, edit_distance(unknown, k.path));
  size_t limit = std::max<size_t>(2, unknown.size() / 6);
  if (best <= limit) {
    for (const auto& k : keys_)
      if (edit_distance(unknown, k.path) == best) out.push_back(k.path);
    if (out.size() > 4) out.resize(4);
    return out;
  }
  // 3. Keys whose own name is close to the last component (right name, wrong section).
  const std::string last = last_component(unknown);
  size_t best_last = std::string::npos;
  for (const auto& k : keys_)
    best_last = std::min(best_last, edit_distance(last, last_component(k.path)));
  if (best_last <= std::max<size_t>(1, last.size() / 4)) {
    for (const auto& k : keys_)
      if (edit_distance(last, last_component(k.path)) == best_last) out.push_back(k.path);
  }
  if (out.size() > 4) out.resize(4);
  return out;
}

std::string Schema::suggestion_text(const std::string& unknown) const {
  auto s = suggest(unknown);
  if (s.size() == 1) return fmt::format(" Did you mean '{}'?", s[0]);
  if (!s.empty()) return fmt::format(" Did you mean one of: {}?", fmt::join(s, ", "));
  // Nothing close: list what the nearest existing section holds.
  std::string parent = parent_of(unknown);
  while (!parent.empty() && !(find(parent) && find(parent)->is_section()))
    parent = parent_of(parent);
  const std::vector<std::string>& kids = parent.empty() ? top_ : find(parent)->children;
  std::vector<std::string> names;
  for (const auto& c : kids) names.push_back(last_component(c));
  std::string list =
      names.size() > 16 ? fmt::format("{}, ...", fmt::join(names.begin(), names.begin() + 16, ", "))
                        : fmt::format("{}", fmt::join(names, ", "));
  return parent.empty() ? fmt::format(" Top-level sections: {}.", list)
                        : fmt::format(" Keys under '{}': {}.", parent, list);
}

std::string default_config_path() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("VERL_CONFIG_DEFAULTS")) {
    VERL_CHECK(fs::exists(env), "VERL_CONFIG_DEFAULTS={} does not exist", env);
    return env;
  }
  std::vector<fs::path> tried;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path dir = exe.parent_path();
    tried.push_back(dir / "../../configs/ppo_trainer.yaml");  // build/bin/verl in a checkout
    tried.push_back(dir / "../configs/ppo_trainer.yaml");
    tried.push_back(dir / "../share/verl/configs/ppo_trainer.yaml");  // installed
  }
  // The checkout this library was built from.
  tried.push_back(fs::path(__FILE__).parent_path() / "../../configs/ppo_trainer.yaml");
  tried.push_back(fs::current_path(ec) / "configs/ppo_trainer.yaml");
  for (const auto& p : tried) {
    if (fs::exists(p, ec)) return fs::weakly_canonical(p, ec).string();
  }
  std::vector<std::string> names;
  for (const auto& p : tried) names.push_back(p.lexically_normal().string());
  VERL_FAIL(
      "cannot find the config defaults file ppo_trainer.yaml; tried {}; set VERL_CONFIG_DEFAULTS "
      "to its path",
      fmt::join(names, ", "));
}

}  // namespace verl::config
