// How this process was launched and the communicator that follows from it. `mpirun` (Open MPI:
// OMPI_COMM_WORLD_*) and Slurm's `srun` through PMI (PMI_RANK / PMI_SIZE, SLURM_PROCID /
// SLURM_NTASKS) give MPI ranks; a process started on its own is one rank (SingleProcess), exactly
// as before data parallelism existed. torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT) without MPI give the TCP communicator (dist/tcp_communicator.h),
// through which rank 0 also hands out NCCL's unique id on GPUs.
#pragma once

#include <memory>
#include <string>

#include "dist/communicator.h"

namespace verl::dist {

struct LaunchInfo {
  std::string launcher = "single";  // single | mpirun | srun | torchrun
  int rank = 0, world_size = 1, local_rank = 0;
};

// Reads the launcher's environment variables (never starts MPI).
LaunchInfo detect_launch();

// The communicator for `info`: SingleProcess for one rank, TcpCommunicator for torchrun-style
// variables, MpiCommunicator otherwise, its collectives bounded by `timeout_s`
// (actor_rollout_ref.nccl_timeout).
std::unique_ptr<Communicator> make_communicator(const LaunchInfo& info, double timeout_s);

}  // namespace verl::dist
