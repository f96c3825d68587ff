// The rollout engine's model runner on CUDA: a bf16 paged KV cache (CudaKVCache) and a runner
// (CudaModelRunner, a rollout::StepRunner) that runs one ScheduledBatch on the GPU: block copies,
// the forward over the paged cache by the trainer's decoder (model/cuda/decoder.h; the LM head for
// the sampled rows only), GPU sampling (sampling.h); the one host round trip per step is the S
// sampled tokens and log-probs the scheduler needs. It reads the weights the trainer updates (the
// training state's bf16 compute copy, optim/cuda/train_state.h, layout order) through a pointer:
// no copy. The runner owns the cache, the metadata, the graphs and sampling, not the layer math.
//
// Memory is planned once: the KV cache takes its block count from rollout/kv_sizing.h, the
// activations one DeviceArena sized for the scheduler's max_num_batched_tokens / max_num_seqs, the
// metadata one pinned host block; nothing is allocated per step. With free_cache_engine both device
// allocations are given back after each generate() and taken again before the next.
//
// Pure decode steps (every item one token, one sample each) run as CUDA graphs captured per batch
// size bucket (1, 2, 4, ... below max_num_seqs, then max_num_seqs), the batch padded to its bucket
// (padding rows write no KV and their samples are dropped); enforce_eager turns graphs off. A
// bucket's graph is captured right after the bucket's first step, which runs eagerly (and so loads
// the kernels and warms cuBLASLt up); graphs are dropped with the memory they point into.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/numerics.h"
#include "model/config.h"
#include "model/cuda/decoder.h"
#include "model/cuda/lora.h"
#include "model/weights.h"
#include "ops/cuda/device.h"
#include "ops/cuda/ops_cuda.h"
#include "ops/cuda/paged_attention.h"
#include "ops/cuda/sampling.h"
#include "ops/cuda/section_timer.h"
#include "rollout/cuda/kv_cache.h"
#include "rollout/scheduler.h"
#include "rollout/step_runner.h"

namespace verl::rollout::cuda {

using ops::cuda::CudaContext;

struct CudaRunnerOptions {
  // The KV pool (kv_pool_blocks, rollout/kv_sizing.h): kv_blocks blocks (0: as many as the budget
  // holds), at most kv_cache_bytes bytes, or, when that is 0, gpu_memory_utilization of the
  // device (measured at construction, after the runner's scratch is allocated).
  int64_t kv_blocks = 0;
  int64_t kv_cache_bytes = 0;
  double gpu_memory_utilization = 0.5;  // verl's default
  bool enforce_eager = false;           // no CUDA graphs
  bool free_cache_engine = false;       // give the KV cache and scratch back after each generate()
  // Split-K of decode attention: an item's context is cut into at most P partitions of at least
  // decode_partition keys (a multiple of 64), P chosen per batch size so that the grid fills the
  // GPU about twice (decode_partitions_for in paged_attention.h); decode_max_partitions > 0 caps P.
  int32_t decode_partition = 64;
  int32_t decode_max_partitions = 0;
  bool split_sampling = true;  // multi-block sampling for greedy / untruncated rows (sampling.h)
  // Prefill chunks (fresh prompts and chunks with a cached prefix alike) run the training kernel
  // over the paged cache (attention_forward_paged, attention.h: the trainer's arithmetic, at its
  // speed); false: the paged prefill kernel of paged_attention.h. Decode items take the split-K
  // decode kernel (unless match_trainer_numerics or batch_invariant).
  bool training_prefill_attention = true;
  // The numerics mode (core/numerics.h), with the actor built in the same mode:
  //  MatchTrainer (actor_rollout_ref.rollout.match_trainer_numerics, on in the config by
  //   default): log-probs within float-rounding noise of the trainer's. Decode items (one new
  //   token) on the training kernel's arithmetic too (attention_forward_paged's decode kernels, no
  //   split along the context) and forward GEMMs that never split k. As fast as the split-K
  //   kernels at large batch; much slower for long contexts at small batch (decode attention 66
  //   against 19 us a layer at 8 items of 4096 keys, Qwen2.5-0.5B on the H200).
  //  BatchInvariant (actor_rollout_ref.rollout.batch_invariant): log-probs bitwise equal to the
  //   trainer's batch-invariant forward: forward GEMMs that never split k (cuBLASLt's unsplit
  //   kernels or gemm_invariant.cu, gemm.h), every item's attention through
  //   attention_forward_paged (the training kernel's arithmetic over the paged cache, attention.h),
  //   and each sampled token's log-prob from the trainer's LM-head op (lm_head_forward) at the
  //   step's temperature, which must be the same for every sample of a step (0, greedy, scores
  //   at 1). Slower than the default kernels.
  Numerics numerics = Numerics::Fast;
  // LoRA: the adapters every projection adds (unmerged: two small GEMMs per adapted module,
  // model/cuda/lora.h), read where they live (the policy's adapter training state, updated in
  // place by the optimizer, so the runner sees each step's adapters without a copy). The runner
  // keeps its own view, switched on: a captured graph bakes the adapters in.
  const model::cuda::CudaLora* lora = nullptr;
};

// Counts of what the steps did (cheap integers, kept always; tests check them): the runner's
// StepRunnerStats and the GPU's own.
struct CudaRunnerCounters : rollout::StepRunnerStats {
  CudaRunnerCounters() { gpu = true; }
  int64_t training_prefill_steps = 0;  // steps whose prefill attention ran attention_forward_paged
};

// One step as a profiling observer sees it (the benchmarks' accumulation lives with them, in
// src/cli/bench/). Host time points: entry = step() entered, enqueued = the step's last GPU work
// enqueued (metadata staging, the one upload, graph launch or eager launches), synced = after the
// stream synchronisation, done = step() about to return. `sections`: GPU ms per section
// (SectionTimer) when the observer asked for them; the steps then run eagerly (events cannot be
// timed inside a replayed graph).
struct StepRecord {
  bool decode = false;  // every item one token and one sample
  bool graph = false;   // replayed a CUDA graph
  int64_t tokens = 0, items = 0, samples = 0;
  int64_t context_tokens = 0;  // the items' context lengths, summed
  std::chrono::steady_clock::time_point entry, enqueued, synced, done;
  const std::vector<std::pair<std::string, double>>* sections = nullptr;
};

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void on_begin_generate() {}
  virtual void on_step(const StepRecord& record) = 0;
};

