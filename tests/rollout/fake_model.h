// A deterministic stand-in for the model runner, for scheduler tests. Its "KV cache" holds, per
// slot, a hash of every token up to that position; a forward step reads the previous position's
// hash through the batch's block tables and writes new hashes through its slot mapping, so a
// wrong slot, block table, fork or copy-on-write changes the generated tokens.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "rollout/scheduler.h"

namespace verl::rollout::testing {

inline uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// KV "content" of position pos given the previous position's content and the token there.
inline uint64_t kv_hash(uint64_t prev, int32_t token, int64_t pos) {
  return mix64(prev ^ (static_cast<uint64_t>(static_cast<uint32_t>(token)) * 0x100000001B3ull) ^
               (static_cast<uint64_t>(pos) << 40));
}
constexpr uint64_t kKvStart = 0x1234567ull;
constexpr uint64_t kEmptySlot = 0xDEADBEEFDEADBEEFull;

// "Sampling": a pure function of the context hash and the sequence's (stream, counter), as the
// real sampler is of the logits and (seed, stream, counter).
inline int32_t fake_token(uint64_t context, uint64_t stream, uint64_t counter, int32_t vocab) {
  return static_cast<int32_t>(mix64(context ^ mix64(stream * 31 + counter)) %
                              static_cast<uint64_t>(vocab));
}

// Generation of one sequence without any scheduler: the ground truth.
struct Reference {
  std::vector<int32_t> output;
  FinishReason reason;
};
inline Reference reference_generate(const Sequence& seq, int32_t vocab, int32_t max_model_len) {
  uint64_t h = kKvStart;
  const auto prompt = seq.prompt_tokens();
  for (size_t p = 0; p < prompt.size(); ++p) h = kv_hash(h, prompt[p], static_cast<int64_t>(p));
  Reference r{{}, FinishReason::None};
  const SamplingParams& sp = seq.params();
  int64_t len = static_cast<int64_t>(prompt.size());
  while (true) {
    const int32_t tok = fake_token(h, seq.rng_stream(), r.output.size(), vocab);
    r.output.push_back(tok);
    if (!sp.ignore_eos && sp.is_stop_token(tok)) {
      r.reason = FinishReason::Stop;
      return r;
    }
    if (static_cast<int32_t>(r.output.size()) >= sp.max_tokens || len + 1 >= max_model_len) {
      r.reason = FinishReason::Length;
      return r;
    }
    h = kv_hash(h, tok, len);
    ++len;
  }
}

class FakeRunner {
 public:
  FakeRunner(int32_t num_blocks, int32_t block_size, int32_t vocab)
      : bs_(block_size),
        vocab_(vocab),
        kv_(static_cast<size_t>(num_blocks) * block_size, kEmptySlot) {}

  // Runs one step: copies, then the forward over every item, then the draws. Fails the test on
  // inconsistent metadata (returns false so the caller can stop).
  bool step(const ScheduledBatch& b, std::vector<int32_t>& tokens) {
    for (const BlockCopy& c : b.block_copies) {
      std::copy_n(kv_.begin() + static_cast<std::ptrdiff_t>(c.src) * bs_, bs_,
                  kv_.begin() + static_cast<std::ptrdiff_t>(c.dst) * bs_);
    }
    const int32_t W = b.max_blocks_per_seq;
    hidden_.assign(static_cast<size_t>(b.num_tokens()), 0);
    EXPECT_EQ(b.cu_seqlens.size(), b.items.size() + 1);
    EXPECT_EQ(b.block_tables.size(), b.items.size() * static_cast<size_t>(W));
    for (size_t i = 0; i < b.items.size(); ++i) {
      const int32_t begin = b.cu_seqlens[i], end = b.cu_seqlens[i + 1];
      EXPECT_EQ(end - begin, b.items[i].num_new_tokens);
      EXPECT_EQ(b.context_lens[i], b.positions[static_cast<size_t>(end - 1)] + 1);
      uint64_t h = kKvStart;
      for (int32_t t = begin; t < end; ++t) {
        const int32_t pos = b.positions[static_cast<size_t>(t)];
        if (t == begin && pos > 0) {
          // Earlier context comes from the cache, found through the block table.
          const int32_t blk =
              b.block_tables[i * static_cast<size_t>(W) + static_cast<size_t>((pos - 1) / bs_)];
          if (blk < 0) {
            ADD_FAILURE() << "block table row " << i << " has no block for position " << pos - 1;
            return false;
          }
          h = kv_[static_cast<size_t>(blk) * bs_ + static_cast<size_t>((pos - 1) % bs_)];
          if (h == kEmptySlot) {
            ADD_FAILURE() << "position " << pos - 1 << " of item " << i
                          << " read before it was written";
            return false;
          }
        }
        h = kv_hash(h, b.input_ids[static_cast<size_t>(t)], pos);
        // The slot mapping must agree with the block table.
        const int32_t blk =
            b.block_tables[i * static_cast<size_t>(W) + static_cast<size_t>(pos / bs_)];
        EXPECT_EQ(b.slot_mapping[static_cast<size_t>(t)], blk * bs_ + pos % bs_);
        kv_[static_cast<size_t>(b.slot_mapping[static_cast<size_t>(t)])] = h;
        hidden_[static_cast<size_t>(t)] = h;
      }
    }
    tokens.resize(static_cast<size_t>(b.num_samples()));
    for (int32_t s = 0; s < b.num_samples(); ++s) {
      const Sequence& seq = *b.sample_seqs[static_cast<size_t>(s)];
      const uint64_t ctx =
          hidden_[static_cast<size_t>(b.sample_token_indices[static_cast<size_t>(s)])];
      tokens[static_cast<size_t>(s)] =
          fake_token(ctx, seq.rng_stream(), seq.num_output_tokens(), vocab_);
    }
    return true;
  }

 private:
  int32_t bs_, vocab_;
  std::vector<uint64_t> kv_;
  std::vector<uint64_t> hidden_;
};

}  // namespace verl::rollout::testing
