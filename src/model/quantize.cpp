#include "model/quantize.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"

namespace verl::model {
namespace {

int max_code(int bits) { return bits == 8 ? 127 : 7; }

}  // namespace

int QuantizedMatrix::code(int64_t r, int64_t c) const {
  if (bits == 8) return static_cast<int8_t>(codes[static_cast<size_t>(r * cols + c)]);
  const uint8_t byte = codes[static_cast<size_t>(r * row_bytes() + c / 2)];
  const int nibble = c % 2 == 0 ? byte & 0x0f : byte >> 4;
  return nibble >= 8 ? nibble - 16 : nibble;
}

QuantizedMatrix quantize_matrix(const float* w, int64_t rows, int64_t cols, int bits, int64_t group) {
  VERL_CHECK(bits == 8 || bits == 4, "quantize: {} bits; 8 or 4", bits);
  VERL_CHECK(rows > 0 && cols > 0, "quantize: a {}x{} matrix", rows, cols);
  QuantizedMatrix q;
  q.bits = bits;
  q.rows = rows;
  q.cols = cols;
  q.group = bits == 8 ? cols : std::min(group, cols);
  VERL_CHECK(q.group >= 1, "quantize: group size {}", group);
  const int64_t G = q.groups_per_row();
  q.scales.assign(static_cast<size_t>(rows * G), 0.0f);
  q.codes.assign(static_cast<size_t>(rows * q.row_bytes()), 0);
  const float qmax = static_cast<float>(max_code(bits));
  bool finite = true;
  // Rows are independent (each owns its scales and code bytes): one thread a block of rows.
#pragma omp parallel for schedule(static) reduction(&& : finite)
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t b = g * q.group, e = std::min(cols, b + q.group);
      float maxabs = 0.0f;
      for (int64_t c = b; c < e; ++c) {
        finite = finite && std::isfinite(row[c]);
        maxabs = std::max(maxabs, std::fabs(row[c]));
      }
      // int8 takes max |w| / 127. For int4 the scale is the one among max |w| x (1, 0.95, ...,
      // 0.5) / 7 with the least squared error over the group: clipping the few largest weights
      // buys a finer step for the rest (the clipping search of weight-only int4 schemes).
      float s = maxabs / qmax;
      if (bits == 4 && maxabs > 0.0f) {
        double best = -1;
        for (int k = 0; k <= 10; ++k) {
          const float cand = maxabs * (1.0f - 0.05f * static_cast<float>(k)) / qmax;
          double err = 0;
          for (int64_t c = b; c < e; ++c) {
            const float v = std::clamp(std::nearbyint(row[c] / cand), -qmax, qmax) * cand;
            err += static_cast<double>(v - row[c]) * static_cast<double>(v - row[c]);
          }
          if (best < 0 || err < best) {
            best = err;
            s = cand;
          }
        }
      }
      q.scales[static_cast<size_t>(r * G + g)] = s;
      for (int64_t c = b; c < e; ++c) {
        const int v = s > 0.0f ? static_cast<int>(std::clamp(std::nearbyint(row[c] / s), -qmax, qmax)) : 0;
        if (bits == 8) {
          q.codes[static_cast<size_t>(r * cols + c)] = static_cast<uint8_t>(static_cast<int8_t>(v));
        } else {
          uint8_t& byte = q.codes[static_cast<size_t>(r * q.row_bytes() + c / 2)];
          const auto nibble = static_cast<uint8_t>(v & 0x0f);
          byte = c % 2 == 0 ? static_cast<uint8_t>((byte & 0xf0) | nibble)
                            : static_cast<uint8_t>((byte & 0x0f) | (nibble << 4));
        }
      }
    }
  }
  if (!finite) {
    for (int64_t i = 0; i < rows * cols; ++i)
      VERL_CHECK(std::isfinite(w[i]), "quantize: weight ({}, {}) is {}", i / cols, i % cols, w[i]);
  }
  return q;
}

void dequantize_matrix(const QuantizedMatrix& q, float* out) {
  const int64_t G = q.groups_per_row();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < q.rows; ++r)
    for (int64_t c = 0; c < q.cols; ++c)
      out[r * q.cols + c] = static_cast<float>(q.code(r, c)) * q.scales[static_cast<size_t>(r * G + c / q.group)];
}

std::string describe(const QuantizeReport& r, int bits, int64_t group) {
  return fmt::format("{} linear matrices quantised to int{}{} ({:.2f} MiB of fp32 -> {:.2f} MiB), largest weight "
                     "error {:.3g}",
                     r.matrices, bits, bits == 4 ? fmt::format(" in groups of {}", group) : std::string(),
                     static_cast<double>(r.fp32_bytes) / 1048576.0, static_cast<double>(r.quantized_bytes) / 1048576.0,
                     r.max_abs_error);
}

QuantizeReport quantize_linear_weights(Weights& w, int bits, int64_t group) {
  QuantizeReport rep;
  if (bits == 16 || bits == 32) return rep;
  VERL_CHECK(bits == 8 || bits == 4, "quantization bits {}: 4, 8 or 16 (none)", bits);
  VERL_CHECK(bits == 8 || (group >= 2 && group % 2 == 0),
             "int4 quantisation: group size {} must be even and at least 2", group);
  std::vector<float> back;
  for (const LayerParams& lp : w.layout.layers) {
    for (int i : {lp.wqkv, lp.wo, lp.wgu, lp.wdown}) {
      if (i < 0) continue;
      const ParamInfo& p = w.layout.params[static_cast<size_t>(i)];
      VERL_CHECK(p.shape.size() == 2, "quantize: {} is not a matrix", p.name);
      float* m = w.param(i);
      const QuantizedMatrix q = quantize_matrix(m, p.shape[0], p.shape[1], bits, group);
      back.resize(static_cast<size_t>(p.numel));
      dequantize_matrix(q, back.data());
      double err = 0;
#pragma omp parallel for schedule(static) reduction(max : err)
      for (int64_t k = 0; k < p.numel; ++k) {
        err = std::max(err, static_cast<double>(std::fabs(back[k] - m[k])));
        m[k] = back[k];
      }
      rep.max_abs_error = std::max(rep.max_abs_error, err);
      ++rep.matrices;
      rep.elements += p.numel;
      rep.fp32_bytes += 4 * static_cast<size_t>(p.numel);
      rep.quantized_bytes += q.bytes();
    }
  }
  return rep;
}

}  // namespace verl::model
