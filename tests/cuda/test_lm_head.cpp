// The fused LM head (logits -> log-softmax, target gather, entropy; src/ops/cuda/lm_head.h) on the
// GPU against the CPU op on the same bf16-rounded inputs: odd T, C not a multiple of 128, an odd
// vocabulary, chunks of 1, 7 and T rows, temperatures 1 and 0.7, some tokens without a target.
// Both modes: logits recomputed in the backward, and the kept bf16 probabilities
// (lm_head_forward_keep_probs / lm_head_backward_from_probs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "ops/cpu/ops.h"
#include "ops/cuda/lm_head.h"
#include "test_util.h"

namespace verl::ops::cuda::test {
namespace {

using CudaLmHead = CudaTest;

struct LmShape {
  int64_t T, C, V;
};

// Inputs and the CPU results of one (shape, temperature).
struct Reference {
  std::vector<float> h, w, dlp, dent, dh0, dw0;
  std::vector<int32_t> targets;
  std::vector<float> logprob, entropy, lse, dh, dw;
  // Magnitude of the terms of each gradient element, sum_j |d_z[t,j]| |w[j,c]| for d_h and
  // sum_t |d_z[t,j]| |h[t,c]| for d_w: the GPU stores d_z as bf16, so its error is bounded by
  // 2^-9 of these (lm_head.h), not by the (possibly cancelled) gradient itself.
  std::vector<float> dh_terms, dw_terms;
  // The kept-probabilities mode: p = exp(z - lse) [T,V] (fp32, from the CPU's lse), and the same
  // sums with |d_z_j| replaced by b_j = (|d_logprob| (1[j==target] + p_j) + |d_entropy| p_j
  // (|log p_j + H| + 1)) / temperature, which bounds both |d_z_j| and the terms that the bf16
  // storage of p perturbs (lm_head.h).
  std::vector<float> probs, dh_pterms, dw_pterms;
};

// with_dlp / with_dent: whether the upstream d_logprob / d_entropy is given (else null = zero).
Reference make_reference(LmShape s, float temperature, uint64_t seed, bool with_dlp = true,
                         bool with_dent = true) {
  const auto [T, C, V] = s;
  Reference r;
  // Logits of standard deviation ~2: peaked but not one-hot softmaxes.
  r.h = bf16_rounded(randn(T * C, seed));
  r.w = bf16_rounded(randn(V * C, seed + 1, 2.0f / std::sqrt(static_cast<float>(C))));
  r.dlp = randn(T, seed + 2);
  r.dent = randn(T, seed + 3);
  r.dh0 = bf16_rounded(randn(T * C, seed + 4, 0.01f));
  r.dw0 = randn(V * C, seed + 5, 0.01f);
  Rng rng(seed + 6);
  r.targets.resize(T);
  for (int64_t t = 0; t < T; ++t) {
    r.targets[t] = (t % 3 == 1) ? -1 : static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
  }
  r.logprob.assign(T, 0.0f);
  r.entropy.assign(T, 0.0f);
  r.lse.assign(T, 0.0f);
  cpu::lm_head_forward(r.logprob.data(), r.entropy.data(), r.lse.data(), r.h.data(), r.w.data(),
                       r.targets.data(), T, C, V, temperature, T);
  r.dh = r.dh0;
  r.dw = r.dw0;
  cpu::lm_head_backward(r.dh.data(), r.dw.data(), with_dlp ? r.dlp.data() : nullptr,
                        with_dent ? r.dent.data() : nullptr, r.h.data(), r.w.data(),
                        r.targets.data(), r.lse.data(), r.entropy.data(), T, C, V, temperature, T);

  // |d_z| on the host (only a scale, so plain loops), then the term magnitudes.
  r.dh_terms.assign(T * C, 0.0f);
  r.dw_terms.assign(V * C, 0.0f);
  r.dh_pterms.assign(T * C, 0.0f);
  r.dw_pterms.assign(V * C, 0.0f);
  r.probs.assign(T * V, 0.0f);
  std::vector<float> adz(V), bdz(V);
  for (int64_t t = 0; t < T; ++t) {
    const float* ht = r.h.data() + t * C;
    for (int64_t j = 0; j < V; ++j) {
      const float* wj = r.w.data() + j * C;
      float z = 0.0f;
      for (int64_t c = 0; c < C; ++c) z += ht[c] * wj[c];
      const float logp = z / temperature - r.lse[t];
      const float p = std::exp(logp);
      const float dl = (with_dlp && r.targets[t] >= 0) ? r.dlp[t] : 0.0f;
      const float de = with_dent ? r.dent[t] : 0.0f;
      float g = -dl * p - de * p * (logp + r.entropy[t]);
      if (j == r.targets[t]) g += dl;
      adz[j] = std::abs(g) / temperature;
      r.probs[t * V + j] = p;
      bdz[j] = (std::abs(dl) * ((j == r.targets[t] ? 1.0f : 0.0f) + p) +
                std::abs(de) * p * (std::abs(logp + r.entropy[t]) + 1.0f)) /
               temperature;
    }
    float* dht = r.dh_terms.data() + t * C;
    float* dhpt = r.dh_pterms.data() + t * C;
    for (int64_t j = 0; j < V; ++j) {
      const float* wj = r.w.data() + j * C;
      float* dwj = r.dw_terms.data() + j * C;
      float* dwpj = r.dw_pterms.data() + j * C;
      for (int64_t c = 0; c < C; ++c) {
        dht[c] += adz[j] * std::abs(wj[c]);
        dwj[c] += adz[j] * std::abs(ht[c]);
        dhpt[c] += bdz[j] * std::abs(wj[c]);
        dwpj[c] += bdz[j] * std::abs(ht[c]);
      }
    }
  }
  return r;
}

// |got - want| <= atol + rtol (|init| + |want - init| + terms): the output's own rounding plus the
// bf16 rounding of d_z, bounded by the magnitude of the summed terms.
void expect_close_terms(const std::string& what, const std::vector<float>& got,
                        const std::vector<float>& want, const std::vector<float>& init,
                        const std::vector<float>& terms, Tol tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    const double scale = std::abs(double(init[i])) + std::abs(w - init[i]) + terms[i];
    if (!(std::abs(g - w) <= tol.atol + tol.rtol * scale)) {
      if (++misses <= 5) {
        ADD_FAILURE() << what << "[" << i << "]: got " << g << " want " << w << " (init " << init[i]
                      << ", terms " << terms[i] << ")";
      }
    }
  }
  EXPECT_EQ(misses, 0) << what << ": " << misses << " of " << got.size() << " out of tolerance";
}

void check_lm_head(const CudaContext& ctx, const CudaSession& session, LmShape s,
                   float temperature) {
  const auto [T, C, V] = s;
  const Reference r = make_reference(s, temperature, 300 + T + C + V);
  auto d_h = upload_bf16(r.h), d_w = upload_bf16(r.w);
  DeviceBuffer<int32_t> d_tg(r.targets);
  DeviceBuffer<float> d_dlp(r.dlp), d_dent(r.dent);
  for (int64_t chunk : {int64_t{1}, int64_t{7}, T}) {
    SCOPED_TRACE("T=" + std::to_string(T) + " C=" + std::to_string(C) + " V=" + std::to_string(V) +
                 " temperature=" + std::to_string(temperature) + " chunk=" + std::to_string(chunk));
    DeviceBuffer<float> d_lp(T), d_ent(T), d_lse(T), d_dw(r.dw0);
    auto d_dh = upload_bf16(r.dh0);
    DeviceBuffer<uint8_t> scratch(lm_head_backward_scratch_bytes(T, V, chunk));
    lm_head_forward(ctx, d_lp.data(), d_ent.data(), d_lse.data(), d_h.data(), d_w.data(),
                    d_tg.data(), T, C, V, temperature, chunk, scratch.data(), scratch.bytes());
    // The backward uses the GPU's own saved lse and entropy, as the trainer will.
    lm_head_backward(ctx, d_dh.data(), d_dw.data(), d_dlp.data(), d_dent.data(), d_h.data(),
                     d_w.data(), d_tg.data(), d_lse.data(), d_ent.data(), T, C, V, temperature,
                     chunk, scratch.data(), scratch.bytes());
    session.synchronize();
    const auto lp = d_lp.download();
    expect_close("logprob", lp, r.logprob, kLmHeadForward);
    expect_close("entropy", d_ent.download(), r.entropy, kLmHeadForward);
    expect_close("lse", d_lse.download(), r.lse, kLmHeadForward);
    for (int64_t t = 0; t < T; ++t) {
      if (r.targets[t] < 0) {
        EXPECT_EQ(lp[t], 0.0f) << "logprob[" << t << "] without a target";
      }
    }
    expect_close_terms("d_h", download_bf16(d_dh), r.dh, r.dh0, r.dh_terms, kLmHeadGrad);
    expect_close_terms("d_w", d_dw.download(), r.dw, r.dw0, r.dw_terms, kLmHeadGrad);
  }
}

TEST_F(CudaLmHead, MatchesCpu) {
  for (int64_t T : {1, 7, 19, 130}) {
    for (int64_t C : {64, 96}) {
      for (int64_t V : {1000, 4099}) {
        for (float temperature : {1.0f, 0.7f}) {
          check_lm_head(ctx(), *session_, LmShape{T, C, V}, temperature);
        }
      }
    }
  }
}

// One upstream gradient at a time (the other null), d_h or d_w alone, and the arena overloads.
TEST_F(CudaLmHead, NullGradientsAndArena) {
  const int64_t T = 19, C = 64, V = 1000, chunk = 7;
  const float temperature = 0.7f;
  const Reference r = make_reference(LmShape{T, C, V}, temperature, 400);
  auto d_h = upload_bf16(r.h), d_w = upload_bf16(r.w);
  DeviceBuffer<int32_t> d_tg(r.targets);
  DeviceBuffer<float> d_dlp(r.dlp), d_dent(r.dent), d_lp(T), d_ent(T), d_lse(T);
  DeviceArena arena("lm_head_test", lm_head_forward_scratch_bytes(T, V, chunk) +
                                        lm_head_backward_scratch_bytes(T, V, chunk) * 4);
  lm_head_forward(ctx(), arena, d_lp.data(), d_ent.data(), d_lse.data(), d_h.data(), d_w.data(),
                  d_tg.data(), T, C, V, temperature, chunk);
  sync();
  expect_close("logprob", d_lp.download(), r.logprob, kLmHeadForward);

  for (int which = 0; which < 2; ++which) {  // 0: d_logprob only, 1: d_entropy only
    SCOPED_TRACE(which == 0 ? "d_logprob only" : "d_entropy only");
    const Reference p = make_reference(LmShape{T, C, V}, temperature, 400, which == 0, which == 1);
    auto d_dh = upload_bf16(p.dh0);
    DeviceBuffer<float> d_dw(p.dw0);
    // d_h and d_w in separate calls: each skips the other.
    for (int part = 0; part < 2; ++part) {
      lm_head_backward(ctx(), arena, part == 0 ? d_dh.data() : nullptr,
                       part == 1 ? d_dw.data() : nullptr, which == 0 ? d_dlp.data() : nullptr,
                       which == 1 ? d_dent.data() : nullptr, d_h.data(), d_w.data(), d_tg.data(),
                       d_lse.data(), d_ent.data(), T, C, V, temperature, chunk);
    }
    sync();
    expect_close_terms("d_h", download_bf16(d_dh), p.dh, p.dh0, p.dh_terms, kLmHeadGrad);
    expect_close_terms("d_w", d_dw.download(), p.dw, p.dw0, p.dw_terms, kLmHeadGrad);
  }
}

// The kept-probabilities mode on one (shape, temperature, upstream gradients): for each chunk, the
// forward's outputs are bitwise those of lm_head_forward, p matches the CPU's exp(z - lse) to one
// bf16 rounding, and the backward from p matches the CPU op within the bound of lm_head.h.
void check_keep_probs(const CudaContext& ctx, const CudaSession& session, LmShape s,
                      float temperature, bool with_dlp, bool with_dent) {
  const auto [T, C, V] = s;
  const Reference r = make_reference(s, temperature, 700 + T + C + V, with_dlp, with_dent);
  auto d_h = upload_bf16(r.h), d_w = upload_bf16(r.w);
  DeviceBuffer<int32_t> d_tg(r.targets);
  DeviceBuffer<float> d_dlp(r.dlp), d_dent(r.dent);
  DeviceBuffer<bf16> d_probs(lm_head_probs_bytes(T, V) / sizeof(bf16));
  for (int64_t chunk : {int64_t{1}, int64_t{7}, T}) {
    SCOPED_TRACE("T=" + std::to_string(T) + " C=" + std::to_string(C) + " V=" + std::to_string(V) +
                 " temperature=" + std::to_string(temperature) + " chunk=" + std::to_string(chunk) +
                 " d_logprob " + (with_dlp ? "on" : "off") + " d_entropy " +
                 (with_dent ? "on" : "off"));
    DeviceBuffer<float> d_lp(T), d_ent(T), d_lse(T), p_lp(T), p_ent(T), p_lse(T), d_dw(r.dw0);
    auto d_dh = upload_bf16(r.dh0);
    DeviceBuffer<uint8_t> fscratch(lm_head_forward_scratch_bytes(T, V, chunk));
    DeviceBuffer<uint8_t> bscratch(lm_head_backward_from_probs_scratch_bytes(T, V, chunk));
    lm_head_forward(ctx, p_lp.data(), p_ent.data(), p_lse.data(), d_h.data(), d_w.data(),
                    d_tg.data(), T, C, V, temperature, chunk, fscratch.data(), fscratch.bytes());
    lm_head_forward_keep_probs(ctx, d_lp.data(), d_ent.data(), d_lse.data(), d_probs.data(),
                               d_h.data(), d_w.data(), d_tg.data(), T, C, V, temperature, chunk,
                               fscratch.data(), fscratch.bytes());
    lm_head_backward_from_probs(ctx, d_dh.data(), d_dw.data(), with_dlp ? d_dlp.data() : nullptr,
                                with_dent ? d_dent.data() : nullptr, d_probs.data(), d_h.data(),
                                d_w.data(), d_tg.data(), d_ent.data(), T, C, V, temperature, chunk,
                                bscratch.data(), bscratch.bytes());
    session.synchronize();
    const auto lp = d_lp.download(), ent = d_ent.download(), lse = d_lse.download();
    EXPECT_TRUE(bitwise_equal(lp, p_lp.download())) << "logprob differs from lm_head_forward";
    EXPECT_TRUE(bitwise_equal(ent, p_ent.download())) << "entropy differs from lm_head_forward";
    EXPECT_TRUE(bitwise_equal(lse, p_lse.download())) << "lse differs from lm_head_forward";
    expect_close("logprob", lp, r.logprob, kLmHeadForward);
    expect_close("entropy", ent, r.entropy, kLmHeadForward);
    expect_close("lse", lse, r.lse, kLmHeadForward);
    expect_close("probs", download_bf16(d_probs), r.probs, kBf16Out);
    expect_close_terms("d_h", download_bf16(d_dh), r.dh, r.dh0, r.dh_pterms, kLmHeadGradKeptProbs);
    expect_close_terms("d_w", d_dw.download(), r.dw, r.dw0, r.dw_pterms, kLmHeadGradKeptProbs);
  }
}

// V = 1000: float4 forward and 8-wide backward; 1004: float4 forward, scalar backward; 4099 and
// 257: scalar both (and rows not 16-byte aligned).
TEST_F(CudaLmHead, KeepProbsMatchesCpu) {
  const LmShape shapes[] = {{1, 64, 1000},   {7, 96, 4099},   {19, 64, 1004},
                            {130, 96, 4099}, {130, 64, 1000}, {19, 96, 257}};
  for (const LmShape& s : shapes) {
    for (float temperature : {1.0f, 0.7f}) {
      check_keep_probs(ctx(), *session_, s, temperature, true, true);
      check_keep_probs(ctx(), *session_, s, temperature, true, false);
      check_keep_probs(ctx(), *session_, s, temperature, false, true);
    }
  }
}

// The arena overloads; the backward from the same kept p twice (d_h alone, then d_w alone: p is
// only read), and bitwise reproducible.
TEST_F(CudaLmHead, KeepProbsArenaAndRepeat) {
  const int64_t T = 19, C = 64, V = 1000, chunk = 7;
  const float temperature = 0.7f;
  const Reference r = make_reference(LmShape{T, C, V}, temperature, 800);
  auto d_h = upload_bf16(r.h), d_w = upload_bf16(r.w);
  DeviceBuffer<int32_t> d_tg(r.targets);
  DeviceBuffer<float> d_dlp(r.dlp), d_dent(r.dent), d_lp(T), d_ent(T), d_lse(T);
  DeviceBuffer<bf16> d_probs(lm_head_probs_bytes(T, V) / sizeof(bf16));
  DeviceArena arena("lm_head_test", lm_head_forward_scratch_bytes(T, V, chunk) +
                                        lm_head_backward_from_probs_scratch_bytes(T, V, chunk) * 4);
  lm_head_forward_keep_probs(ctx(), arena, d_lp.data(), d_ent.data(), d_lse.data(), d_probs.data(),
                             d_h.data(), d_w.data(), d_tg.data(), T, C, V, temperature, chunk);
  std::vector<float> dw_first;
  for (int rep = 0; rep < 2; ++rep) {
    auto d_dh = upload_bf16(r.dh0);
    DeviceBuffer<float> d_dw(r.dw0);
    for (int part = 0; part < 2; ++part) {
      lm_head_backward_from_probs(ctx(), arena, part == 0 ? d_dh.data() : nullptr,
                                  part == 1 ? d_dw.data() : nullptr, d_dlp.data(), d_dent.data(),
                                  d_probs.data(), d_h.data(), d_w.data(), d_tg.data(), d_ent.data(),
                                  T, C, V, temperature, chunk);
    }
    sync();
    const auto dw = d_dw.download();
    expect_close("logprob", d_lp.download(), r.logprob, kLmHeadForward);
    expect_close_terms("d_h", download_bf16(d_dh), r.dh, r.dh0, r.dh_pterms, kLmHeadGradKeptProbs);
    expect_close_terms("d_w", dw, r.dw, r.dw0, r.dw_pterms, kLmHeadGradKeptProbs);
    if (rep == 0) {
      dw_first = dw;
    } else {
      EXPECT_TRUE(bitwise_equal(dw, dw_first)) << "d_w differs between two identical backwards";
    }
  }
}

TEST_F(CudaLmHead, RejectsSmallScratch) {
  const int64_t T = 7, C = 64, V = 1000;
  auto d_h = upload_bf16(randn(T * C, 500)), d_w = upload_bf16(randn(V * C, 501));
  DeviceBuffer<float> d_lse(T);
  DeviceBuffer<uint8_t> scratch(lm_head_forward_scratch_bytes(T, V, 7) - 1);
  EXPECT_THROW(lm_head_forward(ctx(), nullptr, nullptr, d_lse.data(), d_h.data(), d_w.data(),
                               nullptr, T, C, V, 1.0f, 7, scratch.data(), scratch.bytes()),
               Error);
  DeviceBuffer<float> d_ent(T), d_dlp(T);
  DeviceBuffer<bf16> d_probs(T * V), d_dh(T * C);
  DeviceBuffer<uint8_t> bscratch(lm_head_backward_from_probs_scratch_bytes(T, V, 7) - 1);
  EXPECT_THROW(
      lm_head_backward_from_probs(ctx(), d_dh.data(), nullptr, d_dlp.data(), nullptr,
                                  d_probs.data(), d_h.data(), d_w.data(), nullptr, d_ent.data(), T,
                                  C, V, 1.0f, 7, bscratch.data(), bscratch.bytes()),
      Error);
}

}  // namespace
}  // namespace verl::ops::cuda::test
