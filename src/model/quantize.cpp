// Weight-only int8/int4 quantisation at load: round to nearest with a clipping search, and GPTQ
// (Frantar et al. 2022, arXiv:2210.17323, Algorithm 1) for int4 over a random-token calibration
// set run through the model layer by layer.
#include "model/quantize.h"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <optional>
#include <utility>

#include "core/error.h"
#include "core/rng.h"
#include "model/batch.h"
#include "model/transformer.h"
#include "ops/cpu/ops.h"

namespace verl::model {
namespace {

// An int4 group's grid: w ~ (q - zero) * scale with q in [0, 15]. A zero scale: every code 0.
struct Grid {
  float scale = 0.0f;
  int zero = 0;
};

int int4_code(float x, const Grid& g) {
  if (g.scale == 0.0f) return 0;
  return static_cast<int>(
      std::clamp(std::nearbyint(x / g.scale) + static_cast<float>(g.zero), 0.0f, 15.0f));
}

float int4_value(int code, const Grid& g) {
  return static_cast<float>(code - g.zero) * g.scale;
}

// The grid spanning [lo, hi] (lo <= 0 <= hi, lo < hi); the zero point rounds onto the integers so
// that 0 is exact.
Grid grid_of(float lo, float hi) {
  Grid g;
  g.scale = (hi - lo) / 15.0f;
  g.zero = static_cast<int>(std::clamp(std::nearbyint(-lo / g.scale), 0.0f, 15.0f));
  return g;
}

// The squared errors of kCandidates grids (scales > 0) over x[0, n): err[k] is summed in element
// order, as one grid at a time would sum it, so the sums and the choices made from them are the
// same bits; the grids side by side give the compiler independent sums to keep in vector lanes
// instead of one chain of dependent adds.
constexpr int kCandidates = 11;
using Candidates = std::array<Grid, kCandidates>;

std::array<double, kCandidates> squared_errors(const float* x, int64_t n, const Candidates& g) {
  std::array<float, kCandidates> scale{}, zero{};
  for (int k = 0; k < kCandidates; ++k) {
    scale[k] = g[k].scale;
    zero[k] = static_cast<float>(g[k].zero);
  }
  std::array<double, kCandidates> err{};
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
#pragma omp simd
    for (int k = 0; k < kCandidates; ++k) {
      // int4_code then int4_value, in float: the codes and zero points are small integers, exact.
      const float code = std::clamp(std::nearbyint(xi / scale[k]) + zero[k], 0.0f, 15.0f);
      const double d = static_cast<double>((code - zero[k]) * scale[k]) - static_cast<double>(xi);
      err[k] = std::fma(d, d, err[k]);  // one rounding, as the one-grid sum was compiled
    }
  }
  return err;
}

// The grid of x[0, n): [min(x, 0), max(x, 0)] with each end shrunk by a factor in
// (1, 0.95, ..., 0.5) where that lowers the squared error. Clipping the few extreme weights of a
// group buys a finer step for the rest. The search is coordinate-wise (both ends by one factor,
// then the low end, then the high end): 31 candidates instead of the full grid's 121, within 1%
// of its error on Gaussian groups (tests/model/test_quantize.cpp). Each pass's 11 candidates are
// scored together; the first with the lowest error wins, as when tried one after another.
Grid fit_grid(const float* x, int64_t n) {
  float lo = 0.0f, hi = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  if (lo == hi) return {};
  // 1 - 0.05 k with one rounding (a fused multiply-add): the factors the build's flags produced
  // before the candidates were batched, so the grids are the same bits as then.
  auto factor = [](int k) { return std::fma(-0.05f, static_cast<float>(k), 1.0f); };
  float a = 1.0f, b = 1.0f;  // the chosen shrink of the low and the high end
  double best = 0;
  // pass(ends): tries ends(k) = (low factor, high factor) for k = 0..10, keeping a strictly lower
  // error in k order; `first` takes k = 0 as the starting point.
  auto pass = [&](auto ends, bool first) {
    Candidates g;
    std::array<std::pair<float, float>, kCandidates> f;
    for (int k = 0; k < kCandidates; ++k) {
      f[k] = ends(k);
      g[k] = grid_of(f[k].first * lo, f[k].second * hi);
    }
    const std::array<double, kCandidates> err = squared_errors(x, n, g);
    for (int k = 0; k < kCandidates; ++k) {
      if ((first && k == 0) || err[k] < best) {
        best = err[k];
        a = f[k].first;
        b = f[k].second;
      }
    }
  };
  pass([&](int k) { return std::pair{factor(k), factor(k)}; }, true);
  const float both = a;
  pass([&](int k) { return std::pair{factor(k), both}; }, false);
  const float low = a;
  pass([&](int k) { return std::pair{low, factor(k)}; }, false);
  return grid_of(a * lo, b * hi);
}

QuantizedMatrix empty_matrix(int bits, int64_t rows, int64_t cols, int64_t group) {
  VERL_CHECK(bits == 8 || bits == 4, "quantize: {} bits; 8 or 4", bits);
  VERL_CHECK(rows > 0 && cols > 0, "quantize: a {}x{} matrix", rows, cols);
  VERL_CHECK(bits == 8 || group >= 1, "quantize: group size {}", group);
  QuantizedMatrix q;
  q.bits = bits;
  q.rows = rows;
  q.cols = cols;
  q.group = bits == 8 ? cols : std::min(group, cols);
  const auto scales = static_cast<size_t>(rows * q.groups_per_row());
  q.scales.assign(scales, 0.0f);
  if (bits == 4) q.zeros.assign(scales, 0);
  q.codes.assign(static_cast<size_t>(rows * q.row_bytes()), 0);
  return q;
}

void set_code(QuantizedMatrix& q, int64_t r, int64_t c, int v) {
  if (q.bits == 8) {
    q.codes[static_cast<size_t>(r * q.cols + c)] = static_cast<uint8_t>(static_cast<int8_t>(v));
    return;
  }
  uint8_t& byte = q.codes[static_cast<size_t>(r * q.row_bytes() + c / 2)];
  const auto nibble = static_cast<uint8_t>(v & 0x0f);
  byte = c % 2 == 0 ? static_cast<uint8_t>((byte & 0xf0) | nibble)
                    : static_cast<uint8_t>((byte & 0x0f) | (nibble << 4));
}

void set_grid(QuantizedMatrix& q, int64_t r, int64_t g, const Grid& grid) {
  const auto i = static_cast<size_t>(r * q.groups_per_row() + g);
  q.scales[i] = grid.scale;
  q.zeros[i] = static_cast<uint8_t>(grid.zero);
}

void check_finite(const float* w, int64_t rows, int64_t cols) {
  bool finite = true;
#pragma omp parallel for schedule(static) reduction(&& : finite)
  for (int64_t i = 0; i < rows * cols; ++i) finite = finite && std::isfinite(w[i]);
  if (finite) return;
  for (int64_t i = 0; i < rows * cols; ++i)
    VERL_CHECK(std::isfinite(w[i]), "quantize: weight ({}, {}) is {}", i / cols, i % cols, w[i]);
}

// In place, the lower Cholesky factor L of a symmetric positive definite n x n matrix (row-major;
// only its lower triangle is read and written): A = L L^T. Right-looking in blocks of 64: each
// diagonal block unblocked, the panel below it by a triangular solve, the trailing matrix by a
// rank-64 update. False when a pivot is not positive.
bool cholesky_lower(double* a, int64_t n) {
  const int64_t nb = 64;
  for (int64_t k = 0; k < n; k += nb) {
    const int64_t b = std::min(nb, n - k);
    for (int64_t j = k; j < k + b; ++j) {
      double d = a[j * n + j];
      for (int64_t p = k; p < j; ++p) d -= a[j * n + p] * a[j * n + p];
      if (!(d > 0)) return false;
      const double ljj = std::sqrt(d);
      a[j * n + j] = ljj;
      for (int64_t i = j + 1; i < k + b; ++i) {
        double s = a[i * n + j];
        for (int64_t p = k; p < j; ++p) s -= a[i * n + p] * a[j * n + p];
        a[i * n + j] = s / ljj;
      }
    }
    const int64_t m = n - k - b;
    if (m == 0) break;
    double* panel = a + (k + b) * n + k;
    cblas_dtrsm(CblasRowMajor, CblasRight, CblasLower, CblasTrans, CblasNonUnit,
                static_cast<int>(m), static_cast<int>(b), 1.0, a + k * n + k, static_cast<int>(n),
                panel, static_cast<int>(n));
    cblas_dsyrk(CblasRowMajor, CblasLower, CblasNoTrans, static_cast<int>(m), static_cast<int>(b),
                -1.0, panel, static_cast<int>(n), 1.0, a + (k + b) * n + k + b,
                static_cast<int>(n));
  }
  return true;
}

// The upper triangular U with U^T U = H^-1 (H symmetric positive definite, n x n), which GPTQ
// walks: row j of U from column j on is row j of the inverse Hessian of columns j.. (those not
// yet quantised) divided by the square root of its diagonal (the paper's Cholesky reformulation,
// section 3.3). With J the reversal permutation, J H J = L L^T gives
// H^-1 = J L^-T L^-1 J = (J L^-1 J)^T (J L^-1 J), and J L^-1 J is upper triangular: one
// Cholesky factorisation and one triangular inverse. Empty when H is not positive definite.
std::vector<double> inverse_cholesky_upper(const std::vector<double>& h, int64_t n) {
  std::vector<double> a(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) a[i * n + j] = h[(n - 1 - i) * n + (n - 1 - j)];
  if (!cholesky_lower(a.data(), n)) return {};
  std::vector<double> inv(static_cast<size_t>(n * n), 0.0);  // L^-1, solving L X = I
  for (int64_t i = 0; i < n; ++i) inv[i * n + i] = 1.0;
  cblas_dtrsm(CblasRowMajor, CblasLeft, CblasLower, CblasNoTrans, CblasNonUnit, static_cast<int>(n),
              static_cast<int>(n), 1.0, a.data(), static_cast<int>(n), inv.data(),
              static_cast<int>(n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) a[i * n + j] = inv[(n - 1 - i) * n + (n - 1 - j)];
  return a;
}

// The calibration set pushed through the model one layer at a time: random token sequences,
// packed into batches of about 2048 tokens, with each batch's hidden states at the current layer.
class Calibration {
 public:
  Calibration(const Weights& w, const QuantizeOptions& opt) : w_(w), tf_(w) {
    const ModelConfig& c = w.config;
    const int64_t len = std::min(opt.calibration_length, c.max_position_embeddings);
    VERL_CHECK(len >= 1, "quantize: calibration sequences of {} tokens", len);
    const int64_t per_batch = std::max<int64_t>(1, 2048 / len);
    Rng rng(opt.seed);
    for (int64_t s0 = 0; s0 < opt.calibration_samples; s0 += per_batch) {
      std::vector<std::vector<int32_t>> seqs(
          static_cast<size_t>(std::min(per_batch, opt.calibration_samples - s0)));
      for (auto& seq : seqs) {
        seq.resize(static_cast<size_t>(len));
        for (int32_t& id : seq)
          id = static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.vocab_size)));
      }
      batches_.push_back(PackedBatch::from_sequences(seqs));
      const PackedBatch& b = batches_.back();
      x_.emplace_back(static_cast<size_t>(b.num_tokens() * c.hidden_size));
      ops::cpu::embedding_forward(x_.back().data(), b.tokens.data(), w.param(w.layout.embed),
                                  b.num_tokens(), c.hidden_size, c.vocab_size);
      tokens_ += b.num_tokens();
    }
  }
  int64_t tokens() const { return tokens_; }

  // X^T X of layer l's four linear inputs over the calibration tokens, in the order wqkv (the
  // attention norm's output), wo (attention's output), gate/up (the MLP norm's output), down
  // (silu(gate) * up).
  std::array<std::vector<double>, 4> grams(int l) {
    const ModelConfig& c = w_.config;
    const std::array<int64_t, 4> dims = {c.hidden_size, c.q_dim(), c.hidden_size,
                                         c.intermediate_size};
    std::array<std::vector<double>, 4> g;
    for (size_t i = 0; i < 4; ++i) g[i].assign(static_cast<size_t>(dims[i] * dims[i]), 0.0);
    for (size_t k = 0; k < batches_.size(); ++k) {
      run(l, k);
      const std::array<const float*, 4> xs = {a_.xn1.data(), a_.att.data(), a_.xn2.data(),
                                              a_.act.data()};
      for (size_t i = 0; i < 4; ++i) add_gram(g[i], xs[i], batches_[k].num_tokens(), dims[i]);
    }
    for (size_t i = 0; i < 4; ++i)  // the lower triangle from the upper
      for (int64_t r = 0; r < dims[i]; ++r)
        for (int64_t q = 0; q < r; ++q) g[i][r * dims[i] + q] = g[i][q * dims[i] + r];
    return g;
  }
  // Moves every batch's hidden states past layer l (with its weights as they are now: quantised).
  void advance(int l) {
    for (size_t k = 0; k < batches_.size(); ++k) {
      run(l, k);
      x_[k].swap(out_);
    }
  }

 private:
  void run(int l, size_t k) {
    const int64_t n = static_cast<int64_t>(x_[k].size());
    a_.x_in.assign(x_[k].begin(), x_[k].end());
    out_.resize(static_cast<size_t>(n));
    tf_.forward_layer(l, batches_[k], a_, out_.data());
  }
  // g (upper triangle, double) += x^T x for x [T, n] (float products, summed per batch).
  void add_gram(std::vector<double>& g, const float* x, int64_t T, int64_t n) {
    scratch_.resize(static_cast<size_t>(n * n));
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, static_cast<int>(n), static_cast<int>(T),
                1.0f, x, static_cast<int>(n), 0.0f, scratch_.data(), static_cast<int>(n));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t q = r; q < n; ++q) g[r * n + q] += scratch_[r * n + q];
  }

  const Weights& w_;
  Transformer tf_;
  std::vector<PackedBatch> batches_;
  std::vector<std::vector<float>> x_;  // each batch's input to the current layer, [T, C]
  LayerActivations a_;
  std::vector<float> out_, scratch_;
  int64_t tokens_ = 0;
};

}  // namespace

