#include "dist/launch.h"

#include <cstdlib>
#include <string>

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
  take(info, "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK");
  return info;
}

std::unique_ptr<Communicator> make_communicator(const LaunchInfo& info, double timeout_s) {
  if (info.world_size == 1) return std::make_unique<SingleProcess>();
  if (info.launcher == "torchrun") {
    const char* addr = std::getenv("MASTER_ADDR");
    const int port = env_int("MASTER_PORT");
    VERL_CHECK(addr != nullptr && *addr != '\0' && port > 0,
               "launched with torchrun-style variables (RANK={}, WORLD_SIZE={}) but MASTER_ADDR / "
               "MASTER_PORT are not set: rank 0's address and a free port, the same on every rank",
               info.rank, info.world_size);
    return std::make_unique<TcpCommunicator>(info.rank, info.world_size, addr, port, timeout_s);
  }
  auto comm = std::make_unique<MpiCommunicator>(timeout_s);
  VERL_CHECK(comm->rank() == info.rank && comm->world_size() == info.world_size,
             "{} says rank {} of {}, MPI says rank {} of {}", info.launcher, info.rank,
             info.world_size, comm->rank(), comm->world_size());
  return comm;
}

}  // namespace verl::dist
