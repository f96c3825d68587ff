// The MPI communicator's collectives with two (or more) real ranks: run under
//   mpirun --allow-run-as-root --oversubscribe -np 2 test_mpi
// (ctest does; every rank runs every test in the same order, so the collectives pair up). Each
// rank checks values that depend on every rank's contribution, inside split groups too.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/launch.h"
#include "dist/mpi_communicator.h"

namespace verl::dist {
namespace {

// One communicator for the process (MPI is initialised once and finalised at exit).
MpiCommunicator& comm() {
  static MpiCommunicator c(/*timeout_s=*/60);
  return c;
}

TEST(Mpi, LaunchIsDetectedFromMpirun) {
  const LaunchInfo info = detect_launch();
  EXPECT_EQ(info.launcher, "mpirun");
  EXPECT_EQ(info.rank, comm().rank());
  EXPECT_EQ(info.world_size, comm().world_size());
  EXPECT_GE(comm().world_size(), 2) << "run this under mpirun -np 2";
}

TEST(Mpi, AllReduceSumMaxMin) {
  const int r = comm().rank(), n = comm().world_size();
  std::vector<double> x = {1.0 + r, 0.5 * r};
  comm().all_reduce(std::span<double>(x), ReduceOp::Sum);
  EXPECT_DOUBLE_EQ(x[0], n + n * (n - 1) / 2.0);
  EXPECT_DOUBLE_EQ(x[1], 0.5 * n * (n - 1) / 2.0);
  std::vector<int64_t> y = {int64_t{10} * r - 3, -r};
  comm().all_reduce(std::span<int64_t>(y), ReduceOp::Max);
  EXPECT_EQ(y[0], 10 * (n - 1) - 3);
  EXPECT_EQ(y[1], 0);
  std::vector<float> z = {static_cast<float>(r) - 0.25f};
  comm().all_reduce(std::span<float>(z), ReduceOp::Min);
  EXPECT_EQ(z[0], -0.25f);
  EXPECT_DOUBLE_EQ(comm().mean(static_cast<double>(r)), (n - 1) / 2.0);
}

TEST(Mpi, ReduceScatterGivesEachRankItsBlock) {
  const int r = comm().rank(), n = comm().world_size();
  const size_t k = 3;
  std::vector<float> send(k * n);
  for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>(100 * r + i);
  std::vector<float> recv(k);
  comm().reduce_scatter<float>(send, recv, ReduceOp::Sum);
  for (size_t j = 0; j < k; ++j) {
    const size_t i = static_cast<size_t>(r) * k + j;
    EXPECT_EQ(recv[j], static_cast<float>(100 * n * (n - 1) / 2 + n * i)) << j;
  }
  // In place: recv is this rank's block of send.
  comm().reduce_scatter(send.data(), send.data() + r * k, k, DataType::F32, ReduceOp::Sum);
  for (size_t j = 0; j < k; ++j) EXPECT_EQ(send[r * k + j], recv[j]);
}

TEST(Mpi, AllGatherAndBroadcast) {
  const int r = comm().rank(), n = comm().world_size();
  std::vector<int64_t> mine = {r, r * r, 7};
  std::vector<int64_t> all(mine.size() * n);
  comm().all_gather<int64_t>(mine, all);
  for (int j = 0; j < n; ++j) {
    EXPECT_EQ(all[3 * j], j);
    EXPECT_EQ(all[3 * j + 1], j * j);
    EXPECT_EQ(all[3 * j + 2], 7);
  }
  std::vector<double> b = {static_cast<double>(r), -1.0 * r};
  comm().broadcast<double>(b, /*root=*/n - 1);
  EXPECT_EQ(b[0], n - 1);
  EXPECT_EQ(b[1], -(n - 1.0));
}

TEST(Mpi, AllToAllAndAllToAllv) {
  const int r = comm().rank(), n = comm().world_size();
  std::vector<int32_t> send(2 * n), recv(2 * n);
  for (int j = 0; j < n; ++j) {
    send[2 * j] = 10 * r + j;
    send[2 * j + 1] = -(10 * r + j);
  }
  comm().all_to_all<int32_t>(send, recv);
  for (int j = 0; j < n; ++j) {
    EXPECT_EQ(recv[2 * j], 10 * j + r);
    EXPECT_EQ(recv[2 * j + 1], -(10 * j + r));
  }
  // Rank r sends j + 1 values r to rank j; rank j receives r + 1... (recv_counts[i] = j + 1 from
  // each i, since every rank i sends rank j j + 1 values).
  std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
  size_t s_total = 0, r_total = 0;
  for (int j = 0; j < n; ++j) {
    sc[j] = static_cast<size_t>(j + 1);
    sd[j] = s_total;
    s_total += sc[j];
    rc[j] = static_cast<size_t>(r + 1);
    rd[j] = r_total + 1;  // one untouched slot before each slice
    r_total += rc[j] + 1;
  }
  std::vector<float> vs(s_total, static_cast<float>(r)), vr(r_total, -7.0f);
  comm().all_to_allv<float>(vs, sc, sd, vr, rc, rd);
  for (int j = 0; j < n; ++j) {
    EXPECT_EQ(vr[rd[j] - 1], -7.0f);
    for (size_t i = 0; i < rc[j]; ++i) EXPECT_EQ(vr[rd[j] + i], static_cast<float>(j));
  }
}

// ZeRO-3's gather: rank j owns j + 1 elements (rank 0 none when there are 3 ranks or more: a
// zero count), which land at their displacement on every rank; the call is non-blocking, so two
// gathers in flight at once (a layer and the next one's prefetch) complete in order.
TEST(Mpi, AllGatherVariableCounts) {
  const int r = comm().rank(), n = comm().world_size();
  std::vector<size_t> counts(n), displs(n);
  size_t total = 0;
  for (int j = 0; j < n; ++j) {
    counts[j] = n >= 3 && j == 0 ? 0 : static_cast<size_t>(j + 1);
    displs[j] = total;
    total += counts[j];
  }
  std::vector<float> mine(counts[r]), a(total, -1.0f), b(total, -1.0f);
  for (size_t k = 0; k < mine.size(); ++k) mine[k] = static_cast<float>(100 * r + k);
  auto pa = comm().start_all_gather_v(mine.data(), a.data(), counts, displs, DataType::F32);
  std::vector<float> twice(mine);
  for (float& x : twice) x *= 2;
  auto pb = comm().start_all_gather_v(twice.data(), b.data(), counts, displs, DataType::F32);
  pb->wait();
  pa->wait();
  for (int j = 0; j < n; ++j) {
    for (size_t k = 0; k < counts[j]; ++k) {
      EXPECT_EQ(a[displs[j] + k], static_cast<float>(100 * j + k)) << j << " " << k;
      EXPECT_EQ(b[displs[j] + k], 2.0f * static_cast<float>(100 * j + k)) << j << " " << k;
    }
  }
  std::vector<float> c(total, -1.0f);
  comm().all_gather_v(mine.data(), c.data(), counts, displs, DataType::F32);
  EXPECT_EQ(c, a);
}

// Split by rank: every rank is a group of one, whose collectives see only its own values.
TEST(Mpi, SplitIntoGroupsOfOne) {
  const int r = comm().rank();
  comm().set_stage("ref");
  std::unique_ptr<Communicator> g = comm().split(/*color=*/r, /*key=*/0);
  ASSERT_NE(g, nullptr);
  EXPECT_NE(dynamic_cast<MpiCommunicator*>(g.get()), nullptr);
  EXPECT_EQ(g->rank(), 0);
  EXPECT_EQ(g->world_size(), 1);
  EXPECT_EQ(g->stage(), "ref");
  EXPECT_EQ(g->group().world_ranks, std::vector<int>{r});
  EXPECT_EQ(g->describe_rank(), "rank 0 of 1 in group color " + std::to_string(r) +
                                    " (world rank " + std::to_string(r) + ")");
  EXPECT_DOUBLE_EQ(g->sum(1.0 + r), 1.0 + r);
  std::vector<int64_t> mine = {r, 7 * r}, all(2, -1);
  g->all_gather<int64_t>(mine, all);
  EXPECT_EQ(all, mine);
  g->barrier();
  comm().set_stage("setup");
}

// One group of every rank with reversed keys: the child's ranks are the parent's backwards.
TEST(Mpi, SplitWithReversedKeysSwapsTheRanks) {
  const int r = comm().rank(), n = comm().world_size();
  std::unique_ptr<Communicator> g = comm().split(/*color=*/4, /*key=*/-r);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->rank(), n - 1 - r);
  EXPECT_EQ(g->world_size(), n);
  std::vector<int> backwards(n);
  for (int j = 0; j < n; ++j) backwards[j] = n - 1 - j;
  EXPECT_EQ(g->group().world_ranks, backwards);
  // all_gather lands in the child's rank order: parent ranks n - 1 down to 0.
  std::vector<int32_t> mine = {r}, all(n, -1);
  g->all_gather<int32_t>(mine, all);
  EXPECT_EQ(all, std::vector<int32_t>(backwards.begin(), backwards.end()));
  // The child's rank 0 is the parent's last rank.
  std::vector<double> b = {0.25 + r};
  g->broadcast<double>(b, 0);
  EXPECT_EQ(b[0], 0.25 + (n - 1));
  // reduce_scatter: child rank q gets the sum of every rank's block q.
  std::vector<float> send(2 * n), recv(2);
  for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>(10 * r + i);
  g->reduce_scatter<float>(send, recv, ReduceOp::Sum);
  const int q = g->rank();
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(recv[k], static_cast<float>(5 * n * (n - 1) + n * (2 * q + k))) << k;
  }
  // The non-blocking all-reduce runs on the child's communicator too.
  std::vector<int64_t> x = {int64_t{1} << r};
  g->start_all_reduce(x.data(), 1, DataType::I64, ReduceOp::Sum)->wait();
  EXPECT_EQ(x[0], (int64_t{1} << n) - 1);
}

