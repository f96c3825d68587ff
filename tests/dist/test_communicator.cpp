// The communicator interface on SingleProcess with host buffers: every collective moves the exact
// bits for each element type, in-place calls are no-ops, a split gives a one-rank group, and bad
// arguments raise verl::Error with a message naming the collective and the offending value.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "core/error.h"
#include "dist/communicator.h"

namespace verl::dist {
namespace {

constexpr DataType kAllTypes[] = {DataType::F32, DataType::F64,  DataType::I32,
                                  DataType::I64, DataType::BF16, DataType::U8};

void expect_mentions(const std::string& msg, std::initializer_list<const char*> words) {
  EXPECT_FALSE(msg.empty()) << "no verl::Error was thrown";
  for (const char* w : words) EXPECT_PRED_FORMAT2(testing::IsSubstring, w, msg);
}

// `bytes` bytes with a pattern that differs at every offset, so a shifted copy would show.
std::vector<uint8_t> pattern(size_t bytes, uint8_t seed) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<uint8_t>(seed + 37 * i + (i >> 3));
  return v;
}

TEST(DataType, SizesAndNames) {
  const size_t sizes[] = {4, 8, 4, 8, 2, 1};
  const char* names[] = {"f32", "f64", "i32", "i64", "bf16", "u8"};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(data_type_size(kAllTypes[i]), sizes[i]) << names[i];
    EXPECT_STREQ(to_string(kAllTypes[i]), names[i]);
  }
  EXPECT_EQ(data_type_of<float>(), DataType::F32);
  EXPECT_EQ(data_type_of<double>(), DataType::F64);
  EXPECT_EQ(data_type_of<int32_t>(), DataType::I32);
  EXPECT_EQ(data_type_of<int64_t>(), DataType::I64);
  EXPECT_EQ(data_type_of<uint8_t>(), DataType::U8);
}

TEST(Place, HostByDefaultDeviceCarriesItsStream) {
  EXPECT_FALSE(Place{}.on_device());
  EXPECT_FALSE(Place::host().on_device());
  int token = 0;  // any address stands in for a cudaStream_t
  const Place d = Place::device(&token);
  EXPECT_TRUE(d.on_device());
  EXPECT_EQ(d.stream, &token);
}

TEST(SingleProcess, AllReduceLeavesEveryTypeUnchanged) {
  SingleProcess sp;
  Communicator& comm = sp;
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.world_size(), 1);
  for (DataType t : kAllTypes) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
      const std::vector<uint8_t> want = pattern(5 * data_type_size(t), 11);
      std::vector<uint8_t> data = want;
      comm.all_reduce(data.data(), 5, t, op);
      EXPECT_EQ(data, want) << to_string(t);
    }
  }
}

// The span overloads existing callers use, through the base and the derived type, with a vector
// converting to the span.
TEST(SingleProcess, SpanAllReduceAndScalarHelpers) {
  SingleProcess sp;
  Communicator& comm = sp;
  std::vector<float> g = {0.1f, -2.5f, 3e-8f};
  comm.all_reduce(g, ReduceOp::Sum);
  sp.all_reduce(g, ReduceOp::Max);
  EXPECT_EQ(g, (std::vector<float>{0.1f, -2.5f, 3e-8f}));
  std::vector<double> d = {1.0 / 3.0};
  sp.all_reduce(std::span<double>(d), ReduceOp::Min);
  EXPECT_EQ(d[0], 1.0 / 3.0);
  std::vector<int32_t> i32 = {-7, 9};
  comm.all_reduce(i32, ReduceOp::Sum);
  EXPECT_EQ(i32, (std::vector<int32_t>{-7, 9}));
  std::vector<int64_t> i64 = {int64_t{1} << 40};
  sp.all_reduce(i64, ReduceOp::Sum);
  EXPECT_EQ(i64[0], int64_t{1} << 40);

  EXPECT_EQ(comm.sum(2.25), 2.25);
  EXPECT_EQ(comm.sum(int64_t{-12}), -12);
  EXPECT_EQ(sp.max(int64_t{5}), 5);
  EXPECT_EQ(comm.mean(0.75), 0.75);
}

