// The `verl bench grpo-step` subcommand lives in cmd_bench_grpo.cpp and hangs under cmd_bench.cpp's
// `bench` command.
#pragma once

#include "cli/command.h"

namespace verl::cli {

// Declares `grpo-step` under `bench` and returns its action (cmd_bench_grpo.cpp).
Action add_bench_grpo_step(CLI::App& bench);

}  // namespace verl::cli
