#include "dist/launch.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>

#include "core/error.h"
#include "dist/mpi_communicator.h"
#include "dist/tcp_communicator.h"

namespace verl::dist {
namespace {

// The integer value of environment variable `name`, or -1 when unset.
int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  VERL_CHECK(end != v && *end == '\0' && x >= 0 && x < (1 << 24),
             "environment variable {}='{}' is not a rank or a count", name, v);
  return static_cast<int>(x);
}

bool take(LaunchInfo& info, const char* launcher, const char* rank, const char* size,
          const char* local_rank) {
  const int r = env_int(rank), n = env_int(size);
  if (r < 0 || n < 0) return false;
  VERL_CHECK(n >= 1 && r < n, "{}: {}={} is not a rank of {}={}", launcher, rank, r, size, n);
  info.launcher = launcher;
  info.rank = r;
  info.world_size = n;
  const int lr = local_rank ? env_int(local_rank) : -1;
  info.local_rank = lr >= 0 ? lr : 0;
  return true;
}

}  // namespace

LaunchInfo detect_launch() {
  LaunchInfo info;
  if (take(info, "mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
           "OMPI_COMM_WORLD_LOCAL_RANK")) {
    return info;
  }
  if (take(info, "srun", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID") ||
      take(info, "srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")) {
    return info;
  }
  // One of the pair alone is a launch script's slip, not a single process: say so rather than run
  // one process where several were meant (WORLD_SIZE=1 alone is one process either way).
  const int rank = env_int("RANK"), world = env_int("WORLD_SIZE");
  VERL_CHECK(!(rank >= 0 && world < 0),
             "RANK={} is set but WORLD_SIZE is not: a torchrun-style launch sets both (and "
             "MASTER_ADDR, MASTER_PORT); unset RANK to run one process",
             rank);
  VERL_CHECK(!(world > 1 && rank < 0),
             "WORLD_SIZE={} is set but RANK is not: a torchrun-style launch sets both (and "
             "MASTER_ADDR, MASTER_PORT); unset WORLD_SIZE to run one process",
             world);
  take(info, "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK");
  return info;
}

std::string job_id() {
  for (const char* name : {"VERL_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"}) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    const std::string id = v;
    VERL_CHECK(id.size() <= 31,
               "{}='{}' is over 31 characters; the TCP handshake carries the job "
               "id in 31 (set VERL_JOB_ID to a shorter one)",
               name, id);
    return id;
  }
  return "";
}

int master_port() {
  const char* v = std::getenv("MASTER_PORT");
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  VERL_CHECK(end != v && *end == '\0' && x >= 1 && x <= 65535,
             "MASTER_PORT='{}' is not a TCP port: a number in 1..65535, free on rank 0's host (0 "
             "would let the system pick one, which the other ranks could not know)",
             v);
  return static_cast<int>(x);
}

std::unique_ptr<Communicator> make_communicator(const LaunchInfo& info, double timeout_s) {
  if (info.world_size == 1) return std::make_unique<SingleProcess>();
  if (info.launcher == "torchrun") {
    const char* addr = std::getenv("MASTER_ADDR");
    const int port = master_port();
    VERL_CHECK(addr != nullptr && *addr != '\0' && port > 0,
               "launched with torchrun-style variables (RANK={}, WORLD_SIZE={}) but {} not set: "
               "rank 0's address and a free port, the same on every rank",
               info.rank, info.world_size,
               addr == nullptr || *addr == '\0'
                   ? (port > 0 ? "MASTER_ADDR is" : "MASTER_ADDR / MASTER_PORT are")
                   : "MASTER_PORT is");
    return std::make_unique<TcpCommunicator>(info.rank, info.world_size, addr, port, timeout_s,
                                             job_id());
  }
  auto comm = std::make_unique<MpiCommunicator>(timeout_s);
  VERL_CHECK(comm->rank() == info.rank && comm->world_size() == info.world_size,
             "{} says rank {} of {}, MPI says rank {} of {}", info.launcher, info.rank,
             info.world_size, comm->rank(), comm->world_size());
  return comm;
}

