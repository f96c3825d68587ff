// The TCP communicator of torchrun-style launches (dist/tcp_communicator.h), its ranks as threads
// of one process on loopback: every collective against values each rank can compute by hand, the
// same inside the groups of a split, a rank that closes its connection named by the others, and a
// bootstrap nobody joins bounded by the timeout.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/tcp_communicator.h"

namespace verl::dist {
namespace {

// A port that was free a moment ago (bound to port 0, then released).
int free_port() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  close(s);
  return ntohs(a.sin_port);
}

// Runs body(comm) on `world` ranks, each a thread with its own communicator.
void run_ranks(int world, const std::function<void(TcpCommunicator&)>& body,
               double timeout_s = 30) {
  const int port = free_port();
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([=] {
      TcpCommunicator comm(r, world, "127.0.0.1", port, timeout_s);
      body(comm);
    });
  }
  for (auto& t : ranks) t.join();
}

TEST(TcpCommunicator, EveryCollectiveOnThreeRanks) {
  const int n = 3;
  run_ranks(n, [](TcpCommunicator& c) {
    const int r = c.rank();
    EXPECT_EQ(c.world_size(), 3);
    std::vector<double> x = {1.0 + r, 0.5 * r};
    c.all_reduce(std::span<double>(x), ReduceOp::Sum);
    EXPECT_DOUBLE_EQ(x[0], 6.0);
    EXPECT_DOUBLE_EQ(x[1], 1.5);
    std::vector<int64_t> y = {10 * r - 3, -r};
    c.all_reduce(std::span<int64_t>(y), ReduceOp::Max);
    EXPECT_EQ(y[0], 17);
    EXPECT_EQ(y[1], 0);
    std::vector<float> z = {static_cast<float>(r) - 0.25f};
    c.all_reduce(std::span<float>(z), ReduceOp::Min);
    EXPECT_EQ(z[0], -0.25f);
    // reduce_scatter: rank r receives the sum of every rank's block r.
    std::vector<float> send(2 * 3), recv(2);
    for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>(100 * r + i);
    c.reduce_scatter<float>(send, recv, ReduceOp::Sum);
    for (int j = 0; j < 2; ++j) EXPECT_EQ(recv[j], static_cast<float>(300 + 3 * (2 * r + j))) << j;
    // all_gather, in place.
    std::vector<int32_t> all(3 * 2, -1);
    all[2 * r] = r;
    all[2 * r + 1] = 10 * r;
    c.all_gather(all.data() + 2 * r, all.data(), 2, DataType::I32);
    EXPECT_EQ(all, (std::vector<int32_t>{0, 0, 1, 10, 2, 20}));
    // broadcast from rank 2.
    std::vector<int64_t> b = {r == 2 ? 42 : 0, r == 2 ? -7 : 0};
    c.broadcast<int64_t>(b, 2);
    EXPECT_EQ(b, (std::vector<int64_t>{42, -7}));
    // all_to_allv: rank r sends j + 1 copies of 100 r + j to rank j.
    std::vector<size_t> sc(3), sd(3), rc(3), rd(3);
    std::vector<int64_t> s, want;
    for (int j = 0; j < 3; ++j) {
      sd[j] = s.size();
      sc[j] = static_cast<size_t>(j + 1);
      for (int k = 0; k <= j; ++k) s.push_back(100 * r + j);
    }
    size_t total = 0;
    for (int q = 0; q < 3; ++q) {
      rd[q] = total;
      rc[q] = static_cast<size_t>(r + 1);
      total += rc[q];
      for (int k = 0; k <= r; ++k) want.push_back(100 * q + r);
    }
    std::vector<int64_t> got(total, -1);
    c.all_to_allv<int64_t>(s, sc, sd, got, rc, rd);
    EXPECT_EQ(got, want);
    // all_gather_v (ZeRO-3's layer gather): rank q's q + 1 values 10 q + k land at 2 q (a gap of
    // one untouched slot after each), rank 1's through the non-blocking call.
    std::vector<float> mine, gathered(9, -1.0f);
    for (int k = 0; k <= r; ++k) mine.push_back(static_cast<float>(10 * r + k));
    const std::vector<size_t> counts = {1, 2, 3}, displs = {0, 2, 5};
    c.start_all_gather_v(mine.data(), gathered.data(), counts, displs, DataType::F32)->wait();
    EXPECT_EQ(gathered, (std::vector<float>{0, -1, 10, 11, -1, 20, 21, 22, -1}));
    c.barrier();
  });
}

