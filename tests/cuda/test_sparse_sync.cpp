// The CUDA LightweightSync codec (optim/cuda/sparse_sync.h) against the CPU reference
// (optim/sparse_sync.h): the same message bytes, carry and accumulated sums, bit for bit, over
// value types, bucket sizes (below, at and past a chunk; a tail chunk), top_k up to 1, with and
// without carry and error feedback, on random values, values with many exact ties (zeros and -0.0
// among them) and all zeros; NaN and inf where x86 fixes the NaN's bits; one embedding-sized
// bucket, timed.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "optim/cuda/sparse_sync.h"
#include "optim/sparse_sync.h"
#include "test_util.h"

namespace verl::optim::cuda::test {
namespace {

using ops::cuda::CudaContext;
using ops::cuda::CudaSession;
using ops::cuda::DeviceBuffer;
using SparseSyncCuda = ops::cuda::test::CudaTest;

enum class Input { Randn, Ties, Zeros };
const char* to_string(Input in) {
  switch (in) {
    case Input::Randn:
      return "randn";
    case Input::Ties:
      return "ties";
    case Input::Zeros:
      return "zeros";
  }
  return "?";
}

// How the carry takes part: none, error feedback, or a carry zeroed after the send.
enum class Carry { None, Keep, Drop };
const char* to_string(Carry c) {
  switch (c) {
    case Carry::None:
      return "no carry";
    case Carry::Keep:
      return "carry, error feedback";
    case Carry::Drop:
      return "carry, no error feedback";
  }
  return "?";
}

// Ties: randn rounded to multiples of `step` (a few levels around 0, zeros and -0.0 among them);
// the grad's and the carry's steps are powers of two, so their sums are exact and tie too.
std::vector<float> make_input(Input in, int64_t n, uint64_t seed, float scale, float step) {
  std::vector<float> x(static_cast<size_t>(n), 0.0f);
  if (in == Input::Zeros) {
    for (size_t i = 0; i < x.size(); i += 3) x[i] = -0.0f;
    return x;
  }
  x = ops::cuda::test::randn(static_cast<size_t>(n), seed, scale);
  if (in == Input::Ties)
    for (auto& e : x) e = std::round(e / step) * step;
  return x;
}

// Expects a == b byte for byte; reports the first differing element.
template <typename T>
void expect_same(const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (std::memcmp(got.data(), want.data(), got.size() * sizeof(T)) == 0) return;
  size_t i = 0, misses = 0;
  while (std::memcmp(&got[i], &want[i], sizeof(T)) == 0) ++i;
  for (size_t j = i; j < got.size(); ++j) misses += std::memcmp(&got[j], &want[j], sizeof(T)) != 0;
  if constexpr (std::is_same_v<T, float>) {
    uint32_t g, w;
    std::memcpy(&g, &got[i], 4);
    std::memcpy(&w, &want[i], 4);
    ADD_FAILURE() << what << ": first mismatch at [" << i << "]: got " << got[i] << " (0x"
                  << std::hex << g << ") want " << want[i] << " (0x" << w << std::dec << "); "
                  << misses << " of " << got.size() << " differ";
  } else {
    ADD_FAILURE() << what << ": first mismatch at byte [" << i << "]: got " << +got[i] << " want "
                  << +want[i] << "; " << misses << " of " << got.size() << " differ";
  }
}

// Which part of the message a byte offset is in, for the failure message.
std::string message_part(const SparseLayout& l, size_t at) {
  if (at < l.counts) return "scale of chunk " + std::to_string(at / 4);
  if (at < l.index) return "count of chunk " + std::to_string((at - l.counts) / 2);
  if (at < l.index + static_cast<size_t>(l.k)) return "index entry " + std::to_string(at - l.index);
  if (at < l.vals) return "padding after the index";
  return "values, byte " + std::to_string(at - l.vals);
}

void expect_same_message(const SparseLayout& l, const std::vector<uint8_t>& got,
                         const std::vector<uint8_t>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      expect_same("message (" + message_part(l, i) + ")", got, want);
      return;
    }
  }
}

