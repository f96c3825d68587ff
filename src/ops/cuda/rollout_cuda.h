// The rollout engine's model runner on CUDA: a bf16 paged KV cache (CudaKVCache) and a runner
// (CudaModelRunner, a rollout::StepRunner) that runs one ScheduledBatch on the GPU: block copies, the
// forward over the paged cache (src/ops/cuda/paged_attention.h), the LM head for the sampled rows
// only, GPU sampling (sampling.h); the one host round trip per step is the S sampled tokens and
// log-probs the scheduler needs. It reads the weights the trainer updates (CudaTransformer's bf16
// compute copy, layout order) through a pointer: no copy.
//
// Memory is planned once: the KV cache takes a byte budget (or verl's gpu_memory_utilization), the
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

#include <cstdint>
#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"
#include "model/weights.h"
#include "ops/cuda/device.h"
#include "ops/cuda/ops_cuda.h"
#include "ops/cuda/paged_attention.h"
#include "ops/cuda/sampling.h"
#include "ops/cuda/section_timer.h"
#include "rollout/scheduler.h"
#include "rollout/step_runner.h"

namespace verl::ops::cuda {

// Bytes of one KV block: bf16 K and V of every layer.
int64_t kv_cache_bytes_per_block(const model::ModelConfig& cfg, int32_t block_size);

// verl's actor_rollout_ref.rollout.gpu_memory_utilization as a KV byte budget, as vLLM sizes its
// cache: the rollout may hold `fraction` of the device's memory in total, and what is in use now
// (weights, the trainer's state, the runner's scratch, other processes) counts against it:
//   budget = fraction * total - (total - free).
// Throws when that leaves nothing.
int64_t kv_cache_budget_from_utilization(double fraction);

// Paged bf16 KV cache: per layer K and V [num_blocks, block_size, Hkv, D], in one allocation of
// 2 L arrays (K of layer l is array 2l, V array 2l + 1), zeroed when taken.
class CudaKVCache {
 public:
  CudaKVCache(const model::ModelConfig& cfg, int32_t block_size, int64_t budget_bytes);

  void allocate();  // no-op when allocated
  void release();   // gives the memory back (never throws)
  bool allocated() const { return buf_.data() != nullptr; }

  bf16* k(int64_t layer) { return buf_.data() + 2 * layer * array_elems_; }
  bf16* v(int64_t layer) { return buf_.data() + (2 * layer + 1) * array_elems_; }
  bf16* base() { return buf_.data(); }
  const bf16* base() const { return buf_.data(); }
  int64_t num_arrays() const { return 2 * num_layers_; }
  int64_t array_elems() const { return array_elems_; }
  int64_t block_elems() const { return block_elems_; }
  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  int64_t bytes() const { return num_arrays() * array_elems_ * static_cast<int64_t>(sizeof(bf16)); }

