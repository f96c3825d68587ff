// Causal GQA attention over packed sequences: a naive full-matrix masked softmax reference,
// packed == each sequence alone, no leakage across sequences, finite differences of the backward.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "core/error.h"
#include "ops/cpu/ops.h"
#include "test_util.h"

namespace verl::ops::test {
namespace cpu = verl::ops::cpu;

namespace {

struct Shape {
  std::vector<int32_t> cu;  // cu_seqlens
  int64_t H, Hkv, D;
  int64_t B() const { return static_cast<int64_t>(cu.size()) - 1; }
  int64_t T() const { return cu.back(); }
};

// Full T x T score matrix in double with a block-diagonal causal mask (-inf outside).
void naive_attention(std::vector<double>& out, std::vector<double>& lse,
                     const std::vector<float>& q, const std::vector<float>& k,
                     const std::vector<float>& v, const Shape& s, double scale) {
  const int64_t T = s.T(), H = s.H, Hkv = s.Hkv, D = s.D, rep = H / Hkv;
  std::vector<int64_t> seq_of(T);
  for (int64_t b = 0; b < s.B(); ++b)
    for (int64_t t = s.cu[b]; t < s.cu[b + 1]; ++t) seq_of[t] = b;
  out.assign(T * H * D, 0.0);
  lse.assign(T * H, 0.0);
  std::vector<double> S(T * T);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h / rep;
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j) {
        const bool visible = seq_of[i] == seq_of[j] && j <= i;
        double d = 0.0;
        for (int64_t c = 0; c < D; ++c)
          d += static_cast<double>(q[(i * H + h) * D + c]) * k[(j * Hkv + g) * D + c];
        S[i * T + j] = visible ? scale * d : -std::numeric_limits<double>::infinity();
      }
    for (int64_t i = 0; i < T; ++i) {
      double m = -std::numeric_limits<double>::infinity(), l = 0.0;
      for (int64_t j = 0; j < T; ++j) m = std::max(m, S[i * T + j]);
      for (int64_t j = 0; j < T; ++j) l += std::exp(S[i * T + j] - m);
      lse[i * H + h] = m + std::log(l);
      for (int64_t j = 0; j < T; ++j) {
        const double p = std::exp(S[i * T + j] - m) / l;
        for (int64_t c = 0; c < D; ++c) out[(i * H + h) * D + c] += p * v[(j * Hkv + g) * D + c];
      }
    }
  }
}

struct Inputs {
  std::vector<float> q, k, v;
};

Inputs make_inputs(const Shape& s, uint64_t seed) {
  return {randn(s.T() * s.H * s.D, seed), randn(s.T() * s.Hkv * s.D, seed + 1),
          randn(s.T() * s.Hkv * s.D, seed + 2)};
}

void forward(std::vector<float>& out, std::vector<float>& lse, const Inputs& in, const Shape& s,
             float scale) {
  out.assign(s.T() * s.H * s.D, 7.0f);  // garbage: the forward must overwrite
  lse.assign(s.T() * s.H, 7.0f);
  cpu::attention_forward(out.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(), s.cu.data(),
                         s.B(), s.T(), s.H, s.Hkv, s.D, scale);
}

std::string name(const Shape& s) {
  return "H=" + std::to_string(s.H) + " Hkv=" + std::to_string(s.Hkv) + " D=" + std::to_string(s.D);
}

const Shape kPackedGqa{{0, 1, 6, 19}, 4, 2, 5};  // lengths 1, 5, 13; two query heads per kv head
const Shape kPackedMha{{0, 1, 6, 19}, 2, 2, 5};  // H == Hkv

}  // namespace

TEST(Attention, MatchesNaiveMaskedSoftmax) {
  for (const Shape& s : {kPackedGqa, kPackedMha, Shape{{0, 7}, 4, 1, 8}, Shape{{0, 1}, 2, 2, 3},
                         Shape{{0, 40, 40, 57}, 6, 3, 16}}) {  // includes an empty sequence
    auto in = make_inputs(s, 100);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
    std::vector<float> out, lse;
    forward(out, lse, in, s, scale);
    std::vector<double> wout, wlse;
    naive_attention(wout, wlse, in.q, in.k, in.v, s, scale);
    expect_close("out " + name(s), out, wout, kAttentionRef);
    expect_close("lse " + name(s), lse, wlse, kAttentionRef);
  }
}