struct Case {
  int64_t n;
  double top_k;
  SyncValues values;
  Carry carry;
  Input input;
  uint64_t seed;
};

std::string describe(const Case& c) {
  char s[160];
  std::snprintf(s, sizeof s, "n=%" PRId64 " top_k=%g %s, %s, %s", c.n, c.top_k,
                verl::optim::to_string(c.values), to_string(c.carry), to_string(c.input));
  return s;
}

// One compress + accumulate on both sides from the same inputs; compares message, carry and sum.
// The device message and scratch start as garbage: every byte must be written, none read first.
void check_case(const CudaContext& ctx, const CudaSession& session, const Case& c,
                const std::vector<float>* grad_in = nullptr,
                const std::vector<float>* carry_in = nullptr) {
  SCOPED_TRACE(describe(c));
  const SparseLayout l = sparse_layout(c.n, c.top_k, c.values);
  const auto grad = grad_in ? *grad_in : make_input(c.input, c.n, c.seed, 1.0f, 0.5f);
  const auto carry0 = carry_in ? *carry_in : make_input(c.input, c.n, c.seed + 1, 0.5f, 0.25f);
  const auto out0 = ops::cuda::test::randn(static_cast<size_t>(c.n), c.seed + 2);
  const bool has_carry = c.carry != Carry::None, keep = c.carry == Carry::Keep;

  std::vector<uint8_t> msg(l.bytes, 0x5a);
  std::vector<float> carry = carry0, out = out0;
  verl::optim::sparse_compress(grad.data(), has_carry ? carry.data() : nullptr, keep, l,
                               msg.data());
  verl::optim::sparse_accumulate(msg.data(), l, out.data());

  DeviceBuffer<float> d_grad(grad), d_carry(carry0), d_out(out0), d_out_cpu_msg(out0);
  DeviceBuffer<uint8_t> d_msg(std::vector<uint8_t>(l.bytes, 0xa5));
  DeviceBuffer<uint8_t> d_scratch(std::vector<uint8_t>(sparse_scratch_bytes(c.n), 0xcd));
  DeviceBuffer<uint8_t> d_msg_cpu(msg);
  verl::optim::cuda::sparse_compress(ctx, d_grad.data(), has_carry ? d_carry.data() : nullptr, keep,
                                     l, d_msg.data(), d_scratch.data());
  verl::optim::cuda::sparse_accumulate(ctx, d_msg.data(), l, d_out.data());
  verl::optim::cuda::sparse_accumulate(ctx, d_msg_cpu.data(), l, d_out_cpu_msg.data());
  session.synchronize();

  expect_same_message(l, d_msg.download(), msg);
  if (has_carry) expect_same("carry", d_carry.download(), carry);
  expect_same("accumulate", d_out.download(), out);
  expect_same("accumulate of the CPU's message", d_out_cpu_msg.download(), out);
}

// Every size, top_k, carry mode and input for one value type.
void check_grid(const CudaContext& ctx, const CudaSession& session, SyncValues values) {
  const int64_t sizes[] = {1, 255, 256, 257, 10000, (int64_t{1} << 20) + 3};
  const double top_ks[] = {0.001, 0.05, 0.1, 0.5, 1.0};
  uint64_t seed = 1000;
  for (int64_t n : sizes)
    for (double top_k : top_ks)
      for (Carry carry : {Carry::None, Carry::Keep, Carry::Drop})
        for (Input input : {Input::Randn, Input::Ties, Input::Zeros}) {
          check_case(ctx, session, {n, top_k, values, carry, input, seed += 3});
          if (::testing::Test::HasFailure()) return;  // one failing case says enough
        }
}