TEST(SingleProcess, AllGatherCopiesOddFloatsExactly) {
  SingleProcess comm;
  // A negative zero, a subnormal, the largest float, infinity and a NaN payload: a copy that went
  // through arithmetic or a narrower type would change some of these bits.
  const std::vector<float> send = {-0.0f,
                                   1e-40f,
                                   std::numeric_limits<float>::max(),
                                   -std::numeric_limits<float>::infinity(),
                                   std::nanf("0x123"),
                                   1.0f / 3.0f,
                                   -7.25f};
  std::vector<float> recv(7, 42.0f);
  comm.all_gather<float>(send, recv);
  EXPECT_EQ(std::memcmp(recv.data(), send.data(), 7 * sizeof(float)), 0);

  std::vector<float> raw(7, 42.0f);
  comm.all_gather(send.data(), raw.data(), 7, DataType::F32);
  EXPECT_EQ(std::memcmp(raw.data(), send.data(), 7 * sizeof(float)), 0);
}

TEST(SingleProcess, AllGatherEveryTypeAndInPlace) {
  SingleProcess comm;
  for (DataType t : kAllTypes) {
    const std::vector<uint8_t> send = pattern(3 * data_type_size(t), 5);
    std::vector<uint8_t> recv(send.size(), 0xEE);
    comm.all_gather(send.data(), recv.data(), 3, t);
    EXPECT_EQ(recv, send) << to_string(t);
    comm.all_gather(recv.data(), recv.data(), 3, t);  // send == recv + rank * send_count
    EXPECT_EQ(recv, send) << to_string(t) << " in place";
  }
}

TEST(SingleProcess, ReduceScatterOfFiveInt64) {
  SingleProcess comm;
  const std::vector<int64_t> send = {std::numeric_limits<int64_t>::min(), -1, 0, int64_t{1} << 53,
                                     std::numeric_limits<int64_t>::max()};
  std::vector<int64_t> recv(5, 99);
  comm.reduce_scatter(send.data(), recv.data(), 5, DataType::I64, ReduceOp::Sum);
  EXPECT_EQ(recv, send);

  std::vector<int64_t> typed(5, 99);
  comm.reduce_scatter<int64_t>(send, typed, ReduceOp::Max);
  EXPECT_EQ(typed, send);

  std::vector<int64_t> in_place = send;
  comm.reduce_scatter(in_place.data(), in_place.data(), 5, DataType::I64, ReduceOp::Min);
  EXPECT_EQ(in_place, send);
}

TEST(SingleProcess, ReduceScatterEveryType) {
  SingleProcess comm;
  for (DataType t : kAllTypes) {
    const std::vector<uint8_t> send = pattern(4 * data_type_size(t), 200);
    std::vector<uint8_t> recv(send.size(), 0);
    comm.reduce_scatter(send.data(), recv.data(), 4, t, ReduceOp::Sum);
    EXPECT_EQ(recv, send) << to_string(t);
  }
}

TEST(SingleProcess, AllToAllCopiesEveryTypeAndInPlace) {
  SingleProcess comm;
  for (DataType t : kAllTypes) {
    const std::vector<uint8_t> send = pattern(6 * data_type_size(t), 77);
    std::vector<uint8_t> recv(send.size(), 0x5A);
    comm.all_to_all(send.data(), recv.data(), 6, t);
    EXPECT_EQ(recv, send) << to_string(t);
    comm.all_to_all(recv.data(), recv.data(), 6, t);
    EXPECT_EQ(recv, send) << to_string(t) << " in place";
  }
  const std::vector<int32_t> tokens = {151643, 0, -1};
  std::vector<int32_t> out(3, 7);
  comm.all_to_all<int32_t>(tokens, out);
  EXPECT_EQ(out, tokens);
}

