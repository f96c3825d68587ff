// The batch-invariant GEMM (src/ops/cuda/gemm_invariant.cu, CudaContext::batch_invariant): the
// forward GEMMs against the CPU fp32 linear on bf16-rounded inputs, and the bits of a token's row
// under calls of 1, 7, 64, 255 and 1024 tokens (every tile configuration of the kernel) that start
// at other tokens and features, so the row sits elsewhere in the tiles and mma fragments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "ops/cpu/ops.h"
#include "ops/cuda/gemm.h"
#include "test_util.h"

namespace verl::ops::cuda::test {
namespace {

using detail::Gemm;
using detail::run_gemm;

class GemmInvariant : public CudaTest {
 protected:
  CudaContext inv_ctx() const {
    CudaContext c = ctx();
    c.numerics = Numerics::BatchInvariant;
    return c;
  }
};

std::vector<float> abs_of(std::vector<float> v) {
  for (auto& e : v) e = std::abs(e);
  return v;
}

// |got - want| <= tol.atol + tol.rtol |want| + kInvariantGemmSum scale[i] (tolerances.h), where
// scale bounds the magnitudes summed into the element: |alpha| sum_k |x_k w_k| + |beta c| + |bias|.
void expect_close_scaled(const std::string& what, const std::vector<float>& got,
                         const std::vector<float>& want, const std::vector<float>& scale, Tol tol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(scale.size(), want.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    const double bound = tol.atol + tol.rtol * std::abs(w) + kInvariantGemmSum * scale[i];
    if (!(std::abs(g - w) <= bound)) {
      if (++misses <= 5) {
        ADD_FAILURE() << what << "[" << i << "]: got " << g << " want " << w << " (bound " << bound
                      << ")";
      }
    }
  }
  EXPECT_EQ(misses, 0) << what << ": " << misses << " of " << got.size() << " out of tolerance";
}

// ---- (a) linear_forward in batch-invariant mode vs the CPU linear ------------------------------

struct LinearShape {
  int64_t T, K, N;
};

void check_linear(const CudaContext& ctx, const CudaSession& session, LinearShape s) {
  const auto [T, K, N] = s;
  SCOPED_TRACE("T=" + std::to_string(T) + " K=" + std::to_string(K) + " N=" + std::to_string(N));
  const float wscale = 1.0f / std::sqrt(static_cast<float>(K));
  auto x = bf16_rounded(randn(T * K, 300 + T));
  auto w = bf16_rounded(randn(N * K, 301 + K, wscale));
  const auto b = bf16_rounded(randn(N, 302 + N));
  const auto r = bf16_rounded(randn(T * N, 303));

  auto d_x = upload_bf16(x), d_w = upload_bf16(w), d_b = upload_bf16(b), d_r = upload_bf16(r);
  DeviceBuffer<bf16> d_y(T * N), d_yb(T * N), d_yr(T * N);
  linear_forward(ctx, d_y.data(), d_x.data(), d_w.data(), nullptr, T, K, N);
  linear_forward(ctx, d_yb.data(), d_x.data(), d_w.data(), d_b.data(), T, K, N);
  linear_forward(ctx, d_yr.data(), d_x.data(), d_w.data(), d_b.data(), d_r.data(), T, K, N);
  // In place: the residual is the output.
  linear_forward(ctx, d_r.data(), d_x.data(), d_w.data(), d_b.data(), d_r.data(), T, K, N);

  std::vector<float> y(T * N), yb(T * N), sum_abs(T * N);
  cpu::linear_forward(y.data(), x.data(), w.data(), nullptr, T, K, N);
  cpu::linear_forward(yb.data(), x.data(), w.data(), b.data(), T, K, N);
  x = abs_of(std::move(x));
  w = abs_of(std::move(w));
  cpu::linear_forward(sum_abs.data(), x.data(), w.data(), nullptr, T, K, N);  // sum_k |x||w|
  std::vector<float> yr(T * N), scale_b(T * N), scale_r(T * N);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t i = t * N + n;
      yr[i] = yb[i] + r[i];
      scale_b[i] = sum_abs[i] + std::abs(b[n]);
      scale_r[i] = scale_b[i] + std::abs(r[i]);
    }
  }
  session.synchronize();
  expect_close_scaled("y", download_bf16(d_y), y, sum_abs, kBf16Out);
  expect_close_scaled("y + b", download_bf16(d_yb), yb, scale_b, kBf16Out);
  expect_close_scaled("y + b + r", download_bf16(d_yr), yr, scale_r, kBf16Out);
  expect_close_scaled("y + b + r in place", download_bf16(d_r), yr, scale_r, kBf16Out);
}

