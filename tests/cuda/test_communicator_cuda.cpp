// dist::SingleProcess with device buffers: every collective copies on the given stream and the bits
// come back unchanged (a split's child's too); slices outside an all_to_allv's receive ranges stay
// as they were. Skipped on a machine without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"

namespace verl::dist {
namespace {

void cuda_ok(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
  }
}

// A device allocation of `bytes` bytes, filled from and read back to host vectors.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t bytes) : bytes_(bytes) {
    cuda_ok(cudaMalloc(&ptr_, bytes), "malloc");
  }
  template <class T>
  explicit DeviceBytes(const std::vector<T>& host) : DeviceBytes(host.size() * sizeof(T)) {
    cuda_ok(cudaMemcpy(ptr_, host.data(), bytes_, cudaMemcpyHostToDevice), "upload");
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  ~DeviceBytes() { cudaFree(ptr_); }

  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  template <class T>
  std::vector<T> download() const {
    std::vector<T> host(bytes_ / sizeof(T));
    cuda_ok(cudaMemcpy(host.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), "download");
    return host;
  }

 private:
  size_t bytes_;
  void* ptr_ = nullptr;
};

std::vector<uint8_t> pattern(size_t bytes, uint8_t seed) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(seed + 37 * i + (i >> 3));
  return v;
}

class CudaCommunicator : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      GTEST_SKIP() << "no CUDA device: the device communicator tests run on a GPU machine";
    }
    cuda_ok(cudaStreamCreate(&stream_), "stream");
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  Place place() const { return Place::device(stream_); }
  void sync() const { cuda_ok(cudaStreamSynchronize(stream_), "sync"); }

  cudaStream_t stream_ = nullptr;
  SingleProcess comm_;
};

TEST_F(CudaCommunicator, AllGatherCopiesOddFloatsExactly) {
  const std::vector<float> send = {-0.0f,
                                   1e-40f,
                                   std::numeric_limits<float>::max(),
                                   -std::numeric_limits<float>::infinity(),
                                   std::nanf("0x123"),
                                   1.0f / 3.0f,
                                   -7.25f};
  DeviceBytes d_send(send), d_recv(std::vector<float>(7, 42.0f));
  comm_.all_gather(d_send.as<float>(), d_recv.as<float>(), 7, DataType::F32, place());
  sync();
  const std::vector<float> got = d_recv.download<float>();
  EXPECT_EQ(std::memcmp(got.data(), send.data(), 7 * sizeof(float)), 0);
}

// A split's one-rank child copies device buffers as its parent does.
TEST_F(CudaCommunicator, SplitChildCopiesDeviceBuffers) {
  const std::unique_ptr<Communicator> g = comm_.split(/*color=*/0, /*key=*/0);
  ASSERT_NE(g, nullptr);
  const std::vector<uint8_t> send = pattern(23 * 2, 11);
  DeviceBytes d_send(send), d_recv(std::vector<uint8_t>(send.size(), 0));
  g->all_gather(d_send.as<void>(), d_recv.as<void>(), 23, DataType::BF16, place());
  sync();
  EXPECT_EQ(d_recv.download<uint8_t>(), send);
}

TEST_F(CudaCommunicator, ReduceScatterOfFiveInt64AndTypedSpans) {
  const std::vector<int64_t> send = {std::numeric_limits<int64_t>::min(), -1, 0, int64_t{1} << 53,
                                     std::numeric_limits<int64_t>::max()};
  DeviceBytes d_send(send), d_recv(std::vector<int64_t>(5, 99));
  comm_.reduce_scatter(d_send.as<int64_t>(), d_recv.as<int64_t>(), 5, DataType::I64, ReduceOp::Sum,
                       place());
  sync();
  EXPECT_EQ(d_recv.download<int64_t>(), send);

  // The typed wrappers take spans over device memory too.
  DeviceBytes d_typed(std::vector<int64_t>(5, 99));
  comm_.reduce_scatter<int64_t>(std::span<const int64_t>(d_send.as<int64_t>(), 5),
                                std::span<int64_t>(d_typed.as<int64_t>(), 5), ReduceOp::Max,
                                place());
  sync();
  EXPECT_EQ(d_typed.download<int64_t>(), send);
}

TEST_F(CudaCommunicator, AllToAllEveryTypeAndInPlaceCalls) {
  constexpr DataType types[] = {DataType::F32, DataType::F64,  DataType::I32,
                                DataType::I64, DataType::BF16, DataType::U8};
  for (DataType t : types) {
    const std::vector<uint8_t> send = pattern(19 * data_type_size(t), 3);
    DeviceBytes d_send(send), d_recv(std::vector<uint8_t>(send.size(), 0x5A));
    comm_.all_to_all(d_send.as<void>(), d_recv.as<void>(), 19, t, place());
    sync();
    EXPECT_EQ(d_recv.download<uint8_t>(), send) << to_string(t);

    // In place: no copy, no error, the data is unchanged.
    void* p = d_recv.as<void>();
    comm_.all_to_all(p, p, 19, t, place());
    comm_.all_gather(p, p, 19, t, place());
    comm_.reduce_scatter(p, p, 19, t, ReduceOp::Sum, place());
    comm_.all_reduce(p, 19, t, ReduceOp::Max, place());
    comm_.broadcast(p, 19, t, 0, place());
    sync();
    EXPECT_EQ(d_recv.download<uint8_t>(), send) << to_string(t) << " in place";
  }
}

TEST_F(CudaCommunicator, AllToAllvMovesTheSliceAndLeavesTheRest) {
  std::vector<float> send(10);
  for (int i = 0; i < 10; ++i) send[i] = 0.5f + i;
  DeviceBytes d_send(send), d_recv(std::vector<float>(8, -1.0f));
  const size_t counts[] = {4}, send_displs[] = {3}, recv_displs[] = {2};
  comm_.all_to_allv(d_send.as<float>(), counts, send_displs, d_recv.as<float>(), counts,
                    recv_displs, DataType::F32, place());
  sync();
  EXPECT_EQ(d_recv.download<float>(), (std::vector<float>{-1, -1, 3.5f, 4.5f, 5.5f, 6.5f, -1, -1}));
}

TEST_F(CudaCommunicator, DefaultStreamWorks) {
  const std::vector<int32_t> send = {151643, -1, 0};
  DeviceBytes d_send(send), d_recv(std::vector<int32_t>(3, 7));
  comm_.all_gather(d_send.as<int32_t>(), d_recv.as<int32_t>(), 3, DataType::I32,
                   Place::device(nullptr));
  cuda_ok(cudaDeviceSynchronize(), "sync");
  EXPECT_EQ(d_recv.download<int32_t>(), send);
}

// cudaMemcpyAsync does not allow overlapping ranges, so SingleProcess refuses them on the device.
TEST_F(CudaCommunicator, OverlappingDeviceRangesAreAnError) {
  DeviceBytes d(std::vector<float>(8, 1.0f));
  const size_t counts[] = {4}, send_displs[] = {0}, recv_displs[] = {2};
  try {
    comm_.all_to_allv(d.as<float>(), counts, send_displs, d.as<float>(), counts, recv_displs,
                      DataType::F32, place());
    FAIL() << "overlapping device ranges were accepted";
  } catch (const verl::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("all_to_allv"), std::string::npos) << msg;
    EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace verl::dist
