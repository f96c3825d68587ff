// Byte-level BPE model of tokenizer.json ("model": {"type": "BPE"}): the vocabulary, the merge
// ranks (both file formats: "a b" strings and [a, b] pairs), `ignore_merges`, and a per-word cache.
// Words arrive as raw UTF-8 bytes; each byte starts as the id of its byte-level character.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace verl::tokenizer {

// Open-addressing map from a token pair (left id, right id) to its merge rank and merged id.
class MergeTable {
 public:
  struct Entry {
    uint64_t key;
    uint32_t rank;
    int32_t merged;
  };
  void reserve(size_t n);
  void insert(int32_t left, int32_t right, uint32_t rank, int32_t merged);
  // Null when the pair never merges.
  const Entry* find(int32_t left, int32_t right) const {
    const uint64_t key = pack(left, right);
    size_t i = hash(key) & mask_;
    while (true) {
      const Entry& e = slots_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~0ULL;
  static uint64_t pack(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  static size_t hash(uint64_t k) {  // splitmix64 finalizer
    k ^= k >> 30;
    k *= 0xbf58476d1ce4e5b9ULL;
    k ^= k >> 27;
    k *= 0x94d049bb133111ebULL;
    k ^= k >> 31;
    return static_cast<size_t>(k);
  }
  std::vector<Entry> slots_;
  size_t mask_ = 0, size_ = 0;
};

// Token ids of a tokenizer file (vocabulary and added tokens) must lie in [0, kMaxTokenId): per-id
// tables are sized by the largest id, and the largest real vocabularies hold a few hundred
// thousand.
inline constexpr int64_t kMaxTokenId = int64_t{1} << 24;

class BpeModel {
 public:
  // `model` is tokenizer.json's "model" object; `where` names the file in errors.
  static std::unique_ptr<BpeModel> from_json(const nlohmann::json& model, const std::string& where);

  // Appends the ids of one pre-tokenized word given as raw bytes.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  int32_t token_to_id(std::string_view token) const;  // -1 if absent
  const std::string& id_to_token(int32_t id) const;   // empty if absent
  // One past the largest id of the model's vocabulary.
  int64_t size() const { return static_cast<int64_t>(id_to_token_.size()); }

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using StringMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  StringMap vocab_;
  std::vector<std::string> id_to_token_;
  std::array<int32_t, 256> byte_id_{};
  MergeTable merges_;
  bool ignore_merges_ = false;

  // Word cache, sharded so that concurrent encoders rarely share a lock.
  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };
  static constexpr size_t kShards = 16;
  static constexpr size_t kShardCapacity = 1 << 14;
  mutable std::array<CacheShard, kShards> cache_;
};

}  // namespace verl::tokenizer
