// The NCCL communicator: device-buffer collectives between the GPUs of the ranks (gradients,
// later ZeRO's shards), beside a host communicator (MPI, or SingleProcess for one rank) that
// bootstraps it (rank 0's ncclUniqueId is broadcast over it) and keeps carrying the host buffers
// (token counts, metrics). A Place on the device runs on NCCL, a host Place on the host
// communicator, so the trainer holds one communicator for both. Every device collective is waited
// for with the actor_rollout_ref.nccl_timeout deadline: past it the communicator is aborted and
// the job ends naming the stage. split() splits the host communicator and the NCCL one
// (ncclCommSplit, NCCL >= 2.18) together. Host-only header (no CUDA or NCCL headers).
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace verl::dist {

// Creates the NCCL communicator over `host`'s ranks on the current CUDA device (each rank sets its
// device from its local rank first). Sets NCCL_NVLS_ENABLE=0 unless the environment sets it.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host,
                                                     double timeout_s);

}  // namespace verl::dist
