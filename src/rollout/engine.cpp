#include "rollout/engine.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "rollout/kv_sizing.h"

namespace verl::rollout {

Engine::Engine(const model::Weights& weights, const EngineConfig& config,
               const model::LoraWeights* lora)
    : sched_cfg_(config.scheduler) {
  // A byte budget, when given, decides the pool (kv_sizing.h); else the scheduler's block count,
  // capped at half of the host's memory: past that, sequences wait for blocks (or are preempted),
  // and one that could never fit is an error naming its length, not a failed allocation.
  const int64_t block_bytes = kv_block_bytes(weights.config, sched_cfg_.block_size, sizeof(float));
  int64_t budget = config.kv_cache_bytes;
  const int64_t host_half = host_memory_bytes() / 2;
  if (budget <= 0 && host_half > 0 && sched_cfg_.num_blocks > host_half / block_bytes) {
    budget = host_half;
    log::warn(
        "rollout: a KV cache for every sequence at once needs {:.1f} GiB; the CPU engine holds "
        "{:.1f} GiB "
        "(half of this machine's memory), so sequences take turns",
        static_cast<double>(sched_cfg_.num_blocks) * block_bytes / (1 << 30),
        static_cast<double>(host_half) / (1 << 30));
  }
  sched_cfg_.num_blocks = kv_pool_blocks(config.kv_cache_bytes > 0 ? 0 : sched_cfg_.num_blocks,
                                         budget, block_bytes, sched_cfg_.block_size);
  owned_runner_ = std::make_unique<CpuStepRunner>(weights, sched_cfg_.num_blocks,
                                                  sched_cfg_.block_size, nullptr, lora);
  runner_ = owned_runner_.get();
  vocab_ = runner_->vocab_size();
}

Engine::Engine(StepRunner& runner, const EngineConfig& config)
    : sched_cfg_(config.scheduler), runner_(&runner), vocab_(runner.vocab_size()) {
  sched_cfg_.num_blocks = runner.num_blocks();
  sched_cfg_.block_size = runner.block_size();
}

std::vector<Completion> Engine::generate(const std::vector<Request>& requests,
                                         const GenerateHooks& hooks) {
  Timer timer;
  Scheduler sched(sched_cfg_);
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<size_t> first_of(requests.size());
  int64_t next_id = 0;
  for (size_t r = 0; r < requests.size(); ++r) {
    const Request& req = requests[r];
    VERL_CHECK(req.n >= 1, "request {}: n must be >= 1, got {}", r, req.n);
    VERL_CHECK(!req.prompt.empty(), "request {}: the prompt is empty", r);
    for (int32_t t : req.prompt) {
      VERL_CHECK(t >= 0 && t < vocab_, "request {}: prompt token {} is outside [0, {})", r, t,
                 vocab_);
    }
    req.params.validate();
    VERL_CHECK(req.eos_at.empty() || static_cast<int32_t>(req.eos_at.size()) == req.n,
               "request {}: {} forced lengths (eos_at) for n = {} samples", r, req.eos_at.size(),
               req.n);
    first_of[r] = seqs.size();
    std::vector<Sequence*> group;
    for (int32_t i = 0; i < req.n; ++i) {
      SamplingParams params = req.params;
      if (!req.eos_at.empty() && req.eos_at[static_cast<size_t>(i)] > 0) {
        params.max_tokens = std::min(params.max_tokens, req.eos_at[static_cast<size_t>(i)]);
        params.stop_at_max_tokens = true;
      }
      seqs.push_back(
          std::make_unique<Sequence>(next_id++, req.prompt, params, static_cast<int64_t>(r), i));
      // A sample's randomness is named by (request seed, sample index) alone, not by where the
      // request sits in this call, so a rollout replays whatever else is batched with it.
      seqs.back()->set_rng_stream(static_cast<uint64_t>(i));
      seqs.back()->pause_on_stop = hooks.turns != nullptr;
      group.push_back(seqs.back().get());
    }
    sched.add_group(group);
  }
  std::vector<Completion> out(seqs.size());
  auto complete = [&](Sequence* s) {
    const int64_t r = s->group_id();
    Completion& c = out[first_of[r] + s->index_in_group()];
    c.request = r;
    c.sample = s->index_in_group();
    c.tokens.assign(s->output_tokens().begin(), s->output_tokens().end());
    c.logprobs.assign(s->output_logprobs().begin(), s->output_logprobs().end());
    c.finish_reason = s->finish_reason;
    if (hooks.turns) c.generated.assign(s->output_generated().begin(), s->output_generated().end());
    if (hooks.on_finish) hooks.on_finish(c);
  };
  // Multi-turn: the agent loop's continuations of paused samples, appended (or ended) between
  // steps. A continuation that would pass max_tokens or max_model_len ends the trajectory.
  std::vector<Continuation> ready;
  auto take_continuations = [&](bool wait) {
    ready.clear();
    hooks.turns->poll(ready, wait);
    for (const Continuation& k : ready) {
      VERL_CHECK(k.request >= 0 && k.request < static_cast<int64_t>(requests.size()) &&
                     k.sample >= 0 && k.sample < requests[k.request].n,
                 "agent loop continued request {} sample {}, which this generate() does not hold",
                 k.request, k.sample);
      Sequence* s = seqs[first_of[k.request] + k.sample].get();
      VERL_CHECK(s->status == SequenceStatus::Paused,
                 "agent loop continued request {} sample {}, which is {}, not paused", k.request,
                 k.sample, to_string(s->status));
      const int64_t after = s->num_output_tokens() + static_cast<int64_t>(k.append.size());
      const bool fits =
          after < s->params().max_tokens &&
          s->num_tokens() + static_cast<int64_t>(k.append.size()) < sched_cfg_.max_model_len;
      for (int32_t t : k.append)
        VERL_CHECK(t >= 0 && t < vocab_, "agent loop appended token {} outside [0, {})", t, vocab_);
      if (k.end || k.append.empty() || !fits) {
        sched.finish(s, k.end || k.append.empty() ? FinishReason::Stop : FinishReason::Length);
        complete(s);
      } else {
        sched.resume(s, k.append);
      }
    }
  };

  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  runner_->begin_generate();
  // The runner gives its KV memory back even when a step throws.
  struct EndGenerate {
    StepRunner* r;
    ~EndGenerate() { r->end_generate(); }
  } end_generate{runner_};
  while (sched.has_unfinished()) {
    if (hooks.turns && sched.num_paused() > 0) {
      take_continuations(/*wait=*/!sched.has_runnable());
      if (!sched.has_runnable()) continue;
    }
    const ScheduledBatch& batch = sched.schedule();
    VERL_CHECK(!batch.empty(), "rollout scheduler made no progress with {} sequences waiting",
               sched.num_waiting());
    const int32_t S = batch.num_samples();
    tokens.resize(static_cast<size_t>(S));
    logprobs.resize(static_cast<size_t>(S));
    runner_->step(batch, tokens, logprobs);
    if (hooks.on_token) {
      for (int32_t i = 0; i < S; ++i) {
        const Sequence* s = batch.sample_seqs[i];
        hooks.on_token(s->group_id(), s->index_in_group(), tokens[i]);
      }
    }
    for (Sequence* s : sched.postprocess(batch, tokens, logprobs)) complete(s);
    for (Sequence* s : sched.turn_ended())
      hooks.turns->turn_ended(s->group_id(), s->index_in_group(), s->output_tokens());
    if (hooks.stop) {
      for (Sequence* s : batch.sample_seqs) {
        if (s->status == SequenceStatus::Running && hooks.stop(s->group_id(), s->output_tokens())) {
          sched.finish(s, FinishReason::StopString);
          complete(s);
        }
      }
    }
  }
  const SchedulerStats& st = sched.stats();
  stats_.steps = st.num_steps;
  stats_.prompt_tokens_computed = st.prompt_tokens_computed;
  stats_.prompt_tokens_without_sharing = st.prompt_tokens_without_sharing();
  stats_.output_tokens = 0;
  for (const auto& c : out) stats_.output_tokens += static_cast<int64_t>(c.tokens.size());
  stats_.output_tokens -= st.appended_tokens;  // sampled tokens only (tool turns are appended)
  stats_.preemptions = st.num_preemptions;
  stats_.appended_tokens = st.appended_tokens;
  stats_.kv_reused_tokens = st.kv_reused_tokens;
  stats_.seconds = timer.seconds();
  return out;
}

}  // namespace verl::rollout
