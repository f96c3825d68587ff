// DAPO's Minerva-style math check (verl/utils/reward_score/math_dapo.py). Each Python re.sub is
// written out as a scan over UTF-8 text: '.' matches any code point but '\n', so every pattern
// matches within one line, and matches do not overlap (the scan resumes after each).
#include "reward/math_dapo.h"

#include <algorithm>
#include <array>
#include <utility>

#include "reward/math_dataset.h"  // replace_all

namespace verl::reward {
namespace {

// Bytes of the UTF-8 code point at s[i] (1 for ASCII or a stray byte).
size_t cp_len(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80           ? 1
                   : (c >> 5) == 0x6  ? 2
                   : (c >> 4) == 0xE  ? 3
                   : (c >> 3) == 0x1E ? 4
                                      : 1;
  return std::min(n, s.size() - i);
}

// Python's str.isspace() for ASCII (plus the separators \x1c-\x1f that it also counts).
bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' ||
         (c >= 0x1c && c <= 0x1f);
}

// The end of the line that holds position i (the next '\n', or the end).
size_t line_end(std::string_view s, size_t i) {
  const size_t e = s.find('\n', i);
  return e == std::string_view::npos ? s.size() : e;
}

// re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\3$", s): a line with two '$' becomes "$" + the text
// between its first two '$' + "$"; other lines stay.
std::string keep_first_dollar_pair(std::string_view s) {
  std::string out;
  size_t i = 0;
  while (i <= s.size()) {
    const size_t e = line_end(s, i);
    const std::string_view line = s.substr(i, e - i);
    const size_t a = line.find('$');
    const size_t b = a == std::string_view::npos ? a : line.find('$', a + 1);
    if (b != std::string_view::npos) {
      out += '$';
      out.append(line.substr(a + 1, b - a - 1));
      out += '$';
    } else {
      out.append(line);
    }
    if (e == s.size()) break;
    out += '\n';
    i = e + 1;
  }
  return out;
}

// re.sub(r"(<open>)(.*?)(\})", r"\2", s) (lazy: the nearest '}' on the same line) and, greedy,
// re.sub(r"(\\boxed\{)(.*)(\})", r"\2", s) (the last '}' of the line): "<open>x}" -> "x".
std::string unwrap(std::string_view s, std::string_view open, bool greedy) {
  std::string out;
  size_t i = 0;
  for (;;) {
    const size_t p = s.find(open, i);
    if (p == std::string_view::npos) break;
    const size_t body = p + open.size();
    const size_t e = line_end(s, body);
    const size_t close = greedy ? s.substr(0, e).rfind('}') : s.find('}', body);
    if (close != std::string_view::npos && close >= body && close < e) {
      out.append(s.substr(i, p - i));
      out.append(s.substr(body, close - body));
      i = close + 1;
    } else {
      out.append(s.substr(i, p + 1 - i));
      i = p + 1;
    }
  }
  out.append(s.substr(i));
  return out;
}

// re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", s) and re.sub(r"(sqrt)([^{])", r"sqrt{\2}", s).
// `args` is 2 for frac, 1 for sqrt; [^{] matches '\n' too, '.' does not.
std::string brace_args(std::string_view s, std::string_view word, int args) {
  std::string out;
  size_t i = 0;
  for (;;) {
    const size_t p = s.find(word, i);
    if (p == std::string_view::npos) break;
    const size_t a = p + word.size();
    bool ok = a < s.size() && s[a] != '{';
    size_t b = ok ? a + cp_len(s, a) : a, end = b;
    if (ok && args == 2) {
      ok = b < s.size() && s[b] != '\n';
      if (ok) end = b + cp_len(s, b);
    }
    if (!ok) {
      out.append(s.substr(i, p + 1 - i));
      i = p + 1;
      continue;
    }
    out.append(s.substr(i, p - i));
    out.append(word);
    out += '{';
    out.append(s.substr(a, b - a));
    out += '}';
    if (args == 2) {
      out += '{';
      out.append(s.substr(b, end - b));
      out += '}';
    }
    i = end;
  }
  out.append(s.substr(i));
  return out;
}

// verl's SUBSTITUTIONS and REMOVED_EXPRESSIONS, in their order.
constexpr std::array<std::pair<std::string_view, std::string_view>, 10> kSubstitutions = {{
    {"an ", ""},
    {"a ", ""},
    {".$", "$"},
    {"\\$", ""},
    {"\\ ", ""},
    {" ", ""},
    {"mbox", "text"},
    {",\\text{and}", ","},
    {"\\text{and}", ","},
    {"\\text{m}", "\\text{}"},
}};
constexpr std::array<std::string_view, 41> kRemovedExpressions = {
    "square",     "ways",       "integers",  "dollars",      "mph",
    "inches",     "hours",      "km",        "units",        "\\ldots",
    "sue",        "points",     "feet",      "minutes",      "digits",
    "cents",      "degrees",    "cm",        "gm",           "pounds",
    "meters",     "meals",      "edges",     "students",     "childrentickets",
    "multiples",  "\\text{s}",  "\\text{.}", "\\text{\ns}",  "\\text{}^2",
    "\\text{}^3", "\\text{\n}", "\\text{}",  "\\mathrm{th}", "^\\circ",
    "^{\\circ}",  "\\;",        ",\\!",      "{,}",          "\"",
    "\\dots",
};

}  // namespace

