// Countdown scoring (verl/utils/reward_score/countdown.py) with a recursive-descent evaluator in
// place of Python's eval: Python's expression grammar restricted to the characters verl allows
// ([0-9+\-*/(). \s]), with Python's int/float arithmetic.
#include "reward/countdown.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "core/error.h"
#include "core/json_depth.h"

namespace verl::reward {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// Python's str.strip() over the ASCII whitespace (and the \x1c-\x1f separators it also strips).
std::string_view strip(std::string_view s) {
  auto ws = [](char c) { return is_space(c) || (c >= '\x1c' && c <= '\x1f'); };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return s;
}

// A Python number: an int (exact while it fits in int64) or a float.
struct Num {
  bool is_int = true;
  int64_t i = 0;
  double f = 0;
  double value() const { return is_int ? static_cast<double>(i) : f; }
  static Num from_int(int64_t v) { return Num{true, v, 0}; }
  static Num from_float(double v) { return Num{false, 0, v}; }
};

enum class Tok { Num, Plus, Minus, Star, Slash, DSlash, DStar, LParen, RParen, End };

struct Token {
  Tok kind;
  Num num;
};

// Tokenizes greedily as Python does ("**", "//" before "*", "/"). nullopt on a character outside
// verl's allowed set or a malformed number literal.
std::optional<std::vector<Token>> tokenize(std::string_view s) {
  std::vector<Token> toks;
  size_t i = 0;
  while (i < s.size()) {
    char c = s[i];
    if (is_space(c)) {
      ++i;
    } else if ((c >= '0' && c <= '9') || c == '.') {
      size_t start = i;
      while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
      size_t int_digits = i - start;
      bool is_float = false;
      if (i < s.size() && s[i] == '.') {
        is_float = true;
        ++i;
        while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
      }
      std::string lit(s.substr(start, i - start));
      if (lit == ".") return std::nullopt;
      Token t{Tok::Num, {}};
      if (is_float) {
        t.num = Num::from_float(std::strtod(lit.c_str(), nullptr));
      } else {
        // Python forbids leading zeros in a non-zero decimal integer ("007").
        if (int_digits > 1 && lit[0] == '0' && lit.find_first_not_of('0') != std::string::npos)
          return std::nullopt;
        errno = 0;
        long long v = std::strtoll(lit.c_str(), nullptr, 10);
        t.num =
            errno == ERANGE ? Num::from_float(std::strtod(lit.c_str(), nullptr)) : Num::from_int(v);
      }
      toks.push_back(t);
    } else if (c == '*') {
      bool two = i + 1 < s.size() && s[i + 1] == '*';
      toks.push_back({two ? Tok::DStar : Tok::Star, {}});
      i += two ? 2 : 1;
    } else if (c == '/') {
      bool two = i + 1 < s.size() && s[i + 1] == '/';
      toks.push_back({two ? Tok::DSlash : Tok::Slash, {}});
      i += two ? 2 : 1;
    } else if (c == '+' || c == '-' || c == '(' || c == ')') {
      toks.push_back({c == '+'   ? Tok::Plus
                      : c == '-' ? Tok::Minus
                      : c == '(' ? Tok::LParen
                                 : Tok::RParen,
                      {}});
      ++i;
    } else {
      return std::nullopt;  // verl: "Invalid characters in equation."
    }
  }
  toks.push_back({Tok::End, {}});
  return toks;
}

// Raised inside the parser for a syntax error or an arithmetic error (ZeroDivisionError, ...).
struct EvalError {};

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : toks_(std::move(toks)) {}

  Num parse() {
    Num v = expr();
    if (peek() != Tok::End) throw EvalError{};
    return v;
  }

 private:
  static constexpr int kMaxDepth = 200;  // Python's parser refuses deeper nesting too

  Tok peek() const { return toks_[pos_].kind; }
  const Token& next() { return toks_[pos_++]; }

