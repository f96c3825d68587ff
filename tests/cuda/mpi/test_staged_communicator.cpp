// The staged communicator with several ranks on ONE GPU (each its own CUDA context): every
// collective of the Communicator interface on device buffers gives the same bits as the same
// collective on host buffers (MPI), bf16 reductions give fp32 sums rounded once, splits stage
// their group's collectives, and the automatic choice stages when ranks share the GPU. Run under
//   mpirun --allow-run-as-root --oversubscribe -np 2 test_cuda_mpi   (ctest: cuda_mpi.staged)
// Every rank runs every test in the same order, so the collectives pair up. Skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "dist/cuda/staged_communicator.h"
#include "dist/launch.h"
#include "dist/mpi_communicator.h"
#include "world.h"

namespace verl::dist {
namespace {

// A device copy of a host vector, read back whole.
template <class T>
class DeviceVec {
 public:
  explicit DeviceVec(const std::vector<T>& host) : n_(host.size()) {
    cuda_ok(cudaMalloc(&ptr_, std::max<size_t>(n_, 1) * sizeof(T)), "malloc");
    cuda_ok(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "upload");
    // A copy from pageable memory may still be in flight on return, and the collectives' stream
    // does not wait for the default stream (it is non-blocking).
    cuda_ok(cudaDeviceSynchronize(), "upload sync");
  }
  DeviceVec(const DeviceVec&) = delete;
  DeviceVec& operator=(const DeviceVec&) = delete;
  ~DeviceVec() { cudaFree(ptr_); }
  T* data() const { return ptr_; }
  std::vector<T> download() const {
    cuda_ok(cudaDeviceSynchronize(), "sync");
    std::vector<T> host(n_);
    cuda_ok(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return host;
  }

 private:
  size_t n_;
  T* ptr_ = nullptr;
};

// Values that differ by rank and element, with fractions (f32/f64) and signs.
template <class T>
std::vector<T> values(size_t n, int rank, int salt = 0) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) {
    const double x = std::sin(0.37 * static_cast<double>(i) + 1.3 * rank + salt) * 1000.0;
    if constexpr (std::is_floating_point_v<T>) {
      v[i] = static_cast<T>(x / 7.0);
    } else if constexpr (std::is_same_v<T, uint8_t>) {
      v[i] = static_cast<T>((i * 31 + static_cast<size_t>(rank) * 7 + salt) & 0xff);
    } else {
      v[i] = static_cast<T>(std::llround(x)) * (rank + 1);
    }
  }
  return v;
}

// bf16 bits of values small enough that any four of them sum exactly in fp32.
std::vector<uint16_t> bf16_values(size_t n, int rank) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = f32_to_bf16(static_cast<float>(1.37 * (rank + 1) + 0.013 * i - 2.0));
  return v;
}

template <class T>
void expect_all_reduce_matches_host(size_t n, ReduceOp op) {
  const int r = comm().rank();
  std::vector<T> host = values<T>(n, r);
  DeviceVec<T> d(host);
  comm().all_reduce(std::span<T>(host), op);
  comm().all_reduce(std::span<T>(d.data(), n), op, dev());
  EXPECT_EQ(d.download(), host) << to_string(data_type_of<T>()) << " op " << static_cast<int>(op);
}

TEST(Staged, RunsWithSeveralRanks) {
  SKIP_WITHOUT_GPU();
  EXPECT_GE(comm().world_size(), 2) << "run this under mpirun -np 2";
  EXPECT_TRUE(comm().distributed());
}

TEST(Staged, AllReduceEqualsHost) {
  SKIP_WITHOUT_GPU();
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
    expect_all_reduce_matches_host<float>(1037, op);
    expect_all_reduce_matches_host<double>(257, op);
    expect_all_reduce_matches_host<int32_t>(19, op);
    expect_all_reduce_matches_host<int64_t>(7, op);
  }
  // Past the first staging buffer (1 MiB), which then grows.
  expect_all_reduce_matches_host<float>((size_t{1} << 20) + 3, ReduceOp::Sum);
  // The sum itself, not only host = device: element 5 over every rank.
  const int n = comm().world_size();
  std::vector<double> x = values<double>(9, comm().rank());
  DeviceVec<double> d(x);
  comm().all_reduce(std::span<double>(d.data(), 9), ReduceOp::Sum, dev());
  double want = 0;
  for (int j = 0; j < n; ++j) want += values<double>(9, j)[5];
  EXPECT_NEAR(d.download()[5], want, 1e-9 * std::abs(want) + 1e-12);
}