int QuantizedMatrix::code(int64_t r, int64_t c) const {
  if (bits == 8) return static_cast<int8_t>(codes[static_cast<size_t>(r * cols + c)]);
  const uint8_t byte = codes[static_cast<size_t>(r * row_bytes() + c / 2)];
  return c % 2 == 0 ? byte & 0x0f : byte >> 4;
}

int QuantizedMatrix::zero(int64_t r, int64_t c) const {
  return zeros.empty() ? 0 : zeros[static_cast<size_t>(r * groups_per_row() + c / group)];
}

QuantizedMatrix quantize_matrix(const float* w, int64_t rows, int64_t cols, int bits,
                                int64_t group) {
  QuantizedMatrix q = empty_matrix(bits, rows, cols, group);
  check_finite(w, rows, cols);
  const int64_t G = q.groups_per_row();
  // Rows are independent (each owns its scales and code bytes): one thread a block of rows.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t b = g * q.group, e = std::min(cols, b + q.group);
      if (bits == 8) {
        float maxabs = 0.0f;
        for (int64_t c = b; c < e; ++c) maxabs = std::max(maxabs, std::fabs(row[c]));
        const float s = maxabs / 127.0f;
        q.scales[static_cast<size_t>(r)] = s;
        for (int64_t c = b; c < e; ++c)
          set_code(q, r, c,
                   s > 0.0f
                       ? static_cast<int>(std::clamp(std::nearbyint(row[c] / s), -127.0f, 127.0f))
                       : 0);
      } else {
        const Grid grid = fit_grid(row + b, e - b);
        set_grid(q, r, g, grid);
        for (int64_t c = b; c < e; ++c) set_code(q, r, c, int4_code(row[c], grid));
      }
    }
  }
  return q;
}

