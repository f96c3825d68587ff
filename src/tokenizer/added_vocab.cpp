// Added-token matching (see added_vocab.h). Scans the text once; at each position that can start a
// token, walks the byte trie and keeps the longest token found (leftmost-longest).
#include "tokenizer/added_vocab.h"

#include <unicode/uchar.h>

#include "tokenizer/utf8.h"

namespace verl::tokenizer {

namespace {

bool is_word_char(uint32_t cp) {
  return u_isalnum(static_cast<UChar32>(cp)) || cp == '_';
}

}  // namespace

void AddedVocab::add(const AddedToken& token) {
  auto it = by_id_.find(token.id);
  if (it != by_id_.end()) {
    tokens_[it->second] = token;  // a later definition of the same id wins
    return;
  }
  by_id_.emplace(token.id, tokens_.size());
  tokens_.push_back(token);
}

int32_t AddedVocab::id_of(std::string_view content) const {
  for (const AddedToken& t : tokens_)
    if (t.content == content) return t.id;
  return -1;
}

void AddedVocab::build(bool split_special_tokens) {
  for (Trie& t : tries_) t = Trie();
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& tok = tokens_[i];
    if (tok.content.empty() || (split_special_tokens && tok.special)) continue;
    Trie& trie = tries_[tok.normalized ? 1 : 0];
    if (trie.nodes.empty()) trie.nodes.emplace_back();
    int32_t node = 0;
    for (char ch : tok.content) {
      const auto b = static_cast<uint8_t>(ch);
      int32_t next = -1;
      for (auto [c, child] : trie.nodes[static_cast<size_t>(node)].children)
        if (c == b) next = child;
      if (next < 0) {
        next = static_cast<int32_t>(trie.nodes.size());
        trie.nodes[static_cast<size_t>(node)].children.emplace_back(b, next);
        trie.nodes.emplace_back();
      }
      node = next;
    }
    trie.nodes[static_cast<size_t>(node)].token = static_cast<int32_t>(i);
    trie.first_byte[static_cast<uint8_t>(tok.content[0])] = true;
  }
}

void AddedVocab::find(std::string_view text, bool normalized, std::vector<Match>& out) const {
  const Trie& trie = tries_[normalized ? 1 : 0];
  if (trie.nodes.empty()) return;
  size_t prev_end = 0;  // stripping never reaches into the previous match
  size_t i = 0;
  while (i < text.size()) {
    if (!trie.first_byte[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < text.size(); ++j) {
      const auto b = static_cast<uint8_t>(text[j]);
      int32_t next = -1;
      for (auto [c, child] : trie.nodes[static_cast<size_t>(node)].children)
        if (c == b) next = child;
      if (next < 0) break;
      node = next;
      if (trie.nodes[static_cast<size_t>(node)].token >= 0) {
        best = trie.nodes[static_cast<size_t>(node)].token;
        best_end = j + 1;
      }
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& tok = tokens_[static_cast<size_t>(best)];
    size_t b = i, e = best_end;
    if (tok.single_word) {
      size_t p = b;
      const bool word_before = b > 0 && is_word_char(prev_code_point(text, p));
      size_t q = e;
      const bool word_after = e < text.size() && is_word_char(next_code_point(text, q));
      if (word_before || word_after) {
        ++i;
        continue;
      }
    }
    if (tok.lstrip) {
      while (b > prev_end) {
        size_t p = b;
        const uint32_t cp = prev_code_point(text, p);
        if (!u_isUWhiteSpace(static_cast<UChar32>(cp))) break;
        b = p;
      }
    }
    if (tok.rstrip) {
      while (e < text.size()) {
        size_t q = e;
        const uint32_t cp = next_code_point(text, q);
        if (!u_isUWhiteSpace(static_cast<UChar32>(cp))) break;
        e = q;
      }
    }
    out.push_back({b, e, tok.id});
    prev_end = e;
    i = e;
  }
}

}  // namespace verl::tokenizer
