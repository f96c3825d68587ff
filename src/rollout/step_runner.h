// The model side of one rollout step, as the engine sees it: run a scheduled batch's forward over
// the runner's paged KV cache and sample its S tokens. Host-only interface, so src/rollout does not
// depend on CUDA: CpuStepRunner (CpuModelRunner + Sampler) is the default; the GPU implementation
// is rollout::cuda::CudaModelRunner (src/rollout/cuda/model_runner.h), handed to the Engine by the
// caller.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/weights.h"
#include "rollout/model_runner.h"
#include "rollout/sampler.h"
#include "rollout/scheduler.h"

namespace verl::rollout {

// What a runner's steps did since it was built (the trainer logs them per rollout:
// docs/metrics.md).
struct StepRunnerStats {
  int64_t steps = 0;            // step() calls
  int64_t decode_steps = 0;     // steps of one token and one sample a sequence
  int64_t graph_steps = 0;      // decode steps replayed from a CUDA graph (GPU only)
  int64_t graphs_captured = 0;  // CUDA graphs captured (GPU only: one a decode batch bucket)
  double graph_capture_s = 0;   // host seconds capturing and instantiating them
  bool gpu = false;             // a GPU runner (the graph counts apply)
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;

  virtual StepRunnerStats stats() const = 0;

  // The KV pool this runner holds: the scheduler must plan with exactly these.
  virtual int32_t num_blocks() const = 0;
  virtual int32_t block_size() const = 0;
  virtual int64_t vocab_size() const = 0;

  // Applies the batch's block copies, runs its forward (writing the KV of its new tokens) and
  // writes the batch.num_samples() sampled tokens and their log-probs (sampler.h), in sample order.
  virtual void step(const ScheduledBatch& batch, std::span<int32_t> tokens,
                    std::span<float> logprobs) = 0;

  // Called by Engine::generate before its first and after its last step: a runner may take its KV
  // memory at begin and give it back at end (verl's free_cache_engine).
  virtual void begin_generate() {}
  virtual void end_generate() {}
};

// The CPU runner: fp32 paged KV cache, CpuModelRunner's forward, then the Sampler on its logits.
// With `tp` (tensor-parallel generation) `weights` is this rank's TpSlice and its cache holds the
// rank's kv heads; the logits are gathered whole on every rank of the group, so with the same
// requests (hence the same sampling seeds) every rank samples the same tokens.
class CpuStepRunner final : public StepRunner {
 public:
  CpuStepRunner(const model::Weights& weights, int32_t num_blocks, int32_t block_size,
                const model::TpContext* tp = nullptr, const model::LoraWeights* lora = nullptr);

  int32_t num_blocks() const override { return cache_.num_blocks(); }
  int32_t block_size() const override { return cache_.block_size(); }
  int64_t vocab_size() const override { return sampler_.vocab_size(); }
  StepRunnerStats stats() const override { return stats_; }
  void step(const ScheduledBatch& batch, std::span<int32_t> tokens,
            std::span<float> logprobs) override;

 private:
  StepRunnerStats stats_;
  KVCache cache_;
  CpuModelRunner runner_;
  Sampler sampler_;
  std::vector<float> logits_;
};

}  // namespace verl::rollout
