// data.dynamic_batch (data/dynamic_batch.h): the token budget against a fake memory reading
// (shrinks above the threshold, grows back below it, within floor and ceiling), the length
// filter, the packing per communication_sensitivity, fillers for the ranks' common count, and
// token utilisation on hand cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/error.h"
#include "data/dynamic_batch.h"
#include "data/seqlen_balancing.h"

namespace verl::data {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

DynamicBatchConfig make_config(int64_t base, int64_t max_len, int64_t min_len, double threshold_gb,
                               double s) {
  DynamicBatchConfig c;
  c.enable = true;
  c.base_batch_size = base;
  c.max_sequence_length = max_len;
  c.min_sequence_length = min_len;
  c.memory_threshold_gb = threshold_gb;
  c.communication_sensitivity = s;
  return c;
}

std::vector<int64_t> sorted_counts(const DynamicPack& p) {
  std::vector<int64_t> c = p.token_counts;
  std::sort(c.begin(), c.end());
  return c;
}

TEST(DynamicBatch, BudgetShrinksAboveThresholdAndGrowsBackBelow) {
  // planned = min(max_sequence_length 100, run's longest 80) = 80; ceiling = 4 x 80 = 320 (cap
  // 1000 does not bind); floor = one planned sequence = 80.
  double reading = 0;
  DynamicBatchSampler s(make_config(4, 100, 0, 1.0, 1.0), 80, 1000, [&] { return reading; });
  EXPECT_EQ(s.planned_length(), 80);
  EXPECT_EQ(s.ceiling(), 320);
  EXPECT_EQ(s.floor(), 80);
  EXPECT_EQ(s.budget(), 320);
  reading = 2 * kGiB;  // above 1 GiB: halves, down to the floor and no further
  EXPECT_EQ(s.adapt(), 160);
  EXPECT_EQ(s.adapt(), 80);
  EXPECT_EQ(s.adapt(), 80);
  reading = 1 * kGiB;  // at the threshold is not above it: grows by a quarter of the ceiling
  EXPECT_EQ(s.adapt(), 160);
  reading = 0.5 * kGiB;
  EXPECT_EQ(s.adapt(), 240);
  EXPECT_EQ(s.adapt(), 320);
  EXPECT_EQ(s.adapt(), 320);  // the ceiling holds
  const DynamicBatchStats st = s.take_stats();
  EXPECT_EQ(st.shrinks, 2);  // steps that changed the budget
  EXPECT_EQ(st.grows, 3);
  EXPECT_EQ(s.take_stats().shrinks, 0);  // taken: reset
}

TEST(DynamicBatch, CapBoundsCeilingAndFloor) {
  // base x planned = 64 x 4096 is far above the cap: the cap is the ceiling.
  DynamicBatchSampler big(make_config(64, 4096, 0, 70, 1), 5000, 16384, nullptr);
  EXPECT_EQ(big.planned_length(), 4096);
  EXPECT_EQ(big.ceiling(), 16384);
  EXPECT_EQ(big.floor(), 4096);
  // A cap under one planned sequence: floor and ceiling are the cap.
  DynamicBatchSampler tight(make_config(8, 4096, 0, 70, 1), 4096, 1000, [] { return 1e15; });
  EXPECT_EQ(tight.floor(), 1000);
  EXPECT_EQ(tight.ceiling(), 1000);
  EXPECT_EQ(tight.adapt(), 1000);
  // No reading: no adaptation.
  EXPECT_EQ(big.adapt(), 16384);
  EXPECT_EQ(big.take_stats().shrinks, 0);
}

TEST(DynamicBatch, LengthFilterKeepsTheClosedRange) {
  DynamicBatchSampler s(make_config(4, 50, 10, 70, 1), 100, 1000, nullptr);
  EXPECT_FALSE(s.keeps(9));
  EXPECT_TRUE(s.keeps(10));
  EXPECT_TRUE(s.keeps(50));
  EXPECT_FALSE(s.keeps(51));
  DynamicBatchSampler no_min(make_config(4, 50, 0, 70, 1), 100, 1000, nullptr);
  EXPECT_TRUE(no_min.keeps(1));
  EXPECT_EQ(no_min.keeps(std::vector<int64_t>{1, 50, 51}), (std::vector<bool>{true, true, false}));
}

TEST(DynamicBatch, ConfigRefusesMinAboveMaxNamingBothKeys) {
  config::Config ok = config::load_config("", {"data.dynamic_batch.enable=true"});
  const DynamicBatchConfig c = DynamicBatchConfig::from_config(ok);
  EXPECT_TRUE(c.enable);
  EXPECT_EQ(c.base_batch_size, 64);
  EXPECT_DOUBLE_EQ(c.communication_sensitivity, 0.8);
  config::Config bad = config::load_config(
      "", {"data.dynamic_batch.enable=true", "data.dynamic_batch.min_sequence_length=600",
           "data.dynamic_batch.max_sequence_length=512"});
  try {
    (void)DynamicBatchConfig::from_config(bad);
    FAIL() << "min_sequence_length > max_sequence_length was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("data.dynamic_batch.min_sequence_length (600)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("data.dynamic_batch.max_sequence_length (512)"), std::string::npos) << msg;
  }
  // Out-of-range values are refused when the config loads, by the schema's @range.
  EXPECT_THROW(config::load_config("", {"data.dynamic_batch.communication_sensitivity=1.5"}),
               Error);
}

