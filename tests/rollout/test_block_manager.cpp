// Block manager: reference counts, forks, copy-on-write and the free list, on hand-built cases
// and on a randomised workload whose KV contents are simulated slot by slot, so a missing or
// wrong copy, a leaked block or a block freed twice shows up as a wrong number.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "core/error.h"
#include "core/rng.h"
#include "rollout/block_manager.h"

namespace verl::rollout {
namespace {

std::unique_ptr<Sequence> make_seq(int64_t id, int32_t prompt_len, int32_t max_tokens = 64) {
  SamplingParams p;
  p.max_tokens = max_tokens;
  return std::make_unique<Sequence>(id, std::vector<int32_t>(static_cast<size_t>(prompt_len), 1),
                                    p);
}

// What the scheduler's postprocess does after a step: the KV of the allocated tokens now exists.
void commit(Sequence& s, int64_t n) {
  s.num_computed_tokens += n;
}

TEST(BlockManager, AllocateAppendFreeAccounting) {
  BlockManager bm(8, 4);
  auto s = make_seq(1, 10);
  std::vector<BlockCopy> copies;
  EXPECT_EQ(bm.num_blocks_needed(*s, 10), 3);
  bm.allocate(*s, 10, copies);
  commit(*s, 10);
  ASSERT_EQ(s->block_table, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(bm.num_free_blocks(), 5);
  int32_t slots[3];
  bm.slot_mapping(*s, 7, 3, slots);  // positions 7, 8, 9 -> block 1 offset 3, block 2 offsets 0, 1
  EXPECT_EQ(slots[0], 1 * 4 + 3);
  EXPECT_EQ(slots[1], 2 * 4 + 0);
  EXPECT_EQ(slots[2], 2 * 4 + 1);
  // Positions 10 and 11 fit in block 2; position 12 needs a fourth block.
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(bm.num_blocks_needed(*s, 1), 0);
    bm.append_slot(*s, copies);
    commit(*s, 1);
  }
  EXPECT_EQ(bm.num_free_blocks(), 5);
  EXPECT_EQ(bm.num_blocks_needed(*s, 1), 1);
  bm.append_slot(*s, copies);
  commit(*s, 1);
  EXPECT_EQ(s->block_table.size(), 4u);
  EXPECT_EQ(bm.num_free_blocks(), 4);
  EXPECT_TRUE(copies.empty());
  bm.free(*s);
  EXPECT_EQ(bm.num_free_blocks(), 8);
  for (int b = 0; b < 8; ++b) EXPECT_EQ(bm.ref_count(b), 0);
}

TEST(BlockManager, ForkSharesBlocksAndCopyOnWriteSplitsThePartialOne) {
  BlockManager bm(10, 4);
  auto parent = make_seq(1, 10);  // 2 full blocks + 1 block holding 2 tokens
  auto c1 = make_seq(2, 10), c2 = make_seq(3, 10);
  std::vector<BlockCopy> copies;
  bm.allocate(*parent, 10, copies);
  commit(*parent, 10);
  bm.fork(*parent, *c1, 10);
  bm.fork(*parent, *c2, 10);
  EXPECT_EQ(bm.num_free_blocks(), 7);  // forks take no blocks
  for (int32_t b : parent->block_table) EXPECT_EQ(bm.ref_count(b), 3);
  EXPECT_EQ(c1->num_computed_tokens, 10);
  const int32_t shared_last = parent->block_table[2];

  // c1 writes position 10 into the shared partial block: copy-on-write.
  EXPECT_EQ(bm.num_blocks_needed(*c1, 1), 1);
  bm.append_slot(*c1, copies);
  commit(*c1, 1);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, shared_last);
  EXPECT_NE(copies[0].dst, shared_last);
  EXPECT_EQ(c1->block_table[2], copies[0].dst);
  EXPECT_EQ(bm.ref_count(shared_last), 2);
  EXPECT_EQ(bm.ref_count(copies[0].dst), 1);
  EXPECT_EQ(bm.ref_count(parent->block_table[0]), 3);  // full blocks stay shared
  EXPECT_EQ(bm.num_free_blocks(), 6);