// The model's shapes (one decode token through the QKV projection, a prefill through the MLP down
// and gate/up projections) and an odd one (K not a multiple of 8: element-wise staging).
TEST_F(GemmInvariant, LinearForwardMatchesCpu) {
  const CudaContext ctx = inv_ctx();
  for (LinearShape s : {LinearShape{1, 896, 1152}, LinearShape{37, 100, 70},
                        LinearShape{300, 4864, 896}, LinearShape{513, 896, 9728}}) {
    check_linear(ctx, *session_, s);
  }
}

// ---- (b) the bits of a row do not depend on the number of rows -----------------------------

// Host side of one output type: its cudaDataType, upload, rounding and decoding of raw bytes.
template <typename OutT>
struct OutType;
template <>
struct OutType<float> {
  static constexpr cudaDataType_t kType = CUDA_R_32F;
  static constexpr const char* kName = "fp32";
  static DeviceBuffer<float> upload(const std::vector<float>& v) { return DeviceBuffer<float>(v); }
  static std::vector<float> rounded(std::vector<float> v) { return v; }
  static float decode(const uint8_t* p) {
    float f;
    std::memcpy(&f, p, sizeof(f));
    return f;
  }
  static constexpr Tol kTol = kF32Kernel;
};
template <>
struct OutType<bf16> {
  static constexpr cudaDataType_t kType = CUDA_R_16BF;
  static constexpr const char* kName = "bf16";
  static DeviceBuffer<bf16> upload(const std::vector<float>& v) { return upload_bf16(v); }
  static std::vector<float> rounded(std::vector<float> v) { return bf16_rounded(std::move(v)); }
  static float decode(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, sizeof(h));
    return bf16_to_f32(h);
  }
  static constexpr Tol kTol = kBf16Out;
};

template <typename T>
std::vector<uint8_t> raw_bytes(const DeviceBuffer<T>& d) {
  std::vector<uint8_t> h(d.bytes());
  copy_to_host(h.data(), d.data(), h.size());
  return h;
}

// A rows x cols matrix stored with row stride ld >= cols; the padding is NaN, so a kernel that
// read past K (or a C column past m) would show it.
std::vector<float> padded(const std::vector<float>& a, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<float> p(rows * ld, std::nanf(""));
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(a.begin() + r * cols, a.begin() + (r + 1) * cols, p.begin() + r * ld);
  }
  return p;
}

struct InvShape {
  int64_t K, m, ld_k, ldd;  // ld_k: row stride of X and W; ldd: of out and C
};
struct Epilogue {
  const char* name;
  float alpha, beta;
  bool c, bias;
};
// A call on the block of the full problem starting at token t0 and feature j0: M tokens, all
// features from j0 on. Odd offsets move a row and a column to other places in the mma fragments
// and tiles than they have in the full call.
struct SubCall {
  int64_t M, t0, j0;
};