// kNoColor leaves rank 0 out; a split of a split composes the world ranks; the parent works after
// the children are freed.
TEST(Mpi, NestedSplitAndNoColor) {
  const int r = comm().rank(), n = comm().world_size();
  {
    std::unique_ptr<Communicator> g = comm().split(r == 0 ? kNoColor : 1, 0);
    EXPECT_EQ(g != nullptr, r != 0);
    if (g) {
      EXPECT_EQ(g->world_size(), n - 1);
      EXPECT_EQ(g->rank(), r - 1);
      EXPECT_EQ(g->sum(int64_t{r}), int64_t{n} * (n - 1) / 2);
    }
  }
  {
    std::unique_ptr<Communicator> g = comm().split(0, -r);  // parent ranks backwards
    // Backwards again: the parent's order.
    std::unique_ptr<Communicator> h = g->split(2, -g->rank());
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(h->rank(), r);
    std::vector<int> world(n);
    std::iota(world.begin(), world.end(), 0);
    EXPECT_EQ(h->group().world_ranks, world);
    EXPECT_EQ(h->group().color, 2);
    std::vector<int64_t> v = {100 + r};
    h->broadcast<int64_t>(v, n - 1);
    EXPECT_EQ(v[0], 100 + n - 1);
  }
  EXPECT_EQ(comm().sum(int64_t{1} << r), (int64_t{1} << n) - 1);
  try {
    comm().split(-5, 0);  // refused on every rank before any collective
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("color -5"), std::string::npos) << e.what();
  }
  comm().barrier();
}

TEST(Mpi, DeviceBuffersAreRefusedByName) {
  float x = 1.0f;
  try {
    comm().all_reduce(&x, 1, DataType::F32, ReduceOp::Sum, Place::device(nullptr));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL communicator"), std::string::npos) << e.what();
  }
  comm().barrier();
}

}  // namespace
}  // namespace verl::dist
