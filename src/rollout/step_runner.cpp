// The CPU step runner (step_runner.h): the paged fp32 forward of CpuModelRunner, then the Sampler.
#include "rollout/step_runner.h"

#include "core/error.h"

namespace verl::rollout {

CpuStepRunner::CpuStepRunner(const model::Weights& weights, int32_t num_blocks, int32_t block_size,
                             const model::TpContext* tp, const model::LoraWeights* lora)
    : cache_(weights.config, num_blocks, block_size),
      runner_(weights, cache_, tp, lora),
      sampler_(static_cast<int32_t>(tp ? tp->vocab_size : weights.config.vocab_size)) {}

void CpuStepRunner::step(const ScheduledBatch& batch, std::span<int32_t> tokens,
                         std::span<float> logprobs) {
  const int32_t S = batch.num_samples();
  VERL_CHECK(static_cast<int32_t>(tokens.size()) == S && static_cast<int32_t>(logprobs.size()) == S,
             "CpuStepRunner: {} samples, {} token and {} log-prob slots", S, tokens.size(),
             logprobs.size());
  ++stats_.steps;
  if (batch.decode()) ++stats_.decode_steps;
  runner_.run(batch, logits_);
  if (S > 0) sampler_.sample(logits_.data(), batch.sample_seqs, tokens.data(), logprobs.data());
}

}  // namespace verl::rollout
