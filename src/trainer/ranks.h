// The data-parallel ranks of a training run (`verl train`, `verl sft`): the communicator that the
// launcher implies (dist/launch.h), on GPUs each rank on its local rank's device (round robin when
// ranks outnumber GPUs) with NCCL or, where ranks share a GPU, the staged communicator for the
// device collectives (dist/cuda/staged_communicator.h), and the check that the launcher started
// the ranks the config asks for.
#pragma once

#include <memory>

#include "config/config.h"
#include "core/device.h"
#include "dist/communicator.h"

namespace verl::trainer {

// The ranks of a run on `device`, each collective bounded by `timeout_s`. With more than one rank,
// cfg's trainer.nnodes x trainer.n_gpus_per_node must equal the ranks started (an Error naming both
// keys); with one process, counts the user set that ask for more log a warning (no launcher
// started them).
std::unique_ptr<dist::Communicator> start_ranks(const config::Config& cfg, Device device,
                                                double timeout_s);

}  // namespace verl::trainer