TEST(SingleProcess, BroadcastFromRootZeroKeepsData) {
  SingleProcess comm;
  std::vector<double> d = {std::acos(-1.0), -0.0, 1e300};
  const std::vector<double> want = d;
  comm.broadcast<double>(d, 0);
  EXPECT_EQ(std::memcmp(d.data(), want.data(), 3 * sizeof(double)), 0);
  std::vector<uint16_t> bf16 = {0x3F80, 0xC0A0};  // 1.0, -5.0
  comm.broadcast(bf16.data(), 2, DataType::BF16, 0);
  EXPECT_EQ(bf16, (std::vector<uint16_t>{0x3F80, 0xC0A0}));
}

TEST(SingleProcess, BroadcastFromRankOneIsAnError) {
  SingleProcess comm;
  std::vector<float> x(4, 1.0f);
  expect_mentions(test::error_of([&] { comm.broadcast<float>(x, 1); }),
                  {"broadcast", "root 1", "world size 1"});
  expect_mentions(test::error_of([&] { comm.broadcast(x.data(), 4, DataType::F32, -1); }),
                  {"broadcast", "root -1"});
}

TEST(SingleProcess, AllToAllvMovesTheSliceAndLeavesTheRest) {
  SingleProcess comm;
  std::vector<float> send(10);
  for (int i = 0; i < 10; ++i) send[i] = 0.5f + i;
  const size_t counts[] = {4}, send_displs[] = {3}, recv_displs[] = {2};
  std::vector<float> recv(8, -1.0f);
  comm.all_to_allv<float>(send, counts, send_displs, recv, counts, recv_displs);
  EXPECT_EQ(recv, (std::vector<float>{-1, -1, 3.5f, 4.5f, 5.5f, 6.5f, -1, -1}));

  // The raw call with 8-byte elements: the displacements count elements, not bytes.
  std::vector<int64_t> send64 = {10, 11, 12, 13, 14, 15};
  std::vector<int64_t> recv64(6, 0);
  const size_t counts64[] = {2};
  comm.all_to_allv(send64.data(), counts64, send_displs, recv64.data(), counts64, recv_displs,
                   DataType::I64);
  EXPECT_EQ(recv64, (std::vector<int64_t>{0, 0, 13, 14, 0, 0}));

  // The same buffer and displacement is a no-op; a zero count touches nothing.
  std::vector<float> same = send;
  const size_t d3[] = {3}, zero[] = {0};
  comm.all_to_allv(same.data(), counts, d3, same.data(), counts, d3, DataType::F32);
  EXPECT_EQ(same, send);
  comm.all_to_allv(nullptr, zero, zero, nullptr, zero, zero, DataType::F32);
}

TEST(SingleProcess, AllToAllvWithTwoCountsIsAnError) {
  SingleProcess comm;
  std::vector<float> send(4, 1.0f), recv(4, 0.0f);
  const size_t two[] = {2, 2}, one[] = {4}, zero[] = {0};
  expect_mentions(test::error_of([&] {
                    comm.all_to_allv(send.data(), two, zero, recv.data(), one, zero, DataType::F32);
                  }),
                  {"all_to_allv", "send_counts has 2 entries", "world size 1"});
  expect_mentions(test::error_of([&] {
                    comm.all_to_allv(send.data(), one, zero, recv.data(), one, two, DataType::F32);
                  }),
                  {"all_to_allv", "recv_displs has 2 entries"});
  EXPECT_EQ(recv, std::vector<float>(4, 0.0f));
}

TEST(SingleProcess, AllToAllvCountMismatchIsAnError) {
  SingleProcess comm;
  std::vector<int32_t> send(4, 1), recv(4, 0);
  const size_t three[] = {3}, two[] = {2}, zero[] = {0};
  expect_mentions(test::error_of([&] {
                    comm.all_to_allv(send.data(), three, zero, recv.data(), two, zero,
                                     DataType::I32);
                  }),
                  {"all_to_allv", "sends 3", "receive 2"});
}