// Four ranks split by parity with reversed keys: color 0 is parent ranks {2, 0} and color 1 is
// {3, 1}, in that rank order. Every collective inside a group sees the group's values only.
TEST(TcpCommunicator, SplitByParityWithReversedKeys) {
  run_ranks(4, [](TcpCommunicator& c) {
    const int r = c.rank(), color = r % 2;
    c.set_stage("gen");
    std::unique_ptr<Communicator> g = c.split(color, /*key=*/-r);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->world_size(), 2);
    EXPECT_EQ(g->rank(), r < 2 ? 1 : 0);
    EXPECT_EQ(g->group().color, color);
    EXPECT_EQ(g->group().world_ranks, (std::vector<int>{color + 2, color}));
    EXPECT_EQ(g->stage(), "gen");
    EXPECT_EQ(g->describe_rank(), "rank " + std::to_string(g->rank()) + " of 2 in group color " +
                                      std::to_string(color) + " (world rank " + std::to_string(r) +
                                      ")");
    // all_reduce: 1 + r summed over {0, 2} is 4, over {1, 3} is 6.
    std::vector<double> x = {1.0 + r, -1.0 * r};
    g->all_reduce(std::span<double>(x), ReduceOp::Sum);
    EXPECT_EQ(x, color == 0 ? (std::vector<double>{4, -2}) : (std::vector<double>{6, -4}));
    std::vector<int64_t> m = {10 * r};
    g->all_reduce(std::span<int64_t>(m), ReduceOp::Min);
    EXPECT_EQ(m[0], 10 * color);
    // all_gather lands in group rank order: the higher parent rank first.
    std::vector<int32_t> mine = {r, 100 + r}, all(4, -1);
    g->all_gather<int32_t>(mine, all);
    EXPECT_EQ(all, (std::vector<int32_t>{color + 2, 102 + color, color, 100 + color}));
    // broadcast from group rank 1 (parent rank 0 or 1).
    std::vector<float> b = {0.5f + static_cast<float>(r)};
    g->broadcast<float>(b, 1);
    EXPECT_EQ(b[0], 0.5f + static_cast<float>(color));
    // all_to_all: group rank q sends 10 r + j to group rank j.
    const std::vector<int64_t> send = {10 * r, 10 * r + 1};
    std::vector<int64_t> recv(2, -1);
    g->all_to_all<int64_t>(send, recv);
    EXPECT_EQ(recv, (std::vector<int64_t>{10 * (color + 2) + g->rank(), 10 * color + g->rank()}));
    g->barrier();
  });
}

// kNoColor leaves a rank out; a split of a split composes the world ranks; destroying the children
// closes their sockets and leaves the parent working.
TEST(TcpCommunicator, NestedSplitAndNoColor) {
  std::vector<size_t> fds(2);  // open descriptors of the process before and after (rank 0 counts)
  auto open_fds = [] {
    return static_cast<size_t>(std::distance(std::filesystem::directory_iterator("/proc/self/fd"),
                                             std::filesystem::directory_iterator()));
  };
  run_ranks(4, [&](TcpCommunicator& c) {
    const int r = c.rank();
    c.barrier();
    if (r == 0) fds[0] = open_fds();
    c.barrier();  // the other ranks open nothing while rank 0 counts
    {
      std::unique_ptr<Communicator> g = c.split(r == 1 ? kNoColor : 7, /*key=*/0);
      if (r == 1) {
        EXPECT_EQ(g, nullptr);
      } else {
        ASSERT_NE(g, nullptr);
        EXPECT_EQ(g->world_size(), 3);
        EXPECT_EQ(g->group().world_ranks, (std::vector<int>{0, 2, 3}));
        EXPECT_EQ(g->sum(int64_t{r}), 5);
        // Group ranks 0 and 2 (world ranks 0 and 3) form color 5, keyed so world rank 3 is first.
        const bool in = g->rank() != 1;
        std::unique_ptr<Communicator> h = g->split(in ? 5 : kNoColor, -g->rank());
        EXPECT_EQ(h != nullptr, in);
        if (h) {
          EXPECT_EQ(h->world_size(), 2);
          EXPECT_EQ(h->rank(), r == 3 ? 0 : 1);
          EXPECT_EQ(h->group().world_ranks, (std::vector<int>{3, 0}));
          EXPECT_EQ(h->describe_peer(0), "rank 0 (world rank 3)");
          std::vector<int64_t> v = {r};
          h->broadcast<int64_t>(v, 0);
          EXPECT_EQ(v[0], 3);
          EXPECT_EQ(h->sum(1.0 + r), 5.0);
        }
        EXPECT_EQ(g->sum(1.0), 3.0);  // the group works beside its child
      }
    }
    EXPECT_EQ(c.sum(int64_t{1} << r), 15);  // the parent works after its children are gone
    c.barrier();
    if (r == 0) fds[1] = open_fds();
    c.barrier();
  });
  EXPECT_EQ(fds[1], fds[0]);
}

// A member that leaves its group is named by group and world rank.
TEST(TcpCommunicator, AGroupMemberThatLeavesIsNamed) {
  std::string err;
  run_ranks(4, [&](TcpCommunicator& c) {
    const int r = c.rank();
    std::unique_ptr<Communicator> g = c.split(r % 2, r);
    if (r == 3) g.reset();  // closes its connection to its group's rank 0 (world rank 1)
    if (r == 1) {
      g->set_stage("update_actor");
      std::vector<float> x = {1.0f};
      try {
        g->all_reduce(std::span<float>(x), ReduceOp::Sum);
      } catch (const Error& e) {
        err = e.what();
      }
    }
    c.barrier();
  });
  EXPECT_NE(err.find("rank 0 of 2 in group color 1 (world rank 1): all_reduce in stage "
                     "'update_actor': rank 1 (world rank 3) closed the connection"),
            std::string::npos)
      << err;
}

TEST(TcpCommunicator, ARankThatLeavesIsNamed) {
  std::string err;
  run_ranks(2, [&](TcpCommunicator& c) {
    if (c.rank() == 1) return;  // its communicator closes the connection
    std::vector<float> x = {1.0f};
    c.set_stage("update_actor");
    try {
      c.all_reduce(std::span<float>(x), ReduceOp::Sum);
    } catch (const Error& e) {
      err = e.what();
    }
  });
  EXPECT_NE(
      err.find("rank 0 of 2: all_reduce in stage 'update_actor': rank 1 closed the connection"),
      std::string::npos)
      << err;
}

TEST(TcpCommunicator, ABootstrapNobodyJoinsTimesOut) {
  std::string err;
  try {
    TcpCommunicator c(0, 2, "127.0.0.1", free_port(), /*timeout_s=*/0.5);
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("0 of 1 ranks connected"), std::string::npos) << err;
  EXPECT_NE(err.find("MASTER_ADDR / MASTER_PORT"), std::string::npos) << err;
}

}  // namespace
}  // namespace verl::dist
