// The data-parallel ranks of a training run (`verl train`, `verl sft`): the communicator that the
// launcher implies (dist/launch.h), on GPUs each rank on its local rank's device with NCCL for the
// device collectives, and the check that the launcher started the ranks the config asks for.
#pragma once

#include <cstdint>
#include <memory>

#include "core/device.h"
#include "dist/communicator.h"

namespace verl::trainer {

struct RankRequest {
  Device device = Device::Cpu;
  double timeout_s = 600;       // bound of each collective
  int64_t nnodes = 1, gpus_per_node = 1;  // trainer.nnodes, trainer.n_gpus_per_node
  bool counts_set = false;      // either was set by the user (not the defaults)
};

// With more than one rank, nnodes x gpus_per_node must equal the ranks started (an error naming
// both keys); with one process, counts that ask for more log a warning (no launcher started them).
std::unique_ptr<dist::Communicator> start_ranks(const RankRequest& req);

}  // namespace verl::trainer
