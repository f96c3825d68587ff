// Values of the Jinja interpreter and their Python-compatible text forms: str() for output,
// repr() inside containers, and transformers' tojson (json.dumps(ensure_ascii=False)).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "tokenizer/jinja.h"
#include "tokenizer/utf8.h"

namespace verl::tokenizer::jinja {

const Value* ValueDict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

Value* ValueDict::find(std::string_view key) {
  for (auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void ValueDict::set(const std::string& key, Value v) {
  if (Value* old = find(key)) {
    *old = std::move(v);
  } else {
    items.emplace_back(key, std::move(v));
  }
}

Value Value::undefined(std::string what) {
  Value v;
  v.s = std::move(what);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::kBool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::kInt;
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.kind = Kind::kString;
  v.s = std::move(x);
  return v;
}
Value Value::new_list(ValueList items, bool tuple) {
  Value v;
  v.kind = Kind::kList;
  v.tuple = tuple;
  v.list = std::make_shared<ValueList>(std::move(items));
  return v;
}
Value Value::new_dict() {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::make_shared<ValueDict>();
  return v;
}
Value Value::function(Function fn) {
  Value v;
  v.kind = Kind::kFunction;
  v.fn = std::make_shared<Function>(std::move(fn));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return integer(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return number(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return new_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = new_dict();
      d.dict->items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it)
        d.dict->items.emplace_back(it.key(), from_json(it.value()));
      return d;
    }
    default:
      return undefined("binary JSON value");
  }
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b;
    case Kind::kInt:
      return i != 0;
    case Kind::kFloat:
      return f != 0.0;
    case Kind::kString:
      return !s.empty();
    case Kind::kList:
      return !list->empty();
    case Kind::kDict:
      return !dict->items.empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

double Value::as_double() const {
  switch (kind) {
    case Kind::kBool:
      return b ? 1.0 : 0.0;
    case Kind::kInt:
      return static_cast<double>(i);
    case Kind::kFloat:
      return f;
    default:
      return 0.0;
  }
}

const char* Value::type_name() const {
  switch (kind) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return tuple ? "tuple" : "list";
    case Kind::kDict:
      return namespace_ ? "Namespace" : "dict";
    case Kind::kFunction:
      return "function";
  }
  return "?";
}

Value CallArgs::get(size_t i, const char* name, Value dflt) const {
  if (i < args.size()) return args[i];
  for (const auto& [k, v] : kwargs)
    if (k == name) return v;
  return dflt;
}

namespace {

// Python's float repr: the shortest digits that round-trip, fixed notation for exponents in
// [-4, 16), otherwise d.ddde+XX.
std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e + 1));
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out += digits + std::string(static_cast<size_t>(exp + 1) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exp + 1)) + "." +
             digits.substr(static_cast<size_t>(exp + 1));
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return out;
}

std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t len = utf8_sequence_length(s, pos);
    if (len == 0) {  // not reachable for valid input; keep the byte visible
      out += fmt::format("\\x{:02x}", static_cast<uint8_t>(s[pos++]));
      continue;
    }
    size_t p2 = pos;
    const uint32_t cp = next_code_point(s, p2);
    if (cp == static_cast<uint32_t>(q) || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || (cp >= 0x7f && cp < 0xa0) || cp == 0xad) {
      out += fmt::format("\\x{:02x}", cp);
    } else if (cp == 0x2028 || cp == 0x2029) {
      out += fmt::format("\\u{:04x}", cp);
    } else {
      out.append(s, pos, len);
    }
    pos = p2;
  }
  out.push_back(q);
  return out;
}

void json_string(const std::string& s, std::string& out) {
  out.push_back('"');
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (u < 0x20)
          out += fmt::format("\\u{:04x}", u);
        else
          out.push_back(c);
    }
  }
  out.push_back('"');
}

void json_value(const Value& v, int indent, bool sort_keys, int level, std::string& out) {
  auto newline = [&](int lvl) {
    out.push_back('\n');
    out.append(static_cast<size_t>(indent * lvl), ' ');
  };
  switch (v.kind) {
    case Value::Kind::kUndefined:
      VERL_FAIL("tojson: object of type Undefined ({}) is not JSON serializable",
                v.s.empty() ? "?" : v.s);
    case Value::Kind::kFunction:
      VERL_FAIL("tojson: object of type function is not JSON serializable");
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.b ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.i);
      return;
    case Value::Kind::kFloat:
      if (std::isnan(v.f))
        out += "NaN";
      else if (std::isinf(v.f))
        out += v.f > 0 ? "Infinity" : "-Infinity";
      else
        out += float_repr(v.f);
      return;
    case Value::Kind::kString:
      json_string(v.s, out);
      return;
    case Value::Kind::kList: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(level + 1);
        json_value((*v.list)[k], indent, sort_keys, level + 1, out);
      }
      if (indent >= 0) newline(level);
      out.push_back(']');
      return;
    }
    case Value::Kind::kDict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (sort_keys)
        std::sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out.push_back('{');
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(level + 1);
        json_string(items[k]->first, out);
        out += ": ";
        json_value(items[k]->second, indent, sort_keys, level + 1, out);
      }
      if (indent >= 0) newline(level);
      out.push_back('}');
      return;
    }
  }
}

}  // namespace

std::string to_repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kString:
      return string_repr(v.s);
    case Value::Kind::kList: {
      std::string out(1, v.tuple ? '(' : '[');
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += to_repr((*v.list)[k]);
      }
      if (v.tuple && v.list->size() == 1) out += ",";
      out.push_back(v.tuple ? ')' : ']');
      return out;
    }
    case Value::Kind::kDict: {
      if (v.namespace_) return "<Namespace>";
      std::string out = "{";
      for (size_t k = 0; k < v.dict->items.size(); ++k) {
        if (k) out += ", ";
        out += string_repr(v.dict->items[k].first) + ": " + to_repr(v.dict->items[k].second);
      }
      return out + "}";
    }
    default:
      return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.b ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.i);
    case Value::Kind::kFloat:
      return float_repr(v.f);
    case Value::Kind::kString:
      return v.s;
    case Value::Kind::kFunction:
      return "<function>";
    default:
      return to_repr(v);
  }
}

std::string to_json(const Value& v, int indent, bool sort_keys) {
  std::string out;
  json_value(v, indent, sort_keys, 0, out);
  return out;
}

bool values_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat) {
      const int64_t x = a.kind == Value::Kind::kBool ? a.b : a.i;
      const int64_t y = b.kind == Value::Kind::kBool ? b.b : b.i;
      return x == y;
    }
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.s == b.s;
    case Value::Kind::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!values_equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Value::Kind::kDict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !values_equal(v, *o)) return false;
      }
      return true;
    case Value::Kind::kFunction:
      return a.fn == b.fn;
    default:
      return false;
  }
}

}  // namespace verl::tokenizer::jinja
