// Sum of squares of a float buffer, accumulated in double: sum_i x_i^2 (the caller takes the
// sqrt after adding buffers / ranks). The buffer is cut into a fixed number of blocks whose
// partial sums are added in block order, so the result does not depend on the thread count.
#include <algorithm>

#include "ops/cpu/ops.h"

namespace verl::ops::cpu {

double sum_squares(const float* x, int64_t n) {
  if (n <= 0) return 0.0;
  constexpr int64_t kMaxBlocks = 256, kMinBlock = 4096;
  const int64_t nblocks = std::min(kMaxBlocks, (n + kMinBlock - 1) / kMinBlock);
  const int64_t per = (n + nblocks - 1) / nblocks;
  double partial[kMaxBlocks];
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t i0 = blk * per, i1 = std::min(n, i0 + per);
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = i0; i < i1; ++i) s += static_cast<double>(x[i]) * x[i];
    partial[blk] = s;
  }
  double total = 0.0;
  for (int64_t blk = 0; blk < nblocks; ++blk) total += partial[blk];
  return total;
}

}  // namespace verl::ops::cpu
