// tokenizer.json "normalizer": Unicode normalization forms through ICU (NFC, NFD, NFKC, NFKD),
// Lowercase, and Sequence of these. Anything else is rejected at load time with its type named.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace verl::tokenizer {

class Normalizer {
 public:
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kLowercase };

  // `config` is tokenizer.json's "normalizer" value (null gives the identity); `where` names the
  // file for error messages.
  static Normalizer from_json(const nlohmann::json& config, const std::string& where);

  bool empty() const { return steps_.empty(); }
  // Returns true and writes `out` when the text changes; false means `text` is already normal.
  bool apply(std::string_view text, std::string& out) const;

 private:
  std::vector<Kind> steps_;
};

}  // namespace verl::tokenizer
