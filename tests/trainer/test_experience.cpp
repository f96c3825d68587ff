// The one conversion between packed micro-batches and the trainer's [B, L] matrices
// (trainer/experience.h): where a response's outputs sit, zeros past each response's end, and
// gather/scatter as each other's inverse on the response entries.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../common/test_util.h"
#include "core/error.h"
#include "trainer/experience.h"

namespace verl::trainer {
namespace {

// Three rows: prompts of 3, 1 and 4 tokens, responses of 2, 4 and 0 tokens (L = 4).
struct Fixture {
  std::vector<data::Sample> samples{3};
  Experience exp;
  Fixture() {
    samples[0].prompt_ids = {10, 11, 12};
    samples[1].prompt_ids = {20};
    samples[2].prompt_ids = {30, 31, 32, 33};
    exp.B = 3;
    exp.L = 4;
    exp.sample = {&samples[0], &samples[1], &samples[2]};
    exp.response = {{13, 14}, {21, 22, 23, 24}, {}};
  }
};

TEST(PackedResponses, PacksRowsAndFindsEachResponsesOutputs) {
  Fixture f;
  const PackedResponses mb(f.exp, {1, 0});  // row 1 first
  const model::PackedBatch& b = mb.batch();
  ASSERT_EQ(b.num_seqs(), 2);
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{20, 21, 22, 23, 24, 10, 11, 12, 13, 14}));
  // The output at position t scores token t + 1: row 1's response outputs are packed 0..3, row
  // 0's are 7..8 (after its 3 prompt tokens at 5..7).
  std::vector<float> packed(10);
  for (int t = 0; t < 10; ++t) packed[t] = static_cast<float>(100 + t);
  EXPECT_EQ(mb.gather(packed), (std::vector<float>{100, 101, 102, 103, 107, 108, 0, 0}));
  std::vector<float> matrix(12, -1.0f);
  mb.gather_into(packed, matrix);
  EXPECT_EQ(matrix, (std::vector<float>{107, 108, -1, -1, 100, 101, 102, 103, -1, -1, -1, -1}));
}

TEST(PackedResponses, ScatterPutsGradientsWhereGatherReadsThem) {
  Fixture f;
  const PackedResponses mb(f.exp, {0, 2, 1});
  const std::vector<float> per_row = {1, 2, 9, 9, 5, 5, 5, 5, 3, 4, 6, 7};  // [3, 4]
  const std::vector<float> packed = mb.scatter(per_row);
  ASSERT_EQ(static_cast<int64_t>(packed.size()), mb.batch().num_tokens());
  // Past a response's end (row 0 after 2 tokens, row 2 entirely) nothing is written.
  EXPECT_EQ(mb.gather(packed), (std::vector<float>{1, 2, 0, 0, 0, 0, 0, 0, 3, 4, 6, 7}));
  double sum = 0;
  for (float x : packed) sum += x;
  EXPECT_EQ(sum, 1 + 2 + 3 + 4 + 6 + 7);
  EXPECT_TRUE(mb.scatter({}).empty());
}

TEST(PackedResponses, WrongSizesNameTheCall) {
  Fixture f;
  const PackedResponses mb(f.exp, {0});
  const std::string msg = test::expected_error_of([&] { mb.scatter(std::vector<float>(3)); });
  EXPECT_NE(msg.find("PackedResponses::scatter"), std::string::npos) << msg;
  EXPECT_THROW(mb.gather(std::vector<float>(2)), Error);
}

}  // namespace
}  // namespace verl::trainer