QuantizedMatrix quantize_matrix_gptq(const float* w, int64_t rows, int64_t cols, int64_t group,
                                     std::vector<double> xtx, double damp) {
  // The grids are round to nearest's, fitted to the original weights; GPTQ chooses the codes.
  QuantizedMatrix q = quantize_matrix(w, rows, cols, 4, group);
  const int64_t n = cols;
  VERL_CHECK(static_cast<int64_t>(xtx.size()) == n * n,
             "GPTQ: a {}-element Gram matrix for {} inputs", xtx.size(), n);
  // An input that never occurred (zero diagonal) has no error to spread: it gets the mean diagonal,
  // so H stays invertible, and its column is rounded like the others. Then the paper's damping.
  double mean = 0;
  for (int64_t i = 0; i < n; ++i) mean += xtx[i * n + i];
  mean /= static_cast<double>(n);
  if (!(mean > 0)) mean = 1.0;
  for (int64_t i = 0; i < n; ++i)
    if (!(xtx[i * n + i] > 0)) xtx[i * n + i] = mean;
  // Columns in order of decreasing H diagonal (the GPTQ authors' "act-order"): the inputs with the
  // most energy are quantised first, while many columns are left to take their error. The grids
  // stay per group of stored columns, so the format is unchanged.
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[static_cast<size_t>(i)] = i;
  std::stable_sort(perm.begin(), perm.end(),
                   [&](int64_t a, int64_t b) { return xtx[a * n + a] > xtx[b * n + b]; });
  std::vector<double> hp(xtx.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) hp[i * n + j] = xtx[perm[i] * n + perm[j]];
  std::vector<double> u;
  for (int attempt = 0; attempt < 4 && u.empty(); ++attempt, damp *= 10) {
    std::vector<double> h = hp;
    for (int64_t i = 0; i < n; ++i) h[i * n + i] += damp * mean;
    u = inverse_cholesky_upper(h, n);
  }
  VERL_CHECK(!u.empty(), "GPTQ: the {}x{} Hessian is not positive definite even with damping {}", n,
             n, damp);
  const std::vector<float> uf(u.begin(), u.end());
  std::vector<float> wk(static_cast<size_t>(rows * n));  // in quantisation order; takes the errors
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) wk[r * n + j] = w[r * n + perm[j]];
  // Blocks of 128 columns: inside a block each column's error goes to the block's later columns
  // at once; the columns after the block take the block's errors in one GEMM (the paper's lazy
  // batch updates).
  const int64_t nb = 128;
  std::vector<float> err(static_cast<size_t>(rows * nb));
  for (int64_t b0 = 0; b0 < n; b0 += nb) {
    const int64_t b1 = std::min(n, b0 + nb);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* wr = wk.data() + r * n;
      float* er = err.data() + r * nb;
      for (int64_t j = b0; j < b1; ++j) {
        const int64_t c = perm[static_cast<size_t>(j)];
        const Grid grid{q.scale(r, c), q.zero(r, c)};
        const int code = int4_code(wr[j], grid);
        set_code(q, r, c, code);
        // The OBS update restricted to the columns left (the paper's eq. 3, with U's row j).
        const float e = (wr[j] - int4_value(code, grid)) / uf[j * n + j];
        er[j - b0] = e;
        for (int64_t k = j + 1; k < b1; ++k) wr[k] -= e * uf[j * n + k];
      }
    }
    if (b1 < n) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows),
                  static_cast<int>(n - b1), static_cast<int>(b1 - b0), -1.0f, err.data(),
                  static_cast<int>(nb), uf.data() + b0 * n + b1, static_cast<int>(n), 1.0f,
                  wk.data() + b1, static_cast<int>(n));
    }
  }
  return q;
}

