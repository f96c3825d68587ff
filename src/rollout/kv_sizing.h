// How big the rollout's paged KV pool is, one rule for the CPU engine and the GPU runner: a
// block count that holds every sequence of a generate() at once (what the trainer asks for, so
// nothing is preempted), capped by a byte budget (an explicit one, or verl's
// gpu_memory_utilization turned into bytes as vLLM does).
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace verl::rollout {

struct Request;

// Bytes of one KV block: K and V of every layer for block_size tokens at elem_bytes an element
// (4 for the CPU's fp32 cache, 2 for the GPU's bf16 one).
int64_t kv_block_bytes(const model::ModelConfig& cfg, int32_t block_size, int64_t elem_bytes);

// Blocks that hold all of `requests` at once: each of a request's n samples may grow to its
// prompt plus params.max_tokens, plus one block per sample for copy-on-write of a shared prompt's
// last block and a small reserve.
int64_t kv_blocks_to_hold(const std::vector<Request>& requests, int32_t block_size);

// The pool's block count: `wanted_blocks` (> 0) capped by `budget_bytes` (> 0), or, with
// wanted_blocks = 0, as many blocks as the budget holds; neither (0, 0) is an error. Throws when
// the budget holds no block.
int32_t kv_pool_blocks(int64_t wanted_blocks, int64_t budget_bytes, int64_t block_bytes,
                       int32_t block_size);

// This machine's physical memory in bytes (0 when unknown): the CPU engine's cap.
int64_t host_memory_bytes();

// verl's actor_rollout_ref.rollout.gpu_memory_utilization as a KV byte budget, as vLLM sizes its
// cache: the rollout may hold `fraction` of the device's memory in total, and what is in use now
// (weights, the trainer's state, the runner's scratch, other processes) counts against it:
//   budget = fraction * total - (total - free).
// Throws when that leaves nothing, or when there is no GPU.
int64_t kv_budget_from_utilization(double fraction);

}  // namespace verl::rollout
