// Paged KV-cache bookkeeping (PagedAttention, Kwon et al. SOSP 2023): a pool of fixed-size blocks
// with reference counts, a free list, per-sequence block tables, forks that share blocks between
// the samples of one prompt, and copy-on-write when a sequence writes into a shared block.
// Pure CPU accounting: the KV memory itself belongs to the model runner.
#pragma once

#include <cstdint>
#include <vector>

#include "rollout/sequence.h"

namespace verl::rollout {

// The runner copies block `src` to block `dst` (all block_size slots, every layer, K and V)
// before the step's forward writes any KV. Apply the list in order.
struct BlockCopy {
  int32_t src;
  int32_t dst;
};

class BlockManager {
 public:
  BlockManager(int32_t num_blocks, int32_t block_size);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  int32_t num_free_blocks() const { return static_cast<int32_t>(free_.size()); }
  int32_t ref_count(int32_t block) const;
  int32_t blocks_for_tokens(int64_t num_tokens) const {
    return static_cast<int32_t>((num_tokens + block_size_ - 1) / block_size_);
  }

  // Blocks `seq` must take from the pool to write KV for positions
  // [num_computed_tokens, num_computed_tokens + num_new): fresh blocks past the end of its table,
  // plus one when the block holding position num_computed_tokens is shared (copy-on-write).
  int32_t num_blocks_needed(const Sequence& seq, int64_t num_new) const;
  // True when that many blocks are free with `watermark` blocks to spare.
  bool can_allocate(const Sequence& seq, int64_t num_new, int32_t watermark = 0) const {
    return num_blocks_needed(seq, num_new) + watermark <= num_free_blocks();
  }
  // Most new tokens `seq` could write now, keeping `watermark` blocks free (0 when even one
  // token does not fit). Lets the scheduler shrink a prefill chunk to the memory left.
  int64_t max_new_tokens(const Sequence& seq, int32_t watermark = 0) const;
  // Extends seq's block table to cover positions < num_computed_tokens + num_new. A write into a
  // shared, partially filled last block first moves seq to a private copy: the copy is appended
  // to `copies`. Throws when the pool runs out (callers check can_allocate first).
  void allocate(Sequence& seq, int64_t num_new, std::vector<BlockCopy>& copies);
  // Decode: room for one more token (a new block when the last one is full, or a COW).
  void append_slot(Sequence& seq, std::vector<BlockCopy>& copies) { allocate(seq, 1, copies); }
  // child shares every block of parent (full and partial), each ref count + 1; child's KV
  // covers parent's first `num_shared_tokens` positions (child's table must be empty).
  void fork(const Sequence& parent, Sequence& child, int64_t num_shared_tokens);
  // Drops seq's references; a block returns to the free list when its last reference goes.
  void free(Sequence& seq);

  // Slot (block * block_size + offset) of each of seq's positions [start, start + n).
  void slot_mapping(const Sequence& seq, int64_t start, int64_t n, int32_t* out) const;

 private:
  int32_t take_block();
  void release_block(int32_t block);

  int32_t num_blocks_, block_size_;
  std::vector<int32_t> ref_counts_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first
};

}  // namespace verl::rollout
