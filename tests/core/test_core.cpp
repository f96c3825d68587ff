#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/arena.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace verl {

// Known-answer vectors of Philox4x32-10 from the Random123 distribution (kat_vectors).
TEST(Rng, PhiloxKnownAnswers) {
  auto a = philox4x32(0, 0, 0);
  EXPECT_EQ(a[0], 0x6627e8d5u);
  EXPECT_EQ(a[1], 0xe169c58du);
  EXPECT_EQ(a[2], 0xbc57ac4cu);
  EXPECT_EQ(a[3], 0x9b00dbd8u);
  auto b = philox4x32(~0ull, ~0ull, ~0ull);
  EXPECT_EQ(b[0], 0x408f276du);
  EXPECT_EQ(b[1], 0x41c83b0eu);
  EXPECT_EQ(b[2], 0xa20bc7c6u);
  EXPECT_EQ(b[3], 0x6d5451fdu);
  auto c = philox4x32(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull);
  EXPECT_EQ(c[0], 0xd16cfe09u);
  EXPECT_EQ(c[1], 0x94fdccebu);
  EXPECT_EQ(c[2], 0x5001e420u);
  EXPECT_EQ(c[3], 0x24126ea1u);
}

TEST(Rng, ResumeFromOffsetReplaysSequence) {
  Rng r(42, 7);
  for (int i = 0; i < 5; ++i) r.next_u32();
  uint64_t off = r.offset();
  std::vector<uint32_t> first;
  for (int i = 0; i < 9; ++i) first.push_back(r.next_u32());
  Rng s(42, 7);
  s.set_offset(off);
  for (int i = 0; i < 9; ++i) EXPECT_EQ(s.next_u32(), first[i]);
  Rng other_stream(42, 8);
  other_stream.set_offset(off);
  EXPECT_NE(other_stream.next_u32(), first[0]);
}

TEST(Rng, UniformAndNormalMoments) {
  Rng r(1);
  const int n = 200000;
  double su = 0, sn = 0, sn2 = 0;
  for (int i = 0; i < n; ++i) {
    float u = r.uniform();
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    su += u;
    float z = r.normal();
    sn += z;
    sn2 += z * z;
  }
  EXPECT_NEAR(su / n, 0.5, 0.005);
  EXPECT_NEAR(sn / n, 0.0, 0.01);
  EXPECT_NEAR(sn2 / n, 1.0, 0.02);
  std::map<uint64_t, int> counts;
  for (int i = 0; i < 60000; ++i) counts[r.below(6)]++;
  ASSERT_EQ(counts.size(), 6u);
  for (auto& [k, c] : counts) EXPECT_NEAR(c, 10000, 500) << k;
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly half way between two bf16 values: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + 1.0f / 256), 0x3f80);
  // 1 + 3*2^-8 ties to the even neighbour above.
  EXPECT_EQ(f32_to_bf16(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_FLOAT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16RoundTripAndEdges) {
  for (float x : {0.0f, 1.0f, -1.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333251953125f}) {
    EXPECT_EQ(f16_to_f32(f32_to_f16(x)), x) << x;
  }
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);  // tie -> even
  EXPECT_EQ(f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);
  DType t;
  EXPECT_TRUE(dtype_from_name("BF16", &t));
  EXPECT_EQ(t, DType::BF16);
  EXPECT_FALSE(dtype_from_name("F8_E4M3", &t));
}

TEST(Arena, AlignsTracksPeakAndRefusesOverflow) {
  Arena a("test", 1024);
  void* p = a.alloc(10);
  void* q = a.alloc(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(q) % 64, 0u);
  EXPECT_EQ(a.used(), 64u + 128u);
  a.reset();
  EXPECT_EQ(a.used(), 0u);
  EXPECT_EQ(a.peak(), 192u);
  try {
    a.alloc(4096);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("arena 'test' is full"), std::string::npos);
  }
}

TEST(Tensor, ShapeHelpers) {
  float buf[6];
  Tensor t(buf, DType::F32, {2, 3});
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 24u);
  EXPECT_EQ(t.size(-1), 3);
  EXPECT_EQ(t.shape_str(), "[2, 3]");
}

}  // namespace verl