  // c2 copies too; then parent is the last holder and writes in place.
  bm.append_slot(*c2, copies);
  commit(*c2, 1);
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[1].src, shared_last);
  EXPECT_NE(copies[1].dst, copies[0].dst);
  EXPECT_EQ(bm.ref_count(shared_last), 1);
  EXPECT_EQ(bm.num_blocks_needed(*parent, 1), 0);
  bm.append_slot(*parent, copies);
  commit(*parent, 1);
  EXPECT_EQ(copies.size(), 2u);
  EXPECT_EQ(parent->block_table[2], shared_last);

  // Shared blocks go back to the pool only with their last reference.
  bm.free(*parent);
  EXPECT_EQ(bm.num_free_blocks(), 6);  // shared_last freed; blocks 0, 1 still held by c1, c2
  bm.free(*c1);
  EXPECT_EQ(bm.num_free_blocks(), 7);
  EXPECT_EQ(bm.ref_count(c2->block_table[0]), 1);
  bm.free(*c2);
  EXPECT_EQ(bm.num_free_blocks(), 10);
}

TEST(BlockManager, ForkOnBlockBoundaryNeedsNoCopy) {
  BlockManager bm(6, 4);
  auto parent = make_seq(1, 8), child = make_seq(2, 8);
  std::vector<BlockCopy> copies;
  bm.allocate(*parent, 8, copies);
  commit(*parent, 8);
  bm.fork(*parent, *child, 8);
  EXPECT_EQ(bm.num_blocks_needed(*child, 1), 1);  // a fresh block, not a copy
  bm.append_slot(*child, copies);
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(bm.ref_count(child->block_table[2]), 1);
  EXPECT_EQ(bm.ref_count(child->block_table[0]), 2);
}

TEST(BlockManager, MaxNewTokensCountsRoomAndCopy) {
  BlockManager bm(4, 4);
  auto a = make_seq(1, 6), b = make_seq(2, 6);
  std::vector<BlockCopy> copies;
  bm.allocate(*a, 6, copies);
  commit(*a, 6);
  EXPECT_EQ(bm.max_new_tokens(*a), 2 + 2 * 4);  // 2 slots left in block 1, plus 2 free blocks
  EXPECT_EQ(bm.max_new_tokens(*a, 1), 2 + 4);
  bm.fork(*a, *b, 6);
  EXPECT_EQ(bm.max_new_tokens(*b), 2 + 4);  // one free block goes to the copy
  EXPECT_TRUE(bm.can_allocate(*b, 6));
  EXPECT_FALSE(bm.can_allocate(*b, 7));
}

TEST(BlockManager, ExhaustedPoolThrowsAndFreedBlocksAreDistinct) {
  BlockManager bm(5, 2);
  auto a = make_seq(1, 10), b = make_seq(2, 1);
  std::vector<BlockCopy> copies;
  bm.allocate(*a, 10, copies);
  EXPECT_FALSE(bm.can_allocate(*b, 1));
  EXPECT_THROW(bm.allocate(*b, 1, copies), Error);
  std::set<int32_t> ids(a->block_table.begin(), a->block_table.end());
  EXPECT_EQ(ids.size(), 5u);
}

