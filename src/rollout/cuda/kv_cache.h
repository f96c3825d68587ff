// The GPU rollout's paged bf16 KV cache: per layer K and V [num_blocks, block_size, Hkv, D], in
// one allocation of 2 L arrays (K of layer l is array 2l, V array 2l + 1), zeroed when taken. Its
// block count comes from rollout/kv_sizing.h, the rule the CPU engine's cache follows too.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "ops/cuda/device.h"
#include "ops/cuda/ops_cuda.h"

namespace verl::rollout::cuda {

using ops::cuda::bf16;

class CudaKVCache {
 public:
  CudaKVCache(const model::ModelConfig& cfg, int32_t block_size, int32_t num_blocks);

  void allocate();  // no-op when allocated
  void release();   // gives the memory back (never throws)
  bool allocated() const { return buf_.data() != nullptr; }

  bf16* k(int64_t layer) { return buf_.data() + 2 * layer * array_elems_; }
  bf16* v(int64_t layer) { return buf_.data() + (2 * layer + 1) * array_elems_; }
  int64_t layer_stride() const { return 2 * array_elems_; }  // k(l + 1) - k(l), elements
  bf16* base() { return buf_.data(); }
  const bf16* base() const { return buf_.data(); }
  int64_t num_arrays() const { return 2 * num_layers_; }
  int64_t array_elems() const { return array_elems_; }
  int64_t block_elems() const { return block_elems_; }
  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  int64_t bytes() const { return num_arrays() * array_elems_ * static_cast<int64_t>(sizeof(bf16)); }

 private:
  int64_t num_layers_, block_elems_, array_elems_ = 0;
  int32_t num_blocks_ = 0, block_size_;
  ops::cuda::DeviceBuffer<bf16> buf_;
};

}  // namespace verl::rollout::cuda