template <typename OutT>
void check_invariance(const CudaContext& ctx, const CudaSession& session, InvShape s) {
  using O = OutType<OutT>;
  constexpr int64_t kRows = 1024;
  const auto [K, m, ld_k, ldd] = s;
  SCOPED_TRACE(std::string(O::kName) + " K=" + std::to_string(K) + " m=" + std::to_string(m) +
               " ld_k=" + std::to_string(ld_k) + " ldd=" + std::to_string(ldd));
  const auto x = bf16_rounded(randn(kRows * K, 400 + K));
  const auto w = bf16_rounded(randn(m * K, 401 + m, 1.0f / std::sqrt(static_cast<float>(K))));
  const auto cm = O::rounded(randn(kRows * m, 402));
  const auto bias = O::rounded(randn(m, 403));
  auto d_x = upload_bf16(padded(x, kRows, K, ld_k)), d_w = upload_bf16(padded(w, m, K, ld_k));
  auto d_c = O::upload(padded(cm, kRows, m, ldd));
  auto d_bias = O::upload(bias);

  // The call checked against the CPU too (tokens [3, 10), features [1, m)), and the CPU's products
  // and sum_k |x||w| for its tokens over all features.
  constexpr SubCall kCheck{7, 3, 1};
  std::vector<float> y(kCheck.M * m), sum_abs(kCheck.M * m);
  const std::vector<float> xc(x.begin() + kCheck.t0 * K, x.begin() + (kCheck.t0 + kCheck.M) * K);
  cpu::linear_forward(y.data(), xc.data(), w.data(), nullptr, kCheck.M, K, m);
  cpu::linear_forward(sum_abs.data(), abs_of(xc).data(), abs_of(w).data(), nullptr, kCheck.M, K, m);

  const size_t es = sizeof(OutT);
  for (const Epilogue& e :
       {Epilogue{"alpha", 1.0f / 0.7f, 0.0f, false, false},
        Epilogue{"residual", 1.0f, 1.0f, true, false}, Epilogue{"bias", 1.0f, 0.0f, false, true},
        Epilogue{"all", 1.0f / 0.7f, 1.0f, true, true}}) {
    SCOPED_TRACE(e.name);
    std::vector<uint8_t> full;  // the kRows-token call over all features, first in the loop
    for (const SubCall& sub : {SubCall{kRows, 0, 0}, SubCall{255, 700, 3}, SubCall{64, 13, 8},
                               kCheck, SubCall{1, 1000, 7}}) {
      SCOPED_TRACE("M=" + std::to_string(sub.M) + " t0=" + std::to_string(sub.t0) +
                   " j0=" + std::to_string(sub.j0));
      const int64_t mm = m - sub.j0;
      DeviceBuffer<OutT> d_out(sub.M * ldd);
      VERL_CUDA_CHECK(
          cudaMemsetAsync(d_out.data(), 0xff, d_out.bytes(), ctx.stream));  // gaps stay 0xff
      const bf16* w_sub = d_w.data() + sub.j0 * ld_k;
      const bf16* x_sub = d_x.data() + sub.t0 * ld_k;
      Gemm g{CUBLAS_OP_T, CUBLAS_OP_N, mm,          sub.M,        K,   w_sub,    ld_k,
             x_sub,       ld_k,        CUDA_R_16BF, d_out.data(), ldd, O::kType, e.beta};
      g.alpha = e.alpha;
      if (e.bias) g.bias = d_bias.data() + sub.j0;
      if (e.c) g.c = d_c.data() + sub.t0 * ldd + sub.j0;
      run_gemm(ctx, g, "test_gemm_invariant");
      session.synchronize();
      const auto got = raw_bytes(d_out);
      if (sub.M == kRows) full = got;
      int differing_rows = 0, gap_writes = 0;
      for (int64_t t = 0; t < sub.M; ++t) {
        const uint8_t* row = got.data() + t * ldd * es;
        const uint8_t* ref = full.data() + ((sub.t0 + t) * ldd + sub.j0) * es;
        if (std::memcmp(row, ref, mm * es) != 0) {
          if (++differing_rows <= 3) {
            ADD_FAILURE() << "token " << sub.t0 + t << " differs from the " << kRows
                          << "-token call";
          }
        }
        for (size_t i = mm * es; i < ldd * es; ++i) gap_writes += row[i] != 0xff;
      }
      EXPECT_EQ(differing_rows, 0);
      EXPECT_EQ(gap_writes, 0) << "bytes written in the columns past m";
      if (sub.M == kCheck.M) {
        std::vector<float> gotv(sub.M * mm), want(sub.M * mm), scale(sub.M * mm);
        for (int64_t t = 0; t < sub.M; ++t) {
          for (int64_t jj = 0; jj < mm; ++jj) {
            const int64_t j = sub.j0 + jj, i = t * mm + jj, full_i = t * m + j;
            const double cval = cm[(sub.t0 + t) * m + j];
            gotv[i] = O::decode(got.data() + (t * ldd + jj) * es);
            double v = static_cast<double>(e.alpha) * y[full_i];
            double sc = std::abs(e.alpha) * sum_abs[full_i];
            if (e.c) {
              v += e.beta * cval;
              sc += std::abs(e.beta * cval);
            }
            if (e.bias) {
              v += bias[j];
              sc += std::abs(bias[j]);
            }
            want[i] = static_cast<float>(v);
            scale[i] = static_cast<float>(sc);
          }
        }
        expect_close_scaled("out vs cpu", gotv, want, scale, O::kTol);
      }
    }
  }
}

// Shapes: the model's (16-byte rows: cp.async staging), odd K, m and ldd (element-wise staging,
// one-element stores), and K = 100 in 16-byte aligned rows of 104 (cp.async but for the chunk that
// straddles K; out rows with a gap).
TEST_F(GemmInvariant, RowBitsDoNotDependOnRowCount) {
  const CudaContext ctx = inv_ctx();
  for (InvShape s :
       {InvShape{896, 1152, 896, 1152}, InvShape{100, 71, 100, 71}, InvShape{100, 70, 104, 72}}) {
    check_invariance<bf16>(ctx, *session_, s);
    check_invariance<float>(ctx, *session_, s);
  }
}

