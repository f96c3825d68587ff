// Block pool, reference counts, forks and copy-on-write for the paged KV cache.
// Invariant between steps: seq.block_table has exactly blocks_for_tokens(num_computed_tokens)
// entries, so the only existing block a new write can touch is the (partial) last one.
#include "rollout/block_manager.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace verl::rollout {

BlockManager::BlockManager(int32_t num_blocks, int32_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  VERL_CHECK(num_blocks > 0, "BlockManager: num_blocks must be positive, got {}", num_blocks);
  VERL_CHECK(block_size > 0, "BlockManager: block_size must be positive, got {}", block_size);
  // Slots are int32 in the runner's slot mapping.
  VERL_CHECK(static_cast<int64_t>(num_blocks) * block_size <= std::numeric_limits<int32_t>::max(),
             "BlockManager: num_blocks {} x block_size {} slots overflow int32", num_blocks,
             block_size);
  ref_counts_.assign(static_cast<size_t>(num_blocks), 0);
  free_.reserve(static_cast<size_t>(num_blocks));
  // Pushed in reverse so block 0 is handed out first (easier to read in tests and dumps).
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int32_t BlockManager::ref_count(int32_t block) const {
  VERL_CHECK(block >= 0 && block < num_blocks_, "BlockManager: block id {} outside [0, {})", block,
             num_blocks_);
  return ref_counts_[static_cast<size_t>(block)];
}

int32_t BlockManager::num_blocks_needed(const Sequence& seq, int64_t num_new) const {
  const int64_t start = seq.num_computed_tokens;
  const int32_t have = static_cast<int32_t>(seq.block_table.size());
  int32_t need = blocks_for_tokens(start + num_new) - have;
  if (need < 0) need = 0;
  // Writing position `start` into an existing block that someone else also holds needs a copy.
  if (num_new > 0 && start % block_size_ != 0 && start / block_size_ < have &&
      ref_counts_[static_cast<size_t>(seq.block_table[static_cast<size_t>(start / block_size_)])] >
          1) {
    ++need;
  }
  return need;
}

int64_t BlockManager::max_new_tokens(const Sequence& seq, int32_t watermark) const {
  const int64_t start = seq.num_computed_tokens;
  const int64_t have = static_cast<int64_t>(seq.block_table.size());
  int64_t spare = static_cast<int64_t>(num_free_blocks()) - watermark;
  const int64_t room_in_last = have * block_size_ - start;  // unused slots of the last block
  if (room_in_last > 0 && ref_counts_[static_cast<size_t>(seq.block_table.back())] > 1) {
    if (spare < 1) return 0;  // the copy-on-write block itself does not fit
    --spare;
  }
  return room_in_last + std::max<int64_t>(spare, 0) * block_size_;
}

int32_t BlockManager::take_block() {
  VERL_CHECK(!free_.empty(), "BlockManager: out of KV blocks (pool of {})", num_blocks_);
  int32_t b = free_.back();
  free_.pop_back();
  ref_counts_[static_cast<size_t>(b)] = 1;
  return b;
}

void BlockManager::release_block(int32_t block) {
  int32_t& rc = ref_counts_[static_cast<size_t>(block)];
  VERL_CHECK(rc > 0, "BlockManager: block {} released with ref count {} (double free)", block, rc);
  if (--rc == 0) free_.push_back(block);
}

void BlockManager::allocate(Sequence& seq, int64_t num_new, std::vector<BlockCopy>& copies) {
  const int64_t start = seq.num_computed_tokens;
  VERL_CHECK(
      static_cast<int32_t>(seq.block_table.size()) == blocks_for_tokens(start),
      "BlockManager: sequence {} has {} blocks for {} computed tokens (expected {}); was the "
      "last scheduled step not postprocessed?",
      seq.id(), seq.block_table.size(), start, blocks_for_tokens(start));
  VERL_CHECK(num_blocks_needed(seq, num_new) <= num_free_blocks(),
             "BlockManager: sequence {} needs {} blocks for {} new tokens, {} free", seq.id(),
             num_blocks_needed(seq, num_new), num_new, num_free_blocks());
  if (seq.block_table.empty()) {
    // One reservation for the whole generation keeps decode appends allocation-free.
    seq.block_table.reserve(
        static_cast<size_t>(blocks_for_tokens(seq.num_prompt_tokens() + seq.params().max_tokens)));
  }
  if (num_new > 0 && start % block_size_ != 0) {
    int32_t& last = seq.block_table[static_cast<size_t>(start / block_size_)];
    if (ref_counts_[static_cast<size_t>(last)] > 1) {
      // Copy-on-write: the others keep the original, this sequence continues in a private copy.
      int32_t dst = take_block();
      copies.push_back({last, dst});
      release_block(last);
      last = dst;
    }
  }
  const int32_t target = blocks_for_tokens(start + num_new);
  while (static_cast<int32_t>(seq.block_table.size()) < target)
    seq.block_table.push_back(take_block());
}

void BlockManager::fork(const Sequence& parent, Sequence& child, int64_t num_shared_tokens) {
  VERL_CHECK(child.block_table.empty() && child.num_computed_tokens == 0,
             "BlockManager: fork into sequence {} that already holds {} blocks", child.id(),
             child.block_table.size());
  VERL_CHECK(
      static_cast<int32_t>(parent.block_table.size()) == blocks_for_tokens(num_shared_tokens),
      "BlockManager: fork of sequence {} sharing {} tokens, but it holds {} blocks", parent.id(),
      num_shared_tokens, parent.block_table.size());
  child.block_table.reserve(static_cast<size_t>(
      blocks_for_tokens(child.num_prompt_tokens() + child.params().max_tokens)));
  for (int32_t b : parent.block_table) {
    ++ref_counts_[static_cast<size_t>(b)];
    child.block_table.push_back(b);
  }
  child.num_computed_tokens = num_shared_tokens;
}

void BlockManager::free(Sequence& seq) {
  for (int32_t b : seq.block_table) release_block(b);
  seq.block_table.clear();
  seq.num_computed_tokens = 0;
}

void BlockManager::slot_mapping(const Sequence& seq, int64_t start, int64_t n, int32_t* out) const {
  VERL_CHECK(
      start >= 0 && blocks_for_tokens(start + n) <= static_cast<int32_t>(seq.block_table.size()),
      "BlockManager: slots [{}, {}) of sequence {} beyond its {} blocks", start, start + n,
      seq.id(), seq.block_table.size());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = start + i;
    out[i] = seq.block_table[static_cast<size_t>(p / block_size_)] * block_size_ +
             static_cast<int32_t>(p % block_size_);
  }
}

}  // namespace verl::rollout
