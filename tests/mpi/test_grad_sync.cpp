// Gradient buckets reduced while backward goes on (optim/grad_sync.h), with two real ranks under
// mpirun: the non-blocking all-reduce and reduce-to-root, and GradSync at ZeRO stages 0, 1 and 2
// against the sums every rank can compute by hand, over two micro-batches.
#include <gtest/gtest.h>

#include <vector>

#include "dist/mpi_communicator.h"
#include "optim/grad_sync.h"

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

}  // namespace
}  // namespace verl::optim
