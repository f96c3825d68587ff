// The `verl bench grpo-step` and `verl bench rollout` subcommands live in cmd_bench_grpo.cpp and
// cmd_bench_rollout.cpp and hang under cmd_bench.cpp's `bench` command.
#pragma once

#include "cli/command.h"

namespace verl::cli {

// Declares `grpo-step` under `bench` and returns its action (cmd_bench_grpo.cpp).
Action add_bench_grpo_step(CLI::App& bench);
// Declares `rollout` under `bench` and returns its action (cmd_bench_rollout.cpp).
Action add_bench_rollout(CLI::App& bench);

}  // namespace verl::cli
