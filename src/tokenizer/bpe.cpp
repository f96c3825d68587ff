// BPE merging (see bpe.h). A word is a doubly linked list of symbols; a min-heap holds candidate
// pairs ordered by (merge rank, position), so the lowest-ranked, leftmost pair merges first, as in
// HF tokenizers' Word::merge_all. Stale heap entries are detected and dropped when popped.
#include "tokenizer/bpe.h"

#include <algorithm>
#include <functional>

#include "core/error.h"
#include "tokenizer/byte_level.h"

namespace verl::tokenizer {

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  slots_.assign(cap, Entry{kEmpty, 0, 0});
  mask_ = cap - 1;
  size_ = 0;
}

void MergeTable::insert(int32_t left, int32_t right, uint32_t rank, int32_t merged) {
  const uint64_t key = pack(left, right);
  size_t i = hash(key) & mask_;
  while (slots_[i].key != kEmpty) {
    if (slots_[i].key == key) return;  // a repeated merge keeps its first (lowest) rank
    i = (i + 1) & mask_;
  }
  slots_[i] = Entry{key, rank, merged};
  ++size_;
}

std::unique_ptr<BpeModel> BpeModel::from_json(const nlohmann::json& model,
                                              const std::string& where) {
  VERL_CHECK(model.is_object(), "{}: \"model\" must be an object", where);
  const std::string type = model.value("type", std::string("BPE"));
  VERL_CHECK(
      type == "BPE",
      "{}: unsupported model type \"{}\": only byte-level BPE is implemented (not WordPiece, "
      "Unigram or WordLevel)",
      where, type);
  auto m = std::make_unique<BpeModel>();

  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && model[key].is_string()) {
      VERL_CHECK(model[key].get<std::string>().empty(), "{}: BPE \"{}\" is not supported", where,
                 key);
    }
  }
  if (model.contains("dropout") && model["dropout"].is_number()) {
    VERL_CHECK(model["dropout"].get<double>() == 0.0,
               "{}: BPE dropout is not supported (tokenization must be deterministic)", where);
  }
  if (model.contains("byte_fallback") && model["byte_fallback"].is_boolean()) {
    VERL_CHECK(!model["byte_fallback"].get<bool>(),
               "{}: BPE byte_fallback is not supported (only byte-level BPE)", where);
  }
  m->ignore_merges_ = model.contains("ignore_merges") && model["ignore_merges"].is_boolean() &&
                      model["ignore_merges"].get<bool>();

  VERL_CHECK(model.contains("vocab") && model["vocab"].is_object(),
             "{}: model.vocab must be an object of token -> id", where);
  const auto& vocab = model["vocab"];
  m->vocab_.reserve(vocab.size());
  int32_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    VERL_CHECK(it.value().is_number_integer() && it.value().get<int64_t>() >= 0 &&
                   it.value().get<int64_t>() < kMaxTokenId,
               "{}: model.vocab[\"{}\"] must be an integer id in [0, {}), got {}", where, it.key(),
               kMaxTokenId, it.value().dump());
    const auto id = static_cast<int32_t>(it.value().get<int64_t>());
    m->vocab_.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }
  m->id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [tok, id] : m->vocab_) m->id_to_token_[static_cast<size_t>(id)] = tok;

  const ByteLevelAlphabet& alpha = ByteLevelAlphabet::get();
  for (int b = 0; b < 256; ++b) {
    const int32_t id = m->token_to_id(alpha.utf8_of(static_cast<uint8_t>(b)));
    VERL_CHECK(id >= 0,
               "{}: the vocabulary lacks the byte-level token for byte 0x{:02X}; only "
               "byte-level BPE vocabularies are supported",
               where, b);
    m->byte_id_[static_cast<size_t>(b)] = id;
  }

  VERL_CHECK(model.contains("merges") && model["merges"].is_array(),
             "{}: model.merges must be an array", where);
  const auto& merges = model["merges"];
  m->merges_.reserve(merges.size());
  std::string left, right;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& e = merges[rank];
    if (e.is_string()) {  // "a b"
      const std::string& s = e.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      VERL_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
                 "{}: model.merges[{}] = \"{}\" must be two tokens separated by one space", where,
                 rank, s);
      left.assign(s, 0, sp);
      right.assign(s, sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      left = e[0].get<std::string>();
      right = e[1].get<std::string>();
    } else {
      VERL_FAIL("{}: model.merges[{}] must be \"a b\" or [\"a\", \"b\"], got {}", where, rank,
                e.dump());
    }
    const int32_t l = m->token_to_id(left), r = m->token_to_id(right);
    const int32_t merged = m->token_to_id(left + right);
    VERL_CHECK(l >= 0 && r >= 0 && merged >= 0,
               "{}: model.merges[{}] (\"{}\" + \"{}\") refers to a token missing from the "
               "vocabulary",
               where, rank, left, right);
    m->merges_.insert(l, r, static_cast<uint32_t>(rank), merged);
  }
  return m;
}

