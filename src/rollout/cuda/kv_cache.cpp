#include "rollout/cuda/kv_cache.h"

#include "core/error.h"

namespace verl::rollout::cuda {

using ops::cuda::DeviceBuffer;

CudaKVCache::CudaKVCache(const model::ModelConfig& cfg, int32_t block_size, int32_t num_blocks)
    : num_layers_(cfg.num_hidden_layers),
      block_elems_(static_cast<int64_t>(block_size) * cfg.kv_dim()),
      block_size_(block_size) {
  VERL_CHECK(block_size > 0 && num_layers_ > 0 && cfg.kv_dim() > 0,
             "CudaKVCache: block_size {} with {} layers of kv_dim {}", block_size, num_layers_,
             cfg.kv_dim());
  VERL_CHECK(num_blocks >= 1, "CudaKVCache: {} blocks", num_blocks);
  num_blocks_ = num_blocks;
  array_elems_ = static_cast<int64_t>(num_blocks_) * block_elems_;
}

void CudaKVCache::allocate() {
  if (allocated()) return;
  buf_ = DeviceBuffer<bf16>(static_cast<size_t>(num_arrays() * array_elems_));
  // Zeroed once: graph padding rows read block 0, which must hold finite values. The memset runs
  // on the legacy stream, which the non-blocking streams of the ops do not wait for: finish it.
  VERL_CUDA_CHECK(cudaMemset(buf_.data(), 0, buf_.bytes()));
  VERL_CUDA_CHECK(cudaDeviceSynchronize());
}

void CudaKVCache::release() {
  buf_.reset();
}

}  // namespace verl::rollout::cuda