DeviceComm device_comm_from_env() {
  const char* v = std::getenv("VERL_DEVICE_COMM");
  const std::string s = v ? v : "";
  if (s.empty() || s == "auto") return DeviceComm::Auto;
  if (s == "nccl") return DeviceComm::Nccl;
  if (s == "staged") return DeviceComm::Staged;
  VERL_FAIL("VERL_DEVICE_COMM='{}' is not auto, nccl or staged", s);
}

std::vector<DeviceSlot> gather_device_slots(Communicator& comm, const DeviceSlot& mine) {
  // Fixed-size records (node, device id and index, each ended by a NUL) keep it one all-gather.
  constexpr size_t kRecord = 160;
  const std::string text =
      mine.node + '\0' + mine.device_id + '\0' + std::to_string(mine.device) + '\0';
  VERL_CHECK(text.size() <= kRecord, "device slot of node '{}' device '{}' is over {} bytes",
             mine.node, mine.device_id, kRecord);
  std::vector<uint8_t> send(kRecord, 0), recv(kRecord * static_cast<size_t>(comm.world_size()));
  std::memcpy(send.data(), text.data(), text.size());
  comm.all_gather<uint8_t>(send, recv);
  std::vector<DeviceSlot> slots(static_cast<size_t>(comm.world_size()));
  for (size_t r = 0; r < slots.size(); ++r) {
    const char* p = reinterpret_cast<const char*>(recv.data()) + r * kRecord;
    slots[r].node = p;
    p += slots[r].node.size() + 1;
    slots[r].device_id = p;
    p += slots[r].device_id.size() + 1;
    slots[r].device = std::atoi(p);
  }
  return slots;
}

DeviceCommChoice choose_device_comm(std::span<const DeviceSlot> slots, bool nccl_available,
                                    DeviceComm mode) {
  // The ranks on each physical GPU, found by (node, device identity).
  std::map<std::pair<std::string, std::string>, std::vector<size_t>> users;
  for (size_t r = 0; r < slots.size(); ++r) users[{slots[r].node, slots[r].device_id}].push_back(r);
  size_t shared = 0, most = 1;
  int most_device = 0;
  for (const auto& [gpu, ranks] : users) {
    if (ranks.size() < 2) continue;
    ++shared;
    if (ranks.size() > most) {
      most = ranks.size();
      most_device = slots[ranks.front()].device;
    }
  }
  std::string sharing;
  if (shared == 1) sharing = fmt::format("{} ranks share cuda:{}", most, most_device);
  if (shared > 1) sharing = fmt::format("ranks share {} GPUs, up to {} on one", shared, most);
  switch (mode) {
    case DeviceComm::Staged:
      return {true, sharing.empty() ? "VERL_DEVICE_COMM=staged"
                                    : fmt::format("VERL_DEVICE_COMM=staged; {}", sharing)};
    case DeviceComm::Nccl:
      VERL_CHECK(sharing.empty(),
                 "VERL_DEVICE_COMM=nccl, but {}: NCCL refuses two ranks on one GPU; unset "
                 "VERL_DEVICE_COMM (or set it to staged) to stage device collectives through host "
                 "memory",
                 sharing);
      VERL_CHECK(nccl_available,
                 "VERL_DEVICE_COMM=nccl, but NCCL is unavailable on a rank; unset "
                 "VERL_DEVICE_COMM (or set it to staged)");
      return {false, "VERL_DEVICE_COMM=nccl"};
    case DeviceComm::Auto:
      break;
  }
  if (!sharing.empty()) return {true, sharing};
  if (!nccl_available) return {true, "NCCL is unavailable on a rank"};
  return {false, fmt::format("each of the {} ranks has a GPU of its own", slots.size())};
}

}  // namespace verl::dist
