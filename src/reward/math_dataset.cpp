// MATH answer extraction and normalisation (verl/utils/reward_score/math.py). Python's string
// operations (split, replace, indexing by code point) are reproduced on UTF-8 text; the places
// where verl's code raises are returned as nullopt.
#include "reward/math_dataset.h"

#include <vector>

namespace verl::reward {
namespace {

// Python's str.split(sep) (sep non-empty): every piece, empty ones included.
std::vector<std::string> split(std::string_view s, std::string_view sep) {
  std::vector<std::string> parts;
  size_t start = 0, pos;
  while ((pos = s.find(sep, start)) != std::string_view::npos) {
    parts.emplace_back(s.substr(start, pos - start));
    start = pos + sep.size();
  }
  parts.emplace_back(s.substr(start));
  return parts;
}

bool starts_with(std::string_view s, std::string_view p) {
  return s.substr(0, p.size()) == p;
}

// Bytes of the UTF-8 code point starting at s[i] (1 for ASCII or a stray byte).
size_t char_len(std::string_view s, size_t i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
  return std::min(n, s.size() - i);
}

size_t count_chars(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += char_len(s, i)) ++n;
  return n;
}

// fix_sqrt: "\sqrt3" -> "\sqrt{3}" (one character). An empty piece after "\sqrt" raises in verl.
std::optional<std::string> fix_sqrt(std::string_view s) {
  if (s.find("\\sqrt") == std::string_view::npos) return std::string(s);
  std::vector<std::string> parts = split(s, "\\sqrt");
  std::string out = parts[0];
  for (size_t k = 1; k < parts.size(); ++k) {
    const std::string& p = parts[k];
    if (p.empty()) return std::nullopt;  // split[0] raises IndexError
    if (p[0] != '{') {
      size_t n = char_len(p, 0);
      out += "\\sqrt{" + p.substr(0, n) + "}" + p.substr(n);
    } else {
      out += "\\sqrt" + p;
    }
  }
  return out;
}

// fix_fracs: "\frac12" -> "\frac{1}{2}", "\frac1{72}" -> "\frac{1}{72}". A piece of one character
// returns the input unchanged; an empty piece raises in verl.
std::optional<std::string> fix_fracs(std::string_view s) {
  std::vector<std::string> parts = split(s, "\\frac");
  std::string out = parts[0];
  for (size_t k = 1; k < parts.size(); ++k) {
    const std::string& p = parts[k];
    out += "\\frac";
    if (p.empty()) return std::nullopt;  // substr[0] raises IndexError
    if (p[0] == '{') {
      out += p;
      continue;
    }
    size_t na = char_len(p, 0);
    if (na >= p.size()) return std::string(s);  // fewer than 2 characters
    size_t nb = char_len(p, na);
    std::string a = p.substr(0, na), b = p.substr(na, nb), post = p.substr(na + nb);
    if (b != "{") {
      out += "{" + a + "}{" + b + "}" + post;
    } else {
      out += "{" + a + "}" + b + post;
    }
  }
  return out;
}

// A string that Python's int() parses and str() prints back unchanged: -?(0|[1-9][0-9]*), "-0"
// excluded (it prints back as "0").
bool canonical_int(std::string_view s) {
  const bool negative = !s.empty() && s[0] == '-';
  if (negative) s.remove_prefix(1);
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  if (s[0] == '0') return s.size() == 1 && !negative;
  return true;
}

// fix_a_slash_b: "a/b" with integers a, b -> "\frac{a}{b}".
std::string fix_a_slash_b(const std::string& s) {
  std::vector<std::string> parts = split(s, "/");
  if (parts.size() != 2) return s;
  const std::string &a = parts[0], &b = parts[1];
  if (!canonical_int(a) || !canonical_int(b)) return s;
  return "\\frac{" + a + "}{" + b + "}";
}

}  // namespace

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  size_t start = 0, pos;
  while ((pos = s.find(from, start)) != std::string_view::npos) {
    out.append(s.substr(start, pos - start));
    out.append(to);
    start = pos + from.size();
  }
  out.append(s.substr(start));
  return out;
}

