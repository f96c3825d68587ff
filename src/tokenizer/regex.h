// A compiled PCRE2 pattern in UTF + UCP mode (so \s, \p{L}, \w follow Unicode, as the Oniguruma
// regexes of HF tokenizers do), JIT-compiled when the platform allows, safe to share across
// threads.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace verl::tokenizer {

class Regex {
 public:
  // `literal` compiles the pattern as a plain string (tokenizer.json's {"String": ...} patterns).
  // `where` names the pattern's origin for error messages.
  Regex(const std::string& pattern, bool literal, const std::string& where);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Non-overlapping matches [begin, end) in order, as HF's find_iter: an empty match advances by
  // one character. The subject must be valid UTF-8.
  void find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  std::string where_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace verl::tokenizer
