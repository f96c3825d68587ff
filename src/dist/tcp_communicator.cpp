#include "dist/tcp_communicator.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <utility>

#include "core/error.h"
#include "core/log.h"
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

// The bootstrap's two messages, 64 bytes each. A peer says who it is (Hello, kRankMagic); the hub
// answers with its verdict (kHubMagic): a different magic each way, so that a service echoing the
// hello back is told from rank 0. `job` names the job (dist/launch.h's job_id), `session` is rank
// 0's nonce, which a split's members carry so that its hub admits only ranks of this job.
constexpr char kRankMagic[8] = {'v', 'e', 'r', 'l', 'r', 'a', 'n', 'k'};
constexpr char kHubMagic[8] = {'v', 'e', 'r', 'l', '-', 'h', 'u', 'b'};
constexpr uint32_t kProtocolVersion = 2;  // 2: the handshake and the framed collective stream

struct Hello {
  char magic[8];
  uint32_t version;
  int32_t rank, world;
  uint32_t status;  // the hub's verdict (Verdict); 0 in a peer's hello
  uint64_t session;
  char job[32];
};
static_assert(sizeof(Hello) == 64);

enum Verdict : uint32_t { kAdmitted = 0, kOtherJob, kOtherVersion, kOtherWorld, kBadRank };

Hello make_hello(const char (&magic)[8], int rank, int world, uint64_t session,
                 const std::string& job) {
  Hello h{};
  std::memcpy(h.magic, magic, sizeof(h.magic));
  h.version = kProtocolVersion;
  h.rank = rank;
  h.world = world;
  h.session = session;
  std::memcpy(h.job, job.data(), std::min(job.size(), sizeof(h.job) - 1));
  return h;
}

std::string job_text(const Hello& h) {
  const std::string j(h.job, strnlen(h.job, sizeof(h.job)));
  return j.empty() ? "(no job id)" : "'" + j + "'";
}

// The first bytes a stranger sent, printable, for the message that names it.
std::string shown_bytes(const char* p, size_t n) {
  std::string out;
  for (size_t i = 0; i < std::min<size_t>(n, 24); ++i) {
    const unsigned char c = static_cast<unsigned char>(p[i]);
    out += c >= 32 && c < 127 ? static_cast<char>(c) : '.';
  }
  return out;
}

std::string peer_address(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "an unknown address";
  char ip[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &a.sin_addr, ip, sizeof(ip));
  return fmt::format("{}:{}", ip, ntohs(a.sin_port));
}

// Why forming a star failed; empty when it did not. `timed_out` tells a peer that never came from
// one that said something wrong.
struct JoinError {
  std::string why;
  bool timed_out = false;
};

// A connection to the hub that has not said who it is yet.
struct Caller {
  int fd;
  std::string from;
  Hello hello{};
  size_t got = 0;
};