TEST(DynamicBatch, UtilisationOfTokenBudgetBeatsFixedCountOnMixedLengths) {
  // Mixed lengths, 380 tokens. Fixed micro-batches of base_batch_size = 2 sequences, each sized
  // for 2 x 100 planned tokens: 4 micro-batches, 380 / 800. The budget of 200 tokens packs them
  // into ceil(380 / 200) = 2 micro-batches: 380 / 400.
  const std::vector<int64_t> lens = {100, 20, 30, 100, 40, 10, 60, 20};
  const std::vector<bool> keep(lens.size(), true);
  DynamicBatchSampler s(make_config(2, 100, 0, 70, 1), 100, 8192, nullptr);
  ASSERT_EQ(s.budget(), 200);
  const DynamicPack p = s.pack(lens, 8192, nullptr);
  ASSERT_EQ(p.micro_batches.size(), 2u);
  for (int64_t c : p.token_counts) EXPECT_LE(c, 200);
  EXPECT_EQ(p.tokens, 380);
  EXPECT_DOUBLE_EQ(p.token_utilisation(), 0.95);
  EXPECT_DOUBLE_EQ(fixed_count_token_utilisation(lens, keep, 2, 100), 0.475);
  const DynamicBatchStats st = s.take_stats();
  EXPECT_DOUBLE_EQ(st.tokens / st.capacity, 0.95);
  EXPECT_DOUBLE_EQ(st.tokens / st.fixed_capacity, 0.475);
  // Dropping the two 100-token samples (max_sequence_length 99) leaves 180 tokens in one
  // micro-batch of 200 (the planned length is 99 now, the budget 198).
  DynamicBatchSampler f(make_config(2, 99, 0, 70, 1), 100, 8192, nullptr);
  const DynamicPack q = f.pack(lens, 8192, nullptr);
  EXPECT_EQ(q.dropped, 2);
  EXPECT_EQ(q.budget, 198);
  ASSERT_EQ(q.micro_batches.size(), 1u);
  EXPECT_EQ(q.micro_batches[0], (std::vector<int64_t>{1, 2, 4, 5, 6, 7}));
  EXPECT_DOUBLE_EQ(q.token_utilisation(), 180.0 / 198.0);
}

TEST(DynamicBatch, SensitivityTradesBalanceForFullMicroBatches) {
  // 16 sequences of 50 tokens, budget 250: K = ceil(800 / 250) = 4 micro-batches at every s.
  const std::vector<int64_t> lens(16, 50);
  const std::vector<bool> keep(16, true);
  // s = 1: balanced, 200 each (rearrange_micro_batches).
  const DynamicPack bal = pack_micro_batches(lens, keep, 250, 250, 1.0, nullptr);
  EXPECT_EQ(sorted_counts(bal), (std::vector<int64_t>{200, 200, 200, 200}));
  EXPECT_DOUBLE_EQ(bal.spread(), 0.0);
  // s = 0.5: floor(0.5 x 4) = 2 full micro-batches, the other 300 tokens split evenly over 2.
  const DynamicPack half = pack_micro_batches(lens, keep, 250, 250, 0.5, nullptr);
  EXPECT_EQ(sorted_counts(half), (std::vector<int64_t>{150, 150, 250, 250}));
  EXPECT_DOUBLE_EQ(half.spread(), 0.4);
  // s = 0: all four filled in turn: 250, 250, 250 and the 50 left.
  const DynamicPack full = pack_micro_batches(lens, keep, 250, 250, 0.0, nullptr);
  EXPECT_EQ(sorted_counts(full), (std::vector<int64_t>{50, 250, 250, 250}));
  EXPECT_DOUBLE_EQ(full.spread(), 0.8);
  // The count, hence the utilisation, is the same.
  for (const DynamicPack* p : {&bal, &half, &full}) {
    EXPECT_EQ(p->micro_batches.size(), 4u);
    EXPECT_DOUBLE_EQ(p->token_utilisation(), 0.8);
    std::vector<int64_t> all;
    for (const auto& mb : p->micro_batches) all.insert(all.end(), mb.begin(), mb.end());
    std::sort(all.begin(), all.end());
    for (int64_t i = 0; i < 16; ++i) EXPECT_EQ(all[static_cast<size_t>(i)], i);
  }
}