TEST(SingleProcess, SpanWrappersCheckSizes) {
  SingleProcess comm;
  std::vector<float> seven(7, 1.0f), six(6, 0.0f);
  expect_mentions(test::error_of([&] { comm.all_gather<float>(seven, six); }),
                  {"all_gather", "recv has 6", "world_size 1", "send's 7"});
  std::vector<int64_t> five(5, 1), four(4, 0);
  expect_mentions(test::error_of([&] { comm.reduce_scatter<int64_t>(five, four, ReduceOp::Sum); }),
                  {"reduce_scatter", "send has 5", "recv's 4"});
  expect_mentions(test::error_of([&] { comm.all_to_all<float>(seven, six); }),
                  {"all_to_all", "send has 7", "recv 6"});
  // A slice [8, 8 + 4) past the end of a 10-element send.
  std::vector<float> ten(10, 1.0f), out(10, 0.0f);
  const size_t counts[] = {4}, past[] = {8}, zero[] = {0};
  expect_mentions(
      test::error_of([&] { comm.all_to_allv<float>(ten, counts, past, out, counts, zero); }),
      {"all_to_allv", "send slice for rank 0", "[8, 8 + 4)", "10 elements"});
  expect_mentions(
      test::error_of([&] { comm.all_to_allv<float>(ten, counts, zero, out, counts, past); }),
      {"recv slice for rank 0"});
  EXPECT_EQ(six, std::vector<float>(6, 0.0f));  // nothing was written by a rejected call
  EXPECT_EQ(out, std::vector<float>(10, 0.0f));
}

TEST(SingleProcess, NullBuffersWithElementsAreErrors) {
  SingleProcess comm;
  expect_mentions(
      test::error_of([&] { comm.all_reduce(nullptr, 3, DataType::F32, ReduceOp::Sum); }),
      {"all_reduce", "null", "count 3"});
  float x = 1.0f;
  expect_mentions(test::error_of([&] { comm.all_gather(&x, nullptr, 1, DataType::F32); }),
                  {"all_gather", "null"});
  // Zero elements need no buffers.
  EXPECT_EQ(test::error_of([&] { comm.all_gather(nullptr, nullptr, 0, DataType::F32); }), "");
  EXPECT_EQ(test::error_of([&] { comm.all_to_all(nullptr, nullptr, 0, DataType::U8); }), "");
}

TEST(SingleProcess, DevicePlaceWithoutCudaBackendIsAnError) {
#ifdef VERL_HAVE_CUDA
  GTEST_SKIP() << "built with CUDA: tests/cuda/test_communicator_cuda.cpp covers device buffers";
#else
  SingleProcess comm;
  std::vector<float> a(3, 1.0f), b(3, 0.0f);
  const Place dev = Place::device(nullptr);
  expect_mentions(
      test::error_of([&] { comm.all_reduce(a.data(), 3, DataType::F32, ReduceOp::Sum, dev); }),
      {"all_reduce", "no CUDA backend"});
  expect_mentions(
      test::error_of([&] { comm.all_gather(a.data(), b.data(), 3, DataType::F32, dev); }),
      {"all_gather", "no CUDA backend"});
  expect_mentions(test::error_of([&] { comm.broadcast(a.data(), 3, DataType::F32, 0, dev); }),
                  {"broadcast", "no CUDA backend"});
  EXPECT_EQ(b, std::vector<float>(3, 0.0f));
#endif
}

