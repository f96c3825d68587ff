// Evaluator of the Jinja interpreter: scopes (a for-loop iteration, a macro call and a with block
// each get their own, as in Jinja2, so {% set %} inside them does not leak out), expressions with
// Python semantics, and the filters, tests, globals and str/dict/list methods that chat templates
// use. Undefined values behave as Jinja2's default Undefined: printing gives "", testing gives
// false, but attribute access or arithmetic on them is an error.
#include <unicode/uchar.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <ctime>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/utf8.h"

namespace verl::tokenizer::jinja {

namespace {

using Kind = Value::Kind;

bool py_isspace(uint32_t cp) {
  return (cp >= 9 && cp <= 13) || (cp >= 28 && cp <= 32) || cp == 0x85 || cp == 0xa0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> cps;
  size_t pos = 0;
  while (pos < s.size()) cps.push_back(next_code_point(s, pos));
  return cps;
}

std::string from_code_points(const std::vector<uint32_t>& cps, size_t b, size_t e) {
  std::string out;
  for (size_t k = b; k < e; ++k) append_utf8(out, cps[k]);
  return out;
}

// Python's str.strip family; `chars` empty means whitespace.
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::vector<uint32_t> cps = code_points(s);
  std::vector<uint32_t> set;
  const bool ws = chars.is_undefined() || chars.is_none();
  if (!ws) set = code_points(chars.s);
  auto strip_it = [&](uint32_t cp) {
    return ws ? py_isspace(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return from_code_points(cps, b, e);
}

std::string map_case(const std::string& s, int mode) {  // 0 lower, 1 upper
  std::string out;
  size_t pos = 0;
  while (pos < s.size()) {
    const auto cp = static_cast<UChar32>(next_code_point(s, pos));
    append_utf8(out, static_cast<uint32_t>(mode == 0 ? u_tolower(cp) : u_toupper(cp)));
  }
  return out;
}

// Python's str.title: a cased letter after an uncased character is upper-cased, others lowered.
std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  size_t pos = 0;
  while (pos < s.size()) {
    const auto cp = static_cast<UChar32>(next_code_point(s, pos));
    const bool cased = u_hasBinaryProperty(cp, UCHAR_CASED);
    append_utf8(out, static_cast<uint32_t>(prev_cased ? u_tolower(cp) : u_totitle(cp)));
    prev_cased = cased;
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  std::string out;
  size_t pos = 0;
  bool first = true;
  while (pos < s.size()) {
    const auto cp = static_cast<UChar32>(next_code_point(s, pos));
    append_utf8(out, static_cast<uint32_t>(first ? u_totitle(cp) : u_tolower(cp)));
    first = false;
  }
  return out;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to,
                        int64_t count) {
  if (from.empty()) {  // Python inserts `to` between characters
    std::string out = to;
    size_t pos = 0;
    int64_t n = 1;
    while (pos < s.size()) {
      const size_t p0 = pos;
      next_code_point(s, pos);
      out.append(s, p0, pos - p0);
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
    }
    return out;
  }
  std::string out;
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
    ++n;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

// Python's str.split / rsplit.
Value py_split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  ValueList parts;
  if (sep.is_undefined() || sep.is_none()) {  // runs of whitespace; no empty strings
    const std::vector<uint32_t> cps = code_points(s);
    std::vector<std::pair<size_t, size_t>> words;
    size_t k = 0;
    while (k < cps.size()) {
      while (k < cps.size() && py_isspace(cps[k])) ++k;
      if (k >= cps.size()) break;
      size_t b = k;
      while (k < cps.size() && !py_isspace(cps[k])) ++k;
      words.emplace_back(b, k);
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
      if (!from_right) {
        size_t rest = words[static_cast<size_t>(maxsplit)].first;
        size_t end = cps.size();
        while (end > rest && py_isspace(cps[end - 1])) --end;
        for (int64_t w = 0; w < maxsplit; ++w)
          parts.push_back(Value::string(from_code_points(cps, words[w].first, words[w].second)));
        parts.push_back(Value::string(from_code_points(cps, rest, end)));
      } else {
        const size_t first_kept = words.size() - static_cast<size_t>(maxsplit);
        size_t b = 0;
        while (b < cps.size() && py_isspace(cps[b])) ++b;
        parts.push_back(Value::string(from_code_points(cps, b, words[first_kept - 1].second)));
        for (size_t w = first_kept; w < words.size(); ++w)
          parts.push_back(Value::string(from_code_points(cps, words[w].first, words[w].second)));
      }
    } else {
      for (auto [b, e] : words) parts.push_back(Value::string(from_code_points(cps, b, e)));
    }
    return Value::new_list(std::move(parts));
  }
  VERL_CHECK(sep.is_string(), "split: separator must be a string, got {}", sep.type_name());
  VERL_CHECK(!sep.s.empty(), "split: empty separator");
  std::vector<std::string> pieces;
  if (!from_right) {
    size_t pos = 0;
    int64_t n = 0;
    while (maxsplit < 0 || n < maxsplit) {
      const size_t hit = s.find(sep.s, pos);
      if (hit == std::string::npos) break;
      pieces.push_back(s.substr(pos, hit - pos));
      pos = hit + sep.s.size();
      ++n;
    }
    pieces.push_back(s.substr(pos));
  } else {
    size_t end = s.size();
    int64_t n = 0;
    std::vector<std::string> rev;
    while (maxsplit < 0 || n < maxsplit) {
      if (end < sep.s.size()) break;
      const size_t hit = s.rfind(sep.s, end - sep.s.size());
      if (hit == std::string::npos) break;
      rev.push_back(s.substr(hit + sep.s.size(), end - hit - sep.s.size()));
      end = hit;
      ++n;
    }
    rev.push_back(s.substr(0, end));
    pieces.assign(rev.rbegin(), rev.rend());
  }
  for (auto& p : pieces) parts.push_back(Value::string(std::move(p)));
  return Value::new_list(std::move(parts));
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// Python slice indices for a sequence of length n.
std::vector<size_t> slice_indices(int64_t n, const Value& start, const Value& stop,
                                  const Value& step_v) {
  const int64_t step = step_v.is_undefined() || step_v.is_none() ? 1 : step_v.i;
  VERL_CHECK(step != 0, "slice step cannot be zero");
  auto clamp = [&](const Value& v, int64_t dflt, bool is_start) {
    if (v.is_undefined() || v.is_none()) return dflt;
    int64_t x = v.i;
    if (x < 0) x += n;
    if (step > 0) return std::clamp<int64_t>(x, 0, n);
    (void)is_start;
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = clamp(start, step > 0 ? 0 : n - 1, true);
  const int64_t e = clamp(stop, step > 0 ? n : -1, false);
  std::vector<size_t> idx;
  if (step > 0)
    for (int64_t k = b; k < e; k += step) idx.push_back(static_cast<size_t>(k));
  else
    for (int64_t k = b; k > e; k += step) idx.push_back(static_cast<size_t>(k));
  return idx;
}

int compare_values(const Value& a, const Value& b, bool& ok) {
  ok = true;
  if (a.is_number() && b.is_number()) {
    const double x = a.as_double(), y = b.as_double();
    if (a.kind != Kind::kFloat && b.kind != Kind::kFloat) {
      const int64_t p = a.kind == Kind::kBool ? a.b : a.i, q = b.kind == Kind::kBool ? b.b : b.i;
      return p < q ? -1 : (p > q ? 1 : 0);
    }
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) return a.s < b.s ? -1 : (a.s > b.s ? 1 : 0);
  if (a.is_list() && b.is_list()) {
    for (size_t k = 0; k < std::min(a.list->size(), b.list->size()); ++k) {
      if (values_equal((*a.list)[k], (*b.list)[k])) continue;
      return compare_values((*a.list)[k], (*b.list)[k], ok);
    }
    return a.list->size() < b.list->size() ? -1 : (a.list->size() > b.list->size() ? 1 : 0);
  }
  ok = false;
  return 0;
}

class Renderer {
 public:
  Renderer(const std::string& name, const nlohmann::ordered_json& ctx) : name_(name) {
    scopes_.emplace_back();
    if (ctx.is_object())
      for (auto it = ctx.begin(); it != ctx.end(); ++it)
        scopes_[0][it.key()] = Value::from_json(it.value());
  }

  std::string run(const Node& root) {
    std::string out;
    const Flow f = exec_body(root.bodies[0], out);
    if (f != Flow::kNormal) fail(root.pos, "{% break %} or {% continue %} outside a loop");
    return out;
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using Scope = std::unordered_map<std::string, Value>;

  [[noreturn]] void fail(const Pos& p, const std::string& msg) const {
    VERL_FAIL("{}:{}:{}: {}", name_, p.line, p.col, msg);
  }

  // A hostile or broken template must not exhaust memory or the stack (limits in jinja.h).
  void check_size(size_t bytes, const Pos& p, const char* what) const {
    if (bytes > kMaxStringBytes)
      fail(p, fmt::format("{} grew past {} bytes, the limit of a rendered string", what,
                          kMaxStringBytes));
  }
  void count_iteration(const Pos& p) {
    if (++iterations_ > kMaxLoopIterations)
      fail(p, fmt::format("more than {} loop iterations in one render, the limit",
                          kMaxLoopIterations));
  }

  // ---- statements ----

  Flow exec_body(const Body& body, std::string& out) {
    for (const NodePtr& n : body) {
      const Flow f = exec(*n, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow exec(const Node& n, std::string& out) {
    switch (n.kind) {
      case Node::Kind::kText:
        out += n.text;
        check_size(out.size(), n.pos, "the output");
        return Flow::kNormal;
      case Node::Kind::kOutput:
        out += to_str(eval(*n.expr));
        check_size(out.size(), n.pos, "the output");
        return Flow::kNormal;
      case Node::Kind::kIf:
        for (size_t k = 0; k < n.conds.size(); ++k)
          if (eval(*n.conds[k]).truthy()) return exec_body(n.bodies[k], out);
        return exec_body(n.else_body, out);
      case Node::Kind::kFor:
        return exec_for(n, out);
      case Node::Kind::kSet:
        exec_set(n);
        return Flow::kNormal;
      case Node::Kind::kSetBlock: {
        std::string text;
        if (exec_body(n.bodies[0], text) != Flow::kNormal)
          fail(n.pos, "{% break %}/{% continue %} inside {% set %} block");
        scopes_.back()[n.targets[0]] = Value::string(std::move(text));
        return Flow::kNormal;
      }
      case Node::Kind::kMacro:
        define_macro(n);
        return Flow::kNormal;
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
      case Node::Kind::kWith: {
        Scope scope;
        for (const auto& [pname, e] : n.params) scope[pname] = eval(*e);
        scopes_.push_back(std::move(scope));
        const Flow f = exec_body(n.bodies[0], out);
        scopes_.pop_back();
        return f;
      }
      case Node::Kind::kScope:
        return exec_body(n.bodies[0], out);
    }
    return Flow::kNormal;
  }

  ValueList iterate(const Value& v, const Pos& p) {
    switch (v.kind) {
      case Kind::kUndefined:
        return {};
      case Kind::kList:
        return *v.list;
      case Kind::kDict: {
        ValueList keys;
        for (const auto& kv : v.dict->items) keys.push_back(Value::string(kv.first));
        return keys;
      }
      case Kind::kString: {
        ValueList chars;
        size_t pos = 0;
        while (pos < v.s.size()) {
          const size_t p0 = pos;
          next_code_point(v.s, pos);
          chars.push_back(Value::string(v.s.substr(p0, pos - p0)));
        }
        return chars;
      }
      default:
        fail(p, fmt::format("'{}' object is not iterable", v.type_name()));
    }
  }

  void bind_targets(Scope& scope, const std::vector<std::string>& targets, const Value& v,
                    const Pos& p) {
    if (targets.size() == 1) {
      scope[targets[0]] = v;
      return;
    }
    ValueList items = iterate(v, p);
    if (items.size() != targets.size())
      fail(p, fmt::format("cannot unpack {} values into {} names", items.size(), targets.size()));
    for (size_t k = 0; k < targets.size(); ++k) scope[targets[k]] = items[k];
  }

  Flow exec_for(const Node& n, std::string& out) {
    ValueList items = iterate(eval(*n.expr), n.expr->pos);
    if (n.filter) {  // `for x in xs if cond`: loop.length counts the kept items
      ValueList kept;
      for (const Value& it : items) {
        count_iteration(n.pos);
        Scope probe;
        bind_targets(probe, n.targets, it, n.pos);
        scopes_.push_back(std::move(probe));
        const bool keep = eval(*n.filter).truthy();
        scopes_.pop_back();
        if (keep) kept.push_back(it);
      }
      items.swap(kept);
    }
    if (items.empty()) return exec_body(n.else_body, out);
    const auto len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len; ++k) {
      count_iteration(n.pos);
      Scope scope;
      bind_targets(scope, n.targets, items[static_cast<size_t>(k)], n.pos);
      Value loop = Value::new_dict();
      ValueDict& d = *loop.dict;
      d.set("index", Value::integer(k + 1));
      d.set("index0", Value::integer(k));
      d.set("revindex", Value::integer(len - k));
      d.set("revindex0", Value::integer(len - k - 1));
      d.set("first", Value::boolean(k == 0));
      d.set("last", Value::boolean(k == len - 1));
      d.set("length", Value::integer(len));
      d.set("depth", Value::integer(1));
      d.set("depth0", Value::integer(0));
      d.set("previtem",
            k > 0 ? items[static_cast<size_t>(k - 1)] : Value::undefined("loop.previtem"));
      d.set("nextitem",
            k + 1 < len ? items[static_cast<size_t>(k + 1)] : Value::undefined("loop.nextitem"));
      d.set("cycle", Value::function([k](CallArgs& a) {
              VERL_CHECK(!a.args.empty(), "loop.cycle() needs at least one argument");
              return a.args[static_cast<size_t>(k) % a.args.size()];
            }));
      scope["loop"] = loop;
      scopes_.push_back(std::move(scope));
      const Flow f = exec_body(n.bodies[0], out);
      scopes_.pop_back();
      if (f == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  void exec_set(const Node& n) {
    Value v = eval(*n.expr);
    if (!n.attr.empty()) {
      Value target = lookup(n.targets[0]);
      if (!(target.is_dict() && target.namespace_))
        fail(n.pos, fmt::format("cannot assign attribute '{}' on '{}': it is not a namespace()",
                                n.attr, n.targets[0]));
      target.dict->set(n.attr, std::move(v));
      return;
    }
    bind_targets(scopes_.back(), n.targets, v, n.pos);
  }

  void define_macro(const Node& n) {
    const Node* node = &n;
    scopes_.back()[n.name] = Value::function([this, node](CallArgs& a) {
      if (depth_ >= kMaxCallDepth)
        fail(node->pos,
             fmt::format("macro '{}' nested more than {} calls deep (runaway recursion?)",
                         node->name, kMaxCallDepth));
      struct Depth {
        int& d;
        explicit Depth(int& x) : d(x) { ++d; }
        ~Depth() { --d; }
      } depth(depth_);
      if (a.args.size() > node->params.size())
        fail(node->pos, fmt::format("macro '{}' takes {} arguments, got {}", node->name,
                                    node->params.size(), a.args.size()));
      for (const auto& [k, v] : a.kwargs) {
        bool known = false;
        for (const auto& p : node->params) known |= p.first == k;
        if (!known) fail(node->pos, fmt::format("macro '{}' has no parameter '{}'", node->name, k));
      }
      // The body sees the template's top-level variables and its own; Jinja2 closures are wider
      // but templates do not rely on that.
      std::vector<Scope> saved;
      saved.swap(scopes_);
      scopes_.push_back(saved[0]);
      scopes_.emplace_back();
      for (size_t k = 0; k < node->params.size(); ++k) {
        const auto& [pname, dflt] = node->params[k];
        Value v = a.get(k, pname.c_str());
        if (v.is_undefined() && dflt) v = eval(*dflt);
        scopes_.back()[pname] = v;
      }
      std::string text;
      Flow f;
      try {
        f = exec_body(node->bodies[0], text);
      } catch (...) {
        scopes_.swap(saved);
        throw;
      }
      // Top-level changes made inside the macro do not escape: restore the caller's scopes.
      scopes_.swap(saved);
      if (f != Flow::kNormal)
        fail(node->pos, "{% break %}/{% continue %} outside a loop in a macro");
      return Value::string(std::move(text));
    });
  }

  // ---- names ----

  Value lookup(const std::string& name) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return global(name);
  }

  Value global(const std::string& name) {
    if (name == "range") {
      return Value::function([](CallArgs& a) {
        int64_t start = 0, stop = 0, step = 1;
        for (const Value& v : a.args)
          VERL_CHECK(v.kind == Kind::kInt, "range() arguments must be integers, got {}",
                     v.type_name());
        if (a.args.size() == 1) {
          stop = a.args[0].i;
        } else if (a.args.size() >= 2) {
          start = a.args[0].i;
          stop = a.args[1].i;
          if (a.args.size() == 3) step = a.args[2].i;
        } else {
          VERL_FAIL("range() takes 1 to 3 arguments");
        }
        VERL_CHECK(step != 0, "range() step must not be zero");
        const double count =
            step > 0 ? std::ceil((static_cast<double>(stop) - start) / step)
                     : std::ceil((static_cast<double>(start) - stop) / -static_cast<double>(step));
        VERL_CHECK(count <= static_cast<double>(kMaxRangeLength),
                   "range() of {} items is over the limit of {}", static_cast<int64_t>(count),
                   kMaxRangeLength);
        ValueList out;
        for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step)
          out.push_back(Value::integer(k));
        return Value::new_list(std::move(out));
      });
    }
    if (name == "namespace" || name == "dict") {
      const bool ns = name == "namespace";
      return Value::function([ns](CallArgs& a) {
        Value d = Value::new_dict();
        d.namespace_ = ns;
        for (const Value& v : a.args) {
          VERL_CHECK(v.is_dict(), "namespace()/dict() positional argument must be a dict");
          for (const auto& kv : v.dict->items) d.dict->set(kv.first, kv.second);
        }
        for (const auto& [k, v] : a.kwargs) d.dict->set(k, v);
        return d;
      });
    }
    if (name == "raise_exception") {
      return Value::function([this](CallArgs& a) -> Value {
        VERL_FAIL("{}: template raised an exception: {}", name_,
                  a.args.empty() ? "" : to_str(a.args[0]));
      });
    }
    if (name == "strftime_now") {
      return Value::function([](CallArgs& a) {
        const std::string fmt_s = a.args.empty() ? "%Y-%m-%d" : to_str(a.args[0]);
        std::time_t t = std::time(nullptr);
        std::tm tm{};
        localtime_r(&t, &tm);
        char buf[256];
        const size_t len = std::strftime(buf, sizeof(buf), fmt_s.c_str(), &tm);
        return Value::string(std::string(buf, len));
      });
    }
    return Value::undefined(name);
  }

  // ---- expressions ----

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName:
        return lookup(e.name);
      case Expr::Kind::kAttr:
        return get_attr(eval(*e.kids[0]), e.name, e.pos, describe(*e.kids[0]));
      case Expr::Kind::kItem:
        return get_item(eval(*e.kids[0]), eval(*e.kids[1]), e.pos, describe(*e.kids[0]));
      case Expr::Kind::kSlice: {
        Value obj = eval(*e.kids[0]);
        Value parts[3];
        for (int k = 0; k < 3; ++k) {
          if (e.kids[static_cast<size_t>(k + 1)])
            parts[k] = eval(*e.kids[static_cast<size_t>(k + 1)]);
          if (!parts[k].is_undefined() && !parts[k].is_none() && parts[k].kind != Kind::kInt)
            fail(e.pos,
                 fmt::format("slice indices must be integers, got {}", parts[k].type_name()));
        }
        return slice(obj, parts[0], parts[1], parts[2], e.pos);
      }
      case Expr::Kind::kCall: {
        Value callee = eval(*e.kids[0]);
        CallArgs args = eval_args(e);
        if (callee.kind != Kind::kFunction) {
          if (callee.is_undefined())
            fail(e.pos,
                 fmt::format("'{}' is undefined (called as a function)", describe(*e.kids[0])));
          fail(e.pos, fmt::format("'{}' object is not callable", callee.type_name()));
        }
        return call(callee, args, e.pos);
      }
      case Expr::Kind::kFilter: {
        Value operand = eval(*e.kids[0]);
        CallArgs args = eval_args(e);
        return apply_filter(e.name, operand, args, e.pos);
      }
      case Expr::Kind::kTest: {
        Value operand = eval(*e.kids[0]);
        CallArgs args = eval_args(e);
        const bool r = apply_test(e.name, operand, args, e.pos);
        return Value::boolean(e.negated ? !r : r);
      }
      case Expr::Kind::kNot:
        return Value::boolean(!eval(*e.kids[0]).truthy());
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        Value v = eval(*e.kids[0]);
        const bool neg = e.kind == Expr::Kind::kNeg;
        if (v.kind == Kind::kInt || v.kind == Kind::kBool)
          return Value::integer(neg ? -(v.kind == Kind::kBool ? v.b : v.i)
                                    : (v.kind == Kind::kBool ? v.b : v.i));
        if (v.kind == Kind::kFloat) return Value::number(neg ? -v.f : v.f);
        fail(e.pos,
             fmt::format("bad operand type for unary {}: '{}'", neg ? '-' : '+', v.type_name()));
      }
      case Expr::Kind::kBinary:
        return eval_binary(e);
      case Expr::Kind::kCompare: {
        Value left = eval(*e.kids[0]);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value right = eval(*e.kids[k + 1]);
          if (!compare(e.ops[k], left, right, e.pos)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Expr::Kind::kCond: {
        if (eval(*e.kids[0]).truthy()) return eval(*e.kids[1]);
        return e.kids[2] ? eval(*e.kids[2])
                         : Value::undefined("conditional expression without else");
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        ValueList items;
        for (const auto& k : e.kids) items.push_back(eval(*k));
        return Value::new_list(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        Value d = Value::new_dict();
        for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
          Value key = eval(*e.kids[k]);
          if (!key.is_string())
            fail(e.kids[k]->pos, fmt::format("dict keys must be strings, got {}", key.type_name()));
          d.dict->set(key.s, eval(*e.kids[k + 1]));
        }
        return d;
      }
    }
    fail(e.pos, "unknown expression");
  }

  // A short text naming an expression, for "'x.y' is undefined" messages.
  std::string describe(const Expr& e) const {
    switch (e.kind) {
      case Expr::Kind::kName:
        return e.name;
      case Expr::Kind::kAttr:
        return describe(*e.kids[0]) + "." + e.name;
      case Expr::Kind::kItem:
        return describe(*e.kids[0]) + "[...]";
      default:
        return "expression";
    }
  }

  CallArgs eval_args(const Expr& e) {
    CallArgs a;
    for (size_t k = 1; k < e.kids.size(); ++k) a.args.push_back(eval(*e.kids[k]));
    for (const auto& [key, v] : e.kwargs) a.kwargs.emplace_back(key, eval(*v));
    return a;
  }

  Value call(const Value& fn, CallArgs& args, const Pos& p) {
    try {
      return (*fn.fn)(args);
    } catch (const Error& err) {
      const std::string msg = err.what();
      // Errors from builtins get the call's position; template-positioned ones pass through.
      if (msg.rfind(name_ + ":", 0) == 0) throw;
      fail(p, msg);
    }
  }

  Value eval_binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value l = eval(*e.kids[0]);
      return l.truthy() ? eval(*e.kids[1]) : l;
    }
    if (op == "or") {
      Value l = eval(*e.kids[0]);
      return l.truthy() ? l : eval(*e.kids[1]);
    }
    Value l = eval(*e.kids[0]);
    Value r = eval(*e.kids[1]);
    if (op == "~") {
      std::string joined = to_str(l) + to_str(r);
      check_size(joined.size(), e.pos, "a string");
      return Value::string(std::move(joined));
    }
    if (l.is_undefined() || r.is_undefined())
      fail(e.pos, fmt::format("'{}' is undefined (operand of '{}')",
                              describe(l.is_undefined() ? *e.kids[0] : *e.kids[1]), op));
    auto type_error = [&]() {
      fail(e.pos, fmt::format("unsupported operand types for {}: '{}' and '{}'", op, l.type_name(),
                              r.type_name()));
    };
    const bool both_int = (l.kind == Kind::kInt || l.kind == Kind::kBool) &&
                          (r.kind == Kind::kInt || r.kind == Kind::kBool);
    auto ival = [](const Value& v) {
      return v.kind == Kind::kBool ? static_cast<int64_t>(v.b) : v.i;
    };
    if (op == "+") {
      if (both_int) return Value::integer(ival(l) + ival(r));
      if (l.is_number() && r.is_number()) return Value::number(l.as_double() + r.as_double());
      if (l.is_string() && r.is_string()) {
        check_size(l.s.size() + r.s.size(), e.pos, "a string");
        return Value::string(l.s + r.s);
      }
      if (l.is_list() && r.is_list()) check_size(l.list->size() + r.list->size(), e.pos, "a list");
      if (l.is_list() && r.is_list() && l.tuple == r.tuple) {
        ValueList items = *l.list;
        items.insert(items.end(), r.list->begin(), r.list->end());
        return Value::new_list(std::move(items), l.tuple);
      }
      if (l.is_string() || r.is_string())
        fail(e.pos, fmt::format("can only concatenate str (not \"{}\") to str",
                                l.is_string() ? r.type_name() : l.type_name()));
      type_error();
    }
    if (op == "-") {
      if (both_int) return Value::integer(ival(l) - ival(r));
      if (l.is_number() && r.is_number()) return Value::number(l.as_double() - r.as_double());
      type_error();
    }
    if (op == "*") {
      if (both_int) return Value::integer(ival(l) * ival(r));
      if (l.is_number() && r.is_number()) return Value::number(l.as_double() * r.as_double());
      const Value* seq =
          l.is_string() || l.is_list() ? &l : (r.is_string() || r.is_list() ? &r : nullptr);
      const Value* cnt = seq == &l ? &r : &l;
      if (seq && (cnt->kind == Kind::kInt || cnt->kind == Kind::kBool)) {
        const int64_t n = std::max<int64_t>(0, ival(*cnt));
        const size_t unit = seq->is_string() ? seq->s.size() : seq->list->size();
        if (unit > 0 && static_cast<uint64_t>(n) > kMaxStringBytes / unit)
          fail(e.pos,
               fmt::format("{} repeated {} times is over the limit of {} {}", seq->type_name(), n,
                           kMaxStringBytes, seq->is_string() ? "bytes" : "items"));
        if (seq->is_string()) {
          std::string out;
          for (int64_t k = 0; k < n; ++k) out += seq->s;
          return Value::string(std::move(out));
        }
        ValueList items;
        for (int64_t k = 0; k < n; ++k)
          items.insert(items.end(), seq->list->begin(), seq->list->end());
        return Value::new_list(std::move(items), seq->tuple);
      }
      type_error();
    }
    if (op == "/" || op == "//" || op == "%") {
      if (!l.is_number() || !r.is_number()) type_error();
      if (r.as_double() == 0.0) fail(e.pos, op == "%" ? "modulo by zero" : "division by zero");
      if (op == "/") return Value::number(l.as_double() / r.as_double());
      if (both_int) {
        const int64_t a = ival(l), b = ival(r);
        int64_t q = a / b, m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) {  // Python floors
          --q;
          m += b;
        }
        return Value::integer(op == "//" ? q : m);
      }
      const double a = l.as_double(), b = r.as_double();
      if (op == "//") return Value::number(std::floor(a / b));
      double m = std::fmod(a, b);
      if (m != 0 && ((m < 0) != (b < 0))) m += b;
      return Value::number(m);
    }
    if (op == "**") {
      if (!l.is_number() || !r.is_number()) type_error();
      if (both_int && ival(r) >= 0) {  // by squaring: a huge exponent is not a huge loop
        uint64_t out = 1, base = static_cast<uint64_t>(ival(l));
        for (int64_t k = ival(r); k > 0; k >>= 1, base *= base)
          if (k & 1) out *= base;
        return Value::integer(static_cast<int64_t>(out));
      }
      return Value::number(std::pow(l.as_double(), r.as_double()));
    }
    fail(e.pos, fmt::format("unsupported operator '{}'", op));
  }

  bool contains(const Value& container, const Value& item, const Pos& p) {
    switch (container.kind) {
      case Kind::kUndefined:
        return false;
      case Kind::kString:
        if (!item.is_string())
          fail(p, fmt::format("'in <string>' requires string as left operand, not {}",
                              item.type_name()));
        return container.s.find(item.s) != std::string::npos;
      case Kind::kList:
        for (const Value& v : *container.list)
          if (values_equal(v, item)) return true;
        return false;
      case Kind::kDict:
        return item.is_string() && container.dict->find(item.s) != nullptr;
      default:
        fail(p, fmt::format("argument of type '{}' is not iterable", container.type_name()));
    }
  }

  bool compare(const std::string& op, const Value& l, const Value& r, const Pos& p) {
    if (op == "==") return values_equal(l, r);
    if (op == "!=") return !values_equal(l, r);
    if (op == "in") return contains(r, l, p);
    if (op == "not in") return !contains(r, l, p);
    bool ok = false;
    const int c = compare_values(l, r, ok);
    if (!ok)
      fail(p, fmt::format("'{}' not supported between instances of '{}' and '{}'", op,
                          l.type_name(), r.type_name()));
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;  // ">="
  }

  Value slice(const Value& obj, const Value& b, const Value& e, const Value& s, const Pos& p) {
    if (obj.is_list()) {
      ValueList out;
      for (size_t k : slice_indices(static_cast<int64_t>(obj.list->size()), b, e, s))
        out.push_back((*obj.list)[k]);
      return Value::new_list(std::move(out), obj.tuple);
    }
    if (obj.is_string()) {
      const std::vector<uint32_t> cps = code_points(obj.s);
      std::string out;
      for (size_t k : slice_indices(static_cast<int64_t>(cps.size()), b, e, s))
        append_utf8(out, cps[k]);
      return Value::string(std::move(out));
    }
    if (obj.is_undefined()) fail(p, fmt::format("'{}' is undefined (sliced)", obj.s));
    fail(p, fmt::format("'{}' object is not subscriptable", obj.type_name()));
  }

  Value get_item(const Value& obj, const Value& key, const Pos& p, const std::string& what) {
    switch (obj.kind) {
      case Kind::kUndefined:
        fail(p, fmt::format("'{}' is undefined (subscripted)", what));
      case Kind::kDict:
        if (key.is_string()) {
          if (const Value* v = obj.dict->find(key.s)) return *v;
          return get_attr(obj, key.s, p, what);
        }
        return Value::undefined(what + "[...]");
      case Kind::kList:
      case Kind::kString: {
        if (key.is_string()) return get_attr(obj, key.s, p, what);
        if (key.kind != Kind::kInt && key.kind != Kind::kBool)
          return Value::undefined(what + "[...]");
        int64_t k = key.kind == Kind::kBool ? key.b : key.i;
        if (obj.is_list()) {
          const auto n = static_cast<int64_t>(obj.list->size());
          if (k < 0) k += n;
          if (k < 0 || k >= n) return Value::undefined(fmt::format("{}[{}]", what, key.i));
          return (*obj.list)[static_cast<size_t>(k)];
        }
        const std::vector<uint32_t> cps = code_points(obj.s);
        const auto n = static_cast<int64_t>(cps.size());
        if (k < 0) k += n;
        if (k < 0 || k >= n) return Value::undefined(fmt::format("{}[{}]", what, key.i));
        return Value::string(
            from_code_points(cps, static_cast<size_t>(k), static_cast<size_t>(k) + 1));
      }
      default:
        if (key.is_string()) return get_attr(obj, key.s, p, what);
        return Value::undefined(what + "[...]");
    }
  }

  Value get_attr(const Value& obj, const std::string& name, const Pos& p, const std::string& what) {
    switch (obj.kind) {
      case Kind::kUndefined:
        fail(p, fmt::format("'{}' is undefined (reading attribute '{}')", what, name));
      case Kind::kDict: {
        if (!obj.namespace_ &&
            (name == "items" || name == "keys" || name == "values" || name == "get"))
          return dict_method(obj, name);
        if (const Value* v = obj.dict->find(name)) return *v;
        return Value::undefined(what + "." + name);
      }
      case Kind::kString: {
        Value m = string_method(obj, name);
        return m.is_undefined() ? Value::undefined(what + "." + name) : m;
      }
      case Kind::kList:
        if (name == "index" || name == "count") {
          return Value::function([obj, name](CallArgs& a) {
            VERL_CHECK(!a.args.empty(), "list.{}() takes one argument", name);
            int64_t n = 0;
            for (size_t k = 0; k < obj.list->size(); ++k) {
              if (values_equal((*obj.list)[k], a.args[0])) {
                if (name == "index") return Value::integer(static_cast<int64_t>(k));
                ++n;
              }
            }
            VERL_CHECK(name == "count", "list.index(x): {} is not in list", to_repr(a.args[0]));
            return Value::integer(n);
          });
        }
        if (name == "append" || name == "pop" || name == "insert" || name == "extend" ||
            name == "remove")
          fail(p, fmt::format("list.{}() is not allowed: templates run in an immutable sandbox, as "
                              "in transformers",
                              name));
        return Value::undefined(what + "." + name);
      default:
        return Value::undefined(what + "." + name);
    }
  }

  Value dict_method(const Value& obj, const std::string& name) {
    return Value::function([obj, name](CallArgs& a) {
      if (name == "get") {
        VERL_CHECK(!a.args.empty(), "dict.get() takes a key");
        if (a.args[0].is_string())
          if (const Value* v = obj.dict->find(a.args[0].s)) return *v;
        return a.args.size() > 1 ? a.args[1] : Value::none();
      }
      ValueList out;
      for (const auto& [k, v] : obj.dict->items) {
        if (name == "keys")
          out.push_back(Value::string(k));
        else if (name == "values")
          out.push_back(v);
        else
          out.push_back(Value::new_list({Value::string(k), v}, true));
      }
      return Value::new_list(std::move(out));
    });
  }

  Value string_method(const Value& obj, const std::string& name) {
    static const char* kMethods[] = {"startswith", "endswith", "split",      "rsplit",  "strip",
                                     "lstrip",     "rstrip",   "lower",      "upper",   "title",
                                     "capitalize", "replace",  "find",       "rfind",   "index",
                                     "count",      "join",     "splitlines", "isdigit", "isalpha",
                                     "isalnum",    "isspace",  "islower",    "isupper", "format"};
    if (std::find_if(std::begin(kMethods), std::end(kMethods),
                     [&](const char* m) { return name == m; }) == std::end(kMethods))
      return Value::undefined();
    const std::string s = obj.s;
    return Value::function([s, name](CallArgs& a) -> Value {
      auto str_arg = [&](size_t k, const char* what) {
        const Value v = a.get(k, what);
        VERL_CHECK(v.is_string(), "str.{}(): argument must be a string, got {}", name,
                   v.type_name());
        return v.s;
      };
      if (name == "startswith" || name == "endswith") {
        const Value v = a.get(0, "prefix");
        std::vector<std::string> options;
        if (v.is_list()) {
          for (const Value& o : *v.list) options.push_back(to_str(o));
        } else {
          VERL_CHECK(v.is_string(), "str.{}(): argument must be a string or tuple, got {}", name,
                     v.type_name());
          options.push_back(v.s);
        }
        for (const std::string& o : options) {
          if (o.size() > s.size()) continue;
          if (name == "startswith" ? s.compare(0, o.size(), o) == 0
                                   : s.compare(s.size() - o.size(), o.size(), o) == 0)
            return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      if (name == "split" || name == "rsplit") {
        const Value maxsplit = a.get(1, "maxsplit");
        return py_split(s, a.get(0, "sep"), maxsplit.kind == Kind::kInt ? maxsplit.i : -1,
                        name == "rsplit");
      }
      if (name == "strip") return Value::string(py_strip(s, a.get(0, "chars"), true, true));
      if (name == "lstrip") return Value::string(py_strip(s, a.get(0, "chars"), true, false));
      if (name == "rstrip") return Value::string(py_strip(s, a.get(0, "chars"), false, true));
      if (name == "lower") return Value::string(map_case(s, 0));
      if (name == "upper") return Value::string(map_case(s, 1));
      if (name == "title") return Value::string(py_title(s));
      if (name == "capitalize") return Value::string(py_capitalize(s));
      if (name == "replace") {
        const Value count = a.get(2, "count");
        return Value::string(replace_all(s, str_arg(0, "old"), str_arg(1, "new"),
                                         count.kind == Kind::kInt ? count.i : -1));
      }
      if (name == "find" || name == "rfind" || name == "index") {
        const std::string sub = str_arg(0, "sub");
        const size_t hit = name == "rfind" ? s.rfind(sub) : s.find(sub);
        if (hit == std::string::npos) {
          VERL_CHECK(name != "index", "str.index(): substring not found");
          return Value::integer(-1);
        }
        return Value::integer(
            static_cast<int64_t>(count_code_points(std::string_view(s).substr(0, hit))));
      }
      if (name == "count") {
        const std::string sub = str_arg(0, "sub");
        if (sub.empty()) return Value::integer(static_cast<int64_t>(count_code_points(s) + 1));
        int64_t n = 0;
        for (size_t pos = s.find(sub); pos != std::string::npos;
             pos = s.find(sub, pos + sub.size()))
          ++n;
        return Value::integer(n);
      }
      if (name == "join") {
        const Value items = a.get(0, "iterable");
        VERL_CHECK(items.is_list(), "str.join(): argument must be a list, got {}",
                   items.type_name());
        std::string out;
        for (size_t k = 0; k < items.list->size(); ++k) {
          if (k) out += s;
          VERL_CHECK((*items.list)[k].is_string(), "str.join(): item {} is {}, not str", k,
                     (*items.list)[k].type_name());
          out += (*items.list)[k].s;
        }
        return Value::string(std::move(out));
      }
      if (name == "splitlines") {
        ValueList lines;
        size_t b = 0;
        for (size_t k = 0; k < s.size(); ++k) {
          if (s[k] == '\n' || s[k] == '\r') {
            lines.push_back(Value::string(s.substr(b, k - b)));
            if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
            b = k + 1;
          }
        }
        if (b < s.size()) lines.push_back(Value::string(s.substr(b)));
        return Value::new_list(std::move(lines));
      }
      if (name == "format") {  // "{}" and "{0}" / "{name}" fields, no format specs
        std::string out;
        size_t auto_idx = 0;
        for (size_t k = 0; k < s.size(); ++k) {
          if (s[k] == '{' && k + 1 < s.size() && s[k + 1] == '{') {
            out.push_back('{');
            ++k;
            continue;
          }
          if (s[k] == '}' && k + 1 < s.size() && s[k + 1] == '}') {
            out.push_back('}');
            ++k;
            continue;
          }
          if (s[k] != '{') {
            out.push_back(s[k]);
            continue;
          }
          const size_t close = s.find('}', k);
          VERL_CHECK(close != std::string::npos, "str.format(): unmatched '{{'");
          const std::string field = s.substr(k + 1, close - k - 1);
          Value v;
          if (field.empty())
            v = a.get(auto_idx++, "");
          else if (std::all_of(field.begin(), field.end(), ::isdigit))
            v = a.get(std::stoul(field), "");
          else
            v = a.get(a.args.size() + 1000, field.c_str());
          out += to_str(v);
          k = close;
        }
        return Value::string(std::move(out));
      }
      // is* predicates over code points; false for the empty string, as in Python.
      const std::vector<uint32_t> cps = code_points(s);
      if (cps.empty()) return Value::boolean(false);
      bool all = true, any_cased = false;
      for (uint32_t cp : cps) {
        const auto c = static_cast<UChar32>(cp);
        if (name == "isdigit")
          all &= u_isdigit(c) != 0;
        else if (name == "isalpha")
          all &= u_isalpha(c) != 0;
        else if (name == "isalnum")
          all &= u_isalnum(c) != 0;
        else if (name == "isspace")
          all &= py_isspace(cp);
        else if (name == "islower") {
          if (u_isupper(c) || u_istitle(c)) all = false;
          any_cased |= u_islower(c) != 0;
        } else if (name == "isupper") {
          if (u_islower(c) || u_istitle(c)) all = false;
          any_cased |= u_isupper(c) != 0;
        }
      }
      if (name == "islower" || name == "isupper") return Value::boolean(all && any_cased);
      return Value::boolean(all);
    });
  }

  // ---- filters ----

  Value apply_filter(const std::string& f, const Value& v, CallArgs& a, const Pos& p) {
    auto need = [&](bool ok, const char* what) {
      if (!ok) fail(p, fmt::format("filter '{}' needs {}, got {}", f, what, v.type_name()));
    };
    if (f == "default" || f == "d") {
      const Value dflt = a.get(0, "default_value", Value::string(""));
      const bool boolean = a.get(1, "boolean", Value::boolean(false)).truthy();
      if (v.is_undefined() || (boolean && !v.truthy())) return dflt;
      return v;
    }
    if (f == "length" || f == "count") {
      if (v.is_undefined()) return Value::integer(0);
      if (v.is_string()) return Value::integer(static_cast<int64_t>(count_code_points(v.s)));
      if (v.is_list()) return Value::integer(static_cast<int64_t>(v.list->size()));
      if (v.is_dict()) return Value::integer(static_cast<int64_t>(v.dict->items.size()));
      fail(p, fmt::format("object of type '{}' has no len()", v.type_name()));
    }
    if (f == "tojson") {
      const Value indent = a.get(0, "indent");
      const bool sort_keys = a.get(99, "sort_keys", Value::boolean(false)).truthy();
      try {
        return Value::string(
            to_json(v, indent.kind == Kind::kInt ? static_cast<int>(indent.i) : -1, sort_keys));
      } catch (const Error& e) {
        fail(p, e.what());
      }
    }
    if (f == "safe") return v;
    if (f == "string") return Value::string(to_str(v));
    if (f == "e" || f == "escape") return Value::string(html_escape(to_str(v)));
    if (v.is_undefined() && f != "list" && f != "join" && f != "first" && f != "last")
      fail(p, fmt::format("'{}' is undefined (filtered with '{}')", v.s, f));
    if (f == "trim") {
      need(v.is_string(), "a string");
      return Value::string(py_strip(v.s, a.get(0, "chars"), true, true));
    }
    if (f == "upper" || f == "lower")
      return Value::string(map_case(to_str(v), f == "lower" ? 0 : 1));
    if (f == "title") return Value::string(py_title(to_str(v)));
    if (f == "capitalize") return Value::string(py_capitalize(to_str(v)));
    if (f == "replace") {
      const Value count = a.get(2, "count");
      return Value::string(replace_all(to_str(v), to_str(a.get(0, "old")), to_str(a.get(1, "new")),
                                       count.kind == Kind::kInt ? count.i : -1));
    }
    if (f == "int") {
      const Value dflt = a.get(0, "default", Value::integer(0));
      if (v.kind == Kind::kInt) return v;
      if (v.kind == Kind::kBool) return Value::integer(v.b);
      if (v.kind == Kind::kFloat) return Value::integer(static_cast<int64_t>(v.f));
      if (v.is_string()) {
        const std::string t = py_strip(v.s, Value::undefined(), true, true);
        try {
          size_t used = 0;
          const long long x = std::stoll(t, &used);
          if (used == t.size()) return Value::integer(x);
          const double d = std::stod(t, &used);
          if (used == t.size()) return Value::integer(static_cast<int64_t>(d));
        } catch (...) {
        }
      }
      return dflt;
    }
    if (f == "float") {
      const Value dflt = a.get(0, "default", Value::number(0.0));
      if (v.is_number()) return Value::number(v.as_double());
      if (v.is_string()) {
        try {
          size_t used = 0;
          const std::string t = py_strip(v.s, Value::undefined(), true, true);
          const double d = std::stod(t, &used);
          if (used == t.size()) return Value::number(d);
        } catch (...) {
        }
      }
      return dflt;
    }
    if (f == "abs") {
      need(v.is_number(), "a number");
      if (v.kind == Kind::kFloat) return Value::number(std::fabs(v.f));
      return Value::integer(std::llabs(v.kind == Kind::kBool ? v.b : v.i));
    }
    if (f == "round") {
      need(v.is_number(), "a number");
      const Value prec = a.get(0, "precision", Value::integer(0));
      const std::string method = to_str(a.get(1, "method", Value::string("common")));
      const double scale = std::pow(10.0, static_cast<double>(prec.i));
      const double x = v.as_double() * scale;
      double r;
      if (method == "floor")
        r = std::floor(x);
      else if (method == "ceil")
        r = std::ceil(x);
      else
        r = std::nearbyint(x);  // Python's round(): half to even
      return Value::number(r / scale);
    }
    if (f == "join") {
      const std::string sep = to_str(a.get(0, "d", Value::string("")));
      const Value attr = a.get(1, "attribute");
      std::string out;
      const ValueList items = iterate(v, p);
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += sep;
        out += to_str(attr.is_undefined() ? items[k] : get_attr(items[k], to_str(attr), p, "item"));
      }
      return Value::string(std::move(out));
    }
    if (f == "first" || f == "last") {
      const ValueList items = iterate(v, p);
      if (items.empty()) return Value::undefined(f + " of an empty sequence");
      return f == "first" ? items.front() : items.back();
    }
    if (f == "list") return Value::new_list(iterate(v, p));
    if (f == "items") {
      need(v.is_dict(), "a dict");
      CallArgs none;
      return call(dict_method(v, "items"), none, p);
    }
    if (f == "dictsort") {
      need(v.is_dict(), "a dict");
      const bool case_sensitive = a.get(0, "case_sensitive", Value::boolean(false)).truthy();
      const bool by_value = to_str(a.get(1, "by", Value::string("key"))) == "value";
      const bool reverse = a.get(2, "reverse", Value::boolean(false)).truthy();
      ValueList items;
      for (const auto& [k, val] : v.dict->items)
        items.push_back(Value::new_list({Value::string(k), val}, true));
      sort_values(items, p, reverse, case_sensitive,
                  [&](const Value& it) { return (*it.list)[by_value ? 1 : 0]; });
      return Value::new_list(std::move(items));
    }
    if (f == "sort") {
      ValueList items = iterate(v, p);
      const bool reverse = a.get(0, "reverse", Value::boolean(false)).truthy();
      const bool case_sensitive = a.get(1, "case_sensitive", Value::boolean(false)).truthy();
      const Value attr = a.get(2, "attribute");
      sort_values(items, p, reverse, case_sensitive, [&](const Value& it) {
        return attr.is_undefined() ? it : get_attr(it, to_str(attr), p, "item");
      });
      return Value::new_list(std::move(items));
    }
    if (f == "reverse") {
      if (v.is_string()) {
        std::vector<uint32_t> cps = code_points(v.s);
        std::reverse(cps.begin(), cps.end());
        return Value::string(from_code_points(cps, 0, cps.size()));
      }
      ValueList items = iterate(v, p);
      std::reverse(items.begin(), items.end());
      return Value::new_list(std::move(items));
    }
    if (f == "unique") {
      ValueList out;
      for (const Value& it : iterate(v, p)) {
        bool seen = false;
        for (const Value& o : out) seen |= values_equal(o, it);
        if (!seen) out.push_back(it);
      }
      return Value::new_list(std::move(out));
    }
    if (f == "min" || f == "max") {
      ValueList items = iterate(v, p);
      if (items.empty()) return Value::undefined(f + " of an empty sequence");
      sort_values(items, p, false, false, [](const Value& it) { return it; });
      return f == "min" ? items.front() : items.back();
    }
    if (f == "sum") {
      const Value attr = a.get(0, "attribute");
      Value total = a.get(1, "start", Value::integer(0));
      for (const Value& it : iterate(v, p)) {
        const Value x = attr.is_undefined() ? it : get_attr(it, to_str(attr), p, "item");
        if (!x.is_number() || !total.is_number()) fail(p, "filter 'sum' needs numbers");
        if (x.kind == Kind::kFloat || total.kind == Kind::kFloat)
          total = Value::number(total.as_double() + x.as_double());
        else
          total = Value::integer(total.i + (x.kind == Kind::kBool ? x.b : x.i));
      }
      return total;
    }
    if (f == "map") {
      ValueList out;
      const Value attr = a.get(99, "attribute");
      const ValueList items = iterate(v, p);
      if (!attr.is_undefined()) {
        const Value dflt = a.get(99, "default");
        for (const Value& it : items) {
          Value x = get_attr(it, to_str(attr), p, "item");
          out.push_back(x.is_undefined() && !dflt.is_undefined() ? dflt : x);
        }
      } else {
        if (a.args.empty()) fail(p, "filter 'map' needs a filter name or attribute=");
        const std::string inner = to_str(a.args[0]);
        CallArgs rest;
        rest.args.assign(a.args.begin() + 1, a.args.end());
        rest.kwargs = a.kwargs;
        for (const Value& it : items) out.push_back(apply_filter(inner, it, rest, p));
      }
      return Value::new_list(std::move(out));
    }
    if (f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") {
      const bool by_attr = f == "selectattr" || f == "rejectattr";
      const bool keep_if = f == "select" || f == "selectattr";
      size_t k = 0;
      std::string attr;
      if (by_attr) {
        if (a.args.empty()) fail(p, fmt::format("filter '{}' needs an attribute name", f));
        attr = to_str(a.args[k++]);
      }
      std::string test;
      if (k < a.args.size()) test = to_str(a.args[k++]);
      CallArgs targs;
      targs.args.assign(a.args.begin() + static_cast<long>(std::min(k, a.args.size())),
                        a.args.end());
      ValueList out;
      for (const Value& it : iterate(v, p)) {
        const Value x = by_attr ? get_attr(it, attr, p, "item") : it;
        const bool r = test.empty() ? x.truthy() : apply_test(test, x, targs, p);
        if (r == keep_if) out.push_back(it);
      }
      return Value::new_list(std::move(out));
    }
    if (f == "attr") return get_attr(v, to_str(a.get(0, "name")), p, "value");
    if (f == "indent") {
      const Value w = a.get(0, "width", Value::integer(4));
      const size_t spaces = w.is_string() ? 0 : static_cast<size_t>(std::max<int64_t>(0, w.i));
      check_size(spaces, p, "indent's width");
      const std::string pad = w.is_string() ? w.s : std::string(spaces, ' ');
      const bool first = a.get(1, "first", Value::boolean(false)).truthy();
      const bool blank = a.get(2, "blank", Value::boolean(false)).truthy();
      const std::string s = to_str(v);
      std::string out;
      size_t b = 0;
      bool first_line = true;
      while (b <= s.size()) {
        size_t e = s.find('\n', b);
        const bool last = e == std::string::npos;
        if (last) e = s.size();
        const std::string line = s.substr(b, e - b);
        const bool indent_it =
            first_line ? first : (blank || !py_strip(line, Value::undefined(), true, true).empty());
        if (indent_it) out += pad;
        out += line;
        check_size(out.size(), p, "indent's output");
        if (last) break;
        out += '\n';
        b = e + 1;
        first_line = false;
      }
      return Value::string(std::move(out));
    }
    if (f == "center") {
      const int64_t width = a.get(0, "width", Value::integer(80)).i;
      const std::string s = to_str(v);
      const auto n = static_cast<int64_t>(count_code_points(s));
      if (n >= width) return Value::string(s);
      check_size(static_cast<size_t>(width), p, "center's width");
      const int64_t total = width - n, left = total / 2 + (total & width & 1);
      return Value::string(std::string(static_cast<size_t>(left), ' ') + s +
                           std::string(static_cast<size_t>(total - left), ' '));
    }
    if (f == "wordcount") {
      const Value words = py_split(to_str(v), Value::undefined(), -1, false);
      return Value::integer(static_cast<int64_t>(words.list->size()));
    }
    if (f == "format") {  // printf-style: %s, %d, %i, %f, %%
      const std::string s = to_str(v);
      std::string out;
      size_t k = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] != '%' || i + 1 >= s.size()) {
          out.push_back(s[i]);
          continue;
        }
        const char c = s[++i];
        if (c == '%') {
          out.push_back('%');
          continue;
        }
        if (k >= a.args.size()) fail(p, "filter 'format': not enough arguments");
        const Value& x = a.args[k++];
        if (c == 's')
          out += to_str(x);
        else if (c == 'd' || c == 'i')
          out += std::to_string(static_cast<int64_t>(x.as_double()));
        else if (c == 'f')
          out += fmt::format("{:.6f}", x.as_double());
        else
          fail(p, fmt::format("filter 'format': unsupported conversion '%{}'", c));
      }
      return Value::string(std::move(out));
    }
    fail(p, fmt::format("unsupported filter '{}'", f));
  }

  template <typename KeyFn>
  void sort_values(ValueList& items, const Pos& p, bool reverse, bool case_sensitive, KeyFn key) {
    auto norm = [&](Value k) {
      if (!case_sensitive && k.is_string()) k.s = map_case(k.s, 0);
      return k;
    };
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      bool ok = false;
      const int c = compare_values(norm(key(x)), norm(key(y)), ok);
      if (!ok)
        fail(p, fmt::format("cannot sort: '<' not supported between '{}' and '{}'",
                            key(x).type_name(), key(y).type_name()));
      return reverse ? c > 0 : c < 0;
    });
  }

