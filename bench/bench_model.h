// The Qwen2-shaped model the CPU benchmarks run (and their PyTorch peers mirror): tied
// embeddings, q/k/v bias, GQA, rope theta 1e6. The shape table itself lives with `verl bench
// train` in src/cli/bench/shapes.h, so the benchmarks and the command build the same model.
#pragma once

#include "cli/bench/shapes.h"

namespace verl::bench {

using cli::qwen2_shape;

}  // namespace verl::bench