std::optional<std::string> last_boxed_only_string(std::string_view s) {
  size_t idx = s.rfind("\\boxed");
  if (s.find("\\boxed ") != std::string_view::npos) {
    std::vector<std::string> after = split(s, "\\boxed ");
    return "\\boxed " + split(after.back(), "$")[0];
  }
  if (idx == std::string_view::npos) {
    idx = s.rfind("\\fbox");
    if (idx == std::string_view::npos) return std::nullopt;
  }
  int open = 0;
  for (size_t i = idx; i < s.size(); ++i) {
    if (s[i] == '{') ++open;
    if (s[i] == '}') {
      --open;
      if (open == 0) return std::string(s.substr(idx, i + 1 - idx));
    }
  }
  return std::nullopt;
}

std::optional<std::string> remove_boxed(std::string_view boxed) {
  if (boxed.find("\\boxed ") != std::string_view::npos) {
    if (!starts_with(boxed, "\\boxed ")) return std::nullopt;
    return std::string(boxed.substr(7));
  }
  for (std::string_view left : {std::string_view("\\boxed{"), std::string_view("\\fbox{")}) {
    if (starts_with(boxed, left) && boxed.size() > left.size() && boxed.back() == '}')
      return std::string(boxed.substr(left.size(), boxed.size() - left.size() - 1));
  }
  return std::nullopt;
}

std::optional<std::string> math_strip_string(std::string_view in) {
  std::string s = replace_all(in, "\n", "");
  s = replace_all(s, "\\!", "");
  s = replace_all(s, "\\\\", "\\");
  s = replace_all(s, "tfrac", "frac");
  s = replace_all(s, "dfrac", "frac");
  s = replace_all(s, "\\left", "");
  s = replace_all(s, "\\right", "");
  s = replace_all(s, "^{\\circ}", "");
  s = replace_all(s, "^\\circ", "");
  s = replace_all(s, "\\$", "");
  // remove_right_units: "\text{ " only ever introduces units; more than one raises in verl.
  if (s.find("\\text{ ") != std::string::npos) {
    std::vector<std::string> parts = split(s, "\\text{ ");
    if (parts.size() != 2) return std::nullopt;
    s = parts[0];
  }
  s = replace_all(s, "\\%", "");
  s = replace_all(s, " .", " 0.");
  s = replace_all(s, "{.", "{0.");
  if (s.empty()) return s;
  if (s[0] == '.') s = "0" + s;
  // "k = 3" -> "3" when the left side is at most two characters.
  std::vector<std::string> eq = split(s, "=");
  if (eq.size() == 2 && count_chars(eq[0]) <= 2) s = eq[1];
  std::optional<std::string> sq = fix_sqrt(s);
  if (!sq) return std::nullopt;
  s = replace_all(*sq, " ", "");
  std::optional<std::string> fr = fix_fracs(s);
  if (!fr) return std::nullopt;
  s = *fr;
  if (s == "0.5") s = "\\frac{1}{2}";
  return fix_a_slash_b(s);
}

bool math_is_equiv(std::string_view a, std::string_view b) {
  std::optional<std::string> sa = math_strip_string(a), sb = math_strip_string(b);
  if (!sa || !sb) return a == b;
  return *sa == *sb;
}

ScoreResult math_compute_score(std::string_view solution_str, std::string_view ground_truth) {
  ScoreResult r;
  std::optional<std::string> boxed = last_boxed_only_string(solution_str);
  if (!boxed) return r;
  std::optional<std::string> answer = remove_boxed(*boxed);
  if (!answer) return r;
  r.pred = *answer;
  r.acc = math_is_equiv(*answer, ground_truth);
  r.score = r.acc ? 1.0 : 0.0;
  return r;
}

}  // namespace verl::reward
