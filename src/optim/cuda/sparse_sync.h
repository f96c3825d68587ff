// The CUDA versions of LightweightSync's codec (optim/sparse_sync.h): the same message bytes, the
// same carry and the same accumulated sums as the CPU functions, bit for bit, for every input.
// NaN bits follow x86-64's rules too; the one case left to the CPU compiler is an entry whose grad
// and carry are both NaN (which operand's payload survives depends on how the CPU's loop was
// vectorised). Everything is enqueued on the context's stream; nothing waits for the device or
// copies to the host.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/cuda/device.h"
#include "optim/sparse_sync.h"

namespace verl::optim::cuda {

// Device scratch bytes sparse_compress needs for a bucket of n elements.
size_t sparse_scratch_bytes(int64_t n);

// optim::sparse_compress on device pointers: grad [n] f32, carry [n] f32 or null, msg
// layout.bytes bytes (4-byte aligned), scratch >= sparse_scratch_bytes(layout.n) bytes (8-byte
// aligned; its contents need not be zero). The selection (threshold, counts, offsets) stays on
// the device. n must be below 2^32.
void sparse_compress(const ops::cuda::CudaContext& ctx, const float* grad, float* carry,
                     bool keep_error, const SparseLayout& layout, uint8_t* msg, void* scratch);

// Bytes of ctx.workspace sparse_accumulate uses for a bucket of n elements (4 per 64 chunks).
size_t sparse_accumulate_workspace_bytes(int64_t n);

// optim::sparse_accumulate on device pointers: out[i] += the message's decoded value at i.
// Deterministic: within one message each index appears once, so no atomics.
void sparse_accumulate(const ops::cuda::CudaContext& ctx, const uint8_t* msg,
                       const SparseLayout& layout, float* out);

}  // namespace verl::optim::cuda