TEST_F(SparseSyncCuda, Int8MatchesCpu) {
  check_grid(ctx(), *session_, SyncValues::Int8);
}
TEST_F(SparseSyncCuda, Bf16MatchesCpu) {
  check_grid(ctx(), *session_, SyncValues::BF16);
}
TEST_F(SparseSyncCuda, Fp32MatchesCpu) {
  check_grid(ctx(), *session_, SyncValues::F32);
}

// Error feedback over several steps: each step's carry feeds the next compression.
TEST_F(SparseSyncCuda, ErrorFeedbackOverSteps) {
  for (SyncValues values : {SyncValues::Int8, SyncValues::BF16, SyncValues::F32}) {
    const int64_t n = 70001;
    SCOPED_TRACE(verl::optim::to_string(values));
    const SparseLayout l = sparse_layout(n, 0.02, values);
    std::vector<float> carry(n, 0.0f), out(n, 0.0f);
    std::vector<uint8_t> msg(l.bytes);
    DeviceBuffer<float> d_carry(carry), d_out(out), d_grad(static_cast<size_t>(n));
    DeviceBuffer<uint8_t> d_msg(l.bytes), d_scratch(sparse_scratch_bytes(n));
    for (int step = 0; step < 4; ++step) {
      const auto grad = ops::cuda::test::randn(n, 77 + step);
      d_grad.upload(grad);
      verl::optim::sparse_compress(grad.data(), carry.data(), true, l, msg.data());
      verl::optim::sparse_accumulate(msg.data(), l, out.data());
      verl::optim::cuda::sparse_compress(ctx(), d_grad.data(), d_carry.data(), true, l,
                                         d_msg.data(), d_scratch.data());
      verl::optim::cuda::sparse_accumulate(ctx(), d_msg.data(), l, d_out.data());
      sync();
      expect_same_message(l, d_msg.download(), msg);
      expect_same("carry", d_carry.download(), carry);
      expect_same("accumulate", d_out.download(), out);
      if (HasFailure()) return;
    }
  }
}

// An empty bucket is a no-op (no pointers needed), and the scratch size is 0.
TEST_F(SparseSyncCuda, EmptyBucket) {
  const SparseLayout l = sparse_layout(0, 0.1, SyncValues::Int8);
  EXPECT_EQ(sparse_scratch_bytes(0), 0u);
  verl::optim::cuda::sparse_compress(ctx(), nullptr, nullptr, true, l, nullptr, nullptr);
  verl::optim::cuda::sparse_accumulate(ctx(), nullptr, l, nullptr);
  sync();
}

#if defined(__x86_64__)
// NaN and inf: the GPU writes x86's NaN bits (a NaN operand quieted, 0 * inf and inf - inf the
// default NaN). No entry has a NaN in both grad and carry: which one x86 keeps then depends on
// how the compiler ordered the CPU's addition.
TEST_F(SparseSyncCuda, NanAndInfMatchCpu) {
  const float inf = std::numeric_limits<float>::infinity();
  auto bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  for (int64_t n : {int64_t{300}, int64_t{5000}}) {
    auto grad = ops::cuda::test::randn(n, 5 + n), carry = ops::cuda::test::randn(n, 6 + n, 0.5f);
    for (int64_t i = 0; i < n; i += 97) grad[i] = inf;
    for (int64_t i = 13; i < n; i += 89) grad[i] = -inf;
    for (int64_t i = 29; i < n; i += 101) grad[i] = bits(0x7fc01234u);  // quiet NaN, payload
    for (int64_t i = 41; i < n; i += 131) grad[i] = bits(0xff800007u);  // signalling, negative
    for (int64_t i = 57; i < n; i += 113) carry[i] = bits(0x7f8abcdeu);
    for (int64_t i = 13; i < n; i += 178) carry[i] = inf;  // inf + -inf where grad is -inf
    for (int64_t i = 0; i < n; ++i)
      if (std::isnan(grad[i]) && std::isnan(carry[i])) carry[i] = 0.0f;
    for (SyncValues values : {SyncValues::Int8, SyncValues::BF16, SyncValues::F32})
      for (Carry c : {Carry::None, Carry::Keep, Carry::Drop})
        for (double top_k : {0.01, 0.3, 1.0}) {
          check_case(ctx(), *session_, {n, top_k, values, c, Input::Randn, 0}, &grad, &carry);
          if (HasFailure()) return;
        }
  }
}
#endif

