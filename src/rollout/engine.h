// The rollout engine: scheduler + block manager + model runner + sampler in one loop. Requests go
// in (prompt tokens, sampling params, n samples); each sample comes out through a callback the
// moment it finishes, so rewards can be scored while the rest still decode.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/weights.h"
#include "rollout/scheduler.h"
#include "rollout/step_runner.h"

namespace verl::rollout {

struct EngineConfig {
  SchedulerConfig scheduler;
  // KV-cache size: when > 0, the block count is derived from this byte budget (overriding
  // scheduler.num_blocks); verl's gpu_memory_utilization becomes a byte budget the same way.
  int64_t kv_cache_bytes = 0;
};

// Sample i of a request draws from Philox(key = params.seed, stream = i): give requests distinct
// seeds (the trainer derives them from its seed, the step and the prompt index) and any request
// replays exactly, alone or in any batch.
struct Request {
  std::vector<int32_t> prompt;
  SamplingParams params;
  int32_t n = 1;  // samples of this prompt (a GRPO group)
  // Empty, or n lengths: sample i ends with a forced stop after eos_at[i] tokens (at most
  // params.max_tokens; 0 keeps params as they are). The synthetic long-tailed workload.
  std::vector<int32_t> eos_at;
};

struct Completion {
  int64_t request = 0;          // index into the generate() request list
  int32_t sample = 0;           // which of the request's n samples
  std::vector<int32_t> tokens;  // generated tokens (stop token included when it ended the sample)
  std::vector<float> logprobs;  // log-prob of each generated token at the sampling temperature
  FinishReason finish_reason = FinishReason::None;
  // Multi-turn: 1 on tokens the model sampled, 0 on appended ones (tool turns; their log-prob
  // is 0). Empty when the engine ran without a TurnHandler (every token is the model's).
  std::vector<uint8_t> generated;
};

// What an agent loop hands back for a paused sample: tokens to append before it continues, or
// the end of its trajectory.
struct Continuation {
  int64_t request = 0;
  int32_t sample = 0;
  std::vector<int32_t> append;  // rendered tool/user turn plus the next generation prompt
  bool end = false;             // finish the sample (finish reason "stop") instead
};

// The agent loop's side of a multi-turn generate(). Every sample pauses at its stop tokens
// instead of finishing; its KV cache stays while the handler works (tools run on the handler's
// threads while the engine keeps decoding the other samples), and the continuation's tokens are
// prefilled onto the cached prefix: no re-prefill of the context.
class TurnHandler {
 public:
  virtual ~TurnHandler() = default;
  // On the engine's thread, the moment a sample's turn ends at a stop token; `output`: all its
  // output tokens so far (the turn's last token included). The handler answers later, by poll().
  virtual void turn_ended(int64_t request, int32_t sample, std::span<const int32_t> output) = 0;
  // Appends the continuations ready now to `out`; with `wait`, nothing else can run, so it
  // blocks until at least one is ready.
  virtual void poll(std::vector<Continuation>& out, bool wait) = 0;
};

// Optional callbacks of generate().
struct GenerateHooks {
  // Each completion, the moment its sequence finishes (rewards can start on it right away).
  std::function<void(const Completion&)> on_finish;
  // Each sampled token as it is produced (streaming output).
  std::function<void(int64_t request, int32_t sample, int32_t token)> on_token;
  // Stop strings: called with a sample's generated tokens after each new token; returning true
  // ends the sample there with finish reason StopString.
  std::function<bool(int64_t request, std::span<const int32_t> output)> stop;
  // Multi-turn rollouts (the agent loop); null: single-turn.
  TurnHandler* turns = nullptr;
};

struct EngineStats {
  int64_t steps = 0, prompt_tokens_computed = 0, prompt_tokens_without_sharing = 0;
  int64_t output_tokens = 0, preemptions = 0;
  // Multi-turn: tokens appended to paused samples (prefilled onto their cached prefix), and the
  // cached prefix those prefills did not recompute (the prefill KV reuse saved).
  int64_t appended_tokens = 0, kv_reused_tokens = 0;
  double seconds = 0;
};

class Engine {
 public:
  // The CPU runner (CpuStepRunner) on `weights`, with a KV pool of config.kv_cache_bytes (or
  // scheduler.num_blocks).
  // With `lora` (outliving the engine) its adapters run beside the weights, unmerged.
  Engine(const model::Weights& weights, const EngineConfig& config,
         const model::LoraWeights* lora = nullptr);
  // Any runner, e.g. rollout::cuda::CudaModelRunner; it outlives the engine. Its KV pool fixes the
  // scheduler's num_blocks and block_size (kv_cache_bytes is the runner's business then).
  Engine(StepRunner& runner, const EngineConfig& config);

  // Runs all requests to completion; the returned list is in request order, samples in order.
  std::vector<Completion> generate(const std::vector<Request>& requests,
                                   const GenerateHooks& hooks = {});

  const EngineStats& stats() const { return stats_; }
  // The runner's own counts (steps, CUDA graphs and their capture time).
  StepRunnerStats runner_stats() const { return runner_->stats(); }
  const SchedulerConfig& scheduler_config() const { return sched_cfg_; }

 private:
  SchedulerConfig sched_cfg_;
  std::unique_ptr<StepRunner> owned_runner_;  // the CPU runner when the engine built it
  StepRunner* runner_;
  int64_t vocab_;
  EngineStats stats_;
};

}  // namespace verl::rollout