int32_t BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string& BpeModel::id_to_token(int32_t id) const {
  static const std::string empty;
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return empty;
  return id_to_token_[static_cast<size_t>(id)];
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Sym {
    int32_t id;
    int32_t prev, next;  // indices, -1 at the ends
  };
  struct Cand {
    uint32_t rank;
    int32_t left, right;  // symbol indices
    int32_t left_id, right_id;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  thread_local std::vector<Sym> syms;
  thread_local std::vector<Cand> heap;  // a binary min-heap through std::push_heap/pop_heap
  syms.clear();
  heap.clear();
  const auto n = static_cast<int32_t>(word.size());
  for (int32_t i = 0; i < n; ++i)
    syms.push_back({byte_id_[static_cast<uint8_t>(word[static_cast<size_t>(i)])], i - 1,
                    i + 1 < n ? i + 1 : -1});

  auto push_pair = [&](int32_t l) {
    if (l < 0) return;
    const int32_t r = syms[static_cast<size_t>(l)].next;
    if (r < 0) return;
    const int32_t lid = syms[static_cast<size_t>(l)].id, rid = syms[static_cast<size_t>(r)].id;
    if (const MergeTable::Entry* e = merges_.find(lid, rid)) {
      heap.push_back({e->rank, l, r, lid, rid});
      std::push_heap(heap.begin(), heap.end(), std::greater<Cand>());
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<Cand>());
    const Cand c = heap.back();
    heap.pop_back();
    Sym& l = syms[static_cast<size_t>(c.left)];
    // Stale if either side was merged away or changed since the entry was pushed.
    if (l.id != c.left_id || l.next != c.right ||
        syms[static_cast<size_t>(c.right)].id != c.right_id)
      continue;
    Sym& r = syms[static_cast<size_t>(c.right)];
    l.id = merges_.find(c.left_id, c.right_id)->merged;
    l.next = r.next;
    if (r.next >= 0) syms[static_cast<size_t>(r.next)].prev = c.left;
    r.id = -1;  // removed
    if (l.prev >= 0) push_pair(l.prev);
    push_pair(c.left);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = syms[static_cast<size_t>(i)].next)
    out.push_back(syms[static_cast<size_t>(i)].id);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (word.size() == 1) {
    out.push_back(byte_id_[static_cast<uint8_t>(word[0])]);
    return;
  }
  CacheShard& shard = cache_[std::hash<std::string_view>{}(word) % kShards];
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.map.find(word);
    if (it != shard.map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  bool done = false;
  if (ignore_merges_) {  // a word that is itself a token skips merging (Llama-3)
    thread_local std::string shown;
    shown.clear();
    const ByteLevelAlphabet& alpha = ByteLevelAlphabet::get();
    for (char c : word) shown += alpha.utf8_of(static_cast<uint8_t>(c));
    const int32_t id = token_to_id(shown);
    if (id >= 0) {
      out.push_back(id);
      done = true;
    }
  }
  if (!done) merge_word(word, out);
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.map.size() >= kShardCapacity) shard.map.clear();
  shard.map.emplace(std::string(word),
                    std::vector<int32_t>(out.begin() + static_cast<long>(start), out.end()));
}

}  // namespace verl::tokenizer
