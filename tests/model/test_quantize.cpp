// Weight-only quantisation (model/quantize.h): int8 per row, int4 per group with its packing and
// clipping search, and what quantize_linear_weights touches.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "model/quantize.h"

namespace verl::model {
namespace {

std::vector<float> randn(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = rng.normal();
  return x;
}

TEST(Quantize, Int8PerRowWithinHalfAStep) {
  const int64_t R = 5, C = 37;
  std::vector<float> w = randn(R * C, 1);
  for (int64_t c = 0; c < C; ++c) w[2 * C + c] *= 100.0f;  // a row 100x larger gets its own scale
  for (int64_t c = 0; c < C; ++c) w[4 * C + c] = 0.0f;     // an all-zero row
  const QuantizedMatrix q = quantize_matrix(w.data(), R, C, 8, 128);
  ASSERT_EQ(q.scales.size(), 5u);
  EXPECT_EQ(q.scales[4], 0.0f);
  EXPECT_NEAR(q.scales[2] / q.scales[0], 100.0f, 60.0f);
  std::vector<float> d(w.size());
  dequantize_matrix(q, d.data());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_LE(std::abs(q.code(r, c)), 127);
      EXPECT_LE(std::fabs(d[r * C + c] - w[r * C + c]), 0.5f * q.scales[r] * 1.0001f) << r << "," << c;
    }
  // The row's largest magnitude is a code of +-127 exactly.
  int top = 0;
  for (int64_t c = 0; c < C; ++c) top = std::max(top, std::abs(q.code(0, c)));
  EXPECT_EQ(top, 127);
}

TEST(Quantize, Int4GroupsPackTwoANibbleAndClipToTheBestScale) {
  const int64_t R = 3, C = 41, G = 8;  // odd columns: the last byte of a row holds one code
  std::vector<float> w = randn(R * C, 2);
  w[5] = 30.0f;  // an outlier in row 0's first group
  const QuantizedMatrix q = quantize_matrix(w.data(), R, C, 4, G);
  EXPECT_EQ(q.groups_per_row(), 6);
  EXPECT_EQ(q.row_bytes(), 21);
  EXPECT_EQ(q.codes.size(), 63u);
  std::vector<float> d(w.size());
  dequantize_matrix(q, d.data());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const int code = q.code(r, c);
      EXPECT_GE(code, -7);
      EXPECT_LE(code, 7);
      const float s = q.scales[static_cast<size_t>(r * q.groups_per_row() + c / G)];
      EXPECT_EQ(d[r * C + c], static_cast<float>(code) * s);
      // Clipped or not, no element is off by more than the step and what clipping cut off.
      const float clip = 7.0f * s;
      EXPECT_LE(std::fabs(d[r * C + c] - w[r * C + c]),
                0.5f * s * 1.0001f + std::max(0.0f, std::fabs(w[r * C + c]) - clip));
    }
  // The scale search never does worse than max |w| / 7 over a group.
  for (int64_t g = 0; g < q.groups_per_row(); ++g) {
    double chosen = 0, plain = 0;
    float maxabs = 0;
    for (int64_t c = g * G; c < std::min(C, (g + 1) * G); ++c) maxabs = std::max(maxabs, std::fabs(w[c]));
    const float s0 = maxabs / 7.0f;
    for (int64_t c = g * G; c < std::min(C, (g + 1) * G); ++c) {
      chosen += std::pow(d[c] - w[c], 2);
      plain += std::pow(std::clamp(std::nearbyint(w[c] / s0), -7.0f, 7.0f) * s0 - w[c], 2);
    }
    EXPECT_LE(chosen, plain * (1 + 1e-6)) << "group " << g;
  }
}

TEST(Quantize, LinearWeightsOnlyAndBadInputs) {
  ModelConfig c;
  c.architecture = "LlamaForSequenceClassification";
  c.head = HeadKind::SequenceClassification;
  c.num_labels = 1;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  Weights w = Weights::from_config(c);
  w.data = randn(w.layout.total, 3);
  const std::vector<float> before = w.data;
  const QuantizeReport rep = quantize_linear_weights(w, 4, 8);
  EXPECT_EQ(rep.matrices, 8);  // wqkv, wo, gate/up, down of 2 layers
  EXPECT_GT(rep.max_abs_error, 0.0);
  EXPECT_LT(rep.quantized_bytes * 3, rep.fp32_bytes);  // group 8: half a byte and half a scale byte an entry
  for (const ParamInfo& p : w.layout.params) {
    const bool linear = p.name.find("wqkv") != std::string::npos || p.name.find(".wo") != std::string::npos ||
                        p.name.find("wgu") != std::string::npos || p.name.find("wdown") != std::string::npos;
    bool same = true;
    for (int64_t k = 0; k < p.numel; ++k) same = same && w.data[p.offset + k] == before[p.offset + k];
    EXPECT_EQ(same, !linear) << p.name;
  }
  Weights w16 = Weights::from_config(c);
  EXPECT_EQ(quantize_linear_weights(w16, 16).matrices, 0);
  EXPECT_THROW(quantize_linear_weights(w16, 3), Error);
  EXPECT_THROW(quantize_linear_weights(w16, 4, 7), Error);
  std::vector<float> bad = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_THROW(quantize_matrix(bad.data(), 1, 2, 8, 128), Error);
}

}  // namespace
}  // namespace verl::model
