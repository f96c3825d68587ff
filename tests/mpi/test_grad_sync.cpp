// Gradient buckets reduced while backward goes on (optim/grad_sync.h), with two real ranks under
// mpirun: the non-blocking all-reduce and reduce-to-root, and GradSync at ZeRO stages 0, 1 and 2
// against the sums every rank can compute by hand, over two micro-batches; LightweightSync's
// all-gathered top-k messages against the sum of every rank's message decoded here.
#include <gtest/gtest.h>

#include <vector>

#include "dist/mpi_communicator.h"
#include "optim/grad_sync.h"
#include "optim/sparse_sync.h"

namespace verl::optim {
namespace {

dist::MpiCommunicator& comm() {
  static dist::MpiCommunicator c(/*timeout_s=*/60);
  return c;
}

// Rank r's gradient of element i in micro-batch k.
float grad(int r, int64_t i, int k) {
  return static_cast<float>(1 + r) * 0.5f + static_cast<float>(i % 7) + 10.0f * k;
}

TEST(GradSync, StartedCollectivesComplete) {
  const int r = comm().rank(), n = comm().world_size();
  std::vector<float> a = {1.0f + r, 2.0f * r}, b = {3.0f + r};
  auto pa = comm().start_all_reduce(a.data(), a.size(), dist::DataType::F32, dist::ReduceOp::Sum);
  auto pb =
      comm().start_reduce(b.data(), b.size(), dist::DataType::F32, dist::ReduceOp::Sum, n - 1);
  pb->wait();
  pa->wait();
  EXPECT_TRUE(pa->test());
  EXPECT_EQ(a[0], n + n * (n - 1) / 2.0f);
  EXPECT_EQ(a[1], 2.0f * n * (n - 1) / 2.0f);
  if (r == n - 1) EXPECT_EQ(b[0], 3.0f * n + n * (n - 1) / 2.0f);
}

// Ranges of a 23-element layout as a backward hands them out: last first, one range twice open
// (a tied head and embedding) and split across the shard boundary.
void run_backward(GradSync& sync, std::vector<float>* whole, int k, bool last) {
  const int r = comm().rank();
  sync.arm(last);
  float* tied = sync.open(0, 5);  // the embedding: opened by the head, ready at the end
  for (int64_t i = 0; i < 5; ++i) tied[i] += grad(r, i, k);
  const int64_t ranges[][2] = {{17, 23}, {9, 17}, {5, 9}};
  for (const auto& rg : ranges) {
    float* v = sync.open(rg[0], rg[1]);
    for (int64_t i = rg[0]; i < rg[1]; ++i) v[i - rg[0]] += grad(r, i, k);
    sync.ready(rg[0], rg[1]);
  }
  EXPECT_EQ(sync.open(0, 5), tied);
  sync.ready(0, 5);
  (void)whole;
}

TEST(GradSync, StagesZeroOneTwoGiveTheSumOverRanks) {
  const int r = comm().rank(), n = comm().world_size();
  const int64_t numel = 23, chunk = (numel + n - 1) / n;
  std::vector<float> want(numel, 0.0f);
  for (int q = 0; q < n; ++q)
    for (int64_t i = 0; i < numel; ++i) want[i] += grad(q, i, 0) + grad(q, i, 1);
  for (int stage = 0; stage <= 2; ++stage) {
    SyncStats stats;
    std::vector<float> grads(stage == 2 ? chunk : chunk * n, 0.0f);
    {
      GradSync sync(comm(), stage, numel, chunk, grads.data(), stats);
      if (stage < 2) {
        // Micro-batch 0 accumulates locally (not the last), micro-batch 1's backward reduces.
        run_backward(sync, nullptr, 0, false);
        run_backward(sync, nullptr, 1, true);
      } else {
        run_backward(sync, nullptr, 0, false);
        run_backward(sync, nullptr, 1, false);
      }
      EXPECT_TRUE(sync.finish()) << "stage " << stage;
      EXPECT_FALSE(sync.finish()) << "stage " << stage << ": nothing new started";
    }
    const int64_t lo = stage == 0 ? 0 : r * chunk,
                  hi = stage == 0 ? numel : std::min(numel, (r + 1) * chunk);
    for (int64_t i = lo; i < hi; ++i) {
      const float got = stage == 2 ? grads[i - lo] : grads[i];
      EXPECT_FLOAT_EQ(got, want[i]) << "stage " << stage << ", element " << i;
    }
    // Bytes as the ring algorithms count them: stage 0 all-reduces once, 1 reduces to owners
    // once, 2 reduces to owners every micro-batch.
    const double share = static_cast<double>(n - 1) / n;
    const double want_bytes =
        stage == 0 ? 2 * share * 4 * numel : (stage == 1 ? 1 : 2) * share * 4 * numel;
    EXPECT_DOUBLE_EQ(stats.bytes, want_bytes) << "stage " << stage;
  }
}

// Every rank's gradient of a range as run_backward writes it over micro-batches 0 and 1.
std::vector<float> local_grads(int r, int64_t numel) {
  std::vector<float> g(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i)
    g[i] = grad(r, i, 0) + grad(r, i, 1) + 0.37f * static_cast<float>((i * 13 + r * 5) % 11);
  return g;
}

// LightweightSync at stages 0 and 1: each bucket's top-k messages are all-gathered and every rank
// ends with the same sum, that of the decoded messages of all ranks (each computed here from the
// rank's gradient and carry); the carry keeps what was not sent; the bytes are the messages'.
TEST(GradSync, LightweightSumsEveryRanksMessage) {
  const int r = comm().rank(), n = comm().world_size();
  const int64_t numel = 23, chunk = (numel + n - 1) / n;
  const int64_t ranges[][2] = {{17, 23}, {9, 17}, {5, 9}, {0, 5}};
  for (int stage = 0; stage <= 1; ++stage)
    for (const SyncValues values : {SyncValues::Int8, SyncValues::F32}) {
      LightweightConfig cfg;
      cfg.top_k = 0.3;
      cfg.values = values;
      SyncStats stats;
      std::vector<float> grads(static_cast<size_t>(chunk * n), 0.0f),
          carry(static_cast<size_t>(numel), 0.25f);
      std::vector<float> want(static_cast<size_t>(numel), 0.0f);
      double want_bytes = 0;
      for (const auto& rg : ranges) {
        const SparseLayout l = sparse_layout(rg[1] - rg[0], cfg.top_k, values);
        want_bytes += static_cast<double>(n - 1) * static_cast<double>(l.bytes);
        for (int q = 0; q < n; ++q) {
          const std::vector<float> g = local_grads(q, numel);
          std::vector<float> c(static_cast<size_t>(rg[1] - rg[0]), 0.25f);
          std::vector<uint8_t> msg(l.bytes);
          sparse_compress(g.data() + rg[0], c.data(), true, l, msg.data());
          sparse_accumulate(msg.data(), l, want.data() + rg[0]);
        }
      }
      {
        GradSync sync(comm(), stage, numel, chunk, grads.data(), stats);
        sync.use_lightweight(cfg, carry.data());
        const std::vector<float> g = local_grads(r, numel);
        sync.arm(true);
        for (const auto& rg : ranges) {
          float* v = sync.open(rg[0], rg[1]);
          for (int64_t i = rg[0]; i < rg[1]; ++i) v[i - rg[0]] = g[i];
          sync.ready(rg[0], rg[1]);
        }
        EXPECT_TRUE(sync.finish());
      }
      for (int64_t i = 0; i < numel; ++i)
        EXPECT_EQ(grads[i], want[i])
            << "stage " << stage << " " << to_string(values) << ", element " << i;
      // This rank's carry: its accumulated gradient minus what it sent.
      const std::vector<float> g = local_grads(r, numel);
      int64_t sent = 0;
      for (int64_t i = 0; i < numel; ++i) sent += carry[i] != g[i] + 0.25f ? 1 : 0;
      EXPECT_GE(sent, 4 * 1) << "each of the 4 buckets sent something";
      EXPECT_DOUBLE_EQ(stats.bytes, want_bytes);
      EXPECT_DOUBLE_EQ(stats.dense_bytes, 2.0 * (n - 1) / n * 4 * numel);
    }
}

// top_k = 1 in fp32 without a carry: the dense all-reduce's sum.
TEST(GradSync, LightweightWholeInFp32IsTheDenseSum) {
  const int r = comm().rank(), n = comm().world_size();
  const int64_t numel = 1000;
  std::vector<float> dense = local_grads(r, numel), grads = dense;
  comm().all_reduce(std::span<float>(dense), dist::ReduceOp::Sum);
  SyncStats stats;
  GradSync sync(comm(), 0, numel, numel, grads.data(), stats);
  LightweightConfig cfg;
  cfg.top_k = 1.0;
  cfg.values = SyncValues::F32;
  cfg.error_feedback = false;
  sync.use_lightweight(cfg, nullptr);
  sync.sync_whole();
  for (int64_t i = 0; i < numel; ++i) EXPECT_FLOAT_EQ(grads[i], dense[i]) << i;
  (void)n;
}

}  // namespace
}  // namespace verl::optim