class CudaModelRunner final : public rollout::StepRunner {
 public:
  // `weights`: bf16, flat in `layout` order, alive and unchanged while generate() runs (the
  // training state's CudaTrainState::weights_bf16(), or upload_weights_bf16 below).
  CudaModelRunner(const CudaContext& ctx, const model::ModelConfig& cfg,
                  const model::ParamLayout& layout, const bf16* weights,
                  const rollout::SchedulerConfig& sched, const CudaRunnerOptions& options = {});
  ~CudaModelRunner() override;
  CudaModelRunner(const CudaModelRunner&) = delete;
  CudaModelRunner& operator=(const CudaModelRunner&) = delete;

  int32_t num_blocks() const override { return cache_->num_blocks(); }
  int32_t block_size() const override { return cache_->block_size(); }
  int64_t vocab_size() const override { return cfg_.vocab_size; }
  void step(const rollout::ScheduledBatch& batch, std::span<int32_t> tokens,
            std::span<float> logprobs) override;
  void begin_generate() override;
  void end_generate() override;

  const CudaKVCache& cache() const { return *cache_; }
  size_t scratch_bytes() const { return scratch_bytes_; }
  const CudaRunnerCounters& counters() const { return counters_; }
  rollout::StepRunnerStats stats() const override { return counters_; }
  void reset_counters() { counters_ = CudaRunnerCounters{}; }
  // Reports every step to `observer` from now on (null: none); with sections, also the GPU time
  // per section, which makes the steps run eagerly.
  void set_observer(StepObserver* observer, bool sections);
  const std::vector<int32_t>& graph_buckets() const { return buckets_; }

