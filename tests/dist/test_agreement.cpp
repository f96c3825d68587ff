// The check that every rank holds the same configuration (dist/agreement.h), on three TCP ranks as
// threads: equal values pass; a value that differs on one rank fails every rank, naming the key
// and each rank's value.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "dist/agreement.h"
#include "dist/tcp_communicator.h"

namespace verl::dist {
namespace {

int free_port() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  close(s);
  return ntohs(a.sin_port);
}

using Items = std::vector<std::pair<std::string, std::string>>;

// Each of three ranks checks items_of(rank); returns each rank's error ("" when none).
std::vector<std::string> check_on_three(const std::function<Items(int)>& items_of) {
  const int port = free_port();
  std::vector<std::string> errors(3);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      TcpCommunicator c(r, 3, "127.0.0.1", port, 10);
      try {
        check_same_on_every_rank(c, items_of(r), "configuration check");
      } catch (const Error& e) {
        errors[r] = e.what();
      }
      c.barrier();  // the communicator still works after a failed check
    });
  }
  for (auto& t : ranks) t.join();
  return errors;
}

TEST(RankAgreement, EqualValuesPass) {
  const auto errors = check_on_three([](int) {
    return Items{{"actor_rollout_ref.actor.optim.lr", "1e-06"}, {"data.seed", "1"}};
  });
  EXPECT_EQ(errors, std::vector<std::string>(3));
}

TEST(RankAgreement, DifferingKeysAreNamedWithEveryRanksValue) {
  const auto errors = check_on_three([](int r) {
    return Items{{"actor_rollout_ref.actor.optim.lr", r == 1 ? "2e-06" : "1e-06"},
                 {"actor_rollout_ref.rollout.n", "4"},
                 {"data.seed", r == 2 ? "7" : "1"}};
  });
  for (int r = 0; r < 3; ++r) {
    const std::string& e = errors[r];
    EXPECT_NE(e.find("configuration check: the ranks differ in 2 keys"), std::string::npos) << e;
    EXPECT_NE(e.find("actor_rollout_ref.actor.optim.lr: 1e-06 on rank 0, 2e-06 on rank 1, 1e-06 "
                     "on rank 2"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("data.seed: 1 on rank 0, 1 on rank 1, 7 on rank 2"), std::string::npos) << e;
    EXPECT_EQ(e.find("rollout.n"), std::string::npos) << e;  // equal everywhere: not named
  }
}

TEST(RankAgreement, AnotherBuildsKeyListIsNamed) {
  const auto errors = check_on_three([](int r) {
    Items items = {{"a", "1"}};
    if (r == 2) items.push_back({"b", "2"});
    return items;
  });
  EXPECT_NE(errors[0].find("the ranks list between 1 and 2 keys"), std::string::npos) << errors[0];
}

}  // namespace
}  // namespace verl::dist
