// A forward-only model's quantised linear matrices on the device (model/quantize.h's
// QuantizedLayer, per layer wqkv, wo, wgu, wdown) in the layout that ops/cuda/quant_linear.h
// computes with: codes with 16-byte aligned rows, fp32 scales, int4 zero points. The model reads
// them instead of bf16 copies (CudaTransformerOptions::quantized), so they are the memory saving:
// about 1 byte (int8) or 0.56 byte (int4, group 128) a weight instead of 2.
//
// Every matrix lives in one device allocation. A sleeping set (the reference policy's or reward
// model's param_offload) also keeps its image in pinned host memory: sleep() frees the device
// copy, wake() brings it back (the views then point into the new allocation).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/quantize.h"
#include "ops/cuda/device.h"
#include "ops/cuda/quant_linear.h"

namespace verl::model::cuda {

class QuantizedLinears {
 public:
  struct Layer {
    ops::cuda::QuantMatrixView wqkv, wo, wgu, wdown;
  };
  // Uploads `layers` (synchronous). sleeps: keep the pinned host image for sleep()/wake(); the set
  // starts awake.
  explicit QuantizedLinears(const std::vector<model::QuantizedLayer>& layers, bool sleeps = false);
  QuantizedLinears(const QuantizedLinears&) = delete;
  QuantizedLinears& operator=(const QuantizedLinears&) = delete;

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  // Layer l's matrices; device pointers are null while asleep.
  const Layer& layer(int64_t l) const { return layers_[static_cast<size_t>(l)]; }
  // N * K of the largest matrix: the Dequant path's bf16 scratch (quant_linear.h).
  int64_t max_matrix_elems() const { return max_elems_; }
  int bits() const { return bits_; }
  // Device bytes held now (0 while asleep) and of the awake set.
  size_t device_bytes() const { return dev_.bytes(); }
  size_t bytes() const { return bytes_; }
  bool sleeps() const { return host_.size() > 0; }
  // Enqueued on `stream`: wake() copies the image up; sleep() waits for the stream (the pass that
  // read the matrices) and frees them. No-ops for a set that does not sleep.
  void wake(cudaStream_t stream);
  void sleep(cudaStream_t stream);

 private:
  // Byte offsets of one matrix's codes, scales and zero points inside the allocation.
  struct Placement {
    size_t codes = 0, scales = 0, zeros = 0;
  };
  void point(uint8_t* base);  // (re)sets the views' pointers into an allocation at `base`

  std::vector<Layer> layers_;
  std::vector<Placement> places_;  // 4 a layer, in Layer's order
  size_t bytes_ = 0;
  int64_t max_elems_ = 0;
  int bits_ = 0;
  ops::cuda::DeviceBuffer<uint8_t> dev_;
  ops::cuda::PinnedBuffer<uint8_t> host_;  // a sleeping set's image
};

}  // namespace verl::model::cuda