TEST(Staged, Bf16ReductionsAreFp32RoundedOnce) {
  SKIP_WITHOUT_GPU();
  const int n = comm().world_size(), r = comm().rank();
  const size_t count = 301;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
    DeviceVec<uint16_t> d(bf16_values(count, r));
    comm().all_reduce(d.data(), count, DataType::BF16, op, dev());
    const std::vector<uint16_t> got = d.download();
    for (size_t i = 0; i < count; ++i) {
      float acc = op == ReduceOp::Sum ? 0.0f : -INFINITY;
      for (int j = 0; j < n; ++j) {
        const float x = bf16_to_f32(bf16_values(count, j)[i]);
        acc = op == ReduceOp::Sum ? acc + x : std::max(acc, x);
      }
      ASSERT_EQ(got[i], f32_to_bf16(acc)) << "element " << i << " op " << static_cast<int>(op);
    }
  }
  // reduce_scatter: rank r gets block r's sum.
  const size_t block = 13;
  std::vector<std::vector<uint16_t>> sends;
  for (int j = 0; j < n; ++j) sends.push_back(bf16_values(block * n, j));
  DeviceVec<uint16_t> send(sends[r]), recv(std::vector<uint16_t>(block, 0));
  comm().reduce_scatter(send.data(), recv.data(), block, DataType::BF16, ReduceOp::Sum, dev());
  const std::vector<uint16_t> got = recv.download();
  for (size_t i = 0; i < block; ++i) {
    float acc = 0.0f;
    for (int j = 0; j < n; ++j) acc += bf16_to_f32(sends[j][r * block + i]);
    EXPECT_EQ(got[i], f32_to_bf16(acc)) << "element " << i;
  }
}

TEST(Staged, ReduceScatterEqualsHost) {
  SKIP_WITHOUT_GPU();
  const int n = comm().world_size(), r = comm().rank();
  const size_t block = 37;
  const std::vector<float> send = values<float>(block * n, r);
  std::vector<float> host(block);
  comm().reduce_scatter<float>(send, host, ReduceOp::Sum);
  DeviceVec<float> d_send(send), d_recv(std::vector<float>(block, -1.0f));
  comm().reduce_scatter(d_send.data(), d_recv.data(), block, DataType::F32, ReduceOp::Sum, dev());
  EXPECT_EQ(d_recv.download(), host);
  // In place (recv is this rank's block of send): the block becomes the result.
  comm().reduce_scatter(d_send.data(), d_send.data() + r * block, block, DataType::F32,
                        ReduceOp::Sum, dev());
  const std::vector<float> after = d_send.download();
  EXPECT_EQ(std::vector<float>(after.begin() + r * block, after.begin() + (r + 1) * block), host);
  const std::vector<int64_t> isend = values<int64_t>(3 * n, r);
  std::vector<int64_t> ihost(3);
  comm().reduce_scatter<int64_t>(isend, ihost, ReduceOp::Max);
  DeviceVec<int64_t> di_send(isend), di_recv(std::vector<int64_t>(3, 0));
  comm().reduce_scatter(di_send.data(), di_recv.data(), 3, DataType::I64, ReduceOp::Max, dev());
  EXPECT_EQ(di_recv.download(), ihost);
}

TEST(Staged, AllGatherEqualsHost) {
  SKIP_WITHOUT_GPU();
  const int n = comm().world_size(), r = comm().rank();
  const std::vector<uint8_t> send = values<uint8_t>(19, r);
  std::vector<uint8_t> host(19 * n);
  comm().all_gather<uint8_t>(send, host);
  DeviceVec<uint8_t> d_send(send), d_recv(std::vector<uint8_t>(19 * n, 0));
  comm().all_gather(d_send.data(), d_recv.data(), 19, DataType::U8, dev());
  EXPECT_EQ(d_recv.download(), host);
  // In place: this rank's block of recv is its send.
  const std::vector<float> mine = values<float>(5, r);
  std::vector<float> whole(5 * n, 0.0f), fhost(5 * n);
  std::copy(mine.begin(), mine.end(), whole.begin() + r * 5);
  comm().all_gather<float>(mine, fhost);
  DeviceVec<float> d_whole(whole);
  comm().all_gather(d_whole.data() + r * 5, d_whole.data(), 5, DataType::F32, dev());
  EXPECT_EQ(d_whole.download(), fhost);
}