TEST(Attention, PackedEqualsEachSequenceAlone) {
  const Shape s = kPackedGqa;
  auto in = make_inputs(s, 200);
  auto dout = randn(s.T() * s.H * s.D, 203);
  const float scale = 0.37f;
  std::vector<float> out, lse;
  forward(out, lse, in, s, scale);
  std::vector<float> dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
  cpu::attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), in.q.data(), in.k.data(),
                          in.v.data(), out.data(), lse.data(), s.cu.data(), s.B(), s.T(), s.H,
                          s.Hkv, s.D, scale);
  for (int64_t b = 0; b < s.B(); ++b) {
    const int64_t t0 = s.cu[b], L = s.cu[b + 1] - s.cu[b];
    const Shape one{{0, static_cast<int32_t>(L)}, s.H, s.Hkv, s.D};
    auto slice = [&](const std::vector<float>& x, int64_t width) {
      return std::vector<float>(x.begin() + t0 * width, x.begin() + (t0 + L) * width);
    };
    const int64_t qw = s.H * s.D, kw = s.Hkv * s.D;
    Inputs in1{slice(in.q, qw), slice(in.k, kw), slice(in.v, kw)};
    std::vector<float> out1, lse1;
    forward(out1, lse1, in1, one, scale);
    const std::string tag = " of sequence " + std::to_string(b);
    expect_close("out" + tag, out1, slice(out, qw), kSameMath);
    expect_close("lse" + tag, lse1, slice(lse, s.H), kSameMath);
    auto dout1 = slice(dout, qw);
    std::vector<float> dq1(in1.q.size()), dk1(in1.k.size()), dv1(in1.v.size());
    cpu::attention_backward(dq1.data(), dk1.data(), dv1.data(), dout1.data(), in1.q.data(),
                            in1.k.data(), in1.v.data(), out1.data(), lse1.data(), one.cu.data(), 1,
                            L, s.H, s.Hkv, s.D, scale);
    expect_close("d_q" + tag, dq1, slice(dq, qw), kSameMath);
    expect_close("d_k" + tag, dk1, slice(dk, kw), kSameMath);
    expect_close("d_v" + tag, dv1, slice(dv, kw), kSameMath);
  }
}

TEST(Attention, NoLeakageAcrossSequences) {
  const Shape s = kPackedGqa;  // sequences [0,1), [1,6), [6,19)
  auto in = make_inputs(s, 300);
  std::vector<float> out, lse;
  forward(out, lse, in, s, 0.5f);
  Inputs perturbed = in;
  const int64_t kw = s.Hkv * s.D;
  for (int64_t i = 1 * kw; i < 6 * kw; ++i) {  // change sequence 1's keys and values only
    perturbed.k[i] += 3.0f;
    perturbed.v[i] -= 2.0f;
  }
  std::vector<float> out2, lse2;
  forward(out2, lse2, perturbed, s, 0.5f);
  const int64_t qw = s.H * s.D;
  for (int64_t i = 0; i < s.T() * qw; ++i) {
    const int64_t t = i / qw;
    if (t >= 1 && t < 6) continue;
    ASSERT_EQ(out[i], out2[i]) << "output of token " << t << " changed";
  }
  // And the perturbed sequence itself did change (the test can see a difference).
  EXPECT_NE(out[3 * qw], out2[3 * qw]);
}

TEST(Attention, FiniteDifferences) {
  for (const Shape& s : {kPackedGqa, kPackedMha, Shape{{0, 7}, 2, 1, 3}}) {
    auto in = make_inputs(s, 400);
    auto R = randn(s.T() * s.H * s.D, 404);
    const float scale = 0.6f;
    std::vector<float> out, lse;
    auto loss = [&] {
      forward(out, lse, in, s, scale);
      return dot(out, R);
    };
    loss();
    const float init = 0.5f;
    std::vector<float> dq(in.q.size(), init), dk(in.k.size(), init), dv(in.v.size(), init);
    cpu::attention_backward(dq.data(), dk.data(), dv.data(), R.data(), in.q.data(), in.k.data(),
                            in.v.data(), out.data(), lse.data(), s.cu.data(), s.B(), s.T(), s.H,
                            s.Hkv, s.D, scale);
    for (auto* g : {&dq, &dk, &dv})
      for (auto& e : *g) e -= init;
    check_grad("attention d_q " + name(s), in.q, dq, loss);
    check_grad("attention d_k " + name(s), in.k, dk, loss);
    check_grad("attention d_v " + name(s), in.v, dv, loss);
  }
}

TEST(Attention, RejectsBadCuSeqlens) {
  const Shape s{{0, 3, 5}, 2, 2, 4};
  auto in = make_inputs(s, 500);
  std::vector<float> out(s.T() * s.H * s.D), lse(s.T() * s.H);
  std::vector<int32_t> bad = {0, 3, 4};  // ends at 4, but T = 5
  EXPECT_THROW(cpu::attention_forward(out.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(),
                                      bad.data(), 2, 5, 2, 2, 4, 1.0f),
               verl::Error);
  std::vector<int32_t> ok = s.cu;
  EXPECT_THROW(cpu::attention_forward(out.data(), lse.data(), in.q.data(), in.k.data(), in.v.data(),
                                      ok.data(), 2, 5, 3, 2, 4, 1.0f),  // 3 % 2 != 0
               verl::Error);
}

}  // namespace verl::ops::test
