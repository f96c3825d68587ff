// How this process was launched and the communicator that follows from it. `mpirun` (Open MPI:
// OMPI_COMM_WORLD_*) and Slurm's `srun` through PMI (PMI_RANK / PMI_SIZE, SLURM_PROCID /
// SLURM_NTASKS) give MPI ranks; a process started on its own is one rank (SingleProcess), exactly
// as before data parallelism existed. torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT) without MPI give the TCP communicator (dist/tcp_communicator.h),
// through which rank 0 also hands out NCCL's unique id on GPUs.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace verl::dist {

struct LaunchInfo {
  std::string launcher = "single";  // single | mpirun | srun | torchrun
  int rank = 0, world_size = 1, local_rank = 0;
};

// Reads the launcher's environment variables (never starts MPI). RANK without WORLD_SIZE (or
// WORLD_SIZE > 1 without RANK) is an Error naming both.
LaunchInfo detect_launch();

// The job's identity in the TCP handshake: VERL_JOB_ID, else torchrun's TORCHELASTIC_RUN_ID, else
// Slurm's SLURM_JOB_ID, else "" (the job is then told apart by MASTER_PORT and the world size
// alone). Every rank of a job must see the same one.
std::string job_id();

// MASTER_PORT as a TCP port (1..65535), or -1 when unset; anything else is an Error naming it.
int master_port();

// The communicator for `info`: SingleProcess for one rank, TcpCommunicator for torchrun-style
// variables, MpiCommunicator otherwise, its collectives bounded by `timeout_s`
// (actor_rollout_ref.nccl_timeout).
std::unique_ptr<Communicator> make_communicator(const LaunchInfo& info, double timeout_s);

// Which communicator carries the device collectives of a GPU run: NCCL where every rank has a GPU
// of its own, the staged one (dist/cuda/staged_communicator.h: through pinned host memory over the
// host communicator) where ranks share a GPU, which NCCL refuses, or NCCL is unavailable.
// VERL_DEVICE_COMM=auto|nccl|staged overrides the choice (auto when unset).
enum class DeviceComm { Auto, Nccl, Staged };
DeviceComm device_comm_from_env();

// A rank's GPU: its node (host name), the device's identity there (its PCI bus id, which ranks
// seeing it under different CUDA_VISIBLE_DEVICES indices share) and its index in the process.
struct DeviceSlot {
  std::string node;
  std::string device_id;
  int device = 0;
};

// Every rank's slot, in rank order (an all-gather over `comm`, host buffers).
std::vector<DeviceSlot> gather_device_slots(Communicator& comm, const DeviceSlot& mine);

struct DeviceCommChoice {
  bool staged = false;
  std::string reason;  // for the log line: "2 ranks share cuda:0"
};

// The choice from every rank's slot and whether NCCL works on every rank; the same on every rank
// given the same inputs. `mode` forces a backend; Nccl where ranks share a GPU or NCCL is
// unavailable is an Error naming VERL_DEVICE_COMM.
DeviceCommChoice choose_device_comm(std::span<const DeviceSlot> slots, bool nccl_available,
                                    DeviceComm mode);

}  // namespace verl::dist