std::string dapo_normalize_final_answer(std::string_view final_answer) {
  const size_t eq = final_answer.rfind('=');
  std::string s(eq == std::string_view::npos ? final_answer : final_answer.substr(eq + 1));
  for (const auto& [before, after] : kSubstitutions) s = replace_all(s, before, after);
  for (std::string_view expr : kRemovedExpressions) s = replace_all(s, expr, "");
  s = keep_first_dollar_pair(s);
  s = unwrap(s, "\\text{", /*greedy=*/false);
  s = unwrap(s, "\\textbf{", /*greedy=*/false);
  s = unwrap(s, "\\overline{", /*greedy=*/false);
  s = unwrap(s, "\\boxed{", /*greedy=*/true);
  s = brace_args(s, "frac", 2);
  s = brace_args(s, "sqrt", 1);
  s = replace_all(s, "$", "");
  const std::string digits = replace_all(s, ",", "");
  if (!digits.empty() &&
      std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    s = digits;
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string dapo_extract_answer(std::string_view s) {
  auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  std::string_view last;
  bool found = false;
  size_t i = 0;
  while (i + 6 <= s.size()) {
    bool word = true;
    for (size_t k = 0; k < 6 && word; ++k) word = lower(s[i + k]) == "answer"[k];
    size_t q = i + 6;
    while (word && q < s.size() && is_space(s[q])) ++q;
    if (!word || q >= s.size() || s[q] != ':') {
      ++i;
      continue;
    }
    size_t r = q + 1;
    while (r < s.size() && is_space(s[r])) ++r;
    // [^\n]+ needs one character: at the end of the text \s* gives back its last non-newline.
    size_t start = r;
    if (r == s.size()) {
      start = std::string_view::npos;
      for (size_t k = r; k > q + 1; --k)
        if (s[k - 1] != '\n') {
          start = k - 1;
          break;
        }
    }
    if (start == std::string_view::npos) {
      ++i;
      continue;
    }
    const size_t end = line_end(s, start);
    last = s.substr(start, end - start);
    found = true;
    i = end;
  }
  return found ? std::string(last) : std::string("[INVALID]");
}

ScoreResult math_dapo_compute_score(std::string_view solution_str, std::string_view ground_truth) {
  // solution_str[-300:] in code points ("the longest answer in MATH-500 has 159 characters").
  size_t count = 0;
  for (size_t i = 0; i < solution_str.size(); i += cp_len(solution_str, i)) ++count;
  size_t skip = count > 300 ? count - 300 : 0, from = 0;
  while (skip-- > 0) from += cp_len(solution_str, from);
  const std::string pred =
      dapo_normalize_final_answer(dapo_extract_answer(solution_str.substr(from)));
  ScoreResult r;
  r.acc = pred == dapo_normalize_final_answer(ground_truth);
  r.score = r.acc ? 1.0 : -1.0;
  r.pred = pred;
  r.is_dict = true;
  return r;
}

}  // namespace verl::reward