// ---- (c) the LM head's form: fp32 logits over a large vocabulary, alpha = 1 / temperature -------

TEST_F(GemmInvariant, LmHeadLogitsMatchCpu) {
  const CudaContext ctx = inv_ctx();
  constexpr int64_t M = 5, K = 896, V = 151936;
  const float alpha = 1.0f / 0.7f;
  auto h = bf16_rounded(randn(M * K, 500));
  auto w = bf16_rounded(randn(V * K, 501, 1.0f / std::sqrt(static_cast<float>(K))));
  auto d_h = upload_bf16(h), d_w = upload_bf16(w);
  DeviceBuffer<float> d_z(M * V), d_z1(V);
  run_gemm(ctx,
           Gemm{CUBLAS_OP_T, CUBLAS_OP_N, V, M, K, d_w.data(), K, d_h.data(), K, CUDA_R_16BF,
                d_z.data(), V, CUDA_R_32F, 0.0f, nullptr, alpha},
           "test lm_head");
  constexpr int64_t kRow = 3;  // the same token alone: first row of its tile instead of the fourth
  run_gemm(ctx,
           Gemm{CUBLAS_OP_T, CUBLAS_OP_N, V, 1, K, d_w.data(), K, d_h.data() + kRow * K, K,
                CUDA_R_16BF, d_z1.data(), V, CUDA_R_32F, 0.0f, nullptr, alpha},
           "test lm_head (one row)");

  std::vector<float> z(M * V), sum_abs(M * V);
  cpu::linear_forward(z.data(), h.data(), w.data(), nullptr, M, K, V);
  for (auto& e : z) e *= alpha;
  h = abs_of(std::move(h));
  w = abs_of(std::move(w));
  cpu::linear_forward(sum_abs.data(), h.data(), w.data(), nullptr, M, K, V);
  for (auto& e : sum_abs) e *= alpha;
  session_->synchronize();
  const auto got = d_z.download();
  expect_close_scaled("logits", got, z, sum_abs, kF32Kernel);
  const auto got1 = d_z1.download();
  EXPECT_EQ(std::memcmp(got1.data(), got.data() + kRow * V, V * sizeof(float)), 0)
      << "token " << kRow << " alone differs from its row in the " << M << "-token call";
}

// Only the forward form is supported; anything else throws naming the caller.
TEST_F(GemmInvariant, RejectsOtherForms) {
  const CudaContext ctx = inv_ctx();
  auto x = upload_bf16(randn(4 * 16, 600)), w = upload_bf16(randn(8 * 16, 601));
  DeviceBuffer<float> out(4 * 8);
  Gemm ok{CUBLAS_OP_T, CUBLAS_OP_N, 8,           4,       16, nullptr,    16,
          nullptr,     16,          CUDA_R_16BF, nullptr, 8,  CUDA_R_32F, 0.0f};
  ok.a = w.data();
  ok.b = x.data();
  ok.d = out.data();
  EXPECT_NO_THROW(detail::run_gemm_invariant(ctx, ok, "test"));
  Gemm g = ok;
  g.d_type = CUDA_R_16F;
  EXPECT_THROW(detail::run_gemm_invariant(ctx, g, "test"), verl::Error);
  g = ok;
  g.ta = CUBLAS_OP_N;
  EXPECT_THROW(detail::run_gemm_invariant(ctx, g, "test"), verl::Error);
  g = ok;
  g.ldd = 7;  // < m
  EXPECT_THROW(detail::run_gemm_invariant(ctx, g, "test"), verl::Error);
  sync();
}

// ---- (c) the same bits as cuBLASLt's kernels without split-K --------------------------------