  // arith_expr: term (('+' | '-') term)*
  Num expr() {
    Num v = term();
    while (peek() == Tok::Plus || peek() == Tok::Minus) {
      bool add = next().kind == Tok::Plus;
      Num r = term();
      v = add ? plus(v, r) : minus(v, r);
    }
    return v;
  }

  // term: factor (('*' | '/' | '//') factor)*
  Num term() {
    Num v = factor();
    while (peek() == Tok::Star || peek() == Tok::Slash || peek() == Tok::DSlash) {
      Tok op = next().kind;
      Num r = factor();
      v = op == Tok::Star ? times(v, r) : op == Tok::Slash ? divide(v, r) : floor_divide(v, r);
    }
    return v;
  }

  // factor: ('+' | '-') factor | power
  Num factor() {
    if (peek() == Tok::Plus || peek() == Tok::Minus) {
      bool neg = next().kind == Tok::Minus;
      Depth d(*this);
      Num v = factor();
      if (!neg) return v;
      if (v.is_int && v.i != INT64_MIN) return Num::from_int(-v.i);
      return Num::from_float(-v.value());
    }
    return power();
  }

  // power: atom ['**' factor]  (right-associative; binds tighter than a unary sign on its left)
  Num power() {
    Num base = atom();
    if (peek() != Tok::DStar) return base;
    next();
    Depth d(*this);
    Num exp = factor();
    return pow(base, exp);
  }

  // atom: NUMBER | '(' arith_expr ')'
  Num atom() {
    const Token& t = next();
    if (t.kind == Tok::Num) return t.num;
    if (t.kind != Tok::LParen) throw EvalError{};
    Depth d(*this);
    Num v = expr();  // "()" fails here: an empty tuple is no number
    if (next().kind != Tok::RParen) throw EvalError{};
    return v;
  }

  struct Depth {
    explicit Depth(Parser& p) : p(p) {
      if (++p.depth_ > kMaxDepth) throw EvalError{};
    }
    ~Depth() { --p.depth_; }
    Parser& p;
  };

