// Added tokens of tokenizer.json ("added_tokens"): special and non-special strings that are cut out
// of the text before normalization/BPE, matched leftmost-longest as HF tokenizers' AddedVocabulary
// does, honouring `lstrip`/`rstrip` (absorb neighbouring whitespace), `single_word` and
// `normalized` (matched on normalized rather than raw text).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace verl::tokenizer {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool single_word = false;
};

class AddedVocab {
 public:
  struct Match {
    size_t begin, end;  // the span to replace by the token, stripped whitespace included
    int32_t id;
  };

  void add(const AddedToken& token);
  // Builds the matchers; `split_special_tokens` (tokenizer_config.json) leaves special tokens
  // to BPE, as transformers does.
  void build(bool split_special_tokens);

  // Matches of tokens whose `normalized` flag equals `normalized`, in order.
  void find(std::string_view text, bool normalized, std::vector<Match>& out) const;
  bool has(bool normalized) const { return !tries_[normalized ? 1 : 0].nodes.empty(); }

  const AddedToken* by_id(int32_t id) const {
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : &tokens_[it->second];
  }
  int32_t id_of(std::string_view content) const;  // -1 if absent
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // Byte trie of token contents; node 0 is the root.
  struct Trie {
    struct Node {
      std::vector<std::pair<uint8_t, int32_t>> children;
      int32_t token = -1;  // index into tokens_ when a token ends here
    };
    std::vector<Node> nodes;
    std::array<bool, 256> first_byte{};
  };
  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> by_id_;
  std::array<Trie, 2> tries_;
};

}  // namespace verl::tokenizer