// A split of one rank is a one-rank communicator of the same backend that keeps the parent's
// stage and names its group; kNoColor joins none; a nested split composes the world ranks.
TEST(SingleProcess, SplitGivesAOneRankGroup) {
  SingleProcess comm;
  comm.set_stage("gen");
  EXPECT_EQ(comm.describe_rank(), "rank 0 of 1");
  std::unique_ptr<Communicator> g = comm.split(/*color=*/3, /*key=*/-7);
  ASSERT_NE(g, nullptr);
  EXPECT_NE(dynamic_cast<SingleProcess*>(g.get()), nullptr);
  EXPECT_EQ(g->rank(), 0);
  EXPECT_EQ(g->world_size(), 1);
  EXPECT_EQ(g->stage(), "gen");
  EXPECT_EQ(g->group().color, 3);
  EXPECT_EQ(g->group().world_ranks, std::vector<int>{0});
  EXPECT_EQ(g->describe_rank(), "rank 0 of 1 in group color 3 (world rank 0)");
  EXPECT_EQ(g->describe_peer(0), "rank 0 (world rank 0)");
  std::vector<float> x = {1.5f, -2.0f}, y(2);
  g->all_gather<float>(x, y);
  EXPECT_EQ(y, x);
  g->set_stage("update_actor");  // the child's stage is its own
  EXPECT_EQ(comm.stage(), "gen");

  std::unique_ptr<Communicator> h = g->split(0, 0);
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->stage(), "update_actor");
  EXPECT_EQ(h->group().color, 0);
  EXPECT_EQ(h->group().world_ranks, std::vector<int>{0});
  EXPECT_EQ(g->split(kNoColor, 5), nullptr);
  EXPECT_EQ(comm.split(kNoColor, 0), nullptr);
  expect_mentions(test::error_of([&] { comm.split(-2, 0); }),
                  {"split on rank 0 of 1", "color -2", "kNoColor"});
  EXPECT_EQ(comm.group().world_ranks, std::vector<int>{});  // no split made the parent
}

// A backend with three ranks that only records what reaches it: the public calls must hand the
// backend element counts (not bytes) and the DataType of the span, and check sizes against the
// world size. It overrides only the *_impl hooks, so calls through it see every overload.
class RecordingComm final : public Communicator {
 public:
  int rank() const override { return 1; }
  int world_size() const override { return 3; }
  void barrier() override { last = "barrier"; }

  std::string last;
  size_t count = 0;
  DataType type = DataType::U8;
  int root = -1;

 protected:
  void all_reduce_impl(void*, size_t n, DataType t, ReduceOp, Place) override {
    record("all_reduce", n, t);
  }
  void reduce_scatter_impl(const void*, void*, size_t n, DataType t, ReduceOp, Place) override {
    record("reduce_scatter", n, t);
  }
  void all_gather_impl(const void*, void*, size_t n, DataType t, Place) override {
    record("all_gather", n, t);
  }
  void broadcast_impl(void*, size_t n, DataType t, int r, Place) override {
    record("broadcast", n, t);
    root = r;
  }
  void all_to_all_impl(const void*, void*, size_t n, DataType t, Place) override {
    record("all_to_all", n, t);
  }
  void all_to_allv_impl(const void*, std::span<const size_t> counts, std::span<const size_t>, void*,
                        std::span<const size_t>, std::span<const size_t>, DataType t,
                        Place) override {
    record("all_to_allv", counts.size(), t);
  }
  std::unique_ptr<Communicator> split_impl(const SplitGroup& g) override {
    last = "split";
    count = g.members.size();
    return nullptr;
  }

 private:
  void record(const char* what, size_t n, DataType t) {
    last = what;
    count = n;
    type = t;
  }
};

