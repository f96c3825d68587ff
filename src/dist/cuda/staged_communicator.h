// Device collectives staged through pinned host memory: for ranks that share a GPU (NCCL refuses
// two ranks on one device; several processes on one GPU is how multi-rank GPU code is proven on a
// one-GPU machine) and where NCCL is unavailable. A device Place's buffers are copied to a pinned
// staging buffer on place.stream, the same collective runs on the host communicator (MPI or TCP),
// and the result is copied back. Host-only header (no CUDA headers).
#pragma once

#include <memory>

#include "dist/communicator.h"
#include "dist/launch.h"

namespace verl::dist {

// The staged communicator over `host` on the current CUDA device. Host Places go straight to
// `host`. A device collective is complete when the call returns (as the NCCL communicator's
// blocking calls, which wait for theirs); start_* on the device return a collective already
// complete. bf16 reductions run in fp32 on the host (the host communicators move bf16 but do not
// reduce it) and round once to bf16, nearest even. Deadlines are the host communicator's.
std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> host);

// The device communicator of a GPU run (each rank has set its device): every rank gathers every
// rank's GPU (node, PCI bus id) and whether NCCL works over `host`, picks NCCL or the staged
// communicator with choose_device_comm (VERL_DEVICE_COMM overrides), and rank 0 logs the choice
// once ("device collectives: staged through host memory over MPI (2 ranks share cuda:0)").
// `chosen`, when given, receives the choice.
std::unique_ptr<Communicator> make_device_communicator(std::unique_ptr<Communicator> host,
                                                       const LaunchInfo& launch, double timeout_s,
                                                       DeviceCommChoice* chosen = nullptr);

}  // namespace verl::dist
