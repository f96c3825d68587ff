#include "dist/tcp_communicator.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "core/error.h"
#include "dist/deadline.h"

namespace verl::dist {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The first IPv4 address of `addr` (a name or a dotted quad).
sockaddr_in resolve(const std::string& addr, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(addr.c_str(), nullptr, &hints, &res);
  VERL_CHECK(rc == 0 && res != nullptr, "MASTER_ADDR='{}': cannot resolve it ({})", addr,
             gai_strerror(rc));
  sockaddr_in out = *reinterpret_cast<const sockaddr_in*>(res->ai_addr);
  freeaddrinfo(res);
  out.sin_port = htons(static_cast<uint16_t>(port));
  return out;
}

void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one,
             sizeof(one));  // small control messages go out at once
}

template <typename T>
void reduce_into(T* acc, const T* x, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    switch (op) {
      case ReduceOp::Sum:
        acc[i] += x[i];
        break;
      case ReduceOp::Max:
        acc[i] = acc[i] < x[i] ? x[i] : acc[i];
        break;
      case ReduceOp::Min:
        acc[i] = x[i] < acc[i] ? x[i] : acc[i];
        break;
    }
  }
}

void reduce_typed(void* acc, const void* x, size_t n, DataType t, ReduceOp op) {
  switch (t) {
    case DataType::F32:
      return reduce_into(static_cast<float*>(acc), static_cast<const float*>(x), n, op);
    case DataType::F64:
      return reduce_into(static_cast<double*>(acc), static_cast<const double*>(x), n, op);
    case DataType::I32:
      return reduce_into(static_cast<int32_t*>(acc), static_cast<const int32_t*>(x), n, op);
    case DataType::I64:
      return reduce_into(static_cast<int64_t*>(acc), static_cast<const int64_t*>(x), n, op);
    case DataType::U8:
      return reduce_into(static_cast<uint8_t*>(acc), static_cast<const uint8_t*>(x), n, op);
    case DataType::BF16:
      break;
  }
  VERL_FAIL("TCP all_reduce: {} reductions are not supported on the host", to_string(t));
}

// A socket closed when it goes out of scope, unless released.
class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// A socket listening on `port` of every interface (0: a port the system picks), or -1 (errno
// says why).
int listen_on(int port, int backlog) {
  Socket s(socket(AF_INET, SOCK_STREAM, 0));
  if (s.get() < 0) return -1;
  int one = 1;
  setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_ANY);  // peers may use any route to this host
  any.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(s.get(), reinterpret_cast<const sockaddr*>(&any), sizeof(any)) != 0 ||
      listen(s.get(), backlog) != 0) {
    const int err = errno;  // close() must not replace it
    close(s.release());
    errno = err;
    return -1;
  }
  return s.release();
}

// Why forming a star failed; empty when it did not. `timed_out` tells a peer that never came from
// one that said something wrong.
struct JoinError {
  std::string why;
  bool timed_out = false;
};

