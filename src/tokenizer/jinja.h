// Our own interpreter for the subset of Jinja2 that chat templates use (no C++ Jinja library is
// packaged in Debian). Semantics follow Jinja2 as transformers configures it: trim_blocks and
// lstrip_blocks on, loop controls (break/continue) on, Python-like values (str, int, float, list,
// dict, None), transformers' tojson (json.dumps with ensure_ascii=False), raise_exception and
// strftime_now. A construct outside the subset is an error naming it and its line:column.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace verl::tokenizer::jinja {

// Bounds on one render, so that a broken or hostile template fails with an error naming its line
// instead of exhausting the stack or memory. Real chat templates stay far below them.
inline constexpr int kMaxCallDepth = 100;                 // macro calls in progress at once
inline constexpr int64_t kMaxLoopIterations = 1'000'000;  // for-loop iterations in one render
inline constexpr int64_t kMaxRangeLength = 100'000;       // items one range() may produce
inline constexpr size_t kMaxStringBytes =
    64u << 20;  // the output or any string (bytes), or a list (items)
// Nesting levels while parsing: brackets, unary operators, blocks inside blocks, and each operand
// of a chain (a + b + c ... or x|f|g ...) count one each, so both the parser's recursion and the
// depth of the trees the renderer walks recursively stay bounded.
inline constexpr int kMaxNesting = 256;

struct Value;
using ValueList = std::vector<Value>;

// A dict keeps insertion order, like Python's; keys are strings.
struct ValueDict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(const std::string& key, Value v);
};

struct CallArgs;
using Function = std::function<Value(CallArgs&)>;

struct Value {
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kFunction
  };
  Kind kind = Kind::kUndefined;
  bool tuple = false;       // a list created as a tuple: printed as (a, b)
  bool namespace_ = false;  // a namespace(): attributes may be assigned with {% set ns.x = ... %}
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // the string; for undefined values, what was undefined (for error messages)
  std::shared_ptr<ValueList> list;
  std::shared_ptr<ValueDict> dict;
  std::shared_ptr<Function> fn;

  static Value undefined(std::string what = "");
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  static Value new_list(ValueList items = {}, bool tuple = false);
  static Value new_dict();
  static Value function(Function fn);
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_number() const {
    return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool;
  }
  bool is_list() const { return kind == Kind::kList; }
  bool is_dict() const { return kind == Kind::kDict; }
  bool truthy() const;
  double as_double() const;
  const char* type_name() const;  // Python's name: str, int, list, dict, NoneType, ...
};

struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  // Positional argument i or keyword `name`, else `dflt`.
  Value get(size_t i, const char* name, Value dflt = Value::undefined()) const;
};

// Python's str(v) (what {{ v }} prints), repr(v) and transformers' tojson.
std::string to_str(const Value& v);
std::string to_repr(const Value& v);
std::string to_json(const Value& v, int indent, bool sort_keys);  // indent < 0: one line
bool values_equal(const Value& a, const Value& b);

struct Node;

class Template {
 public:
  // Parses `source`; `name` prefixes error positions ("chat_template:3:14: ...").
  Template(std::string_view source, std::string name);
  ~Template();
  Template(Template&&) noexcept;
  std::string render(const nlohmann::ordered_json& context) const;

 private:
  std::string name_;
  std::shared_ptr<const Node> root_;
};

}  // namespace verl::tokenizer::jinja