 private:
  // Points the device slices into `arena` and returns the bytes they take (null: count only).
  size_t carve(ops::cuda::DeviceArena* arena);
  void acquire();                  // scratch (carved) and cache, when not held
  void release_memory() noexcept;  // graphs, cache, scratch
  void destroy_graphs() noexcept;
  void apply_block_copies(const rollout::ScheduledBatch& b);
  // Enqueues the whole step for T tokens in B items and S samples from the device metadata.
  // `plan` says which paged kernels run (prefill chunks take attention_forward_paged instead when
  // training_prefill_attention is on).
  void forward(int64_t T, int64_t B, int64_t S, const ops::cuda::PagedAttentionPlan& plan);
  void capture(size_t bucket);
  ops::cuda::PagedAttentionPlan decode_plan(int64_t B) const;
  // Whether decode items / prefill chunks take the training kernel's arithmetic
  // (attention_forward_paged) rather than the paged kernels (CudaRunnerOptions).
  bool batch_invariant() const { return opts_.numerics == Numerics::BatchInvariant; }
  bool training_decode() const { return opts_.numerics != Numerics::Fast; }
  bool training_prefill() const { return batch_invariant() || opts_.training_prefill_attention; }
  // Points the h_/d_ metadata arrays at their packed places for a step of T tokens, B items and S
  // samples and returns the bytes they span (the one upload).
  size_t place_metadata(int64_t T, int64_t B, int64_t S);
  void mark(const char* section) {
    if (timer_) timer_->mark(ctx_.stream, section);
  }

  CudaContext ctx_;
  model::ModelConfig cfg_;
  std::unique_ptr<model::cuda::CudaLora> lora_;  // the adapters' view (null: none)
  model::cuda::CudaDecoder decoder_;             // the layer math over the weights
  rollout::SchedulerConfig sched_;
  CudaRunnerOptions opts_;
  std::vector<float> inv_freq_host_;  // uploaded again whenever the scratch is taken again
  int64_t token_cap_, seq_cap_, W_;
  int sm_count_ = 132;
  size_t scratch_bytes_ = 0, attn_ws_bytes_ = 0, sample_ws_bytes_ = 0, meta_bytes_ = 0;

  ops::cuda::DeviceArena arena_;
  std::unique_ptr<CudaKVCache> cache_;
  // Device slices of arena_ (re-carved on acquire()).
  bf16 *x_ = nullptr, *y_ = nullptr, *xn_ = nullptr, *qkv_ = nullptr, *q_ = nullptr,
       *att_ = nullptr, *gu_ = nullptr, *act_ = nullptr, *rows_ = nullptr, *rows_y_ = nullptr,
       *hn_ = nullptr;
  bf16* lora_u_ = nullptr;  // [T, r] the adapters' x A^T
  float *logits_ = nullptr, *inv_freq_ = nullptr;
  void *attn_ws_ = nullptr, *sample_ws_ = nullptr;
  // Per-step metadata: one device block mirroring one pinned host block byte for byte, so a step
  // uploads it with one copy; the arrays are packed for the step's (T, B, S) (place_metadata), and
  // a graph bucket always gets the same places.
  uint8_t *d_meta_ = nullptr, *h_meta_ = nullptr;
  int32_t *d_ids_ = nullptr, *d_pos_ = nullptr, *d_slots_ = nullptr, *d_cu_ = nullptr,
          *d_tables_ = nullptr, *d_sidx_ = nullptr;
  ops::cuda::SampleParamsDevice* d_params_ = nullptr;
  int32_t *h_ids_ = nullptr, *h_pos_ = nullptr, *h_slots_ = nullptr, *h_cu_ = nullptr,
          *h_tables_ = nullptr, *h_sidx_ = nullptr;
  ops::cuda::SampleParamsDevice* h_params_ = nullptr;
  // Results: tokens [0, S) and log-probs [S, 2 S) of one array, downloaded with one copy.
  int32_t *d_res_ = nullptr, *h_res_ = nullptr;
  int32_t *d_copies_ = nullptr, *h_copies_ = nullptr;
  void* pinned_ = nullptr;  // h_meta_, h_res_, h_copies_ (one cudaHostAlloc for the runner's life)
  float logprob_temperature_ =
      1.0f;  // batch_invariant: the LM-head op's temperature (graphs bake it)
  std::unique_ptr<ops::cuda::SectionTimer> timer_;  // GPU sections, for an observer that asks
  StepObserver* observer_ = nullptr;

  std::vector<int32_t> buckets_;         // decode batch sizes with a graph
  std::vector<cudaGraphExec_t> graphs_;  // per bucket; null until captured
  CudaRunnerCounters counters_;
};

// The standalone owner of bf16 weights for tools and tests without a trainer: w.data rounded to
// bf16 on the device (in chunks, through a bounded fp32 staging buffer), layout order.
ops::cuda::DeviceBuffer<bf16> upload_weights_bf16(const CudaContext& ctx, const model::Weights& w);

}  // namespace verl::rollout::cuda
