// The NCCL communicator with one rank (what one GPU allows): device collectives run through NCCL
// and return the one rank's data, in a split's one-rank group too; host buffers go to the host
// communicator it wraps. Several ranks are the multi-GPU issue's runs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "dist/cuda/nccl_communicator.h"
#include "test_util.h"

namespace verl::ops::cuda::test {
namespace {

using NcclCommunicatorTest = CudaTest;

TEST_F(NcclCommunicatorTest, OneRankCollectivesOnDeviceBuffers) {
  auto comm = dist::make_nccl_communicator(std::make_unique<dist::SingleProcess>(), 30.0);
  EXPECT_EQ(comm->world_size(), 1);
  EXPECT_TRUE(comm->distributed());
  const dist::Place dev = dist::Place::device(ctx().stream);
  const std::vector<float> x = {1.5f, -2.0f, 3.25f, 7.0f, 0.0f};
  DeviceBuffer<float> a(x), b(x.size());
  comm->all_reduce(a.data(), x.size(), dist::DataType::F32, dist::ReduceOp::Sum, dev);
  EXPECT_EQ(a.download(), x);
  comm->all_gather(a.data(), b.data(), x.size(), dist::DataType::F32, dev);
  EXPECT_EQ(b.download(), x);
  b.zero(ctx().stream);
  comm->reduce_scatter(a.data(), b.data(), x.size(), dist::DataType::F32, dist::ReduceOp::Max, dev);
  EXPECT_EQ(b.download(), x);
  comm->broadcast(a.data(), x.size(), dist::DataType::F32, 0, dev);
  EXPECT_EQ(a.download(), x);
  b.zero(ctx().stream);
  comm->all_to_all(a.data(), b.data(), x.size(), dist::DataType::F32, dev);
  EXPECT_EQ(b.download(), x);
  // Host buffers go through the host communicator.
  std::vector<double> h = {4.0};
  comm->all_reduce(std::span<double>(h), dist::ReduceOp::Sum);
  EXPECT_EQ(h[0], 4.0);
  EXPECT_DOUBLE_EQ(comm->sum(2.5), 2.5);
}

// A split of the one rank (ncclCommSplit beside the host communicator's split): a one-rank NCCL
// group with the parent's stage whose device and host collectives return the rank's data;
// kNoColor gives nullptr; the parent works after the child is destroyed.
TEST_F(NcclCommunicatorTest, OneRankSplit) {
  auto comm = dist::make_nccl_communicator(std::make_unique<dist::SingleProcess>(), 30.0);
  comm->set_stage("update_actor");
  const dist::Place dev = dist::Place::device(ctx().stream);
  const std::vector<float> x = {0.75f, -4.0f, 9.5f};
  DeviceBuffer<float> a(x), b(x.size());
  {
    std::unique_ptr<dist::Communicator> g = comm->split(/*color=*/2, /*key=*/-1);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->rank(), 0);
    EXPECT_EQ(g->world_size(), 1);
    EXPECT_TRUE(g->distributed());  // NCCL's, not the host's SingleProcess
    EXPECT_EQ(g->stage(), "update_actor");
    EXPECT_EQ(g->describe_rank(), "rank 0 of 1 in group color 2 (world rank 0)");
    g->all_reduce(a.data(), x.size(), dist::DataType::F32, dist::ReduceOp::Sum, dev);
    EXPECT_EQ(a.download(), x);
    g->all_gather(a.data(), b.data(), x.size(), dist::DataType::F32, dev);
    EXPECT_EQ(b.download(), x);
    std::vector<double> h = {3.0};
    g->all_reduce(std::span<double>(h), dist::ReduceOp::Max);
    EXPECT_EQ(h[0], 3.0);
    EXPECT_EQ(comm->split(dist::kNoColor, 0), nullptr);
  }
  b.zero(ctx().stream);
  comm->all_gather(a.data(), b.data(), x.size(), dist::DataType::F32, dev);
  EXPECT_EQ(b.download(), x);
}

}  // namespace
}  // namespace verl::ops::cuda::test
