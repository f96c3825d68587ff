// The TCP communicator of torchrun-style launches (dist/tcp_communicator.h), its ranks as threads
// of one process on loopback: every collective against values each rank can compute by hand, a
// rank that closes its connection named by the others, and a bootstrap nobody joins bounded by the
// timeout.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
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