// At thousands of rows cuBLASLt's heuristic takes a kernel without split-K for every forward
// shape of the models (a chain of 16-wide k steps into one fp32 accumulator per element, like
// ours). The two give the same bits, so a call may take either and rows still agree: this is
// what lets the batch-invariant mode keep cuBLASLt wherever it does not split K.
TEST_F(GemmInvariant, SameBitsAsCublasLtWithoutSplitK) {
  const int64_t T = 2048;
  struct S {
    int64_t K, N;
    bool bias;
  };
  for (S s : {S{896, 1152, true}, S{896, 896, false}, S{896, 9728, false}, S{4864, 896, false},
              S{1536, 2048, true}, S{8960, 1536, false}}) {
    SCOPED_TRACE("K=" + std::to_string(s.K) + " N=" + std::to_string(s.N));
    const auto x = bf16_rounded(randn(T * s.K, 500 + s.K));
    const auto w = bf16_rounded(randn(s.N * s.K, 501 + s.N, 1.0f / std::sqrt(float(s.K))));
    const auto b = bf16_rounded(randn(s.N, 502));
    auto d_x = upload_bf16(x), d_w = upload_bf16(w), d_b = upload_bf16(b);
    DeviceBuffer<bf16> d_lt(T * s.N), d_inv(T * s.N);
    const bf16* bias = s.bias ? d_b.data() : nullptr;
    linear_forward(ctx(), d_lt.data(), d_x.data(), d_w.data(), bias, T, s.K, s.N);
    linear_forward(inv_ctx(), d_inv.data(), d_x.data(), d_w.data(), bias, T, s.K, s.N);
    const auto lt = raw_bytes(d_lt), inv = raw_bytes(d_inv);
    int64_t differ = 0;
    for (size_t i = 0; i < lt.size(); i += 2) differ += lt[i] != inv[i] || lt[i + 1] != inv[i + 1];
    EXPECT_EQ(differ, 0) << "of " << T * s.N << " outputs";
  }
  // fp32 output: the LM head's logits.
  const int64_t K = 896, V = 32000, n = 512;
  const auto h = bf16_rounded(randn(n * K, 510));
  const auto w = bf16_rounded(randn(V * K, 511, 0.03f));
  auto d_h = upload_bf16(h), d_w = upload_bf16(w);
  DeviceBuffer<float> z_lt(n * V), z_inv(n * V);
  for (const bool inv : {false, true}) {
    const CudaContext c = inv ? inv_ctx() : ctx();
    detail::run_gemm(c,
                     Gemm{CUBLAS_OP_T, CUBLAS_OP_N, V, n, K, d_w.data(), K, d_h.data(), K,
                          CUDA_R_16BF, inv ? z_inv.data() : z_lt.data(), V, CUDA_R_32F, 0.0f},
                     "test logits");
  }
  EXPECT_TRUE(raw_bytes(z_lt) == raw_bytes(z_inv)) << "LM-head logits";
}

// ---- (d) unsplit_k: forward GEMMs that never split k --------------------------------------------

// cuBLASLt's heuristic splits k for the MLP down projection at decode batch sizes; with
// ctx.unsplit_k run_gemm takes an algorithm that does not split k at every row count, so a row of
// the model's forward GEMMs has the same bits in a decode step and in the trainer's forward. Calls
// of 256, 64, 7 and 1 rows at both ends of a 5000-row call against that call.
TEST_F(GemmInvariant, UnsplitKRowsDoNotDependOnRowCount) {
  CudaContext unsplit = ctx();
  unsplit.numerics = Numerics::MatchTrainer;
  const int64_t T = 5000;
  struct S {
    int64_t K, N;
    bool bias;
  };
  for (S s : {S{896, 1152, true}, S{896, 896, false}, S{896, 9728, false}, S{4864, 896, false},
              S{8960, 1536, false}}) {
    SCOPED_TRACE("K=" + std::to_string(s.K) + " N=" + std::to_string(s.N));
    const auto x = bf16_rounded(randn(T * s.K, 600 + s.K));
    const auto w = bf16_rounded(randn(s.N * s.K, 601 + s.N, 1.0f / std::sqrt(float(s.K))));
    const auto b = bf16_rounded(randn(s.N, 602));
    auto d_x = upload_bf16(x), d_w = upload_bf16(w), d_b = upload_bf16(b);
    const bf16* bias = s.bias ? d_b.data() : nullptr;
    DeviceBuffer<bf16> full(T * s.N);
    linear_forward(unsplit, full.data(), d_x.data(), d_w.data(), bias, T, s.K, s.N);
    const auto ref = raw_bytes(full);
    const size_t row_bytes = static_cast<size_t>(s.N) * 2;
    for (const int64_t M : {int64_t{256}, int64_t{64}, int64_t{7}, int64_t{1}}) {
      for (const int64_t t0 : {int64_t{0}, T - M}) {
        DeviceBuffer<bf16> part(M * s.N);
        linear_forward(unsplit, part.data(), d_x.data() + t0 * s.K, d_w.data(), bias, M, s.K, s.N);
        const auto got = raw_bytes(part);
        EXPECT_EQ(std::memcmp(got.data(), ref.data() + t0 * row_bytes, got.size()), 0)
            << M << " rows from row " << t0;
      }
    }
  }
}

}  // namespace
}  // namespace verl::ops::cuda::test