  // ---- tests ----

  bool apply_test(const std::string& t, const Value& v, CallArgs& a, const Pos& p) {
    auto arg = [&]() {
      if (a.args.empty()) fail(p, fmt::format("test '{}' needs an argument", t));
      return a.args[0];
    };
    if (t == "defined") return !v.is_undefined();
    if (t == "undefined") return v.is_undefined();
    if (t == "none") return v.is_none();
    if (t == "boolean") return v.kind == Kind::kBool;
    if (t == "true") return v.kind == Kind::kBool && v.b;
    if (t == "false") return v.kind == Kind::kBool && !v.b;
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer") return v.kind == Kind::kInt;
    if (t == "float") return v.kind == Kind::kFloat;
    if (t == "mapping") return v.is_dict();
    if (t == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
    if (t == "sequence") return v.is_list() || v.is_dict() || v.is_string();
    if (t == "callable") return v.kind == Kind::kFunction;
    if (t == "lower") return v.is_string() && map_case(v.s, 0) == v.s;
    if (t == "upper") return v.is_string() && map_case(v.s, 1) == v.s;
    if (t == "odd" || t == "even" || t == "divisibleby") {
      if (v.kind != Kind::kInt)
        fail(p, fmt::format("test '{}' needs an integer, got {}", t, v.type_name()));
      const int64_t d = t == "divisibleby" ? arg().i : 2;
      if (d == 0) fail(p, "divisibleby 0");
      const bool div = v.i % d == 0;
      return t == "odd" ? !div : div;
    }
    if (t == "eq" || t == "equalto" || t == "==") return values_equal(v, arg());
    if (t == "ne" || t == "!=") return !values_equal(v, arg());
    if (t == "sameas") {
      const Value o = arg();
      if (v.kind != o.kind) return false;
      if (v.is_none() || v.is_undefined()) return true;
      if (v.kind == Kind::kBool) return v.b == o.b;
      if (v.is_list()) return v.list == o.list;
      if (v.is_dict()) return v.dict == o.dict;
      return values_equal(v, o);
    }
    if (t == "in") return contains(arg(), v, p);
    if (t == "lt" || t == "<" || t == "lessthan") return compare("<", v, arg(), p);
    if (t == "le" || t == "<=") return compare("<=", v, arg(), p);
    if (t == "gt" || t == ">" || t == "greaterthan") return compare(">", v, arg(), p);
    if (t == "ge" || t == ">=") return compare(">=", v, arg(), p);
    fail(p, fmt::format("unsupported test '{}'", t));
  }

  std::string name_;
  std::vector<Scope> scopes_;
  int depth_ = 0;           // macro calls in progress
  int64_t iterations_ = 0;  // loop iterations so far in this render
};

}  // namespace

Template::Template(std::string_view source, std::string name)
    : name_(std::move(name)), root_(parse_template(source, name_)) {}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;

std::string Template::render(const nlohmann::ordered_json& context) const {
  Renderer r(name_, context);
  return r.run(*root_);
}

}  // namespace verl::tokenizer::jinja
