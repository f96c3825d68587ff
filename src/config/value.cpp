// Values of config keys: parsing YAML scalars, converting YAML nodes and interpolation results to
// a key's declared type, checking allowed values and bounds, and resolving ${...} interpolations
// (OmegaConf's syntax as verl uses it: ${a.b}, ${.sibling}, ${oc.select:a.b,default}, ${oc.env:V}).
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "config/detail.h"
#include "core/log.h"

namespace verl::config::detail {

void raise(std::string msg) {
  throw Issue(std::move(msg));
}

bool is_null_text(const std::string& s) {
  return s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL";
}

std::optional<bool> parse_bool(const std::string& s) {
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  return std::nullopt;
}

std::optional<int64_t> parse_int(const std::string& s) {
  if (s.empty()) return std::nullopt;
  size_t start = (s[0] == '+') ? 1 : 0;
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data() + start, s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || start == s.size()) return std::nullopt;
  return v;
}

std::optional<double> parse_float(const std::string& s) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) return std::nullopt;
  std::string t = s;
  // YAML's spellings of infinity and NaN, besides the ones strtod knows.
  if (t == ".inf" || t == ".Inf" || t == "+.inf") return INFINITY;
  if (t == "-.inf" || t == "-.Inf") return -INFINITY;
  if (t == ".nan" || t == ".NaN") return NAN;
  // strtod also reads hex floats and words like "infinity"; a config value never means those.
  for (char c : t) {
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' ||
          c == '+' || c == '-'))
      return std::nullopt;
  }
  char* end = nullptr;
  double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return std::nullopt;
  return v;
}

bool is_quoted(const YAML::Node& n) {
  return n.IsScalar() && n.Tag() == "!";
}

namespace {

// YAML aliases share a node, and a value can name an alias of an alias ... ten times over ("billion
// laughs"): a few lines that expand to 10^9 values. Expanded, no config value comes near these.
constexpr int64_t kMaxValueNodes = int64_t{1} << 16;
constexpr int kMaxValueDepth = 256;

Json generic_bounded(const YAML::Node& n, int64_t& budget, int depth) {
  if (--budget < 0) {
    throw TooLarge(
        fmt::format("the value expands to more than {} YAML nodes (aliases inside aliases?); no "
                    "config value is that large",
                    kMaxValueNodes));
  }
  if (depth > kMaxValueDepth)
    throw TooLarge(fmt::format("the value nests more than {} levels deep", kMaxValueDepth));
  if (!n.IsDefined() || n.IsNull()) return nullptr;
  if (n.IsScalar()) {
    const std::string& s = n.Scalar();
    if (is_quoted(n)) return s;
    if (is_null_text(s)) return nullptr;
    if (auto b = parse_bool(s)) return *b;
    if (auto i = parse_int(s)) return *i;
    if (auto f = parse_float(s)) return *f;
    return s;
  }
  if (n.IsSequence()) {
    Json a = Json::array();
    for (const auto& e : n) a.push_back(generic_bounded(e, budget, depth + 1));
    return a;
  }
  Json o = Json::object();
  for (const auto& kv : n) o[kv.first.Scalar()] = generic_bounded(kv.second, budget, depth + 1);
  return o;
}

}  // namespace

Json generic(const YAML::Node& n) {
  int64_t budget = kMaxValueNodes;
  return generic_bounded(n, budget, 0);
}

std::string format_float(double d) {
  if (std::isnan(d)) return ".nan";
  if (std::isinf(d)) return d > 0 ? ".inf" : "-.inf";
  std::string s = fmt::format("{}", d);  // shortest text that reads back as the same double
  // Keep a '.' in the mantissa so that YAML 1.1 readers (PyYAML) also see a float.
  size_t e = s.find_first_of("eE");
  std::string mant = e == std::string::npos ? s : s.substr(0, e);
  if (mant.find('.') == std::string::npos) {
    mant += ".0";
    s = e == std::string::npos ? mant : mant + s.substr(e);
  }
  return s;
}

std::string scalar_text(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number_float()) return format_float(v.get<double>());
  if (v.is_string()) return v.get<std::string>();
  return show(v);
}

std::string show(const Json& v) {
  if (v.is_string()) return fmt::format("'{}'", v.get_ref<const std::string&>());
  if (v.is_array()) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + scalar_text(v[i]);
    return s + "]";
  }
  if (v.is_object()) return v.dump();
  return scalar_text(v);
}