void dequantize_matrix(const QuantizedMatrix& q, float* out) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < q.rows; ++r)
    for (int64_t c = 0; c < q.cols; ++c)
      out[r * q.cols + c] = static_cast<float>(q.code(r, c) - q.zero(r, c)) * q.scale(r, c);
}

std::string describe(const QuantizeReport& r, int bits, int64_t group) {
  return fmt::format(
      "{} linear matrices quantised to int{}{} ({:.2f} MiB of fp32 -> {:.2f} MiB), largest weight "
      "error {:.3g}{}, {:.2f} s",
      r.matrices, bits, bits == 4 ? fmt::format(" in groups of {}", group) : std::string(),
      static_cast<double>(r.fp32_bytes) / 1048576.0,
      static_cast<double>(r.quantized_bytes) / 1048576.0, r.max_abs_error,
      r.calibration_tokens > 0
          ? fmt::format(", GPTQ over {} calibration tokens", r.calibration_tokens)
          : std::string(bits == 4 ? ", rounded to nearest" : ""),
      r.seconds);
}

QuantizeReport quantize_linear_weights(Weights& w, const QuantizeOptions& opt,
                                       std::vector<QuantizedLayer>* out) {
  const auto t0 = std::chrono::steady_clock::now();
  QuantizeReport rep;
  if (out != nullptr) out->clear();
  const int bits = opt.bits;
  if (bits == 16 || bits == 32) return rep;
  VERL_CHECK(bits == 8 || bits == 4, "quantization bits {}: 4, 8 or 16 (none)", bits);
  VERL_CHECK(bits == 8 || (opt.group >= 2 && opt.group % 2 == 0),
             "int4 quantisation: group size {} must be even and at least 2", opt.group);
  VERL_CHECK(opt.calibration_samples >= 0 && opt.calibration_samples <= kMaxCalibrationSamples,
             "quantisation: {} calibration samples; want 0 (round to nearest) to {}",
             opt.calibration_samples, kMaxCalibrationSamples);
  std::optional<Calibration> cal;
  if (bits == 4 && opt.calibration_samples > 0 && !w.layout.layers.empty()) {
    cal.emplace(w, opt);
    rep.calibration_tokens = cal->tokens();
  }
  std::vector<float> back;
  for (size_t l = 0; l < w.layout.layers.size(); ++l) {
    const LayerParams& lp = w.layout.layers[l];
    std::array<std::vector<double>, 4> grams;
    if (cal) grams = cal->grams(static_cast<int>(l));
    const std::array<int, 4> mats = {lp.wqkv, lp.wo, lp.wgu, lp.wdown};
    QuantizedLayer* kept = nullptr;
    if (out != nullptr) kept = &out->emplace_back();
    const std::array<QuantizedMatrix*, 4> slots =
        kept ? std::array<QuantizedMatrix*, 4>{&kept->wqkv, &kept->wo, &kept->wgu, &kept->wdown}
             : std::array<QuantizedMatrix*, 4>{};
    for (size_t k = 0; k < 4; ++k) {
      const int i = mats[k];
      if (i < 0) continue;
      const ParamInfo& p = w.layout.params[static_cast<size_t>(i)];
      VERL_CHECK(p.shape.size() == 2, "quantize: {} is not a matrix", p.name);
      float* m = w.param(i);
      QuantizedMatrix q =
          cal ? quantize_matrix_gptq(m, p.shape[0], p.shape[1], opt.group, std::move(grams[k]))
              : quantize_matrix(m, p.shape[0], p.shape[1], bits, opt.group);
      back.resize(static_cast<size_t>(p.numel));
      dequantize_matrix(q, back.data());
      double err = 0;
#pragma omp parallel for schedule(static) reduction(max : err)
      for (int64_t e = 0; e < p.numel; ++e) {
        err = std::max(err, static_cast<double>(std::fabs(back[e] - m[e])));
        m[e] = back[e];
      }
      rep.max_abs_error = std::max(rep.max_abs_error, err);
      ++rep.matrices;
      rep.elements += p.numel;
      rep.fp32_bytes += 4 * static_cast<size_t>(p.numel);
      rep.quantized_bytes += q.bytes();
      if (slots[k] != nullptr) *slots[k] = std::move(q);
    }
    if (cal) cal->advance(static_cast<int>(l));
  }
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace verl::model