// The hub's side of forming a star: accepts connections on `lfd` until fds.size() - 1 ranks of
// this job have said hello or `timeout_s` after `start` has passed; each admitted rank's socket
// goes to fds[rank]. Connections are read side by side, so a silent one (a port scanner, a health
// check) holds nobody up; a stranger (not verl's hello) or a rank of another job (its job id or
// session differs) is refused, named in `refused`, and the hub waits on. A rank of this job that
// cannot belong (another world size, protocol version or a rank taken twice) fails the bootstrap.
JoinError accept_peers(int lfd, int port, std::vector<int>& fds, double timeout_s,
                       Clock::time_point start, const std::string& job, uint64_t session,
                       uint64_t welcome_session, std::vector<std::string>& refused) {
  const int world = static_cast<int>(fds.size());
  std::vector<Caller> callers;
  auto close_callers = [&] {
    for (auto& c : callers) close(c.fd);
  };
  auto refuse = [&](const std::string& why) {
    refused.push_back(why);
    log::warn("rank 0: {}", why);
  };
  auto answer = [&](Caller& c, Verdict v) {
    Hello h = make_hello(kHubMagic, 0, world, welcome_session, job);
    h.status = v;
    ::send(c.fd, &h, sizeof(h), MSG_NOSIGNAL);  // best effort: a peer that left learns nothing
  };
  for (int joined = 1; joined < world;) {
    const double left = timeout_s - seconds_since(start);
    std::vector<pollfd> p{{lfd, POLLIN, 0}};
    for (const auto& c : callers) p.push_back({c.fd, POLLIN, 0});
    if (left <= 0 || poll(p.data(), p.size(), static_cast<int>(left * 1000) + 1) <= 0) {
      const std::string silent =
          callers.empty()
              ? ""
              : fmt::format("; {} connection{} said nothing ({}): not ranks of this job",
                            callers.size(), callers.size() == 1 ? "" : "s", callers[0].from);
      close_callers();
      return {fmt::format("{} of {} ranks connected to port {} within {:g} s "
                          "(actor_rollout_ref.nccl_timeout){}",
                          joined - 1, world - 1, port, timeout_s, silent),
              true};
    }
    // Read what callers sent, newest first so that erasing keeps the indices of the rest.
    for (size_t i = callers.size(); i-- > 0;) {
      if (!(p[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Caller& c = callers[i];
      char* buf = reinterpret_cast<char*>(&c.hello);
      const ssize_t r = ::recv(c.fd, buf + c.got, sizeof(Hello) - c.got, 0);
      if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      std::string why;
      if (r <= 0) {
        why = c.got == 0 ? fmt::format(
                               "a connection from {} to port {} closed without a word (a "
                               "port scanner or health check?); ignored",
                               c.from, port)
                         : fmt::format(
                               "a connection from {} to port {} closed after {} bytes "
                               "('{}'): not a verl rank; ignored",
                               c.from, port, c.got, shown_bytes(buf, c.got));
      } else {
        c.got += static_cast<size_t>(r);
        const size_t head = std::min(c.got, sizeof(kRankMagic));
        if (std::memcmp(buf, kRankMagic, head) != 0) {
          why = fmt::format(
              "refused a connection from {} to port {}: it is not a verl rank (it "
              "sent '{}')",
              c.from, port, shown_bytes(buf, c.got));
        } else if (c.got < sizeof(Hello)) {
          continue;  // the rest of the hello is on its way
        }
      }
      if (why.empty()) {
        const Hello& h = c.hello;
        const std::string mine = job.empty() ? "(no job id)" : "'" + job + "'";
        if (h.version != kProtocolVersion) {
          answer(c, kOtherVersion);
          close_callers();
          return {
              fmt::format("rank {} (from {}) speaks bootstrap protocol {}, this binary {}: "
                          "every rank must run the same verl build",
                          h.rank, c.from, h.version, kProtocolVersion)};
        }
        if (job_text(h) != mine || h.session != session) {
          answer(c, kOtherJob);
          why = fmt::format(
              "refused rank {} of {} of job {} from {}: this is job {} (two jobs on "
              "port {}? give each its own MASTER_PORT or VERL_JOB_ID)",
              h.rank, h.world, job_text(h), c.from, mine, port);
        } else if (h.world != world) {
          answer(c, kOtherWorld);
          close_callers();
          return {
              fmt::format("a rank from {} says it is rank {} of {}, but this job has {} ranks "
                          "(WORLD_SIZE differs between ranks)",
                          c.from, h.rank, h.world, world)};
        } else if (h.rank <= 0 || h.rank >= world || fds[h.rank] >= 0) {
          answer(c, kBadRank);
          close_callers();
          return {
              fmt::format("a rank from {} says it is rank {} of {}: {} (RANK must be unique, "
                          "1..{} on the other ranks)",
                          c.from, h.rank, world,
                          h.rank > 0 && h.rank < world ? "that rank joined twice"
                                                       : "not a rank of another process",
                          world - 1)};
        } else {
          answer(c, kAdmitted);
          fds[h.rank] = c.fd;
          ++joined;
          callers.erase(callers.begin() + static_cast<std::ptrdiff_t>(i));
          continue;
        }
      }
      refuse(why);
      close(c.fd);
      callers.erase(callers.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (p[0].revents & POLLIN) {
      const int c = accept(lfd, nullptr, nullptr);
      if (c >= 0) {
        tune(c);
        callers.push_back({c, peer_address(c)});
      }
    }
  }
  close_callers();  // silent ones left when every rank has come: not ours
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

// A peer's side of the handshake on connected socket `fd`: its hello, then the hub's verdict, read
// within `timeout_s` after `start`. Returns the session nonce of the admitting hub; anything else
// (silence, an echo, an HTTP answer, a refusal) is an Error naming `hub` (where this rank called).
uint64_t greet_hub(int fd, int rank, int world, uint64_t session, const std::string& job,
                   const std::string& hub, double timeout_s, Clock::time_point start) {
  const Hello mine = make_hello(kRankMagic, rank, world, session, job);
  VERL_CHECK(::send(fd, &mine, sizeof(mine), MSG_NOSIGNAL) == sizeof(mine),
             "rank {}: {} closed the connection before the handshake ({})", rank, hub,
             std::strerror(errno));
  Hello h{};
  char* buf = reinterpret_cast<char*>(&h);
  size_t got = 0;
  while (got < sizeof(h)) {
    pollfd p{fd, POLLIN, 0};
    const double left = timeout_s - seconds_since(start);
    VERL_CHECK(left > 0 && poll(&p, 1, static_cast<int>(left * 1000) + 1) > 0,
               "rank {}: {} accepted the connection but sent no verl reply within {:g} s "
               "(actor_rollout_ref.nccl_timeout){}: is it rank 0 of this job?",
               rank, hub, timeout_s, got ? fmt::format(" (only '{}')", shown_bytes(buf, got)) : "");
    const ssize_t r = ::recv(fd, buf + got, sizeof(h) - got, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  if (got < sizeof(h) || std::memcmp(h.magic, kHubMagic, sizeof(h.magic)) != 0) {
    std::string what;
    if (got == 0) {
      what = "closed the connection without a reply";
    } else if (std::memcmp(buf, kRankMagic, std::min(got, sizeof(kRankMagic))) == 0) {
      what = "sent this rank's own hello back (an echo service?)";
    } else if (got >= 4 && std::memcmp(buf, "HTTP", 4) == 0) {
      what = fmt::format("answered in HTTP ('{}'): a web server", shown_bytes(buf, got));
    } else {
      what = fmt::format("answered '{}', which is not verl's handshake", shown_bytes(buf, got));
    }
    VERL_FAIL(
        "rank {}: {} is not rank 0 of a verl job: it {}; check MASTER_ADDR / MASTER_PORT "
        "(rank 0's address and a port free there)",
        rank, hub, what);
  }
  switch (static_cast<Verdict>(h.status)) {
    case kAdmitted:
      return h.session;
    case kOtherJob:
      VERL_FAIL(
          "rank {}: rank 0 at {} belongs to job {}, this rank to job {}: refused (two jobs "
          "on one MASTER_PORT? give each its own port or VERL_JOB_ID)",
          rank, hub, job_text(h), job.empty() ? "(no job id)" : "'" + job + "'");
    case kOtherVersion:
      VERL_FAIL(
          "rank {}: rank 0 at {} runs bootstrap protocol {}, this rank {}: every rank must "
          "run the same verl build",
          rank, hub, h.version, kProtocolVersion);
    case kOtherWorld:
      VERL_FAIL(
          "rank {}: rank 0 at {} has {} ranks, this rank was started as one of {} "
          "(WORLD_SIZE differs between ranks)",
          rank, hub, h.world, world);
    case kBadRank:
      VERL_FAIL(
          "rank {}: rank 0 at {} refused this rank: another process joined as rank {} "
          "(RANK must be unique)",
          rank, hub, rank);
  }
  VERL_FAIL("rank {}: rank 0 at {} answered with verdict {}, unknown to this build", rank, hub,
            h.status);
}

// A nonce for rank 0's session: what tells this run's ranks from another's on a split's port.
uint64_t make_session() {
  std::random_device rd;
  const uint64_t t = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  return (static_cast<uint64_t>(rd()) << 32 ^ rd()) ^ t ^ (static_cast<uint64_t>(getpid()) << 16);
}

// Per-message frame of the collective stream: a marker, the collective (kOps), a sequence number
// per direction of a connection and the payload's length. 16 bytes against payloads of counts and
// gradients: a stream out of step (ranks in different collectives, a stranger's bytes) is caught
// at the first message, and named, instead of read as sizes and data.
constexpr uint16_t kFrameMarker = 0x7672;  // "vr"
struct Frame {
  uint16_t marker;
  uint16_t op;
  uint32_t seq;
  uint64_t bytes;
};
static_assert(sizeof(Frame) == 16);

constexpr const char* kOps[] = {"?",         "bootstrap",   "all_reduce", "all_gather",
                                "broadcast", "all_to_allv", "split"};

uint16_t op_code(const char* what) {
  for (uint16_t i = 1; i < std::size(kOps); ++i)
    if (std::strcmp(kOps[i], what) == 0) return i;
  return 0;
}

const char* op_name(uint16_t op) {
  return op < std::size(kOps) ? kOps[op] : "?";
}

}  // namespace

TcpCommunicator::TcpCommunicator(int rank, int world_size, const std::string& addr, int port,
                                 double timeout_s, std::string job_id)
    : rank_(rank),
      world_(world_size),
      timeout_s_(timeout_s),
      job_(std::move(job_id)),
      fds_(static_cast<size_t>(world_size), -1),
      send_seq_(static_cast<size_t>(world_size), 0),
      recv_seq_(static_cast<size_t>(world_size), 0) {
  VERL_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "TCP bootstrap: rank {} of {}",
             rank, world_size);
  VERL_CHECK(port > 0 && port < 65536, "MASTER_PORT={} is not a TCP port (1..65535)", port);
  VERL_CHECK(timeout_s > 0, "actor_rollout_ref.nccl_timeout must be > 0 seconds, got {}",
             timeout_s);
  VERL_CHECK(job_.size() < sizeof(Hello::job), "job id '{}' is over {} characters", job_,
             sizeof(Hello::job) - 1);
  if (world_ == 1) return;
  try {
    join(addr, port);
  } catch (...) {
    for (int& f : fds_) {  // the destructor does not run for a constructor that throws
      if (f >= 0) close(f);
      f = -1;
    }
    throw;
  }
}

void TcpCommunicator::join(const std::string& addr, int port) {
  const sockaddr_in where = resolve(addr, port);
  const auto start = Clock::now();
  if (rank_ == 0) {
    session_ = make_session();
    const Socket lfd(listen_on(port, world_));
    VERL_CHECK(lfd.get() >= 0,
               "rank 0 cannot listen on MASTER_PORT={}: {} (another job on this port?)", port,
               std::strerror(errno));
    const JoinError e =
        accept_peers(lfd.get(), port, fds_, timeout_s_, start, job_, 0, session_, refused_);
    VERL_CHECK(
        e.why.empty(), "rank 0: {}{}", e.why,
        e.timed_out ? "; check RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT on every rank" : "");
  } else {
    fds_[0] = connect_to(where, timeout_s_, start);
    VERL_CHECK(fds_[0] >= 0,
               "rank {}: cannot reach rank 0 at MASTER_ADDR={} MASTER_PORT={} within {:g} s "
               "(actor_rollout_ref.nccl_timeout)",
               rank_, addr, port, timeout_s_);
    session_ =
        greet_hub(fds_[0], rank_, world_, 0, job_,
                  fmt::format("MASTER_ADDR={} MASTER_PORT={}", addr, port), timeout_s_, start);
  }
  barrier();  // every rank is connected before the first collective
}

TcpCommunicator::TcpCommunicator(int rank, int world_size, double timeout_s, std::string job_id,
                                 uint64_t session)
    : rank_(rank),
      world_(world_size),
      timeout_s_(timeout_s),
      job_(std::move(job_id)),
      session_(session),
      fds_(static_cast<size_t>(world_size), -1),
      send_seq_(static_cast<size_t>(world_size), 0),
      recv_seq_(static_cast<size_t>(world_size), 0) {}

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
  std::unique_ptr<TcpCommunicator> child(
      new TcpCommunicator(g.rank, size, timeout_s_, job_, session_));
  if (size == 1) return child;
  const int hub_rank = g.members[0];
  const int port = static_cast<int>(all[2 * hub_rank + 1]);
  VERL_CHECK(port > 0, "split on {}: group color {}: its rank 0 (here {}) could not listen",
             describe_rank(), g.color, describe_peer(hub_rank));
  const auto start = Clock::now();
  if (hub) {
    const JoinError e = accept_peers(lfd.get(), port, child->fds_, timeout_s_, start, job_,
                                     session_, session_, child->refused_);
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
    greet_hub(child->fds_[0], g.rank, size, session_, job_,
              fmt::format("its rank 0 ({}) at port {}", describe_peer(hub_rank), port), timeout_s_,
              start);
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

void TcpCommunicator::send_raw(int peer, const void* data, size_t n, int flags, const char* what) {
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
    const ssize_t w = ::send(f, p, n, MSG_NOSIGNAL | flags);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    VERL_CHECK(w > 0, "{}: {} in stage '{}': {} closed the connection ({}): it died or failed",
               describe_rank(), what, stage(), describe_peer(peer), std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void TcpCommunicator::recv_raw(int peer, void* data, size_t n, const char* what) {
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

void TcpCommunicator::send_bytes(int peer, const void* data, size_t n, const char* what) {
  const Frame h{kFrameMarker, op_code(what), send_seq_[peer]++, n};
  // MSG_MORE holds the frame back until its payload follows: one segment for small messages.
  send_raw(peer, &h, sizeof(h), n > 0 ? MSG_MORE : 0, what);
  if (n > 0) send_raw(peer, data, n, 0, what);
}

void TcpCommunicator::recv_bytes(int peer, void* data, size_t n, const char* what) {
  Frame h{};
  recv_raw(peer, &h, sizeof(h), what);
  const uint32_t want = recv_seq_[peer]++;
  VERL_CHECK(h.marker == kFrameMarker,
             "{}: {} in stage '{}': the stream from {} holds bytes that are not a verl message "
             "('{}'): a stranger on the connection, or a rank of another build",
             describe_rank(), what, stage(), describe_peer(peer),
             shown_bytes(reinterpret_cast<const char*>(&h), sizeof(h)));
  VERL_CHECK(h.seq == want && h.op == op_code(what) && h.bytes == n,
             "{}: {} in stage '{}': the stream from {} is out of step: this rank expects message "
             "{} ({} of {} bytes), {} sent message {} ({} of {} bytes); the ranks run different "
             "collectives here (a configuration that differs between ranks?)",
             describe_rank(), what, stage(), describe_peer(peer), want, what, n,
             describe_peer(peer), h.seq, op_name(h.op), h.bytes);
  if (n > 0) recv_raw(peer, data, n, what);
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
