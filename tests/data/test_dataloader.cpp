// Tests of the DataLoader: Philox epoch permutations, drop_last, exact resume from state(),
// prefetching workers that give the same batches as none, and worker errors reaching the caller.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "config/config.h"
#include "core/error.h"
#include "data/dataloader.h"
#include "data_test_util.h"

namespace verl::data {
namespace {

using testing::make_row;
using testing::qwen3;
using OJ = nlohmann::ordered_json;

// n rows whose ground truth is their row number.
RLDataset numbered(int64_t n, DatasetOptions opts = {}) {
  std::vector<OJ> rows;
  for (int64_t i = 0; i < n; ++i)
    rows.push_back(
        make_row(fmt::format("Question {}: what is {} + {}?", i, i, i), std::to_string(i)));
  return RLDataset::from_rows(rows, "rows.jsonl", qwen3(), opts);
}

// All batches the loader still has, as (epoch, batch, indices, ids of the first sample).
struct Seen {
  int64_t epoch, batch;
  std::vector<int64_t> indices;
  std::vector<std::vector<int32_t>> ids;
  bool operator==(const Seen&) const = default;
};
std::vector<Seen> drain(DataLoader& loader, int64_t limit = 1 << 30) {
  std::vector<Seen> out;
  while (static_cast<int64_t>(out.size()) < limit) {
    auto b = loader.next();
    if (!b) break;
    Seen s{b->epoch, b->batch, b->indices, {}};
    EXPECT_EQ(b->samples.size(), b->indices.size());
    for (size_t i = 0; i < b->samples.size(); ++i) {
      EXPECT_EQ(b->samples[i].index, b->indices[i]);
      EXPECT_EQ(b->samples[i].ground_truth, std::to_string(b->indices[i]));
      s.ids.push_back(b->samples[i].prompt_ids);
    }
    out.push_back(std::move(s));
  }
  return out;
}

TEST(ShuffledOrder, PermutationDeterministicAndPerEpoch) {
  const auto a = shuffled_order(1000, 7, 0);
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_EQ(a, shuffled_order(1000, 7, 0));
  EXPECT_NE(a, shuffled_order(1000, 7, 1));
  EXPECT_NE(a, shuffled_order(1000, 8, 0));
  // Not the identity, and every position roughly uniform: the first element over many epochs.
  std::vector<int> first(10, 0);
  for (int e = 0; e < 2000; ++e) first[shuffled_order(10, 3, e)[0]]++;
  for (int c : first) EXPECT_GT(c, 120);  // expected 200 each; 120 is > 6 sigma below
}

TEST(DataLoader, EpochsDropLastAndEveryRowOnce) {
  RLDataset ds = numbered(23);
  LoaderOptions o;
  o.batch_size = 5;
  o.seed = 11;
  o.total_epochs = 3;
  o.num_workers = 2;
  DataLoader loader(ds, o);
  EXPECT_EQ(loader.batches_per_epoch(), 4);  // 23 // 5, the last 3 rows dropped
  auto all = drain(loader);
  ASSERT_EQ(all.size(), 12u);
  EXPECT_FALSE(loader.next().has_value());
  for (int64_t e = 0; e < 3; ++e) {
    const auto order = loader.epoch_order(e);
    std::vector<int64_t> served;
    for (int64_t b = 0; b < 4; ++b) {
      const Seen& s = all[e * 4 + b];
      EXPECT_EQ(s.epoch, e);
      EXPECT_EQ(s.batch, b);
      ASSERT_EQ(s.indices.size(), 5u);
      served.insert(served.end(), s.indices.begin(), s.indices.end());
    }
    EXPECT_EQ(served, std::vector<int64_t>(order.begin(), order.begin() + 20));
    EXPECT_EQ(std::set<int64_t>(served.begin(), served.end()).size(), 20u);  // no repeats
  }
  EXPECT_NE(all[0].indices, all[4].indices);  // a new order each epoch

  // drop_last off: every row exactly once per epoch, the last batch short.
  o.drop_last = false;
  DataLoader full(ds, o);
  EXPECT_EQ(full.batches_per_epoch(), 5);
  auto all2 = drain(full);
  ASSERT_EQ(all2.size(), 15u);
  for (int64_t e = 0; e < 3; ++e) {
    std::multiset<int64_t> rows;
    for (int64_t b = 0; b < 5; ++b)
      rows.insert(all2[e * 5 + b].indices.begin(), all2[e * 5 + b].indices.end());
    EXPECT_EQ(rows.size(), 23u);
    EXPECT_EQ(std::set<int64_t>(rows.begin(), rows.end()).size(), 23u);
    EXPECT_EQ(all2[e * 5 + 4].indices.size(), 3u);
  }
}

TEST(DataLoader, SameSeedSameOrderNoShuffleInOrder) {
  RLDataset ds = numbered(12);
  LoaderOptions o;
  o.batch_size = 4;
  o.seed = 5;
  o.total_epochs = 2;
  DataLoader a(ds, o), b(ds, o);
  EXPECT_EQ(drain(a), drain(b));
  o.seed = 6;
  DataLoader c(ds, o);
  a.rewind();
  EXPECT_NE(drain(a), drain(c));

  o.shuffle = false;
  DataLoader plain(ds, o);
  auto seen = drain(plain);
  ASSERT_EQ(seen.size(), 6u);
  EXPECT_EQ(seen[1].indices, (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(seen[3].indices, (std::vector<int64_t>{0, 1, 2, 3}));  // epoch 1 starts over
}

TEST(DataLoader, PrefetchGivesTheSameBatchesAsNone) {
  RLDataset ds = numbered(30);
  LoaderOptions o;
  o.batch_size = 4;
  o.seed = 99;
  o.total_epochs = 2;
  o.num_workers = 0;
  DataLoader sync(ds, o);
  auto expected = drain(sync);
  for (int64_t workers : {1, 3, 8}) {
    for (int64_t prefetch : {1, 4}) {
      o.num_workers = workers;
      o.prefetch_factor = prefetch;
      DataLoader threaded(ds, o);
      EXPECT_EQ(drain(threaded), expected) << workers << " workers, prefetch " << prefetch;
      EXPECT_GE(threaded.data_wait_seconds(), threaded.last_wait_seconds());
    }
  }
  // Destroying a loader with batches still queued and workers waiting must not hang.
  o.num_workers = 4;
  DataLoader abandoned(ds, o);
  ASSERT_TRUE(abandoned.next().has_value());
}

TEST(DataLoader, StateRestoresTheRemainingBatchesExactly) {
  RLDataset ds = numbered(21);
  LoaderOptions o;
  o.batch_size = 4;  // 5 batches per epoch
  o.seed = 1234;
  o.total_epochs = 3;
  o.num_workers = 2;
  DataLoader reference(ds, o);
  auto all = drain(reference);
  ASSERT_EQ(all.size(), 15u);

  for (int64_t cut : {0, 3, 5, 7, 14}) {
    DataLoader first(ds, o);
    auto head = drain(first, cut);
    ASSERT_EQ(static_cast<int64_t>(head.size()), cut);
    // Through text, as a checkpoint would store it.
    const std::string saved = first.state().dump();
    const auto st = nlohmann::json::parse(saved);
    EXPECT_EQ(st["epoch"], cut / 5);
    EXPECT_EQ(st["batch"], cut % 5);
    DataLoader resumed(ds, o);
    resumed.load_state(st);
    auto tail = drain(resumed);
    ASSERT_EQ(static_cast<int64_t>(tail.size()), 15 - cut) << "cut " << cut;
    for (size_t i = 0; i < tail.size(); ++i)
      EXPECT_EQ(tail[i], all[cut + i]) << "cut " << cut << " batch " << i;
  }

  // load_state on a loader that already prefetched elsewhere drops what it had queued.
  DataLoader busy(ds, o);
  drain(busy, 9);
  DataLoader probe(ds, o);
  drain(probe, 2);
  busy.load_state(probe.state());
  EXPECT_EQ(drain(busy, 1)[0], all[2]);
}

TEST(DataLoader, StateMismatchesAreErrors) {
  RLDataset ds = numbered(12);
  LoaderOptions o;
  o.batch_size = 4;
  DataLoader loader(ds, o);
  auto st = loader.state();
  st["seed"] = 2;
  try {
    loader.load_state(st);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'seed'"), std::string::npos) << e.what();
  }
  st = loader.state();
  st["dataset_size"] = 13;
  EXPECT_THROW(loader.load_state(st), Error);
  st = loader.state();
  st["batch"] = 3;  // only 3 batches per epoch
  EXPECT_THROW(loader.load_state(st), Error);
  EXPECT_THROW(loader.load_state(nlohmann::json::array()), Error);
}

TEST(DataLoader, WorkerErrorsSurfaceInOrder) {
  // Row 5 is far over the limit with truncation=error; it lands in the second batch (no shuffle).
  std::vector<OJ> rows;
  for (int i = 0; i < 8; ++i) {
    std::string q = "q" + std::to_string(i);
    if (i == 5)
      for (int r = 0; r < 30; ++r) q += " and a long tail of words to count";
    rows.push_back(make_row(q, std::to_string(i)));
  }
  DatasetOptions dopts;
  dopts.max_prompt_length = 40;
  RLDataset ds = RLDataset::from_rows(rows, "prompts.jsonl", qwen3(), dopts);
  for (int64_t workers : {0, 1, 3}) {
    LoaderOptions o;
    o.batch_size = 4;
    o.shuffle = false;
    o.num_workers = workers;
    DataLoader loader(ds, o);
    ASSERT_TRUE(loader.next().has_value());  // batch 0 is fine
    for (int attempt = 0; attempt < 2; ++attempt) {
      try {
        loader.next();
        FAIL() << "expected the worker's error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("prompts.jsonl:6: prompt length"), std::string::npos)
            << e.what();
      }
    }
    EXPECT_EQ(loader.state()["batch"], 1);  // the failed batch was not consumed
    loader.rewind();                        // a rewind clears the failure
    EXPECT_TRUE(loader.next().has_value());
  }
}

TEST(DataLoader, TooSmallDatasetIsAnError) {
  RLDataset ds = numbered(3);
  LoaderOptions o;
  o.batch_size = 4;
  try {
    DataLoader loader(ds, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 rows, fewer than one batch of 4"), std::string::npos)
        << e.what();
  }
  o.drop_last = false;
  DataLoader ok(ds, o);
  EXPECT_EQ(ok.batches_per_epoch(), 1);
}

TEST(DataLoader, OptionsFromConfigAndValidation) {
  config::Config cfg =
      config::load_config("", {"data.train_batch_size=6", "data.seed=42", "trainer.total_epochs=2",
                               "data.dataloader_num_workers=3", "data.prefetch_factor=5"});
  LoaderOptions t = LoaderOptions::train_from_config(cfg);
  EXPECT_EQ(t.batch_size, 6);  // gen_batch_size follows train_batch_size
  EXPECT_EQ(t.seed, 42u);
  EXPECT_EQ(t.total_epochs, 2);
  EXPECT_TRUE(t.shuffle);
  EXPECT_TRUE(t.drop_last);
  EXPECT_EQ(t.num_workers, 3);
  EXPECT_EQ(t.prefetch_factor, 5);
  EXPECT_EQ(LoaderOptions::train_from_config(config::load_config("", {})).seed, 1u);  // null seed

  RLDataset ds = numbered(7);
  LoaderOptions v = LoaderOptions::val_from_config(cfg, ds.size());
  EXPECT_FALSE(v.shuffle);
  EXPECT_FALSE(v.drop_last);
  DataLoader val(ds, v);
  auto once = drain(val);
  ASSERT_EQ(once.size(), 1u);  // val_batch_size null: the whole set in one batch
  EXPECT_EQ(once[0].indices, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}));
  val.rewind();
  EXPECT_EQ(drain(val), once);

  config::Config cfg2 = config::load_config("", {"data.val_batch_size=3"});
  DataLoader val3(ds, LoaderOptions::val_from_config(cfg2, ds.size()));
  auto parts = drain(val3);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[2].indices, (std::vector<int64_t>{6}));
}

}  // namespace
}  // namespace verl::data