namespace {

const char* expected_text(Type t) {
  switch (t) {
    case Type::Bool:
      return "a bool (true or false)";
    case Type::Int:
      return "an int";
    case Type::Float:
      return "a float";
    case Type::String:
      return "a string";
    case Type::StringList:
      return "a list of strings";
    case Type::NumberList:
      return "a list of numbers";
    case Type::Map:
      return "a mapping";
  }
  return "?";
}

// Digits with an optional sign: an integer, whatever its size.
bool is_integer_text(const std::string& s) {
  const size_t start = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
  return s.size() > start && std::all_of(s.begin() + static_cast<std::ptrdiff_t>(start), s.end(),
                                         [](char c) { return c >= '0' && c <= '9'; });
}

std::string node_text(const YAML::Node& n) {
  if (n.IsScalar()) return is_quoted(n) ? "'" + n.Scalar() + "'" : n.Scalar();
  return show(generic(n));
}

[[noreturn]] void wrong_type(const KeySpec& spec, const std::string& origin,
                             const std::string& got) {
  raise(fmt::format("{}: {} expects {} (type {}{}), got {}", origin, spec.path,
                    expected_text(spec.type), type_name(spec.type), spec.nullable ? " or null" : "",
                    got));
}

[[noreturn]] void not_nullable(const KeySpec& spec, const std::string& origin) {
  raise(fmt::format("{}: {} may not be null; expected {} (type {})", origin, spec.path,
                    expected_text(spec.type), type_name(spec.type)));
}

// Drops list elements that verl accepts but that mean nothing here (e.g. the wandb logger).
Json drop_ignored(Json list, const KeySpec& spec, const std::string& origin) {
  if (spec.ignored_choices.empty() || !list.is_array()) return list;
  Json kept = Json::array();
  for (const auto& e : list) {
    std::string t = scalar_text(e);
    if (std::find(spec.ignored_choices.begin(), spec.ignored_choices.end(), t) !=
        spec.ignored_choices.end()) {
      log::warn("{}: {} entry '{}' is not available in verl.cpp and is ignored", origin, spec.path,
                t);
    } else {
      kept.push_back(e);
    }
  }
  return kept;
}

}  // namespace

Json convert_node(const YAML::Node& n, const KeySpec& spec, const std::string& origin) {
  if (!n.IsDefined() || n.IsNull()) {
    if (!spec.nullable) not_nullable(spec, origin);
    return nullptr;
  }
  const bool scalar = n.IsScalar();
  const std::string text = scalar ? n.Scalar() : "";
  switch (spec.type) {
    case Type::Bool:
      if (scalar) {
        if (auto b = parse_bool(text)) return *b;
      }
      wrong_type(spec, origin, node_text(n));
    case Type::Int:
      if (scalar) {
        if (auto i = parse_int(text)) return *i;
        if (is_integer_text(text))
          raise(fmt::format("{}: {} = {} is an integer too large for 64 bits", origin, spec.path,
                            text));
      }
      wrong_type(spec, origin, node_text(n));
    case Type::Float:
      if (scalar) {
        if (auto f = parse_float(text)) return *f;
      }
      wrong_type(spec, origin, node_text(n));
    case Type::String:
      if (scalar) return text;
      wrong_type(spec, origin, node_text(n));
    case Type::StringList: {
      Json a = Json::array();
      if (scalar) {
        a.push_back(text);  // verl accepts one file name where a list of them is expected
      } else if (n.IsSequence()) {
        for (size_t i = 0; i < n.size(); ++i) {
          if (!n[i].IsScalar())
            raise(fmt::format("{}: {}[{}] expects a string, got {}", origin, spec.path, i,
                              node_text(n[i])));
          a.push_back(n[i].Scalar());
        }
      } else {
        wrong_type(spec, origin, node_text(n));
      }
      return drop_ignored(std::move(a), spec, origin);
    }
    case Type::NumberList: {
      Json a = Json::array();
      auto number = [&](const YAML::Node& e, size_t i) -> Json {
        if (e.IsScalar()) {
          if (auto v = parse_int(e.Scalar())) return *v;
          if (auto v = parse_float(e.Scalar())) return *v;
        }
        raise(
            fmt::format("{}: {}[{}] expects a number, got {}", origin, spec.path, i, node_text(e)));
      };
      if (n.IsSequence()) {
        for (size_t i = 0; i < n.size(); ++i) a.push_back(number(n[i], i));
      } else {
        wrong_type(spec, origin, node_text(n));
      }
      return a;
    }
    case Type::Map:
      if (n.IsMap()) return generic(n);
      wrong_type(spec, origin, node_text(n));
  }
  wrong_type(spec, origin, node_text(n));
}

