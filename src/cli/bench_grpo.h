// The `verl bench grpo-step` subcommand lives in cmd_bench_grpo.cpp and hangs under cmd_bench.cpp's
// `bench` command; these are the two functions the files share.
#pragma once

#include <cstdint>

#include "cli/command.h"
#include "model/config.h"
#include "model/weights.h"

namespace verl::cli {

// Declares `grpo-step` under `bench` and returns its action (cmd_bench_grpo.cpp).
Action add_bench_grpo_step(CLI::App& bench);

// The random weights of `bench train` (matrices N(0, 0.02) from Philox, norms one, biases zero;
// cmd_bench.cpp), so both benchmarks time the same model.
model::Weights bench_random_weights(const model::ModelConfig& c, uint64_t seed);

}  // namespace verl::cli
