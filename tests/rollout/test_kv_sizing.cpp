// The KV pool's one sizing rule (rollout/kv_sizing.h): the blocks a generate() needs, capped by
// a byte budget, on either device.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "rollout/engine.h"
#include "rollout/kv_sizing.h"

namespace verl::rollout {
namespace {

TEST(KvSizing, BlockBytesCountKAndVOfEveryLayer) {
  model::ModelConfig c;
  c.num_hidden_layers = 3;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  EXPECT_EQ(kv_block_bytes(c, 16, 4), 2 * 3 * 16 * 16 * 4);
  EXPECT_EQ(kv_block_bytes(c, 16, 2), 2 * 3 * 16 * 16 * 2);
}

TEST(KvSizing, BlocksToHoldEverySampleAtOnce) {
  std::vector<Request> reqs(2);
  reqs[0].prompt.assign(10, 1);
  reqs[0].params.max_tokens = 7;
  reqs[0].n = 3;  // 3 x 17 tokens
  reqs[1].prompt.assign(33, 1);
  reqs[1].params.max_tokens = 15;
  reqs[1].n = 1;  // 48 tokens
  // ceil(99 / 16) = 7 blocks of tokens, one per sample (4) for copy-on-write, 16 in reserve.
  EXPECT_EQ(kv_blocks_to_hold(reqs, 16), 7 + 4 + 16);
}

TEST(KvSizing, PoolIsTheWantedBlocksCappedByTheBudget) {
  EXPECT_EQ(kv_pool_blocks(100, 0, 64, 16), 100);           // no budget
  EXPECT_EQ(kv_pool_blocks(100, 64 * 40, 64, 16), 40);      // the budget caps it
  EXPECT_EQ(kv_pool_blocks(10, 64 * 40 + 63, 64, 16), 10);  // the budget is enough
  EXPECT_EQ(kv_pool_blocks(0, 64 * 40 + 63, 64, 16), 40);   // as many as the budget holds
  try {
    kv_pool_blocks(10, 63, 64, 16);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds no block"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kv_pool_blocks(0, 0, 64, 16), Error);
}

}  // namespace
}  // namespace verl::rollout
