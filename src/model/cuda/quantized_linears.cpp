// Uploading quantised linear matrices into the device layout of ops/cuda/quant_linear.h
// (model/cuda/quantized_linears.h).
#include "model/cuda/quantized_linears.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include "core/error.h"

namespace verl::model::cuda {
namespace {

constexpr size_t kAlign = 256;
size_t round_up(size_t x) {
  return (x + kAlign - 1) / kAlign * kAlign;
}

std::array<const model::QuantizedMatrix*, 4> matrices(const model::QuantizedLayer& l) {
  return {&l.wqkv, &l.wo, &l.wgu, &l.wdown};
}
std::array<ops::cuda::QuantMatrixView*, 4> views(QuantizedLinears::Layer& l) {
  return {&l.wqkv, &l.wo, &l.wgu, &l.wdown};
}

}  // namespace

QuantizedLinears::QuantizedLinears(const std::vector<model::QuantizedLayer>& layers, bool sleeps) {
  VERL_CHECK(!layers.empty(), "QuantizedLinears: no layers");
  layers_.resize(layers.size());
  places_.resize(4 * layers.size());
  bits_ = layers[0].wqkv.bits;
  // Plan: each matrix's codes (rows padded to the device stride), scales and zero points, each
  // 256-byte aligned.
  size_t at = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    const auto ms = matrices(layers[l]);
    const auto vs = views(layers_[l]);
    for (size_t k = 0; k < 4; ++k) {
      const model::QuantizedMatrix& m = *ms[k];
      VERL_CHECK(m.bits == bits_ && (m.bits == 8 || m.bits == 4) && m.rows > 0 && m.cols > 0 &&
                     m.group > 0,
                 "QuantizedLinears: layer {} matrix {} is {}-bit [{}, {}] in groups of {} (every "
                 "matrix must be int{} and not empty)",
                 l, k, m.bits, m.rows, m.cols, m.group, bits_);
      VERL_CHECK(m.codes.size() == static_cast<size_t>(m.rows * m.row_bytes()) &&
                     m.scales.size() == static_cast<size_t>(m.rows * m.groups_per_row()) &&
                     m.zeros.size() == (m.bits == 4 ? m.scales.size() : size_t{0}),
                 "QuantizedLinears: layer {} matrix {} [{}, {}]: {} code bytes, {} scales, {} zero "
                 "points do not fit its shape",
                 l, k, m.rows, m.cols, m.codes.size(), m.scales.size(), m.zeros.size());
      ops::cuda::QuantMatrixView& v = *vs[k];
      v.bits = m.bits;
      v.rows = m.rows;
      v.cols = m.cols;
      v.group = m.group;
      v.ld = ops::cuda::quant_codes_stride(m.bits, m.cols);
      Placement& p = places_[4 * l + k];
      p.codes = at;
      at = round_up(at + static_cast<size_t>(v.rows * v.ld));
      p.scales = at;
      at = round_up(at + 4 * m.scales.size());
      p.zeros = at;
      at = round_up(at + m.zeros.size());
      max_elems_ = std::max(max_elems_, m.rows * m.cols);
    }
  }
  bytes_ = at;
  // The image on the host (pinned when it must stay for wake()), then one copy up.
  std::vector<uint8_t> pageable;
  uint8_t* img = nullptr;
  if (sleeps) {
    host_ = ops::cuda::PinnedBuffer<uint8_t>(bytes_);
    img = host_.data();
  } else {
    pageable.resize(bytes_);
    img = pageable.data();
  }
  std::memset(img, 0, bytes_);  // the rows' padding codes are zero
  for (size_t l = 0; l < layers.size(); ++l) {
    const auto ms = matrices(layers[l]);
    const auto vs = views(layers_[l]);
    for (size_t k = 0; k < 4; ++k) {
      const model::QuantizedMatrix& m = *ms[k];
      const Placement& p = places_[4 * l + k];
      const auto row_bytes = static_cast<size_t>(m.row_bytes());
      for (int64_t r = 0; r < m.rows; ++r)
        std::memcpy(img + p.codes + static_cast<size_t>(r * vs[k]->ld),
                    m.codes.data() + static_cast<size_t>(r) * row_bytes, row_bytes);
      std::memcpy(img + p.scales, m.scales.data(), 4 * m.scales.size());
      if (!m.zeros.empty()) std::memcpy(img + p.zeros, m.zeros.data(), m.zeros.size());
    }
  }
  dev_ = ops::cuda::DeviceBuffer<uint8_t>(bytes_);
  ops::cuda::copy_to_device(dev_.data(), img, bytes_);
  point(dev_.data());
}

void QuantizedLinears::point(uint8_t* base) {
  for (size_t l = 0; l < layers_.size(); ++l) {
    const auto vs = views(layers_[l]);
    for (size_t k = 0; k < 4; ++k) {
      const Placement& p = places_[4 * l + k];
      ops::cuda::QuantMatrixView& v = *vs[k];
      v.codes = base ? base + p.codes : nullptr;
      v.scales = base ? reinterpret_cast<const float*>(base + p.scales) : nullptr;
      v.zeros = base && v.bits == 4 ? base + p.zeros : nullptr;
    }
  }
}

void QuantizedLinears::wake(cudaStream_t stream) {
  if (!sleeps() || dev_.size() > 0) return;
  dev_ = ops::cuda::DeviceBuffer<uint8_t>(bytes_);
  VERL_CUDA_CHECK(
      cudaMemcpyAsync(dev_.data(), host_.data(), bytes_, cudaMemcpyHostToDevice, stream));
  point(dev_.data());
}

void QuantizedLinears::sleep(cudaStream_t stream) {
  if (!sleeps() || dev_.size() == 0) return;
  VERL_CUDA_CHECK(cudaStreamSynchronize(stream));  // the pass that read them is done
  dev_.reset();
  point(nullptr);
}

}  // namespace verl::model::cuda
