// The process's communicator and GPU for the tests with several ranks on one GPU: the local
// rank's device (round robin, so ranks share it), a stream of its own, and the staged
// communicator over MPI. One instance for every test file of test_cuda_mpi; destroyed at exit,
// which finalises MPI.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "dist/cuda/staged_communicator.h"
#include "dist/launch.h"
#include "dist/mpi_communicator.h"

namespace verl::dist {

inline void cuda_ok(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

struct World {
  World() {
    int n = 0;
    gpus = cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
    if (gpus > 0) {
      cuda_ok(cudaSetDevice(detect_launch().local_rank % gpus), "set device");
      cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    }
    comm = make_staged_communicator(std::make_unique<MpiCommunicator>(/*timeout_s=*/60));
  }
  int gpus = 0;
  cudaStream_t stream = nullptr;
  std::unique_ptr<Communicator> comm;
};

inline World& world() {
  static World w;
  return w;
}
inline Communicator& comm() {
  return *world().comm;
}
inline Place dev() {
  return Place::device(world().stream);
}

}  // namespace verl::dist

#define SKIP_WITHOUT_GPU() \
  if (::verl::dist::world().gpus == 0) GTEST_SKIP() << "no CUDA device"
