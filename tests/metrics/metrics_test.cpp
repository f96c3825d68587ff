// Tests of the metrics map, verl's mean/max/min reductions, section ordering, and the stage
// timer's interval arithmetic on synthetic timelines (times injected, no sleeps).
#include "metrics/metrics.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "core/error.h"

using namespace verl::metrics;

TEST(Metrics, AddStatsGivesMeanMaxMin) {
  Metrics m;
  const std::vector<double> v = {1.0, -2.0, 4.5, 0.5};
  m.add_stats("critic/rewards", v);
  EXPECT_EQ(m.size(), 3u);
  EXPECT_DOUBLE_EQ(m.get("critic/rewards/mean"), 1.0);
  EXPECT_DOUBLE_EQ(m.get("critic/rewards/max"), 4.5);
  EXPECT_DOUBLE_EQ(m.get("critic/rewards/min"), -2.0);
}

TEST(Metrics, AddStatsFloatAndEmpty) {
  Metrics m;
  const std::vector<float> f = {3.0f};
  m.add_stats("critic/score", f);
  EXPECT_DOUBLE_EQ(m.get("critic/score/mean"), 3.0);
  EXPECT_DOUBLE_EQ(m.get("critic/score/min"), 3.0);
  m.add_stats("critic/values", std::vector<double>{});
  EXPECT_FALSE(m.contains("critic/values/mean"));
  EXPECT_EQ(m.size(), 3u);
}

TEST(Metrics, LengthStatsCountClippedSequences) {
  Metrics m;
  const std::vector<int64_t> lens = {10, 512, 300, 512};
  m.add_length_stats("response_length", lens, 512);
  EXPECT_DOUBLE_EQ(m.get("response_length/mean"), 333.5);
  EXPECT_DOUBLE_EQ(m.get("response_length/max"), 512);
  EXPECT_DOUBLE_EQ(m.get("response_length/min"), 10);
  EXPECT_DOUBLE_EQ(m.get("response_length/clip_ratio"), 0.5);
}

TEST(Metrics, GetMissingNamesTheMetric) {
  Metrics m;
  m.set("actor/pg_loss", 0.25);
  EXPECT_DOUBLE_EQ(m.get_or("actor/lr", 7.0), 7.0);
  try {
    m.get("actor/lr");
    FAIL() << "expected verl::Error";
  } catch (const verl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("actor/lr"), std::string::npos);
  }
  m.set("actor/pg_loss", 0.5);  // overwrite, not duplicate
  EXPECT_EQ(m.size(), 1u);
  EXPECT_DOUBLE_EQ(m.get("actor/pg_loss"), 0.5);
}

TEST(Metrics, MergeOverwrites) {
  Metrics a, b;
  a.set("x", 1);
  a.set("y", 2);
  b.set("y", 3);
  b.set("z", 4);
  a.merge(b);
  EXPECT_EQ(a.size(), 3u);
  EXPECT_DOUBLE_EQ(a.get("y"), 3);
}

TEST(Metrics, ThroughputIsTokensPerSecondPerGpu) {
  Metrics m;
  add_throughput(m, 8000, 2.0, 4);
  EXPECT_DOUBLE_EQ(m.get("perf/throughput"), 1000.0);
  EXPECT_DOUBLE_EQ(m.get("perf/total_num_tokens"), 8000.0);
  EXPECT_DOUBLE_EQ(m.get("perf/time_per_step"), 2.0);
  EXPECT_THROW(add_throughput(m, 1, 1.0, 0), verl::Error);
}

TEST(Metrics, SortedNamesFollowVerlSections) {
  Metrics m;
  for (const char* n : {"zzz/other", "perf/throughput", "timing_s/gen", "critic/score/mean",
                        "actor/pg_loss", "response_length/mean", "actor/entropy"}) {
    m.set(n, 1.0);
  }
  const std::vector<std::string> want = {
      "actor/entropy", "actor/pg_loss",   "critic/score/mean", "response_length/mean",
      "timing_s/gen",  "perf/throughput", "zzz/other"};
  EXPECT_EQ(sorted_names(m), want);
}

TEST(StageTimer, OverlapOfSyntheticTimeline) {
  StageTimer t;
  // gen runs 0..10; reward scores finished sequences in chunks 4..6 and 8..12; adv after.
  t.record("gen", 0.0, 10.0);
  t.record("reward", 4.0, 6.0);
  t.record("reward", 8.0, 12.0);
  t.record("adv", 12.0, 13.0);
  EXPECT_DOUBLE_EQ(t.overlap("gen", "reward"), 4.0);
  EXPECT_DOUBLE_EQ(t.overlap("reward", "gen"), 4.0);
  EXPECT_DOUBLE_EQ(t.overlap("gen", "adv"), 0.0);
  EXPECT_DOUBLE_EQ(t.seconds("reward"), 6.0);
  EXPECT_DOUBLE_EQ(t.overlap("gen", "missing"), 0.0);
  const auto tl = t.timeline();
  ASSERT_EQ(tl.size(), 4u);
  EXPECT_EQ(tl[0].stage, "gen");
  EXPECT_EQ(tl[3].stage, "adv");
  EXPECT_DOUBLE_EQ(busy_seconds(tl), 13.0);
}

TEST(StageTimer, ConcurrentSpansOfOneStageCountOnce) {
  // Two worker threads scoring rewards at once: 1..5 and 3..7 is 6 s of wall time, not 8.
  std::vector<StageSpan> tl = {{"reward", 1, 5}, {"reward", 3, 7}, {"ref", 2, 4}, {"ref", 6, 9}};
  EXPECT_DOUBLE_EQ(stage_seconds(tl, "reward"), 6.0);
  EXPECT_DOUBLE_EQ(stage_seconds(tl, "ref"), 5.0);
  // reward [1,7] with ref [2,4] and [6,9]: 2 + 1.
  EXPECT_DOUBLE_EQ(overlap_seconds(tl, "reward", "ref"), 3.0);
  EXPECT_DOUBLE_EQ(busy_seconds(tl), 8.0);
}

TEST(StageTimer, AddToWritesTimingMetrics) {
  StageTimer t;
  t.record("gen", 0.0, 2.5);
  t.record("update_actor", 3.0, 4.0);
  t.record("update_actor", 5.0, 5.5);
  Metrics m;
  t.add_to(m);
  EXPECT_EQ(m.size(), 2u);
  EXPECT_DOUBLE_EQ(m.get("timing_s/gen"), 2.5);
  EXPECT_DOUBLE_EQ(m.get("timing_s/update_actor"), 1.5);
  t.reset();
  EXPECT_TRUE(t.timeline().empty());
  EXPECT_THROW(t.record("gen", 2.0, 1.0), verl::Error);
}

TEST(StageTimer, ScopesFromThreadsAreAllRecorded) {
  StageTimer t;
  std::vector<std::thread> workers;
  for (int i = 0; i < 4; ++i) {
    workers.emplace_back([&t] {
      for (int k = 0; k < 50; ++k) auto s = t.scope("reward");
    });
  }
  for (auto& w : workers) w.join();
  {
    auto s = t.scope("adv");
    s.stop();
    EXPECT_EQ(s.stop(), 0.0);  // a second stop records nothing
  }
  const auto tl = t.timeline();
  EXPECT_EQ(tl.size(), 201u);
  for (const auto& sp : tl) EXPECT_LE(sp.start_s, sp.end_s);
}
