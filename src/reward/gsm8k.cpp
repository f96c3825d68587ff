// GSM8K answer extraction and scoring (verl/utils/reward_score/gsm8k.py), with the regexes
// "#### (-?[0-9.,]+)" and "(-?[0-9.,]+)" matched by hand, left to right and non-overlapping as
// Python's re.findall does.
#include "reward/gsm8k.h"

#include <vector>

namespace verl::reward {
namespace {

constexpr size_t kSolutionClipChars = 300;  // verl's _SOLUTION_CLIP_CHARS

bool number_char(char c) {
  return (c >= '0' && c <= '9') || c == '.' || c == ',';
}

// Length of the match of "-?[0-9.,]+" at s[pos], 0 if none.
size_t match_number(std::string_view s, size_t pos) {
  size_t i = pos;
  if (i < s.size() && s[i] == '-') ++i;
  size_t start = i;
  while (i < s.size() && number_char(s[i])) ++i;
  if (i > start) return i - pos;
  // "-?" backtracks to empty: the class must then match at pos itself, which is '-' -> no match.
  return 0;
}

}  // namespace

std::string_view utf8_last_chars(std::string_view s, size_t n) {
  size_t count = 0, i = s.size();
  while (i > 0 && count < n) {
    --i;
    // Step back over continuation bytes (10xxxxxx) to the start of the code point.
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    ++count;
  }
  return s.substr(i);
}

std::optional<std::string> gsm8k_extract_solution(std::string_view solution_str,
                                                  Gsm8kMethod method) {
  std::string_view s = utf8_last_chars(solution_str, kSolutionClipChars);
  if (method == Gsm8kMethod::Strict) {
    std::optional<std::string> last;
    constexpr std::string_view kMarker = "#### ";
    size_t pos = 0;
    while ((pos = s.find(kMarker, pos)) != std::string_view::npos) {
      size_t len = match_number(s, pos + kMarker.size());
      if (len == 0) {
        ++pos;
        continue;
      }
      std::string ans;
      for (char c : s.substr(pos + kMarker.size(), len))
        if (c != ',' && c != '$') ans += c;
      last = std::move(ans);
      pos += kMarker.size() + len;
    }
    return last;
  }
  std::vector<std::string_view> matches;
  for (size_t pos = 0; pos < s.size();) {
    size_t len = match_number(s, pos);
    if (len == 0) {
      ++pos;
      continue;
    }
    matches.push_back(s.substr(pos, len));
    pos += len;
  }
  if (matches.empty()) return std::nullopt;
  // The last match that is not "" or "."; when all are invalid verl's loop variable is left at
  // the first match.
  for (auto it = matches.rbegin(); it != matches.rend(); ++it)
    if (*it != "" && *it != ".") return std::string(*it);
  return std::string(matches.front());
}

ScoreResult gsm8k_compute_score(std::string_view solution_str, std::string_view ground_truth,
                                Gsm8kMethod method, double format_score, double score) {
  ScoreResult r;
  std::optional<std::string> answer = gsm8k_extract_solution(solution_str, method);
  if (!answer) return r;
  r.pred = *answer;
  r.acc = *answer == ground_truth;
  r.score = r.acc ? score : format_score;
  return r;
}

}  // namespace verl::reward
