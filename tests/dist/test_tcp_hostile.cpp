// The TCP bootstrap against what else may be on MASTER_PORT (issue 41): a silent connection and an
// HTTP client at rank 0 while a 2-rank job starts, an echo service and a web server where a rank
// expects rank 0, a rank of another job, ranks whose collectives fall out of step, and the
// launcher variables that used to be misread (MASTER_PORT=0 or abc, RANK without WORLD_SIZE).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/launch.h"
#include "dist/tcp_communicator.h"

namespace verl::dist {
namespace {

#define EXPECT_HAS(msg, part) \
  EXPECT_NE((msg).find(part), std::string::npos) << "missing '" << (part) << "' in:\n" << (msg)

sockaddr_in loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

// A socket listening on a loopback port the system picks; `port` receives it.
int listen_any(int& port) {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = loopback(0);
  bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  listen(s, 4);
  socklen_t len = sizeof(a);
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return s;
}

int free_port() {
  int port = 0;
  close(listen_any(port));
  return port;
}

// A client connection to `port`, retried while nobody listens yet (rank 0 starting).
int connect_retry(int port) {
  for (int i = 0; i < 200; ++i) {
    const int s = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = loopback(port);
    if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return s;
    close(s);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

// True once the other side closed `fd` (recv returns 0) within `ms`.
bool closed_within(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  char c;
  return poll(&p, 1, ms) > 0 && recv(fd, &c, 1, 0) == 0;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A silent connection at rank 0 before rank 1 (a port scanner, a health check) holds nobody up:
// rank 0 admits rank 1 while the stranger says nothing, then closes the stranger's connection.
TEST(TcpHostile, ASilentConnectionDoesNotHoldRankZero) {
  const int port = free_port();
  std::optional<double> sum;
  std::string err;
  std::thread rank0([&] {
    try {
      TcpCommunicator c(0, 2, "127.0.0.1", port, /*timeout_s=*/10);
      sum = c.sum(1.0);
    } catch (const Error& e) {
      err = e.what();
    }
  });
  const int stranger = connect_retry(port);
  ASSERT_GE(stranger, 0);
  std::thread rank1([&] {
    TcpCommunicator c(1, 2, "127.0.0.1", port, 10);
    c.sum(2.0);
  });
  // Rank 0 closes the silent connection once rank 1 has joined; the stranger waits up to 3 s for
  // that (today's bootstrap blocked reading it until it went away, then failed).
  const bool closed = closed_within(stranger, 3000);
  close(stranger);
  rank1.join();
  rank0.join();
  EXPECT_EQ(err, "");
  EXPECT_EQ(sum, 3.0);
  EXPECT_TRUE(closed) << "rank 0 left the silent connection open";
}

// An HTTP client on MASTER_PORT is refused and named; the job forms all the same.
TEST(TcpHostile, AnHttpClientAtRankZeroIsRefusedAndNamed) {
  const int port = free_port();
  std::vector<std::string> refused;
  std::optional<int64_t> sum;
  std::thread rank0([&] {
    TcpCommunicator c(0, 2, "127.0.0.1", port, 10);
    sum = c.sum(int64_t{5});
    refused = c.refused();
  });
  const int stranger = connect_retry(port);
  ASSERT_GE(stranger, 0);
  const char get[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  send(stranger, get, sizeof(get) - 1, MSG_NOSIGNAL);
  EXPECT_TRUE(closed_within(stranger, 5000));  // refused at once
  close(stranger);
  std::thread rank1([&] {
    TcpCommunicator c(1, 2, "127.0.0.1", port, 10);
    c.sum(int64_t{7});
  });
  rank1.join();
  rank0.join();
  EXPECT_EQ(sum, 12);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_HAS(refused[0], "refused a connection from 127.0.0.1:");
  EXPECT_HAS(refused[0], "it is not a verl rank (it sent 'GET /health HTTP/1.1");
}

// A service on MASTER_PORT that answers in kind: rank 1 names it instead of reading its bytes as
// collective sizes.
void serve_once(int lfd, const std::function<void(int)>& reply) {
  const int c = accept(lfd, nullptr, nullptr);
  if (c < 0) return;
  reply(c);
  close(c);
}

TEST(TcpHostile, AnEchoServiceIsNotRankZero) {
  int port = 0;
  const int lfd = listen_any(port);
  std::thread echo([&] {
    serve_once(lfd, [](int c) {
      char buf[256];
      pollfd p{c, POLLIN, 0};
      while (poll(&p, 1, 3000) > 0) {
        const ssize_t r = recv(c, buf, sizeof(buf), 0);
        if (r <= 0) break;
        send(c, buf, static_cast<size_t>(r), MSG_NOSIGNAL);
      }
    });
  });
  const std::string err = error_of([&] { TcpCommunicator c(1, 2, "127.0.0.1", port, 5); });
  echo.join();
  close(lfd);
  EXPECT_HAS(err, "rank 1: MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
                      " is not rank 0 of a verl job: it sent this rank's own hello back (an echo "
                      "service?)");
}

TEST(TcpHostile, AWebServerIsNotRankZero) {
  int port = 0;
  const int lfd = listen_any(port);
  std::thread http([&] {
    serve_once(lfd, [](int c) {
      char buf[256];
      recv(c, buf, sizeof(buf), 0);
      const char answer[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
      send(c, answer, sizeof(answer) - 1, MSG_NOSIGNAL);
    });
  });
  const std::string err = error_of([&] { TcpCommunicator c(1, 2, "127.0.0.1", port, 5); });
  http.join();
  close(lfd);
  EXPECT_HAS(err, "is not rank 0 of a verl job: it answered in HTTP ('HTTP/1.1 400 Bad Request");
}

// A rank of another job on the same port is refused (both sides say which jobs); this job's rank
// then joins.
TEST(TcpHostile, ARankOfAnotherJobIsRefused) {
  const int port = free_port();
  std::vector<std::string> refused;
  std::optional<int64_t> sum;
  std::thread rank0([&] {
    TcpCommunicator c(0, 2, "127.0.0.1", port, 10, "job-a");
    sum = c.sum(int64_t{1});
    refused = c.refused();
  });
  const std::string err =
      error_of([&] { TcpCommunicator c(1, 2, "127.0.0.1", port, 10, "job-b"); });
  std::thread rank1([&] {
    TcpCommunicator c(1, 2, "127.0.0.1", port, 10, "job-a");
    c.sum(int64_t{1});
  });
  rank1.join();
  rank0.join();
  EXPECT_HAS(err, "rank 1: rank 0 at MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) +
                      " belongs to job 'job-a', this rank to job 'job-b': refused");
  EXPECT_EQ(sum, 2);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_HAS(refused[0], "refused rank 1 of 2 of job 'job-b' from 127.0.0.1:");
  EXPECT_HAS(refused[0], "this is job 'job-a'");
}

// Ranks that run different collectives (rank 1 in an all_gather where rank 0 is in an all_reduce)
// or the same one with different counts are caught at the first message and named; before the
// framing, rank 0 read the all_gather's bytes as the all_reduce's, and a count mismatch hung.
TEST(TcpHostile, AStreamOutOfStepIsNamed) {
  const int port = free_port();
  std::string err0, err1;
  auto run = [&](const std::function<void(TcpCommunicator&)>& zero,
                 const std::function<void(TcpCommunicator&)>& one) {
    err0 = err1 = "";
    std::thread t0([&] {
      TcpCommunicator c(0, 2, "127.0.0.1", port, 5);
      c.set_stage("update_actor");
      err0 = error_of([&] { zero(c); });
    });
    std::thread t1([&] {
      TcpCommunicator c(1, 2, "127.0.0.1", port, 5);
      err1 = error_of([&] { one(c); });
    });
    t0.join();
    t1.join();
  };
  run(
      [](TcpCommunicator& c) {
        std::vector<float> x = {1.0f};
        c.all_reduce(std::span<float>(x), ReduceOp::Sum);
      },
      [](TcpCommunicator& c) {
        std::vector<int32_t> mine = {1, 2}, all(4);
        c.all_gather<int32_t>(mine, all);
      });
  EXPECT_HAS(err0,
             "rank 0 of 2: all_reduce in stage 'update_actor': the stream from rank 1 is out of "
             "step: this rank expects message 1 (all_reduce of 4 bytes), rank 1 sent message 1 "
             "(all_gather of 8 bytes)");
  EXPECT_HAS(err1, "rank 0 closed the connection");  // rank 0 stopped; rank 1 is told, not hung
  run(
      [](TcpCommunicator& c) {
        std::vector<double> x(2, 1.0);
        c.all_reduce(std::span<double>(x), ReduceOp::Sum);
      },
      [](TcpCommunicator& c) {
        std::vector<double> x(3, 1.0);
        c.all_reduce(std::span<double>(x), ReduceOp::Sum);
      });
  EXPECT_HAS(err0,
             "this rank expects message 1 (all_reduce of 16 bytes), rank 1 sent message 1 "
             "(all_reduce of 24 bytes)");
}

// Sets environment variables for one scope and restores them.
class Env {
 public:
  Env(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (auto [k, v] : vars) {
      const char* old = std::getenv(k);
      saved_.push_back({k, old ? std::optional<std::string>(old) : std::nullopt});
      if (v)
        setenv(k, v, 1);
      else
        unsetenv(k);
    }
  }
  ~Env() {
    for (auto& [k, v] : saved_) {
      if (v)
        setenv(k.c_str(), v->c_str(), 1);
      else
        unsetenv(k.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

TEST(TcpHostile, LauncherVariablesSaidRight) {
  {
    Env e({{"RANK", "0"},
           {"WORLD_SIZE", nullptr},
           {"OMPI_COMM_WORLD_RANK", nullptr},
           {"PMI_RANK", nullptr},
           {"SLURM_PROCID", nullptr}});
    EXPECT_HAS(error_of([] { detect_launch(); }), "RANK=0 is set but WORLD_SIZE is not");
  }
  {
    Env e({{"RANK", nullptr},
           {"WORLD_SIZE", "2"},
           {"OMPI_COMM_WORLD_RANK", nullptr},
           {"PMI_RANK", nullptr},
           {"SLURM_PROCID", nullptr}});
    EXPECT_HAS(error_of([] { detect_launch(); }), "WORLD_SIZE=2 is set but RANK is not");
  }
  for (const char* bad : {"0", "abc", "70000"}) {
    Env e({{"MASTER_PORT", bad}});
    EXPECT_HAS(error_of([] { master_port(); }),
               "MASTER_PORT='" + std::string(bad) + "' is not a TCP port: a number in 1..65535");
  }
  {
    Env e({{"MASTER_PORT", "29500"}});
    EXPECT_EQ(master_port(), 29500);
  }
  {
    Env e({{"VERL_JOB_ID", nullptr}, {"TORCHELASTIC_RUN_ID", "rdzv-7"}, {"SLURM_JOB_ID", "42"}});
    EXPECT_EQ(job_id(), "rdzv-7");
  }
  {
    Env e({{"VERL_JOB_ID", "mine"}, {"TORCHELASTIC_RUN_ID", "rdzv-7"}});
    EXPECT_EQ(job_id(), "mine");
  }
}

}  // namespace
}  // namespace verl::dist