// Randomised: sequences are created, forked, grown (with COW), and freed at random. Every slot
// write is mirrored in a simulated KV array; after each operation every live sequence must read
// back its own values for all computed positions, and ref counts must equal the number of live
// tables holding each block.
TEST(BlockManager, RandomisedWorkloadNeverLeaksOrCorrupts) {
  constexpr int32_t kBlocks = 48, kBs = 4;
  BlockManager bm(kBlocks, kBs);
  std::vector<uint64_t> kv(static_cast<size_t>(kBlocks * kBs), 0);
  struct Live {
    std::unique_ptr<Sequence> seq;
    std::vector<uint64_t> values;  // expected KV value per computed position
  };
  std::vector<Live> live;
  Rng rng(1234, 0);
  int64_t next_id = 0, copies_seen = 0, forks = 0, frees = 0;
  std::vector<BlockCopy> copies;

  auto grow = [&](Live& l, int64_t n) {
    copies.clear();
    const int64_t start = l.seq->num_computed_tokens;
    bm.allocate(*l.seq, n, copies);
    for (const BlockCopy& c : copies) {
      ASSERT_NE(c.src, c.dst);
      ASSERT_EQ(bm.ref_count(c.dst), 1);
      ASSERT_GE(bm.ref_count(c.src), 1);
      std::copy_n(kv.begin() + c.src * kBs, kBs, kv.begin() + c.dst * kBs);
    }
    copies_seen += static_cast<int64_t>(copies.size());
    std::vector<int32_t> slots(static_cast<size_t>(n));
    bm.slot_mapping(*l.seq, start, n, slots.data());
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t v =
          (static_cast<uint64_t>(l.seq->id()) << 32) | static_cast<uint64_t>(start + i);
      kv[static_cast<size_t>(slots[static_cast<size_t>(i)])] = v;
      l.values.push_back(v);
    }
    commit(*l.seq, n);
  };

  for (int op = 0; op < 4000; ++op) {
    const uint64_t kind = rng.below(10);
    if (kind < 2 || live.empty()) {  // new sequence, prefilled in one go
      const int32_t len = 1 + static_cast<int32_t>(rng.below(20));
      Live l{make_seq(next_id++, len, 200), {}};
      if (bm.can_allocate(*l.seq, len)) {
        grow(l, len);
        live.push_back(std::move(l));
      }
    } else if (kind < 4) {  // fork a random live sequence
      Live& parent = live[rng.below(live.size())];
      Live child{make_seq(next_id++, 1, 200), parent.values};
      bm.fork(*parent.seq, *child.seq, parent.seq->num_computed_tokens);
      ++forks;
      live.push_back(std::move(child));
    } else if (kind < 8) {  // decode or a chunk
      Live& l = live[rng.below(live.size())];
      const int64_t n = rng.below(3) == 0 ? 1 + static_cast<int64_t>(rng.below(6)) : 1;
      if (bm.can_allocate(*l.seq, n)) grow(l, n);
    } else {  // finish or preempt
      const size_t i = rng.below(live.size());
      bm.free(*live[i].seq);
      ++frees;
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    // Accounting model.
    std::map<int32_t, int32_t> refs;
    for (const Live& l : live) {
      for (int32_t b : l.seq->block_table) ++refs[b];
    }
    ASSERT_EQ(bm.num_free_blocks(), kBlocks - static_cast<int32_t>(refs.size())) << "op " << op;
    for (int32_t b = 0; b < kBlocks; ++b) {
      const auto it = refs.find(b);
      ASSERT_EQ(bm.ref_count(b), it == refs.end() ? 0 : it->second)
          << "block " << b << " op " << op;
    }
    // KV contents: every computed position reads back what its sequence (or its ancestor) wrote.
    for (const Live& l : live) {
      std::vector<int32_t> slots(l.values.size());
      bm.slot_mapping(*l.seq, 0, static_cast<int64_t>(l.values.size()), slots.data());
      for (size_t p = 0; p < slots.size(); ++p) {
        ASSERT_EQ(kv[static_cast<size_t>(slots[p])], l.values[p])
            << "seq " << l.seq->id() << " pos " << p;
      }
    }
  }
  // The workload must actually have exercised sharing and copies.
  EXPECT_GT(forks, 100);
  EXPECT_GT(copies_seen, 50);
  EXPECT_GT(frees, 100);
  for (Live& l : live) bm.free(*l.seq);
  EXPECT_EQ(bm.num_free_blocks(), kBlocks);
  // Every block is on the free list exactly once: taking the whole pool yields distinct ids.
  auto all = make_seq(next_id, kBlocks * kBs);
  bm.allocate(*all, kBlocks * kBs, copies);
  std::set<int32_t> ids(all->block_table.begin(), all->block_table.end());
  EXPECT_EQ(ids.size(), static_cast<size_t>(kBlocks));
}

}  // namespace
}  // namespace verl::rollout
