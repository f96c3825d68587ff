// Weight-only quantisation of a model's linear layers (reward and reference models, forward only;
// docs/reward_model.md#quantisation): each layer's wqkv, wo, gate/up and down matrices
// ([out, in] row-major) are quantised once at load, never on disk.
//   int8: one scale per output channel (row): s = max |w| / 127, q = round(w / s) in [-127, 127].
//   int4: one scale per row and group of `group` consecutive inputs (the last group of a row may
//         be shorter): s = max |w| / 7, q = round(w / s) in [-7, 7], two to a byte (low nibble
//         first, two's complement).
// The embedding, the norms, the biases and the output heads stay in full precision. Rounding is
// to nearest, ties to even; a zero block has scale 0 and all-zero codes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/weights.h"

namespace verl::model {

struct QuantizedMatrix {
  int bits = 8;  // 8 or 4
  int64_t rows = 0, cols = 0, group = 0;  // group: inputs per int4 scale (cols for int8)
  std::vector<uint8_t> codes;  // int8: rows*cols bytes; int4: rows*ceil(cols/2), each row's own
  std::vector<float> scales;   // rows * ceil(cols / group)
  int64_t groups_per_row() const { return (cols + group - 1) / group; }
  int64_t row_bytes() const { return bits == 8 ? cols : (cols + 1) / 2; }
  // The code of element (r, c) as a signed integer.
  int code(int64_t r, int64_t c) const;
  size_t bytes() const { return codes.size() + 4 * scales.size(); }
};

QuantizedMatrix quantize_matrix(const float* w, int64_t rows, int64_t cols, int bits, int64_t group);
// out[r*cols + c] = code(r, c) * scale(r, c / group): what a dequantising GEMM multiplies by.
void dequantize_matrix(const QuantizedMatrix& q, float* out);

struct QuantizeReport {
  int64_t matrices = 0, elements = 0;
  size_t fp32_bytes = 0, quantized_bytes = 0;  // of the quantised matrices
  double max_abs_error = 0;                     // over every quantised element
};

// "N linear matrices quantised to intB[ in groups of G] (X MiB of fp32 -> Y MiB), largest weight
// error E", for logs.
std::string describe(const QuantizeReport& r, int bits, int64_t group);

// Quantises every layer's linear matrices of `w` (bits 8 or 4; `group` for int4, >= 2 and even)
// and writes the dequantised values back into w.data: the fp32 model then computes with exactly
// the weights a dequantising kernel would use (the CPU reference; it holds fp32, so the memory
// saving is the GPU kernels' to take). bits 16 (or 32) leaves w as it is.
QuantizeReport quantize_linear_weights(Weights& w, int bits, int64_t group = 128);

}  // namespace verl::model