 private:
  int64_t num_layers_, block_elems_, array_elems_ = 0;
  int32_t num_blocks_ = 0, block_size_;
  DeviceBuffer<bf16> buf_;
};

struct CudaRunnerOptions {
  // KV budget in bytes; 0 = gpu_memory_utilization of the device (measured at construction, after
  // the runner's scratch is allocated).
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
  // Log-probs within float-rounding noise of the trainer's (actor_rollout_ref.rollout.
  // match_trainer_numerics, on in the config by default; the actor built with
  // CudaTransformerOptions::unsplit_k): decode items (one new token) on the training kernel's
  // arithmetic too (attention_forward_paged's decode kernels, no split along the context) and
  // forward GEMMs that never split k (CudaContext::unsplit_k). As fast as the split-K kernels at
  // large batch; much slower for long contexts at small batch (decode attention 66 against 19 us a
  // layer at 8 items of 4096 keys, Qwen2.5-0.5B on the H200).
  bool match_trainer_numerics = false;
  // Log-probs bitwise equal to the trainer's batch-invariant forward (CudaTransformerOptions::
  // batch_invariant; actor_rollout_ref.rollout.batch_invariant): forward GEMMs that never split k
  // (cuBLASLt's unsplit kernels or gemm_invariant.cu, gemm.h), every item's attention through
  // attention_forward_paged (the training kernel's arithmetic over the paged cache, attention.h),
  // and each sampled token's log-prob from the trainer's LM-head op (lm_head_forward) at the step's
  // temperature, which must be the same for every sample of a step (0, greedy, scores at 1).
  // Slower than the default kernels.
  bool batch_invariant = false;
};

// Counters for benchmarks; pure decode steps are timed on the host (each step ends in a sync).
// Host times (std::chrono, decode steps only): prep = step() entry until the step's last GPU work
// is enqueued (metadata staging, the one upload, graph launch or eager launches); sync_wait = in
// cudaStreamSynchronize; post = after it until step() returns; between = from the previous
// step()'s return to this one's entry (the engine's scheduler and postprocess). The GPU idles
// about between + post + the part of prep before the first upload.
struct CudaRunnerStats {
  int64_t steps = 0, decode_steps = 0, graph_steps = 0, graphs_captured = 0;
  int64_t training_prefill_steps = 0;  // steps whose prefill attention ran attention_forward_paged
  int64_t decode_context_tokens = 0;  // sum over decode steps of the items' context lengths
  double decode_seconds = 0.0;
  double host_prep_seconds = 0.0, sync_wait_seconds = 0.0, host_post_seconds = 0.0;
  double between_steps_seconds = 0.0;
  int64_t between_steps = 0;  // decode steps with a previous step in the same generate()
  // With set_profile(true): GPU ms per section (cudaEvent), summed over the profiled decode
  // steps (eager: graphs are off while profiling) and, separately, over the other steps.
  int64_t profiled_decode_steps = 0, profiled_other_steps = 0;
  std::vector<std::pair<std::string, double>> decode_profile_ms, other_profile_ms;
};

class CudaModelRunner final : public rollout::StepRunner {
 public:
  // `weights`: bf16, flat in `layout` order, alive and unchanged while generate() runs (the
  // trainer's CudaTransformer::weights_bf16()). The RoPE frequencies are computed in the caller's
  // object, so verl_cuda needs only headers from verl_model.
  CudaModelRunner(const CudaContext& ctx, const model::ModelConfig& cfg,
                  const model::ParamLayout& layout, const bf16* weights,
                  const rollout::SchedulerConfig& sched, const CudaRunnerOptions& options = {})
      : CudaModelRunner(ctx, cfg, layout, weights, model::rope_inv_freq(cfg), sched, options) {}
  CudaModelRunner(const CudaContext& ctx, const model::ModelConfig& cfg,
                  const model::ParamLayout& layout, const bf16* weights,
                  const std::vector<float>& inv_freq, const rollout::SchedulerConfig& sched,
                  const CudaRunnerOptions& options);
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
  const CudaRunnerStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CudaRunnerStats{}; }
  // GPU time per section of every step from now on (SectionTimer); the steps run eagerly, since
  // events cannot be timed inside a replayed graph.
  void set_profile(bool on);
  const std::vector<int32_t>& graph_buckets() const { return buckets_; }

