// The CPU model as the trainer, quantize.cpp, the CLI and the tests know it: forward and backward
// over a packed batch, fp32. The code is the one CPU decoder (model/cpu/decoder.h), which the
// rollout's runner drives over its paged KV cache too.
#pragma once

#include "model/cpu/decoder.h"

namespace verl::model {

using Transformer = cpu::Decoder;

}  // namespace verl::model
