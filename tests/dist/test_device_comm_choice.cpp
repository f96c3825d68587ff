// How a GPU run picks its device communicator (dist/launch.h): NCCL where every rank has a GPU of
// its own, the staged communicator where ranks share one (same node and PCI bus id) or NCCL is
// unavailable, VERL_DEVICE_COMM forcing either; and the all-gather of every rank's GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"
#include "dist/launch.h"

namespace verl::dist {
namespace {

DeviceSlot slot(const char* node, const char* bus, int device) {
  return {node, bus, device};
}

TEST(DeviceCommChoice, RanksSharingAGpuAreStaged) {
  const std::vector<DeviceSlot> two = {slot("n0", "0000:19:00.0", 0),
                                       slot("n0", "0000:19:00.0", 0)};
  const DeviceCommChoice c = choose_device_comm(two, true, DeviceComm::Auto);
  EXPECT_TRUE(c.staged);
  EXPECT_EQ(c.reason, "2 ranks share cuda:0");
}

TEST(DeviceCommChoice, OwnGpusGiveNccl) {
  const std::vector<DeviceSlot> four = {
      slot("n0", "0000:19:00.0", 0), slot("n0", "0000:3b:00.0", 1),
      // The same bus id on another node is another GPU.
      slot("n1", "0000:19:00.0", 0), slot("n1", "0000:3b:00.0", 1)};
  const DeviceCommChoice c = choose_device_comm(four, true, DeviceComm::Auto);
  EXPECT_FALSE(c.staged);
  EXPECT_EQ(c.reason, "each of the 4 ranks has a GPU of its own");
}

TEST(DeviceCommChoice, SharingIsFoundByBusIdNotIndex) {
  // Ranks 1-3 see one GPU under different CUDA_VISIBLE_DEVICES indices; the busiest GPU is named
  // by its first rank's index.
  const std::vector<DeviceSlot> s = {slot("n0", "A", 0), slot("n0", "B", 1), slot("n0", "B", 0),
                                     slot("n0", "B", 2)};
  const DeviceCommChoice c = choose_device_comm(s, true, DeviceComm::Auto);
  EXPECT_TRUE(c.staged);
  EXPECT_EQ(c.reason, "3 ranks share cuda:1");
  const std::vector<DeviceSlot> pairs = {slot("n0", "A", 0), slot("n0", "B", 1), slot("n0", "A", 0),
                                         slot("n0", "B", 1)};
  EXPECT_EQ(choose_device_comm(pairs, true, DeviceComm::Auto).reason,
            "ranks share 2 GPUs, up to 2 on one");
}

TEST(DeviceCommChoice, NcclUnavailableIsStaged) {
  const std::vector<DeviceSlot> s = {slot("n0", "A", 0), slot("n0", "B", 1)};
  const DeviceCommChoice c = choose_device_comm(s, false, DeviceComm::Auto);
  EXPECT_TRUE(c.staged);
  EXPECT_EQ(c.reason, "NCCL is unavailable on a rank");
}

TEST(DeviceCommChoice, OverrideForcesABackendOrFailsByName) {
  const std::vector<DeviceSlot> own = {slot("n0", "A", 0), slot("n0", "B", 1)};
  const std::vector<DeviceSlot> shared = {slot("n0", "A", 0), slot("n0", "A", 0)};
  EXPECT_TRUE(choose_device_comm(own, true, DeviceComm::Staged).staged);
  EXPECT_EQ(choose_device_comm(own, true, DeviceComm::Staged).reason, "VERL_DEVICE_COMM=staged");
  EXPECT_FALSE(choose_device_comm(own, true, DeviceComm::Nccl).staged);
  std::string msg;
  try {
    choose_device_comm(shared, true, DeviceComm::Nccl);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("VERL_DEVICE_COMM=nccl, but 2 ranks share cuda:0"), std::string::npos) << msg;
  EXPECT_THROW(choose_device_comm(own, false, DeviceComm::Nccl), Error);
}

TEST(DeviceCommChoice, OverrideIsReadFromTheEnvironment) {
  const char* before = std::getenv("VERL_DEVICE_COMM");
  const std::string saved = before ? before : "";
  setenv("VERL_DEVICE_COMM", "staged", 1);
  EXPECT_EQ(device_comm_from_env(), DeviceComm::Staged);
  setenv("VERL_DEVICE_COMM", "nccl", 1);
  EXPECT_EQ(device_comm_from_env(), DeviceComm::Nccl);
  setenv("VERL_DEVICE_COMM", "auto", 1);
  EXPECT_EQ(device_comm_from_env(), DeviceComm::Auto);
  setenv("VERL_DEVICE_COMM", "mpi", 1);
  EXPECT_THROW(device_comm_from_env(), Error);
  unsetenv("VERL_DEVICE_COMM");
  EXPECT_EQ(device_comm_from_env(), DeviceComm::Auto);
  if (before) setenv("VERL_DEVICE_COMM", saved.c_str(), 1);
}

TEST(DeviceCommChoice, SlotsRoundTripThroughTheGather) {
  SingleProcess comm;
  const std::vector<DeviceSlot> got =
      gather_device_slots(comm, slot("gpu-node-7", "00000000:9A:00.0", 3));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].node, "gpu-node-7");
  EXPECT_EQ(got[0].device_id, "00000000:9A:00.0");
  EXPECT_EQ(got[0].device, 3);
  EXPECT_THROW(gather_device_slots(comm, {std::string(200, 'x'), "A", 0}), Error);
}

}  // namespace
}  // namespace verl::dist