 private:
  const bf16* W(int i) const { return i >= 0 ? w_ + layout_.params[i].offset : nullptr; }
  // Points the device slices into `arena` and returns the bytes they take (null: count only).
  size_t carve(DeviceArena* arena);
  void acquire();                  // scratch (carved) and cache, when not held
  void release_memory() noexcept;  // graphs, cache, scratch
  void destroy_graphs() noexcept;
  void apply_block_copies(const rollout::ScheduledBatch& b);
  // Enqueues the whole step for T tokens in B items and S samples from the device metadata.
  // `plan` says which paged kernels run (prefill chunks take attention_forward_paged instead when
  // training_prefill_attention is on).
  void forward(int64_t T, int64_t B, int64_t S, const PagedAttentionPlan& plan);
  void capture(size_t bucket);
  PagedAttentionPlan decode_plan(int64_t B) const;
  // Whether decode items / prefill chunks take the training kernel's arithmetic
  // (attention_forward_paged) rather than the paged kernels (CudaRunnerOptions).
  bool training_decode() const { return opts_.batch_invariant || opts_.match_trainer_numerics; }
  bool training_prefill() const { return opts_.batch_invariant || opts_.training_prefill_attention; }
  // Points the h_/d_ metadata arrays at their packed places for a step of T tokens, B items and S
  // samples and returns the bytes they span (the one upload).
  size_t place_metadata(int64_t T, int64_t B, int64_t S);
  void mark(const char* section) {
    if (timer_) timer_->mark(ctx_.stream, section);
  }

  CudaContext ctx_;
  model::ModelConfig cfg_;
  model::ParamLayout layout_;
  const bf16* w_;
  rollout::SchedulerConfig sched_;
  CudaRunnerOptions opts_;
  int64_t token_cap_, seq_cap_, W_;
  int sm_count_ = 132;
  size_t scratch_bytes_ = 0, attn_ws_bytes_ = 0, sample_ws_bytes_ = 0, meta_bytes_ = 0;
  std::vector<float> inv_freq_host_;

  DeviceArena arena_;
  std::unique_ptr<CudaKVCache> cache_;
  // Device slices of arena_ (re-carved on acquire()).
  bf16 *x_ = nullptr, *y_ = nullptr, *xn_ = nullptr, *qkv_ = nullptr, *q_ = nullptr, *att_ = nullptr,
       *gu_ = nullptr, *act_ = nullptr, *rows_ = nullptr, *rows_y_ = nullptr, *hn_ = nullptr;
  float *logits_ = nullptr, *inv_freq_ = nullptr;
  void *attn_ws_ = nullptr, *sample_ws_ = nullptr;
  // Per-step metadata: one device block mirroring one pinned host block byte for byte, so a step
  // uploads it with one copy; the arrays are packed for the step's (T, B, S) (place_metadata), and
  // a graph bucket always gets the same places.
  uint8_t *d_meta_ = nullptr, *h_meta_ = nullptr;
  int32_t *d_ids_ = nullptr, *d_pos_ = nullptr, *d_slots_ = nullptr, *d_cu_ = nullptr,
          *d_tables_ = nullptr, *d_sidx_ = nullptr;
  SampleParamsDevice* d_params_ = nullptr;
  int32_t *h_ids_ = nullptr, *h_pos_ = nullptr, *h_slots_ = nullptr, *h_cu_ = nullptr,
          *h_tables_ = nullptr, *h_sidx_ = nullptr;
  SampleParamsDevice* h_params_ = nullptr;
  // Results: tokens [0, S) and log-probs [S, 2 S) of one array, downloaded with one copy.
  int32_t *d_res_ = nullptr, *h_res_ = nullptr;
  int32_t *d_copies_ = nullptr, *h_copies_ = nullptr;
  void* pinned_ = nullptr;  // h_meta_, h_res_, h_copies_ (one cudaHostAlloc for the runner's life)
  float logprob_temperature_ = 1.0f;  // batch_invariant: the LM-head op's temperature (graphs bake it)
  std::unique_ptr<SectionTimer> timer_;
  std::chrono::steady_clock::time_point last_step_end_{};
  bool have_last_step_ = false;

  std::vector<int32_t> buckets_;         // decode batch sizes with a graph
  std::vector<cudaGraphExec_t> graphs_;  // per bucket; null until captured
  CudaRunnerStats stats_;
};

// The standalone owner of bf16 weights for tools and tests without a trainer: w.data rounded to
// bf16 on the device (in chunks, through a bounded fp32 staging buffer), layout order.
DeviceBuffer<bf16> upload_weights_bf16(const CudaContext& ctx, const model::Weights& w);

}  // namespace verl::ops::cuda
