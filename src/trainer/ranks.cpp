#include "trainer/ranks.h"

#include "core/error.h"
#include "core/log.h"
#include "dist/agreement.h"
#include "dist/launch.h"
#ifdef VERL_HAVE_CUDA
#include "dist/cuda/staged_communicator.h"
#endif

namespace verl::trainer {

std::unique_ptr<dist::Communicator> start_ranks(const config::Config& cfg, Device device,
                                                double timeout_s) {
  const dist::LaunchInfo launch = dist::detect_launch();
  std::unique_ptr<dist::Communicator> comm = dist::make_communicator(launch, timeout_s);
  // Before anything is loaded: a rank with another lr, seed or batch size stops the job here.
  dist::check_same_on_every_rank(*comm, cfg.rank_comparable_values(), "configuration check");
  if (device == Device::Cuda && launch.launcher != "single") {
    const int gpus = cuda_device_count();
    VERL_CHECK(gpus > 0, "{}: local rank {} is on a node without a GPU", launch.launcher,
               launch.local_rank);
    // More ranks than GPUs share them round robin; their device collectives are then staged
    // through host memory, since NCCL refuses two ranks on one GPU.
    cuda_set_device(launch.local_rank % gpus);
#ifdef VERL_HAVE_CUDA
    comm = dist::make_device_communicator(std::move(comm), launch, timeout_s);
#endif
  }
  const int world = comm->world_size();
  const int64_t nnodes = cfg.get<int64_t>("trainer.nnodes"),
                per_node = cfg.get<int64_t>("trainer.n_gpus_per_node");
  const int64_t asked = nnodes * per_node;
  const bool set = cfg.origin("trainer.nnodes") != "defaults" ||
                   cfg.origin("trainer.n_gpus_per_node") != "defaults";
  if (world > 1) {
    VERL_CHECK(asked == world,
               "trainer.nnodes ({}) x trainer.n_gpus_per_node ({}) = {} ranks, but the launcher "
               "started {}; set "
               "them to match (e.g. trainer.nnodes=1 trainer.n_gpus_per_node={})",
               nnodes, per_node, asked, world, world);
  } else if (set && asked > 1) {
    log::warn(
        "trainer.nnodes={} x trainer.n_gpus_per_node={} asks for {} ranks, but no launcher started "
        "any: this "
        "run uses one process (start {} with mpirun or torchrun, docs/distributed.md)",
        nnodes, per_node, asked, asked);
  }
  return comm;
}

}  // namespace verl::trainer
