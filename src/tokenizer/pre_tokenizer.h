// tokenizer.json "pre_tokenizer": cuts normalized text into words before BPE. Supported: Split
// (regex or string pattern, every delimiter behavior, invert), ByteLevel (add_prefix_space,
// use_regex with GPT-2's pattern) and Sequence. Byte-level mapping itself happens in the BPE model,
// which works on raw bytes, so ByteLevel here only splits and prefixes.
#pragma once

#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace verl::tokenizer {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  static PreTokenizer from_json(const nlohmann::json& config, const std::string& where);

  // Appends the words of `text` to `out`. Words are views into `text` or into strings that this
  // call adds to `storage` (a prefix space), which must outlive the views.
  void split(std::string_view text, std::vector<std::string_view>& out,
             std::deque<std::string>& storage) const;

  // True when a ByteLevel step is present: the tokenizer requires it (byte-level BPE only).
  bool has_byte_level() const { return has_byte_level_; }

 private:
  struct Step {
    std::shared_ptr<Regex> regex;  // null for a ByteLevel step without use_regex
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    bool prefix_space = false;  // ByteLevel add_prefix_space
  };
  std::vector<Step> steps_;
  bool has_byte_level_ = false;
};

}  // namespace verl::tokenizer
