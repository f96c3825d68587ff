// The LightweightSync carry's update on the GPU for an interval's step without a sync.
#pragma once

#include <cstdint>

#include "ops/cuda/device.h"

namespace verl::optim::cuda {

// y[i] += x[i] for i < n, enqueued on ctx.stream.
void add_into(const ops::cuda::CudaContext& ctx, float* y, const float* x, int64_t n);

}  // namespace verl::optim::cuda
