// Weight-only quantisation of a model's linear layers (reward and reference models, forward only;
// docs/reward_model.md#quantisation): each layer's wqkv, wo, gate/up and down matrices
// ([out, in] row-major) are quantised once at load, never on disk.
//   int8: one scale per output channel (row), symmetric: s = max |w| / 127, q = round(w / s) in
//         [-127, 127], w ~ q * s.
//   int4: one scale and one zero point per row and group of `group` consecutive inputs (the last
//         group of a row may be shorter), asymmetric: codes q in [0, 15], two to a byte (low
//         nibble first), zero point z in [0, 15], w ~ (q - z) * s. The range [lo, hi] (which holds
//         0, so 0 is exact) is fitted to the group's [min, max] shrunk at either end where that
//         lowers the squared error (a clipping search), s = (hi - lo) / 15, z = round(-lo / s).
//         With calibration data the codes (not the grids) are chosen by GPTQ (Frantar et al.
//         2022): columns are quantised one at a time, in order of decreasing H diagonal, and each
//         one's rounding error is spread over the columns not yet quantised through the inverse of
//         H = X^T X + damping, X the layer's inputs.
// The embedding, the norms, the biases and the output heads stay in full precision. Rounding is
// to nearest, ties to even; a zero block has scale 0 and all-zero codes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/weights.h"

namespace verl::model {

struct QuantizedMatrix {
  int bits = 8;                           // 8 or 4
  int64_t rows = 0, cols = 0, group = 0;  // group: inputs per int4 scale (cols for int8)
  std::vector<uint8_t> codes;  // int8: rows*cols bytes; int4: rows*ceil(cols/2), each row's own
  std::vector<float> scales;   // rows * ceil(cols / group)
  std::vector<uint8_t> zeros;  // int4: one zero point in [0, 15] per scale; int8: none (symmetric)
  int64_t groups_per_row() const { return (cols + group - 1) / group; }
  int64_t row_bytes() const { return bits == 8 ? cols : (cols + 1) / 2; }
  // The code of element (r, c): int8 signed in [-127, 127], int4 unsigned in [0, 15].
  int code(int64_t r, int64_t c) const;
  // The zero point of element (r, c)'s group (0 for int8).
  int zero(int64_t r, int64_t c) const;
  float scale(int64_t r, int64_t c) const {
    return scales[static_cast<size_t>(r * groups_per_row() + c / group)];
  }
  size_t bytes() const { return codes.size() + 4 * scales.size() + zeros.size(); }
};

// Round to nearest (with int4's clipping search).
QuantizedMatrix quantize_matrix(const float* w, int64_t rows, int64_t cols, int bits,
                                int64_t group);
// int4 by GPTQ: `xtx` is the [cols, cols] Gram matrix X^T X of the layer's inputs (X [n, cols],
// any positive multiple of it), `damp` the fraction of its mean diagonal added to the diagonal
// (the paper's 1%). Takes round to nearest's scales and zero points and chooses the codes to
// lower ||(W - Q) X^T|| instead of ||W - Q||.
QuantizedMatrix quantize_matrix_gptq(const float* w, int64_t rows, int64_t cols, int64_t group,
                                     std::vector<double> xtx, double damp = 0.01);
// out[r*cols + c] = (code(r, c) - zero(r, c)) * scale(r, c): what a dequantising GEMM multiplies
// by.
void dequantize_matrix(const QuantizedMatrix& q, float* out);

// GPTQ's calibration set holds every sample's hidden states at once (samples x 64 tokens x hidden
// fp32: 117 MiB for 128 samples of a 7B model); 16384 samples (1M tokens, four times the paper's
// largest set) bound it.
constexpr int64_t kMaxCalibrationSamples = 16384;

struct QuantizeOptions {
  int bits = 16;        // 8, 4, or 16/32 (none)
  int64_t group = 128;  // int4: inputs per scale and zero point, even, >= 2
  // int4: random token sequences the model runs over to collect each layer's inputs for GPTQ
  // (0: round to nearest). Ids are uniform over the vocabulary, drawn from `seed`.
  int64_t calibration_samples = 128;  // at most kMaxCalibrationSamples
  int64_t calibration_length = 64;    // tokens a sample (at most max_position_embeddings)
  uint64_t seed = 0;
};

struct QuantizeReport {
  int64_t matrices = 0, elements = 0;
  size_t fp32_bytes = 0, quantized_bytes = 0;  // of the quantised matrices
  double max_abs_error = 0;                    // over every quantised element
  int64_t calibration_tokens = 0;              // GPTQ's inputs (0: round to nearest)
  double seconds = 0;                          // wall time of the quantisation
};

// "N linear matrices quantised to intB[ in groups of G] (X MiB of fp32 -> Y MiB), largest weight
// error E[, GPTQ over T calibration tokens] in S s", for logs.
std::string describe(const QuantizeReport& r, int bits, int64_t group);

// One layer's quantised linear matrices, [out, in] as the layout's wqkv, wo, wgu, wdown.
struct QuantizedLayer {
  QuantizedMatrix wqkv, wo, wgu, wdown;
};

// Quantises every layer's linear matrices of `w` and writes the dequantised values back into
// w.data: the fp32 model then computes with exactly the weights a dequantising kernel would use
// (the CPU reference). bits 16 (or 32) leaves w as it is. int4 with calibration samples runs GPTQ
// layer by layer: layer l's Gram matrices come from running layer l (fp32) on the outputs of
// layers 0..l-1 already quantised. `out` (may be null) receives the quantised matrices, one entry
// a layer (none for bits 16): what the GPU model keeps instead of bf16 copies
// (model/cuda/quantized_linears.h), which is where the memory saving is.
QuantizeReport quantize_linear_weights(Weights& w, const QuantizeOptions& opt,
                                       std::vector<QuantizedLayer>* out = nullptr);

}  // namespace verl::model