  static Num plus(Num a, Num b) {
    int64_t r;
    if (a.is_int && b.is_int && !__builtin_add_overflow(a.i, b.i, &r)) return Num::from_int(r);
    return Num::from_float(a.value() + b.value());
  }
  static Num minus(Num a, Num b) {
    int64_t r;
    if (a.is_int && b.is_int && !__builtin_sub_overflow(a.i, b.i, &r)) return Num::from_int(r);
    return Num::from_float(a.value() - b.value());
  }
  static Num times(Num a, Num b) {
    int64_t r;
    if (a.is_int && b.is_int && !__builtin_mul_overflow(a.i, b.i, &r)) return Num::from_int(r);
    return Num::from_float(a.value() * b.value());
  }
  static Num divide(Num a, Num b) {
    if (b.value() == 0) throw EvalError{};  // ZeroDivisionError
    return Num::from_float(a.value() / b.value());
  }
  static Num floor_divide(Num a, Num b) {
    if (b.value() == 0) throw EvalError{};
    if (a.is_int && b.is_int && !(a.i == INT64_MIN && b.i == -1)) {
      int64_t q = a.i / b.i;
      if ((a.i % b.i != 0) && ((a.i < 0) != (b.i < 0))) --q;  // floor, not truncation
      return Num::from_int(q);
    }
    return Num::from_float(std::floor(a.value() / b.value()));
  }
  static Num pow(Num a, Num b) {
    if (a.is_int && b.is_int && b.i >= 0) {
      int64_t r = 1, base = a.i;
      bool overflow = false;
      for (int64_t e = b.i; e > 0 && !overflow; e >>= 1) {
        if (e & 1) overflow |= __builtin_mul_overflow(r, base, &r);
        if (e > 1) overflow |= __builtin_mul_overflow(base, base, &base);
      }
      if (!overflow) return Num::from_int(r);
      return Num::from_float(std::pow(a.value(), b.value()));
    }
    const double x = a.value(), y = b.value();
    if (x == 0 && y < 0) throw EvalError{};              // ZeroDivisionError
    if (x < 0 && y != std::floor(y)) throw EvalError{};  // a complex result: no number
    double r = std::pow(x, y);
    if (std::isinf(r) && std::isfinite(x) && std::isfinite(y)) throw EvalError{};  // Overflow
    return Num::from_float(r);
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

std::optional<double> evaluate_arithmetic(std::string_view expr) {
  std::optional<std::vector<Token>> toks = tokenize(expr);
  if (!toks) return std::nullopt;
  try {
    return Parser(std::move(*toks)).parse().value();
  } catch (const EvalError&) {
    return std::nullopt;
  }
}

std::optional<std::string> countdown_extract_solution(std::string_view s) {
  for (std::string_view marker :
       {std::string_view("Assistant:"), std::string_view("<|im_start|>assistant")}) {
    size_t p = s.find(marker);
    if (p != std::string_view::npos) {
      s = s.substr(p + marker.size());
      break;
    }
  }
  size_t nl = s.rfind('\n');
  if (nl != std::string_view::npos) s = s.substr(nl + 1);
  // The last non-overlapping match of "<answer>(.*?)</answer>".
  constexpr std::string_view kOpen = "<answer>", kClose = "</answer>";
  std::optional<std::string> last;
  size_t pos = 0;
  while (true) {
    size_t open = s.find(kOpen, pos);
    if (open == std::string_view::npos) break;
    size_t close = s.find(kClose, open + kOpen.size());
    if (close == std::string_view::npos) break;
    last = std::string(strip(s.substr(open + kOpen.size(), close - open - kOpen.size())));
    pos = close + kClose.size();
  }
  return last;
}

bool countdown_validate_equation(std::string_view equation, std::vector<double> available) {
  std::vector<double> used;
  for (size_t i = 0; i < equation.size();) {
    if (equation[i] < '0' || equation[i] > '9') {
      ++i;
      continue;
    }
    size_t start = i;
    while (i < equation.size() && equation[i] >= '0' && equation[i] <= '9') ++i;
    used.push_back(std::strtod(std::string(equation.substr(start, i - start)).c_str(), nullptr));
  }
  std::sort(used.begin(), used.end());
  std::sort(available.begin(), available.end());
  return used == available;
}

ScoreResult countdown_compute_score(std::string_view solution_str,
                                    const nlohmann::json& ground_truth, double format_score,
                                    double score) {
  nlohmann::json gt = ground_truth;
  if (gt.is_string()) {
    check_json_depth(gt.get_ref<const std::string&>(), "countdown: ground_truth");
    try {
      gt = nlohmann::json::parse(gt.get<std::string>());
    } catch (const nlohmann::json::exception&) {
      VERL_FAIL("countdown: ground_truth is a string but not JSON: {}", ground_truth.dump());
    }
  }
  VERL_CHECK(gt.is_object() && gt.contains("target") && gt["target"].is_number() &&
                 gt.contains("numbers") && gt["numbers"].is_array(),
             "countdown: ground_truth must be {{\"target\": number, \"numbers\": [...]}}, got {}",
             ground_truth.dump());
  const double target = gt["target"].get<double>();
  std::vector<double> numbers;
  for (const auto& n : gt["numbers"]) {
    VERL_CHECK(n.is_number(), "countdown: ground_truth.numbers holds a non-number: {}", n.dump());
    numbers.push_back(n.get<double>());
  }
  ScoreResult r;
  std::optional<std::string> equation = countdown_extract_solution(solution_str);
  if (!equation) return r;
  r.pred = *equation;
  r.score = format_score;
  if (!countdown_validate_equation(*equation, numbers)) return r;
  std::optional<double> value = evaluate_arithmetic(*equation);
  if (!value || !(std::abs(*value - target) < 1e-5)) return r;
  r.score = score;
  r.acc = true;
  return r;
}

}  // namespace verl::reward