// One bucket the size of a big embedding (50M entries, 1% int8): matches the CPU, and the time
// of compress + accumulate is printed.
TEST_F(SparseSyncCuda, LargeBucketInt8) {
  const int64_t n = 50'000'000;
  const SparseLayout l = sparse_layout(n, 0.01, SyncValues::Int8);
  const auto grad = ops::cuda::test::randn(n, 4242);
  const auto carry0 = ops::cuda::test::randn(n, 4243, 0.1f);
  std::vector<float> carry = carry0, out(n, 0.0f);
  std::vector<uint8_t> msg(l.bytes);
  verl::optim::sparse_compress(grad.data(), carry.data(), true, l, msg.data());
  verl::optim::sparse_accumulate(msg.data(), l, out.data());

  DeviceBuffer<float> d_grad(grad), d_carry(carry0), d_out(static_cast<size_t>(n));
  DeviceBuffer<uint8_t> d_msg(l.bytes), d_scratch(sparse_scratch_bytes(n));
  d_out.zero(ctx().stream);
  verl::optim::cuda::sparse_compress(ctx(), d_grad.data(), d_carry.data(), true, l, d_msg.data(),
                                     d_scratch.data());
  verl::optim::cuda::sparse_accumulate(ctx(), d_msg.data(), l, d_out.data());
  sync();
  expect_same_message(l, d_msg.download(), msg);
  expect_same("carry", d_carry.download(), carry);
  expect_same("accumulate", d_out.download(), out);

  // Timing (the carry keeps changing; the work per call does not).
  constexpr int kIters = 20;
  cudaEvent_t e0, e1, e2;
  VERL_CUDA_CHECK(cudaEventCreate(&e0));
  VERL_CUDA_CHECK(cudaEventCreate(&e1));
  VERL_CUDA_CHECK(cudaEventCreate(&e2));
  VERL_CUDA_CHECK(cudaEventRecord(e0, ctx().stream));
  for (int i = 0; i < kIters; ++i)
    verl::optim::cuda::sparse_compress(ctx(), d_grad.data(), d_carry.data(), true, l, d_msg.data(),
                                       d_scratch.data());
  VERL_CUDA_CHECK(cudaEventRecord(e1, ctx().stream));
  for (int i = 0; i < kIters; ++i)
    verl::optim::cuda::sparse_accumulate(ctx(), d_msg.data(), l, d_out.data());
  VERL_CUDA_CHECK(cudaEventRecord(e2, ctx().stream));
  sync();
  float ms_compress = 0.0f, ms_accumulate = 0.0f;
  VERL_CUDA_CHECK(cudaEventElapsedTime(&ms_compress, e0, e1));
  VERL_CUDA_CHECK(cudaEventElapsedTime(&ms_accumulate, e1, e2));
  std::printf("sparse_sync n=%" PRId64 " k=%" PRId64
              " int8 with carry: compress %.3f ms, "
              "accumulate %.3f ms, compress+accumulate %.3f ms\n",
              n, l.k, ms_compress / kIters, ms_accumulate / kIters,
              (ms_compress + ms_accumulate) / kIters);
  VERL_CUDA_CHECK(cudaEventDestroy(e0));
  VERL_CUDA_CHECK(cudaEventDestroy(e1));
  VERL_CUDA_CHECK(cudaEventDestroy(e2));
}

}  // namespace
}  // namespace verl::optim::cuda::test