TEST(DynamicBatch, SensitivityOneIsRearrangeMicroBatches) {
  const std::vector<int64_t> lens = {37, 5, 120, 64, 64, 9, 80, 33, 71, 2, 110, 48, 15, 90};
  const std::vector<bool> keep(lens.size(), true);
  for (int64_t budget : {120, 200, 333, 1000}) {
    MicroBatchOptions mo;
    mo.max_token_len = budget;
    mo.dp_max = [](int64_t k) { return k + 1; };  // another rank needs one more
    const MicroBatches want = rearrange_micro_batches(lens, mo);
    const DynamicPack got = pack_micro_batches(lens, keep, budget, budget, 1.0, mo.dp_max);
    EXPECT_EQ(got.micro_batches, want.micro_batches) << "budget " << budget;
    EXPECT_EQ(got.token_counts, want.token_counts) << "budget " << budget;
    EXPECT_EQ(got.fillers, 0);
  }
}

TEST(DynamicBatch, FillersMakeUpTheAgreedCountWithOneDpMaxCall) {
  // Three kept rows, two dropped; the other ranks need 5 micro-batches: each kept row alone, then
  // the dropped rows shortest first.
  const std::vector<int64_t> lens = {10, 20, 30, 200, 5};
  const std::vector<bool> keep = {true, true, true, false, false};
  int calls = 0;
  DpMax five = [&](int64_t k) {
    ++calls;
    return std::max<int64_t>(k, 5);
  };
  const DynamicPack p = pack_micro_batches(lens, keep, 100, 300, 0.8, five);
  EXPECT_EQ(calls, 1);
  ASSERT_EQ(p.micro_batches.size(), 5u);
  EXPECT_EQ(p.fillers, 2);
  EXPECT_EQ(p.tokens, 60);
  EXPECT_EQ(p.micro_batches[0], (std::vector<int64_t>{3}));  // heaviest first: the 200-token filler
  EXPECT_DOUBLE_EQ(p.token_utilisation(), 60.0 / 500.0);
  // Nothing kept here: still one dp_max call, and as many fillers as agreed.
  calls = 0;
  const std::vector<bool> none(lens.size(), false);
  DpMax two = [&](int64_t k) {
    ++calls;
    return std::max<int64_t>(k, 2);
  };
  const DynamicPack q = pack_micro_batches(lens, none, 100, 300, 1.0, two);
  EXPECT_EQ(calls, 1);
  ASSERT_EQ(q.micro_batches.size(), 2u);
  EXPECT_EQ(q.fillers, 2);
  EXPECT_EQ(sorted_counts(q), (std::vector<int64_t>{5, 10}));
  // Nothing kept on any rank (one rank): one filler, so the update still runs one micro-batch.
  const DynamicPack r = pack_micro_batches(lens, none, 100, 300, 1.0, nullptr);
  ASSERT_EQ(r.micro_batches.size(), 1u);
  EXPECT_EQ(r.micro_batches[0], (std::vector<int64_t>{4}));
  EXPECT_DOUBLE_EQ(r.token_utilisation(), 0.0);
  // A filler over the pass's token key cannot run: an Error naming the keys.
  DpMax many = [](int64_t) { return int64_t{5}; };
  EXPECT_THROW(pack_micro_batches(lens, keep, 100, 150, 1.0, many), Error);
}

TEST(DynamicBatch, KeptSequenceOverBudgetIsAnError) {
  const std::vector<int64_t> lens = {10, 300};
  try {
    (void)pack_micro_batches(lens, {true, true}, 200, 400, 1.0, nullptr);
    FAIL() << "a 300-token sequence was packed under a 200-token budget";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.dynamic_batch.max_sequence_length"),
              std::string::npos)
        << e.what();
  }
}

TEST(DynamicBatch, PackReadsMemoryOncePerPacking) {
  int reads = 0;
  DynamicBatchSampler s(make_config(4, 100, 0, 1.0, 1.0), 50, 1000, [&] {
    ++reads;
    return 2 * kGiB;
  });
  ASSERT_EQ(s.budget(), 200);
  const std::vector<int64_t> lens(8, 25);  // 200 tokens
  const DynamicPack a = s.pack(lens, 1000, nullptr);
  EXPECT_EQ(a.budget, 100);  // halved before packing: two micro-batches
  EXPECT_EQ(a.micro_batches.size(), 2u);
  const DynamicPack b = s.pack(lens, 1000, nullptr);
  EXPECT_EQ(b.budget, 50);  // the floor
  EXPECT_EQ(b.micro_batches.size(), 4u);
  const DynamicPack c = s.pack(lens, 40, nullptr);  // a pass whose token key is lower still
  EXPECT_EQ(c.budget, 40);
  EXPECT_EQ(c.micro_batches.size(), 8u);
  EXPECT_EQ(reads, 3);
  const DynamicBatchStats st = s.take_stats();
  EXPECT_EQ(st.packings, 3);
  EXPECT_EQ(st.micro_batches, 2 + 4 + 8);
  EXPECT_EQ(st.shrinks, 2);
  EXPECT_DOUBLE_EQ(st.capacity, 2 * 100 + 4 * 50 + 8 * 40);
}

}  // namespace
}  // namespace verl::data