// Rank j contributes 3 + 2j elements at displacement 4j + j(j+1): gaps stay untouched.
TEST(Staged, AllGatherVEqualsHostAndLeavesGaps) {
  SKIP_WITHOUT_GPU();
  const int n = comm().world_size(), r = comm().rank();
  std::vector<size_t> counts(n), displs(n);
  for (int j = 0; j < n; ++j) {
    counts[j] = 3 + 2 * j;
    displs[j] = 4 * j + j * (j + 1);
  }
  const size_t total = displs[n - 1] + counts[n - 1] + 2;
  const std::vector<double> send = values<double>(counts[r], r, 5);
  std::vector<double> host(total, -7.5);
  comm().all_gather_v(send.data(), host.data(), counts, displs, DataType::F64);
  DeviceVec<double> d_send(send), d_recv(std::vector<double>(total, -7.5));
  comm().all_gather_v(d_send.data(), d_recv.data(), counts, displs, DataType::F64, dev());
  EXPECT_EQ(d_recv.download(), host);
  EXPECT_EQ(host[displs[0] + counts[0]], -7.5);  // a gap
  DeviceVec<double> d_recv2(std::vector<double>(total, -7.5));
  comm()
      .start_all_gather_v(d_send.data(), d_recv2.data(), counts, displs, DataType::F64, dev())
      ->wait();
  EXPECT_EQ(d_recv2.download(), host);
}

TEST(Staged, BroadcastEqualsHost) {
  SKIP_WITHOUT_GPU();
  const int n = comm().world_size(), r = comm().rank();
  const int root = n - 1;
  std::vector<double> host = values<double>(41, r);
  DeviceVec<double> d(host);
  comm().broadcast(std::span<double>(host), root);
  comm().broadcast(std::span<double>(d.data(), 41), root, dev());
  EXPECT_EQ(d.download(), host);
  EXPECT_EQ(host, values<double>(41, root));
  // bf16 moves without reducing; on the default stream.
  DeviceVec<uint16_t> b(bf16_values(11, r));
  comm().broadcast(b.data(), 11, DataType::BF16, 0, Place::device(nullptr));
  EXPECT_EQ(b.download(), bf16_values(11, 0));
}

TEST(Staged, AllToAllEqualsHost) {
  SKIP_WITHOUT_GPU();
  const int n = comm().world_size(), r = comm().rank();
  const std::vector<int32_t> send = values<int32_t>(6 * n, r);
  std::vector<int32_t> host(6 * n);
  comm().all_to_all<int32_t>(send, host);
  DeviceVec<int32_t> d_send(send), d_recv(std::vector<int32_t>(6 * n, 0));
  comm().all_to_all(d_send.data(), d_recv.data(), 6, DataType::I32, dev());
  EXPECT_EQ(d_recv.download(), host);
  EXPECT_EQ(host[6 * (n - 1)], values<int32_t>(6 * n, n - 1)[6 * r]);  // block r of the last rank
}

// Rank r sends 1 + r + 2j elements to rank j; recv leaves a one-element gap after each slice.
TEST(Staged, AllToAllvEqualsHostAndLeavesGaps) {
  SKIP_WITHOUT_GPU();
  const int n = comm().world_size(), r = comm().rank();
  std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
  size_t s_end = 0, r_end = 0;
  for (int j = 0; j < n; ++j) {
    sc[j] = 1 + r + 2 * j;
    sd[j] = s_end;
    s_end += sc[j];
    rc[j] = 1 + j + 2 * r;
    rd[j] = r_end;
    r_end += rc[j] + 1;
  }
  const std::vector<float> send = values<float>(s_end, r, 3);
  std::vector<float> host(r_end, 99.0f);
  comm().all_to_allv<float>(send, sc, sd, host, rc, rd);
  DeviceVec<float> d_send(send), d_recv(std::vector<float>(r_end, 99.0f));
  comm().all_to_allv(d_send.data(), sc, sd, d_recv.data(), rc, rd, DataType::F32, dev());
  EXPECT_EQ(d_recv.download(), host);
  EXPECT_EQ(host[rd[0] + rc[0]], 99.0f);
}