// The hub's side of forming a star: accepts fds.size() - 1 connections on `lfd` until
// `timeout_s` after `start`; each peer says hello {its rank, the world size} and its socket goes
// to fds[rank].
JoinError accept_peers(int lfd, int port, std::vector<int>& fds, double timeout_s,
                       Clock::time_point start) {
  const int world = static_cast<int>(fds.size());
  for (int joined = 1; joined < world;) {
    pollfd p{lfd, POLLIN, 0};
    const double left = timeout_s - seconds_since(start);
    if (left <= 0 || poll(&p, 1, static_cast<int>(left * 1000) + 1) <= 0) {
      return {fmt::format("{} of {} ranks connected to port {} within {:g} s "
                          "(actor_rollout_ref.nccl_timeout)",
                          joined - 1, world - 1, port, timeout_s),
              true};
    }
    Socket c(accept(lfd, nullptr, nullptr));
    if (c.get() < 0) continue;
    tune(c.get());
    int32_t hello[2] = {-1, -1};  // the peer's rank and world size
    size_t got = 0;
    while (got < sizeof(hello)) {
      const ssize_t r =
          ::recv(c.get(), reinterpret_cast<char*>(hello) + got, sizeof(hello) - got, 0);
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    if (got != sizeof(hello) || hello[1] != world || hello[0] <= 0 || hello[0] >= world ||
        fds[hello[0]] >= 0) {
      return {
          fmt::format("a peer on port {} says it is rank {} of {}, but this job has {} ranks "
                      "(or that rank joined twice)",
                      port, hello[0], hello[1], world)};
    }
    fds[hello[0]] = c.release();
    ++joined;
  }
  return {};
}

// A peer's side: a connection to `where`, retried until `timeout_s` after `start` (the hub may not
// listen yet), or -1.
int connect_to(const sockaddr_in& where, double timeout_s, Clock::time_point start) {
  for (;;) {
    Socket c(socket(AF_INET, SOCK_STREAM, 0));
    VERL_CHECK(c.get() >= 0, "TCP bootstrap: socket: {}", std::strerror(errno));
    if (connect(c.get(), reinterpret_cast<const sockaddr*>(&where), sizeof(where)) == 0) {
      tune(c.get());
      return c.release();
    }
    if (seconds_since(start) >= timeout_s) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

TcpCommunicator::TcpCommunicator(int rank, int world_size, const std::string& addr, int port,
                                 double timeout_s)
    : rank_(rank),
      world_(world_size),
      timeout_s_(timeout_s),
      fds_(static_cast<size_t>(world_size), -1) {
  VERL_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "TCP bootstrap: rank {} of {}",
             rank, world_size);
  VERL_CHECK(port > 0 && port < 65536, "MASTER_PORT={} is not a TCP port", port);
  VERL_CHECK(timeout_s > 0, "actor_rollout_ref.nccl_timeout must be > 0 seconds, got {}",
             timeout_s);
  if (world_ == 1) return;
  const sockaddr_in where = resolve(addr, port);
  const auto start = Clock::now();
  if (rank_ == 0) {
    const Socket lfd(listen_on(port, world_));
    VERL_CHECK(lfd.get() >= 0,
               "rank 0 cannot listen on MASTER_PORT={}: {} (another job on this port?)", port,
               std::strerror(errno));
    const JoinError e = accept_peers(lfd.get(), port, fds_, timeout_s_, start);
    VERL_CHECK(
        e.why.empty(), "rank 0: {}{}", e.why,
        e.timed_out ? "; check RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT on every rank" : "");
  } else {
    fds_[0] = connect_to(where, timeout_s_, start);
    VERL_CHECK(fds_[0] >= 0,
               "rank {}: cannot reach rank 0 at MASTER_ADDR={} MASTER_PORT={} within {:g} s "
               "(actor_rollout_ref.nccl_timeout)",
               rank_, addr, port, timeout_s_);
    const int32_t hello[2] = {rank_, world_};
    send_bytes(0, hello, sizeof(hello), "bootstrap");
  }
  barrier();  // every rank is connected before the first collective
}

TcpCommunicator::TcpCommunicator(int rank, int world_size, double timeout_s)
    : rank_(rank),
      world_(world_size),
      timeout_s_(timeout_s),
      fds_(static_cast<size_t>(world_size), -1) {}

std::unique_ptr<Communicator> TcpCommunicator::split_impl(const SplitGroup& g) {
  // The group's rank 0 is its hub, as in every TCP communicator: it listens on a port the system
  // picks, and this communicator carries the address to the members (no port to configure).
  const int size = static_cast<int>(g.members.size());
  const bool hub = g.rank == 0 && size > 1;
  const Socket lfd(hub ? listen_on(0, size) : -1);
  int64_t mine[2] = {0, 0};  // the hub's IPv4 address and port (host byte order); port 0: none
  std::string listen_error;
  if (hub) {
    sockaddr_in a{};
    socklen_t len = sizeof(a);
    if (lfd.get() < 0 || getsockname(lfd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      listen_error = std::strerror(errno);
    } else {
      mine[0] = local_address();
      mine[1] = ntohs(a.sin_port);
    }
  }
  // Every rank takes part, so a hub that cannot listen fails its members too, not by a timeout.
  std::vector<int64_t> all(2 * static_cast<size_t>(world_));
  all_gather(mine, all.data(), 2, DataType::I64);
  VERL_CHECK(listen_error.empty(), "split on {}: group color {} cannot listen: {}", describe_rank(),
             g.color, listen_error);
  if (g.color == kNoColor) return nullptr;

  // The child closes what it holds if forming it fails part way.
  std::unique_ptr<TcpCommunicator> child(new TcpCommunicator(g.rank, size, timeout_s_));
  if (size == 1) return child;
  const int hub_rank = g.members[0];
  const int port = static_cast<int>(all[2 * hub_rank + 1]);
  VERL_CHECK(port > 0, "split on {}: group color {}: its rank 0 (here {}) could not listen",
             describe_rank(), g.color, describe_peer(hub_rank));
  const auto start = Clock::now();
  if (hub) {
    const JoinError e = accept_peers(lfd.get(), port, child->fds_, timeout_s_, start);
    VERL_CHECK(e.why.empty(), "split on {}: group color {} ({} ranks): {}", describe_rank(),
               g.color, size, e.why);
  } else {
    sockaddr_in where{};
    where.sin_family = AF_INET;
    where.sin_addr.s_addr = htonl(static_cast<uint32_t>(all[2 * hub_rank]));
    where.sin_port = htons(static_cast<uint16_t>(port));
    child->fds_[0] = connect_to(where, timeout_s_, start);
    VERL_CHECK(child->fds_[0] >= 0,
               "split on {}: group color {} ({} ranks): cannot reach its rank 0 (here {}) at port "
               "{} within {:g} s (actor_rollout_ref.nccl_timeout)",
               describe_rank(), g.color, size, describe_peer(hub_rank), port, timeout_s_);
    const int32_t hello[2] = {g.rank, size};
    child->send_bytes(0, hello, sizeof(hello), "split");
  }
  child->barrier();  // every member is connected before the first collective
  return child;
}

uint32_t TcpCommunicator::local_address() const {
  // Rank 0 of a star is reached at the address its peers connected to; another rank at the one
  // its connection to rank 0 leaves from.
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  VERL_CHECK(getsockname(fd(rank_ == 0 ? 1 : 0), reinterpret_cast<sockaddr*>(&a), &len) == 0,
             "TCP: {}: getsockname: {}", describe_rank(), std::strerror(errno));
  return ntohl(a.sin_addr.s_addr);
}

TcpCommunicator::~TcpCommunicator() {
  for (int f : fds_)
    if (f >= 0) close(f);
}

int TcpCommunicator::fd(int peer) const {
  VERL_CHECK(peer >= 0 && peer < world_ && fds_[peer] >= 0,
             "TCP: rank {} has no connection to rank {}", rank_, peer);
  return fds_[peer];
}

void TcpCommunicator::send_bytes(int peer, const void* data, size_t n, const char* what) {
  const int f = fd(peer);
  const char* p = static_cast<const char*>(data);
  const auto start = Clock::now();
  while (n > 0) {
    pollfd pf{f, POLLOUT, 0};
    const double left = timeout_s_ - seconds_since(start);
    const int ready = left > 0 ? poll(&pf, 1, static_cast<int>(left * 1000) + 1) : 0;
    if (ready == 0) {
      report_timeout(describe_rank(), what, stage(), timeout_s_);
      std::_Exit(3);  // the peers see the connection close and stop too
    }
    const ssize_t w = ::send(f, p, n, MSG_NOSIGNAL);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    VERL_CHECK(w > 0, "{}: {} in stage '{}': {} closed the connection ({}): it died or failed",
               describe_rank(), what, stage(), describe_peer(peer), std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void TcpCommunicator::recv_bytes(int peer, void* data, size_t n, const char* what) {
  const int f = fd(peer);
  char* p = static_cast<char*>(data);
  const auto start = Clock::now();
  while (n > 0) {
    pollfd pf{f, POLLIN, 0};
    const double left = timeout_s_ - seconds_since(start);
    const int ready = left > 0 ? poll(&pf, 1, static_cast<int>(left * 1000) + 1) : 0;
    if (ready == 0) {
      report_timeout(describe_rank(), what, stage(), timeout_s_);
      std::_Exit(3);
    }
    const ssize_t r = ::recv(f, p, n, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    VERL_CHECK(r > 0, "{}: {} in stage '{}': {} closed the connection: it died or failed",
               describe_rank(), what, stage(), describe_peer(peer));
    p += r;
    n -= static_cast<size_t>(r);
  }
}

void TcpCommunicator::host_only(Place place, const char* what) const {
  VERL_CHECK(!place.on_device(),
             "TCP {}: the TCP communicator moves host buffers; device buffers go through "
             "the NCCL communicator",
             what);
}

void TcpCommunicator::fan_out(void* data, size_t bytes, const char* what) {
  if (rank_ == 0) {
    for (int r = 1; r < world_; ++r) send_bytes(r, data, bytes, what);
  } else {
    recv_bytes(0, data, bytes, what);
  }
}

void TcpCommunicator::barrier() {
  uint8_t token = 0;
  all_reduce_impl(&token, 1, DataType::U8, ReduceOp::Max, Place::host());
}

void TcpCommunicator::all_reduce_impl(void* data, size_t count, DataType type, ReduceOp op,
                                      Place place) {
  host_only(place, "all_reduce");
  if (world_ == 1 || count == 0) return;
  const size_t bytes = count * data_type_size(type);
  if (rank_ == 0) {
    // Rank order: ((r0 op r1) op r2) ..., the same sum on every run.
    std::vector<char> x(bytes);
    for (int r = 1; r < world_; ++r) {
      recv_bytes(r, x.data(), bytes, "all_reduce");
      reduce_typed(data, x.data(), count, type, op);
    }
  } else {
    send_bytes(0, data, bytes, "all_reduce");
  }
  fan_out(data, bytes, "all_reduce");
}

void TcpCommunicator::reduce_scatter_impl(const void* send, void* recv, size_t recv_count,
                                          DataType type, ReduceOp op, Place place) {
  host_only(place, "reduce_scatter");
  const size_t bytes = recv_count * data_type_size(type);
  std::vector<char> all(static_cast<const char*>(send),
                        static_cast<const char*>(send) + bytes * world_);
  all_reduce_impl(all.data(), recv_count * world_, type, op, place);
  std::memcpy(recv, all.data() + bytes * rank_, bytes);
}

void TcpCommunicator::all_gather_impl(const void* send, void* recv, size_t send_count,
                                      DataType type, Place place) {
  host_only(place, "all_gather");
  const size_t bytes = send_count * data_type_size(type);
  char* out = static_cast<char*>(recv);
  std::memmove(out + bytes * rank_, send, bytes);  // in place when send is already there
  if (world_ == 1) return;
  if (rank_ == 0) {
    for (int r = 1; r < world_; ++r) recv_bytes(r, out + bytes * r, bytes, "all_gather");
  } else {
    send_bytes(0, out + bytes * rank_, bytes, "all_gather");
  }
  fan_out(out, bytes * world_, "all_gather");
}

void TcpCommunicator::broadcast_impl(void* data, size_t count, DataType type, int root,
                                     Place place) {
  host_only(place, "broadcast");
  if (world_ == 1) return;
  const size_t bytes = count * data_type_size(type);
  if (root != 0) {  // the root's data reaches rank 0 first
    if (rank_ == root) send_bytes(0, data, bytes, "broadcast");
    if (rank_ == 0) recv_bytes(root, data, bytes, "broadcast");
  }
  if (rank_ == 0) {
    for (int r = 1; r < world_; ++r)
      if (r != root) send_bytes(r, data, bytes, "broadcast");
  } else if (rank_ != root) {
    recv_bytes(0, data, bytes, "broadcast");
  }
}

void TcpCommunicator::all_to_all_impl(const void* send, void* recv, size_t count_per_rank,
                                      DataType type, Place place) {
  std::vector<size_t> counts(static_cast<size_t>(world_), count_per_rank),
      displs(static_cast<size_t>(world_));
  for (int r = 0; r < world_; ++r) displs[r] = count_per_rank * r;
  all_to_allv_impl(send, counts, displs, recv, counts, displs, type, place);
}

void TcpCommunicator::all_to_allv_impl(const void* send, std::span<const size_t> send_counts,
                                       std::span<const size_t> send_displs, void* recv,
                                       std::span<const size_t> recv_counts,
                                       std::span<const size_t> recv_displs, DataType type,
                                       Place place) {
  host_only(place, "all_to_allv");
  const size_t size = data_type_size(type);
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  VERL_CHECK(send_counts[rank_] == recv_counts[rank_],
             "all_to_allv: rank {} sends {} elements to itself but "
             "expects {}",
             rank_, send_counts[rank_], recv_counts[rank_]);
  if (send_counts[rank_] > 0)
    std::memcpy(out + recv_displs[rank_] * size, in + send_displs[rank_] * size,
                send_counts[rank_] * size);
  if (world_ == 1) return;
  if (rank_ != 0) {
    // To rank 0: the counts, then every block for another rank; from rank 0: every block for us.
    std::vector<uint64_t> counts(send_counts.begin(), send_counts.end());
    send_bytes(0, counts.data(), counts.size() * sizeof(uint64_t), "all_to_allv");
    for (int j = 0; j < world_; ++j)
      if (j != rank_)
        send_bytes(0, in + send_displs[j] * size, send_counts[j] * size, "all_to_allv");
    for (int s = 0; s < world_; ++s)
      if (s != rank_)
        recv_bytes(0, out + recv_displs[s] * size, recv_counts[s] * size, "all_to_allv");
    return;
  }
  // Rank 0 routes: block [s][j] of every sender s goes to j (its own blocks to j directly).
  std::vector<std::vector<std::vector<char>>> blocks(
      static_cast<size_t>(world_), std::vector<std::vector<char>>(static_cast<size_t>(world_)));
  for (int s = 1; s < world_; ++s) {
    std::vector<uint64_t> counts(static_cast<size_t>(world_));
    recv_bytes(s, counts.data(), counts.size() * sizeof(uint64_t), "all_to_allv");
    for (int j = 0; j < world_; ++j) {
      if (j == s) continue;
      blocks[s][j].resize(counts[j] * size);
      recv_bytes(s, blocks[s][j].data(), blocks[s][j].size(), "all_to_allv");
    }
    VERL_CHECK(counts[0] == recv_counts[s],
               "all_to_allv: rank {} sends {} elements to rank 0, which expects {}", s, counts[0],
               recv_counts[s]);
    if (counts[0] > 0)
      std::memcpy(out + recv_displs[s] * size, blocks[s][0].data(), counts[0] * size);
  }
  for (int j = 1; j < world_; ++j)
    for (int s = 0; s < world_; ++s) {
      if (s == j) continue;
      if (s == 0) {
        send_bytes(j, in + send_displs[j] * size, send_counts[j] * size, "all_to_allv");
      } else {
        send_bytes(j, blocks[s][j].data(), blocks[s][j].size(), "all_to_allv");
      }
    }
}

}  // namespace verl::dist