TEST(Communicator, WrappersPassElementCountsAndTypesToTheBackend) {
  RecordingComm comm;
  std::vector<float> g(6);
  comm.all_reduce(g, ReduceOp::Sum);  // the existing callers' form, through the derived type
  EXPECT_EQ(comm.last, "all_reduce");
  EXPECT_EQ(comm.count, 6u);
  EXPECT_EQ(comm.type, DataType::F32);

  std::vector<double> shard(2);
  comm.reduce_scatter<double>(std::vector<double>(6), shard, ReduceOp::Sum);
  EXPECT_EQ(comm.last, "reduce_scatter");
  EXPECT_EQ(comm.count, 2u);  // recv_count, not the 6 sent
  EXPECT_EQ(comm.type, DataType::F64);

  std::vector<int64_t> mine(4), all(12);
  comm.all_gather<int64_t>(mine, all);
  EXPECT_EQ(comm.count, 4u);
  EXPECT_EQ(comm.type, DataType::I64);

  std::vector<int32_t> tokens(9), got(9);
  comm.all_to_all<int32_t>(tokens, got);
  EXPECT_EQ(comm.last, "all_to_all");
  EXPECT_EQ(comm.count, 3u);  // per rank
  EXPECT_EQ(comm.type, DataType::I32);

  std::vector<uint8_t> flags(5);
  comm.broadcast<uint8_t>(flags, 2);
  EXPECT_EQ(comm.last, "broadcast");
  EXPECT_EQ(comm.root, 2);
  EXPECT_EQ(comm.type, DataType::U8);

  const size_t counts[] = {1, 2, 3}, displs[] = {0, 1, 3};
  std::vector<float> send(6), recv(6);
  comm.all_to_allv<float>(send, counts, displs, recv, counts, displs);
  EXPECT_EQ(comm.last, "all_to_allv");
  EXPECT_EQ(comm.count, 3u);  // one count per rank reached the backend

  EXPECT_EQ(comm.sum(1.5), 1.5);  // the recording backend reduces nothing
  EXPECT_EQ(comm.last, "all_reduce");
  EXPECT_EQ(comm.count, 1u);
  EXPECT_EQ(comm.type, DataType::F64);
  comm.barrier();
  EXPECT_EQ(comm.last, "barrier");
}

// split() works out the group itself and holds the backend to it: RecordingComm gathers nothing
// (every color reads 0), so rank 1 of 3 must be formed as rank 1 of 3, and its nullptr is refused.
TEST(Communicator, SplitHoldsTheBackendToTheGroup) {
  RecordingComm comm;
  expect_mentions(
      test::error_of([&] { comm.split(0, 0); }),
      {"split on rank 1 of 3", "group color 0 was formed as rank -1 of 0", "want rank 1 of 3"});
  EXPECT_EQ(comm.last, "split");
  EXPECT_EQ(comm.count, 3u);  // the three members reached the backend
  EXPECT_EQ(comm.split(kNoColor, 0), nullptr);
  EXPECT_EQ(comm.count, 0u);  // no members under kNoColor
}

TEST(Communicator, ChecksAreAgainstTheWorldSize) {
  RecordingComm comm;
  std::vector<float> two(2), five(5), six(6);
  expect_mentions(test::error_of([&] { comm.all_gather<float>(two, five); }),
                  {"all_gather", "recv has 5", "world_size 3", "= 6"});
  expect_mentions(test::error_of([&] { comm.reduce_scatter<float>(five, two, ReduceOp::Sum); }),
                  {"reduce_scatter", "send has 5", "= 6"});
  expect_mentions(test::error_of([&] { comm.all_to_all<float>(five, five); }),
                  {"all_to_all", "world_size 3"});
  expect_mentions(test::error_of([&] { comm.broadcast<float>(six, 3); }),
                  {"broadcast", "root 3", "world size 3"});
  const size_t one[] = {1};
  expect_mentions(test::error_of([&] {
                    comm.all_to_allv(six.data(), one, one, six.data(), one, one, DataType::F32);
                  }),
                  {"send_counts has 1 entries", "world size 3"});
  comm.last.clear();
  EXPECT_EQ(test::error_of([&] { comm.all_gather<float>(two, six); }), "");
  EXPECT_EQ(comm.last, "all_gather");
}

}  // namespace
}  // namespace verl::dist