TEST(Staged, StartedCollectivesEqualHost) {
  SKIP_WITHOUT_GPU();
  const int n = comm().world_size(), r = comm().rank();
  std::vector<float> host = values<float>(513, r);
  DeviceVec<float> d(host);
  auto p = comm().start_all_reduce(d.data(), 513, DataType::F32, ReduceOp::Sum, dev());
  comm().all_reduce(std::span<float>(host), ReduceOp::Sum);
  p->wait();
  EXPECT_TRUE(p->test());
  EXPECT_EQ(d.download(), host);
  const std::vector<double> mine = values<double>(4, r);
  std::vector<double> gathered(4 * n);
  comm().all_gather<double>(mine, gathered);
  DeviceVec<double> d_mine(mine), d_all(std::vector<double>(4 * n, 0.0));
  comm().start_all_gather(d_mine.data(), d_all.data(), 4, DataType::F64, dev())->wait();
  EXPECT_EQ(d_all.download(), gathered);
  // start_reduce is a host collective: the root gets the sum.
  std::vector<int64_t> x = {int64_t{r} + 1, 10};
  comm().start_reduce(x.data(), 2, DataType::I64, ReduceOp::Sum, 0)->wait();
  if (r == 0) {
    EXPECT_EQ(x, (std::vector<int64_t>{int64_t{n} * (n + 1) / 2, 10 * n}));
  }
}

TEST(Staged, SplitGroupsStageTheirCollectives) {
  SKIP_WITHOUT_GPU();
  const int n = comm().world_size(), r = comm().rank();
  comm().set_stage("update_actor");
  {
    // Every rank, keys reversed: group rank n-1-r, so the gathered blocks come in reverse.
    std::unique_ptr<Communicator> g = comm().split(0, -r);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->rank(), n - 1 - r);
    EXPECT_EQ(g->stage(), "update_actor");
    const std::vector<float> mine = values<float>(3, r);
    DeviceVec<float> d_mine(mine), d_all(std::vector<float>(3 * n, 0.0f));
    g->all_gather(d_mine.data(), d_all.data(), 3, DataType::F32, dev());
    std::vector<float> want;
    for (int j = n - 1; j >= 0; --j) {
      const std::vector<float> b = values<float>(3, j);
      want.insert(want.end(), b.begin(), b.end());
    }
    EXPECT_EQ(d_all.download(), want);
    // Groups of one: the device all-reduce is this rank's data; the last rank joins none.
    std::unique_ptr<Communicator> alone = comm().split(r == n - 1 ? kNoColor : r, 0);
    if (r == n - 1) {
      EXPECT_EQ(alone, nullptr);
    } else {
      ASSERT_NE(alone, nullptr);
      EXPECT_EQ(alone->world_size(), 1);
      DeviceVec<float> d(mine);
      alone->all_reduce(d.data(), 3, DataType::F32, ReduceOp::Sum, dev());
      EXPECT_EQ(d.download(), mine);
    }
  }
  comm().set_stage("setup");
}

// make_device_communicator over the ranks of this job: staged when they outnumber the GPUs (one
// node), and its device collectives work either way.
TEST(Staged, AutomaticChoiceStagesRanksSharingAGpu) {
  SKIP_WITHOUT_GPU();
  const int n = comm().world_size();
  DeviceCommChoice choice;
  std::unique_ptr<Communicator> c =
      make_device_communicator(std::make_unique<MpiCommunicator>(60), detect_launch(), 60, &choice);
  EXPECT_EQ(choice.staged, n > world().gpus) << choice.reason;
  if (n > world().gpus) {
    EXPECT_NE(choice.reason.find("share"), std::string::npos) << choice.reason;
  }
  std::vector<int32_t> host = {comm().rank() + 1, 7};
  DeviceVec<int32_t> d(host);
  c->all_reduce(d.data(), 2, DataType::I32, ReduceOp::Sum, dev());
  EXPECT_EQ(d.download(), (std::vector<int32_t>{n * (n + 1) / 2, 7 * n}));
}

}  // namespace
}  // namespace verl::dist