Json convert_json(const Json& v, const KeySpec& spec, const std::string& origin) {
  if (v.is_null()) {
    if (!spec.nullable) not_nullable(spec, origin);
    return nullptr;
  }
  switch (spec.type) {
    case Type::Bool:
      if (v.is_boolean()) return v;
      if (v.is_string()) {
        if (auto b = parse_bool(v.get<std::string>())) return *b;
      }
      break;
    case Type::Int:
      if (v.is_number_integer()) return v;
      if (v.is_string()) {
        if (auto i = parse_int(v.get<std::string>())) return *i;
      }
      break;
    case Type::Float:
      if (v.is_number()) return v.get<double>();
      if (v.is_string()) {
        if (auto f = parse_float(v.get<std::string>())) return *f;
      }
      break;
    case Type::String:
      if (v.is_string()) return v;
      if (v.is_primitive()) return scalar_text(v);
      break;
    case Type::StringList:
      if (v.is_string()) return drop_ignored(Json::array({v}), spec, origin);
      if (v.is_array()) {
        Json a = Json::array();
        for (const auto& e : v) {
          if (!e.is_primitive() || e.is_null()) break;
          a.push_back(scalar_text(e));
        }
        if (a.size() == v.size()) return drop_ignored(std::move(a), spec, origin);
      }
      break;
    case Type::NumberList:
      if (v.is_array() &&
          std::all_of(v.begin(), v.end(), [](const Json& e) { return e.is_number(); }))
        return v;
      break;
    case Type::Map:
      if (v.is_object()) return v;
      break;
  }
  wrong_type(spec, origin, show(v));
}

void check_value(const Json& v, const KeySpec& spec, const std::string& origin) {
  if (v.is_null()) return;
  auto check_one = [&](const std::string& t) {
    auto has = [&](const std::vector<std::string>& set) {
      return std::find(set.begin(), set.end(), t) != set.end();
    };
    if (has(spec.verl_choices)) {
      raise(fmt::format(
          "{}: {} = {} is a verl option that verl.cpp does not support yet; supported: {}{}",
          origin, spec.path, t, fmt::join(spec.choices, ", "),
          spec.reason.empty() ? "" : " (" + spec.reason + ")"));
    }
    if (!spec.choices.empty() && !has(spec.choices)) {
      std::string hint;
      size_t best = 3;  // the nearest choice within two edits ("grpoo" is grpo, not rloo)
      for (const auto& c : spec.choices) {
        if (const size_t d = edit_distance(c, t); d < best) {
          best = d;
          hint = fmt::format(" (did you mean '{}'?)", c);
        }
      }
      raise(fmt::format("{}: {} = {} is not allowed; allowed values: {}{}", origin, spec.path, t,
                        fmt::join(spec.choices, ", "), hint));
    }
  };
  if (v.is_array()) {
    for (const auto& e : v) check_one(scalar_text(e));
  } else if (v.is_primitive()) {
    check_one(scalar_text(v));
  }
  // NaN compares false with every bound, so it would pass the range check below; and no key
  // (rates, coefficients, ratios, lengths) means anything at NaN or infinity.
  auto finite = [&](const Json& x, const std::string& where) {
    if (x.is_number_float() && !std::isfinite(x.get<double>()))
      raise(fmt::format("{}: {} = {} is not a finite number; {} expects {}", origin, where,
                        scalar_text(x), spec.path,
                        spec.min || spec.max ? "a finite value in its range" : "a finite number"));
  };
  if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) finite(v[i], fmt::format("{}[{}]", spec.path, i));
  } else {
    finite(v, spec.path);
  }
  if (v.is_number() && (spec.min || spec.max)) {
    double x = v.get<double>();
    bool low = spec.min && (spec.min_exclusive ? x <= *spec.min : x < *spec.min);
    bool high = spec.max && (spec.max_exclusive ? x >= *spec.max : x > *spec.max);
    if (low || high) {
      const char* open = spec.min_exclusive ? "(" : "[";
      const char* close = spec.max_exclusive ? ")" : "]";
      std::string want =
          spec.min && spec.max
              ? fmt::format("a value in {}{}, {}{}", open, *spec.min, *spec.max, close)
          : spec.min ? fmt::format("a value {} {}", spec.min_exclusive ? ">" : ">=", *spec.min)
                     : fmt::format("a value {} {}", spec.max_exclusive ? "<" : "<=", *spec.max);
      raise(fmt::format("{}: {} = {} is out of range; expected {}", origin, spec.path,
                        scalar_text(v), want));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Interpolation

bool has_interpolation(const std::string& s) {
  return s.find("${") != std::string::npos;
}

namespace {

// Index of the '}' closing the "${" at `open`, or npos.
size_t match_close(const std::string& s, size_t open) {
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    if (s.compare(i, 2, "${") == 0) {
      ++depth;
      ++i;
    } else if (s[i] == '}') {
      if (--depth == 0) return i;
    }
  }
  return std::string::npos;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// Splits "path,default" at the first comma outside brackets, braces and quotes.
std::pair<std::string, std::optional<std::string>> split_arg(const std::string& s) {
  int depth = 0;
  char quote = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '[' || c == '{') {
      ++depth;
    } else if (c == ']' || c == '}') {
      --depth;
    } else if (c == ',' && depth == 0) {
      return {trim(s.substr(0, i)), trim(s.substr(i + 1))};
    }
  }
  return {trim(s), std::nullopt};
}

struct Skip {};  // a referenced key already failed; its own error has been reported

}  // namespace

