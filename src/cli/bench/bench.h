// The `verl bench` subcommands, one file each in this folder: train.cpp (`bench train`, which also
// declares the `bench` command), rollout.cpp (`bench rollout`), grpo_step.cpp (`bench grpo-step`),
// grad_sync.cpp (`bench grad-sync`), quant.cpp (`bench quant-linear`, `bench score`).
// Benchmark bookkeeping lives here too, never in the runners they time.
#pragma once

#include "cli/command.h"

namespace verl::cli {

// Declares `grpo-step` under `bench` and returns its action (grpo_step.cpp).
Action add_bench_grpo_step(CLI::App& bench);
// Declares `rollout` under `bench` and returns its action (rollout.cpp).
Action add_bench_rollout(CLI::App& bench);
// Declares `grad-sync` under `bench` and returns its action (grad_sync.cpp).
Action add_bench_grad_sync(CLI::App& bench);
// Declare `quant-linear` and `score` under `bench` and return their actions (quant.cpp).
Action add_bench_quant_linear(CLI::App& bench);
Action add_bench_score(CLI::App& bench);

}  // namespace verl::cli
