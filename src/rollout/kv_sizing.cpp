#include "rollout/kv_sizing.h"

#include <unistd.h>

#include <algorithm>

#include "core/device.h"
#include "core/error.h"
#include "rollout/engine.h"

namespace verl::rollout {

int64_t kv_block_bytes(const model::ModelConfig& cfg, int32_t block_size, int64_t elem_bytes) {
  return 2 * cfg.num_hidden_layers * static_cast<int64_t>(block_size) * cfg.kv_dim() * elem_bytes;
}

int64_t kv_blocks_to_hold(const std::vector<Request>& requests, int32_t block_size) {
  VERL_CHECK(block_size > 0, "kv_blocks_to_hold: block_size must be positive, got {}", block_size);
  int64_t tokens = 0, samples = 0;
  for (const Request& r : requests) {
    tokens += (static_cast<int64_t>(r.prompt.size()) + r.params.max_tokens) * r.n;
    samples += r.n;
  }
  return (tokens + block_size - 1) / block_size + samples + 16;
}

int32_t kv_pool_blocks(int64_t wanted_blocks, int64_t budget_bytes, int64_t block_bytes,
                       int32_t block_size) {
  VERL_CHECK(block_bytes > 0, "kv_pool_blocks: a KV block of {} bytes", block_bytes);
  VERL_CHECK(wanted_blocks > 0 || budget_bytes > 0,
             "kv_pool_blocks: neither a block count nor a byte budget for the KV cache");
  int64_t blocks = wanted_blocks;
  if (budget_bytes > 0) {
    const int64_t fit = budget_bytes / block_bytes;
    VERL_CHECK(fit >= 1,
               "KV cache budget of {} bytes holds no block ({} bytes per block of {} tokens)",
               budget_bytes, block_bytes, block_size);
    blocks = wanted_blocks > 0 ? std::min(wanted_blocks, fit) : fit;
  }
  return static_cast<int32_t>(std::min<int64_t>(blocks, INT32_MAX));
}

int64_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

int64_t kv_budget_from_utilization(double fraction) {
  VERL_CHECK(fraction > 0.0 && fraction <= 1.0, "gpu_memory_utilization must be in (0, 1], got {}",
             fraction);
  VERL_CHECK(cuda_available(), "gpu_memory_utilization: no CUDA device to take it of");
  const double total = static_cast<double>(device_memory_total());
  const double used = static_cast<double>(device_memory_in_use());
  const double budget = fraction * total - used;
  VERL_CHECK(
      budget > 0.0,
      "gpu_memory_utilization {} leaves no KV cache: {:.2f} of {:.2f} GiB are already in use; "
      "raise it, or give the rollout a byte budget",
      fraction, used / (1 << 30), total / (1 << 30));
  return static_cast<int64_t>(budget);
}

}  // namespace verl::rollout