std::optional<std::string> whole_interpolation(const std::string& s) {
  if (s.rfind("${", 0) != 0) return std::nullopt;
  size_t close = match_close(s, 0);
  if (close != s.size() - 1) return std::nullopt;
  return s.substr(2, s.size() - 3);
}

RefExpr parse_ref(const std::string& expr_in, const std::string& holder_path) {
  RefExpr r;
  std::string expr = trim(expr_in);
  std::string path;
  if (expr.rfind("oc.select:", 0) == 0) {
    r.select = true;
    auto [p, d] = split_arg(expr.substr(10));
    path = p;
    r.fallback = d;
  } else if (expr.rfind("oc.env:", 0) == 0) {
    auto [p, d] = split_arg(expr.substr(7));
    r.env = p;
    r.fallback = d;
    return r;
  } else {
    size_t colon = expr.find(':');
    if (colon != std::string::npos)
      raise(
          fmt::format("resolver '{}' in ${{{}}} is not supported; use ${{a.b}}, "
                      "${{oc.select:a.b,default}} or ${{oc.env:VAR}}",
                      expr.substr(0, colon), expr));
    path = expr;
  }
  size_t dots = 0;
  while (dots < path.size() && path[dots] == '.') ++dots;
  if (dots == 0) {
    r.path = path;
    return r;
  }
  // Relative: one dot is the holder's own section, each further dot one level up.
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t dot = holder_path.find('.', start);
    parts.push_back(holder_path.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  parts.pop_back();  // the holder's own name
  for (size_t i = 1; i < dots && !parts.empty(); ++i) parts.pop_back();
  std::string base;
  for (const auto& p : parts) base += (base.empty() ? "" : ".") + p;
  std::string rest = path.substr(dots);
  r.path = base.empty() ? rest : base + "." + rest;
  return r;
}

void resolve_all(const std::vector<KeySpec>& keys,
                 const std::function<long(const std::string&)>& index_of,
                 const std::function<std::string(const std::string&)>& suggest,
                 std::vector<Slot>& slots, const std::function<void(const std::string&)>& report) {
  std::vector<char> failed(slots.size(), 0);
  std::vector<size_t> stack;

  std::function<Json(size_t)> resolve_slot;
  std::function<Json(const std::string&, size_t)> eval;
  std::function<std::string(const std::string&, size_t)> interpolate_string;

  auto parse_fallback = [&](const std::string& text_in, size_t holder) -> Json {
    // verl writes quoted defaults inside a plain YAML scalar as \"...\"; drop the backslashes.
    std::string text;
    for (size_t k = 0; k < text_in.size(); ++k) {
      if (!(text_in[k] == '\\' && k + 1 < text_in.size() && text_in[k + 1] == '"'))
        text += text_in[k];
    }
    if (has_interpolation(text)) {
      if (auto inner = whole_interpolation(text)) return eval(*inner, holder);
      return interpolate_string(text, holder);
    }
    try {
      return generic(YAML::Load(text));
    } catch (const YAML::Exception&) {
      return text;
    }
  };

  eval = [&](const std::string& expr, size_t holder) -> Json {
    const KeySpec& h = keys[holder];
    RefExpr r;
    try {
      r = parse_ref(expr, h.path);
    } catch (const Issue& e) {
      raise(fmt::format("{}: {}: {}", slots[holder].origin, h.path, e.what()));
    }
    if (!r.env.empty()) {
      if (const char* v = std::getenv(r.env.c_str())) return std::string(v);
      if (r.fallback) return parse_fallback(*r.fallback, holder);
      raise(fmt::format("{}: {} refers to environment variable {}, which is not set",
                        slots[holder].origin, h.path, r.env));
    }
    long idx = index_of(r.path);
    if (idx < 0) {
      if (r.select) return r.fallback ? parse_fallback(*r.fallback, holder) : Json(nullptr);
      raise(fmt::format("{}: {} = ${{{}}} refers to unknown key '{}'.{}", slots[holder].origin,
                        h.path, expr, r.path, suggest(r.path)));
    }
    if (keys[idx].is_alias()) idx = index_of(keys[idx].alias_of.front());
    if (keys[idx].is_section())
      raise(
          fmt::format("{}: {} = ${{{}}} refers to the section '{}'; interpolations must name a key "
                      "with a value",
                      slots[holder].origin, h.path, expr, r.path));
    return resolve_slot(static_cast<size_t>(idx));
  };

  interpolate_string = [&](const std::string& s, size_t holder) -> Json {
    std::string out;
    size_t i = 0;
    while (i < s.size()) {
      size_t open = s.find("${", i);
      if (open == std::string::npos) {
        out += s.substr(i);
        break;
      }
      size_t close = match_close(s, open);
      if (close == std::string::npos)
        raise(fmt::format("{}: {} = {}: unterminated ${{", slots[holder].origin, keys[holder].path,
                          s));
      out += s.substr(i, open - i);
      Json v = eval(s.substr(open + 2, close - open - 2), holder);
      if (v.is_array() || v.is_object())
        raise(fmt::format("{}: {} = {}: only scalars can be spliced into a string, got {}",
                          slots[holder].origin, keys[holder].path, s, show(v)));
      out += scalar_text(v);
      i = close + 1;
    }
    return out;
  };

  resolve_slot = [&](size_t i) -> Json {
    Slot& slot = slots[i];
    if (failed[i]) throw Skip{};
    if (!slot.pending) return slot.value;
    if (slot.resolving) {
      std::string chain;
      auto it = std::find(stack.begin(), stack.end(), i);
      for (; it != stack.end(); ++it) chain += keys[*it].path + " -> ";
      raise(fmt::format("{}: interpolation cycle: {}{}", slot.origin, chain, keys[i].path));
    }
    slot.resolving = true;
    stack.push_back(i);
    try {
      Json raw;
      if (auto inner = whole_interpolation(slot.interp)) {
        raw = eval(*inner, i);
      } else {
        raw = interpolate_string(slot.interp, i);
      }
      std::string where = fmt::format("{} (from {})", slot.origin, slot.interp);
      Json v = convert_json(raw, keys[i], where);
      check_value(v, keys[i], where);
      slot.value = std::move(v);
    } catch (...) {
      slot.resolving = false;
      slot.pending = false;
      failed[i] = 1;
      stack.pop_back();
      throw;
    }
    slot.resolving = false;
    slot.pending = false;
    stack.pop_back();
    return slot.value;
  };

  for (size_t i = 0; i < slots.size(); ++i) {
    if (!slots[i].pending) continue;
    try {
      resolve_slot(i);
    } catch (const Skip&) {
    } catch (const Issue& e) {
      report(e.what());
    }
  }
}

}  // namespace verl::config::detail
