// The CUDA model runner of the rollout engine (rollout/cuda/model_runner.h): a step's metadata
// staged and uploaded once, the forward over the paged cache by the CUDA decoder
// (model/cuda/decoder.h, the trainer's layer math: logits [S, V] fp32 of the sampled rows), then
// sampling on the GPU; decode steps replayed as CUDA graphs. Host code; no layer kernel here.
#include "rollout/cuda/model_runner.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "ops/cuda/glue.h"
#include "rollout/kv_sizing.h"

namespace verl::rollout::cuda {
using namespace ops::cuda;  // the kernels' wrappers and device memory
namespace {

// The runner's own view of the caller's adapters, switched on (null: none).
std::unique_ptr<model::cuda::CudaLora> own_lora(const model::cuda::CudaLora* lora) {
  if (lora == nullptr) return nullptr;
  auto view = std::make_unique<model::cuda::CudaLora>(*lora);
  view->set_enabled(true);
  view->set_grads(nullptr);
  return view;
}

constexpr size_t kAlign = 256;
size_t round_up(size_t x) {
  return (x + kAlign - 1) / kAlign * kAlign;
}

// The profile's sections (the benchmarks report these names).
constexpr model::cuda::SectionNames kSections = [] {
  using model::cuda::Section;
  model::cuda::SectionNames n{};
  auto set = [&n](Section s, const char* name) { n[static_cast<size_t>(s)] = name; };
  set(Section::Embed, "embed");
  set(Section::AttnNorm, "rmsnorm");
  set(Section::QkvProj, "qkv_gemm");
  set(Section::QkRope, "rope_kv_write");
  set(Section::Attention, "attention");
  set(Section::OProj, "o_proj");
  set(Section::MlpNorm, "rmsnorm");
  set(Section::GateUp, "mlp_gate_up_gemm");
  set(Section::Swiglu, "mlp_swiglu");
  set(Section::Down, "mlp_down_gemm");
  set(Section::FinalNorm, "final_gather_norm");
  set(Section::LmHead, "lm_head_gemm");
  return n;
}();

}  // namespace

// ---- CudaModelRunner
// --------------------------------------------------------------------------------

CudaModelRunner::CudaModelRunner(const CudaContext& ctx, const model::ModelConfig& cfg,
                                 const model::ParamLayout& layout, const bf16* weights,
                                 const rollout::SchedulerConfig& sched,
                                 const CudaRunnerOptions& options)
    : ctx_(ctx),
      cfg_(cfg),
      lora_(own_lora(options.lora)),
      decoder_(ctx, cfg, layout, weights,
               model::cuda::CudaDecoderOptions{.numerics = options.numerics, .lora = lora_.get()}),
      sched_(sched),
      opts_(options) {
  // The stronger of the context's and the options' modes (Fast < MatchTrainer < BatchInvariant).
  ctx_.numerics = std::max(ctx_.numerics, opts_.numerics);
  sm_count_ = cuda_sm_count();
  inv_freq_host_ = model::rope_inv_freq(cfg_);
  VERL_CHECK(cfg_.head == model::HeadKind::CausalLM,
             "CudaModelRunner: the rollout needs a causal LM, got {}", cfg_.architecture);
  VERL_CHECK(weights != nullptr, "CudaModelRunner: no weights");
  VERL_CHECK(lora_ == nullptr || lora_->weights() != nullptr,
             "CudaModelRunner: LoRA adapters with no weights");
  VERL_CHECK(sched_.max_num_seqs > 0 && sched_.max_num_batched_tokens > 0 &&
                 sched_.max_model_len > 0 && sched_.block_size > 0,
             "CudaModelRunner: max_num_seqs {}, max_num_batched_tokens {}, max_model_len {} and "
             "block_size {} must be positive",
             sched_.max_num_seqs, sched_.max_num_batched_tokens, sched_.max_model_len,
             sched_.block_size);
  VERL_CHECK(opts_.decode_partition > 0 && opts_.decode_partition % 64 == 0 &&
                 opts_.decode_max_partitions >= 0,
             "CudaModelRunner: decode_partition {} must be a positive multiple of 64 and "
             "decode_max_partitions {} >= 0",
             opts_.decode_partition, opts_.decode_max_partitions);
  token_cap_ = std::max(sched_.max_num_batched_tokens, sched_.max_num_seqs);
  seq_cap_ = sched_.max_num_seqs;
  W_ = (sched_.max_model_len + sched_.block_size - 1) / sched_.block_size;
  for (int32_t b = 1; b < seq_cap_; b *= 2) buckets_.push_back(b);
  buckets_.push_back(static_cast<int32_t>(seq_cap_));
  graphs_.assign(buckets_.size(), nullptr);
  // The decode workspace for the largest B * partitions over the batch sizes a step can have.
  for (int64_t b = 1; b <= seq_cap_; ++b) {
    const PagedAttentionPlan plan = decode_plan(b);
    attn_ws_bytes_ = std::max(
        attn_ws_bytes_,
        paged_attention_workspace_bytes(b, cfg_.num_attention_heads, cfg_.head_dim,
                                        plan.max_context, plan.partition, plan.max_partitions));
  }
  sample_ws_bytes_ = opts_.split_sampling ? sample_workspace_bytes(seq_cap_, cfg_.vocab_size) : 0;

  // Pinned staging: the per-step metadata going up, the sampled tokens coming down, block copies.
  meta_bytes_ = place_metadata(token_cap_, seq_cap_, seq_cap_);  // the largest step
  const size_t res_bytes = round_up(static_cast<size_t>(2 * seq_cap_) * sizeof(int32_t));
  const size_t copies_bytes = round_up(static_cast<size_t>(2 * seq_cap_) * sizeof(int32_t));
  VERL_CUDA_CHECK(
      cudaHostAlloc(&pinned_, meta_bytes_ + res_bytes + copies_bytes, cudaHostAllocDefault));
  h_meta_ = static_cast<uint8_t*>(pinned_);
  h_res_ = reinterpret_cast<int32_t*>(h_meta_ + meta_bytes_);
  h_copies_ = reinterpret_cast<int32_t*>(h_meta_ + meta_bytes_ + res_bytes);

  scratch_bytes_ = carve(nullptr);
  try {
    arena_ = DeviceArena("rollout_scratch", scratch_bytes_);
    carve(&arena_);
    copy_to_device(inv_freq_, inv_freq_host_.data(), inv_freq_host_.size() * sizeof(float));
    // The KV budget is measured with the scratch already taken (vLLM profiles before sizing).
    const int64_t budget = opts_.kv_cache_bytes > 0
                               ? opts_.kv_cache_bytes
                               : kv_budget_from_utilization(opts_.gpu_memory_utilization);
    const int32_t blocks =
        kv_pool_blocks(opts_.kv_blocks, budget,
                       kv_block_bytes(cfg_, sched_.block_size, sizeof(bf16)), sched_.block_size);
    cache_ = std::make_unique<CudaKVCache>(cfg_, sched_.block_size, blocks);
    cache_->allocate();
  } catch (...) {
    arena_.release();
    cudaFreeHost(pinned_);
    throw;
  }
}

CudaModelRunner::~CudaModelRunner() {
  release_memory();
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
}

size_t CudaModelRunner::carve(DeviceArena* arena) {
  const int64_t T = token_cap_, S = seq_cap_, C = cfg_.hidden_size, F = cfg_.intermediate_size;
  const int64_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), Q3 = qd + 2 * kvd;
  size_t bytes = 0;
  auto take_raw = [&](void*& p, size_t n) {
    bytes += round_up(n);
    p = arena != nullptr && n > 0 ? arena->alloc(n) : nullptr;
  };
  take_raw(attn_ws_, attn_ws_bytes_);
  take_raw(sample_ws_, sample_ws_bytes_);
  void* meta = nullptr;
  take_raw(meta, meta_bytes_);
  d_meta_ = static_cast<uint8_t*>(meta);
  auto take = [&](auto*& p, int64_t n) {
    using E = std::remove_reference_t<decltype(*p)>;
    bytes += round_up(static_cast<size_t>(n) * sizeof(E));
    p = arena != nullptr ? arena->alloc_n<E>(static_cast<size_t>(n)) : nullptr;
  };
  take(x_, T * C);
  take(y_, T * C);
  take(xn_, T * C);
  take(qkv_, T * Q3);
  take(q_, T * qd);
  take(att_, T * qd);
  take(gu_, T * 2 * F);
  take(act_, T * F);
  if (lora_) take(lora_u_, T * lora_->rank());
  take(rows_, S * C);
  take(rows_y_, S * C);
  take(hn_, S * C);
  // Also the scratch of the batch-invariant mode's LM-head log-probs (at least S x V floats).
  take(logits_, static_cast<int64_t>(decoder_.lm_head_scratch_bytes(S, S) / sizeof(float)));
  take(inv_freq_, static_cast<int64_t>(inv_freq_host_.size()));
  take(d_res_, 2 * S);
  take(d_copies_, 2 * S);
  return bytes;
}

size_t CudaModelRunner::place_metadata(int64_t T, int64_t B, int64_t S) {
  size_t off = 0;
  auto place = [&](auto*& h, auto*& d, int64_t n) {
    using E = std::remove_reference_t<decltype(*h)>;
    off = (off + alignof(E) - 1) / alignof(E) * alignof(E);
    h = h_meta_ != nullptr ? reinterpret_cast<E*>(h_meta_ + off) : nullptr;
    d = d_meta_ != nullptr ? reinterpret_cast<E*>(d_meta_ + off) : nullptr;
    off += static_cast<size_t>(n) * sizeof(E);
  };
  place(h_params_, d_params_, S);  // 8-byte fields first
  place(h_ids_, d_ids_, T);
  place(h_pos_, d_pos_, T);
  place(h_slots_, d_slots_, T);
  place(h_cu_, d_cu_, B + 1);
  place(h_sidx_, d_sidx_, S);
  place(h_tables_, d_tables_, B * W_);
  return round_up(off);
}

void CudaModelRunner::acquire() {
  if (arena_.capacity() == 0) {
    arena_ = DeviceArena("rollout_scratch", scratch_bytes_);
    carve(&arena_);
    copy_to_device(inv_freq_, inv_freq_host_.data(), inv_freq_host_.size() * sizeof(float));
  }
  cache_->allocate();
}

void CudaModelRunner::destroy_graphs() noexcept {
  for (cudaGraphExec_t& g : graphs_) {
    if (g != nullptr) cudaGraphExecDestroy(g);
    g = nullptr;
  }
}

void CudaModelRunner::release_memory() noexcept {
  if (ctx_.stream != nullptr) cudaStreamSynchronize(ctx_.stream);  // nothing may still use it
  destroy_graphs();  // they point into the memory below
  if (cache_) cache_->release();
  arena_.release();
}

void CudaModelRunner::begin_generate() {
  acquire();
  if (observer_) observer_->on_begin_generate();
}

void CudaModelRunner::end_generate() {
  if (opts_.free_cache_engine) release_memory();
}

void CudaModelRunner::apply_block_copies(const rollout::ScheduledBatch& b) {
  const std::vector<rollout::BlockCopy>& copies = b.block_copies;
  if (copies.empty()) return;
  // Copies run concurrently unless one's destination is another's source (then one by one, in
  // order).
  bool dependent = false;
  for (size_t i = 0; i < copies.size() && !dependent; ++i) {
    for (size_t j = 0; j < copies.size(); ++j) {
      if (copies[i].dst == copies[j].src) {
        dependent = true;
        break;
      }
    }
  }
  for (size_t c0 = 0; c0 < copies.size(); c0 += static_cast<size_t>(seq_cap_)) {
    if (c0 > 0) VERL_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));  // the staging is reused
    const size_t n = std::min(copies.size() - c0, static_cast<size_t>(seq_cap_));
    for (size_t i = 0; i < n; ++i) {
      const rollout::BlockCopy& cp = copies[c0 + i];
      VERL_CHECK(cp.src >= 0 && cp.src < num_blocks() && cp.dst >= 0 && cp.dst < num_blocks(),
                 "CudaModelRunner: block copy {} -> {} outside the pool of {} blocks", cp.src,
                 cp.dst, num_blocks());
      h_copies_[2 * i] = cp.src;
      h_copies_[2 * i + 1] = cp.dst;
    }
    VERL_CUDA_CHECK(cudaMemcpyAsync(d_copies_, h_copies_, 2 * n * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, ctx_.stream));
    const int64_t per_launch = dependent ? 1 : static_cast<int64_t>(n);
    for (int64_t i = 0; i < static_cast<int64_t>(n); i += per_launch) {
      paged_kv_copy_blocks(ctx_, cache_->base(), cache_->num_arrays(), cache_->array_elems(),
                           cache_->block_elems(), d_copies_ + 2 * i, per_launch);
    }
  }
}

void CudaModelRunner::set_observer(StepObserver* observer, bool sections) {
  observer_ = observer;
  if (observer != nullptr && sections) {
    if (!timer_) timer_ = std::make_unique<SectionTimer>();
  } else {
    timer_.reset();
  }
}

// The split-K shape for B decode items; graphs use it with B = the bucket and max_model_len.
PagedAttentionPlan CudaModelRunner::decode_plan(int64_t B) const {
  PagedAttentionPlan plan;
  plan.max_context = sched_.max_model_len;
  plan.decode = true;
  plan.prefill = false;
  plan.partition = opts_.decode_partition;
  plan.max_partitions = decode_partitions_for(B, cfg_.num_key_value_heads, plan.max_context,
                                              plan.partition, sm_count_);
  if (opts_.decode_max_partitions > 0) {
    plan.max_partitions = std::min(plan.max_partitions, opts_.decode_max_partitions);
  }
  return plan;
}

void CudaModelRunner::forward(int64_t T, int64_t B, int64_t S, const PagedAttentionPlan& plan) {
  const model::cuda::PagedKv kv{.k = cache_->k(0),
                                .v = cache_->v(0),
                                .layer_stride = cache_->layer_stride(),
                                .block_size = cache_->block_size(),
                                .slots = d_slots_,
                                .block_tables = d_tables_,
                                .W = W_,
                                .plan = plan,
                                .training_decode = training_decode(),
                                .training_prefill = training_prefill(),
                                .workspace = attn_ws_,
                                .workspace_bytes = attn_ws_bytes_};
  const model::cuda::DecoderStep st{.T = T,
                                    .B = B,
                                    .ids = d_ids_,
                                    .positions = d_pos_,
                                    .cu_seqlens = d_cu_,
                                    .inv_freq = inv_freq_,
                                    .qkv = qkv_,
                                    .lora_u = lora_u_,
                                    .paged = &kv,
                                    .timer = timer_.get(),
                                    .names = &kSections};
  // One activation set for every layer; the residual stream x_ takes each block's output y_
  // inside the next norm.
  model::cuda::LayerActs a{
      .xn1 = xn_, .q = q_, .att = att_, .xn2 = xn_, .gu = gu_, .act = act_, .y = y_};
  decoder_.forward_paged(st, a, x_, d_sidx_, S, rows_, rows_y_, hn_, logits_);
  mark("sampling");
  // Tokens at d_res_[0, S), log-probs at d_res_[S, 2 S): one download.
  sample_tokens(ctx_, d_res_, reinterpret_cast<float*>(d_res_ + S), logits_, cfg_.vocab_size,
                d_params_, S, cfg_.vocab_size, sample_ws_, sample_ws_bytes_);
  if (batch_invariant()) {
    // The sampled tokens' log-probs again, from the trainer's own LM-head op on the same rows (the
    // logits are free again: they are its scratch).
    mark("lm_head_logprob");
    decoder_.lm_head_logprobs(reinterpret_cast<float*>(d_res_ + S), nullptr, nullptr, nullptr, hn_,
                              d_res_, S, logprob_temperature_, S, logits_,
                              decoder_.lm_head_scratch_bytes(S, S));
  }
}

void CudaModelRunner::capture(size_t bucket) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t Bp = buckets_[bucket];
  cudaGraph_t graph = nullptr;
  VERL_CUDA_CHECK(cudaStreamBeginCapture(ctx_.stream, cudaStreamCaptureModeThreadLocal));
  try {
    forward(Bp, Bp, Bp, decode_plan(Bp));
  } catch (...) {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(ctx_.stream, &partial);
    if (partial != nullptr) cudaGraphDestroy(partial);
    throw;
  }
  VERL_CUDA_CHECK(cudaStreamEndCapture(ctx_.stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  VERL_CUDA_CHECK(e);
  graphs_[bucket] = exec;
  ++counters_.graphs_captured;
  counters_.graph_capture_s +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void CudaModelRunner::step(const rollout::ScheduledBatch& b, std::span<int32_t> tokens,
                           std::span<float> logprobs) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  const int64_t T = b.num_tokens(), B = b.num_seqs(), S = b.num_samples();
  VERL_CHECK(static_cast<int64_t>(tokens.size()) == S && static_cast<int64_t>(logprobs.size()) == S,
             "CudaModelRunner: {} samples, {} token and {} log-prob slots", S, tokens.size(),
             logprobs.size());
  VERL_CHECK(T <= token_cap_ && B <= seq_cap_ && S <= seq_cap_,
             "CudaModelRunner: a step of {} tokens, {} sequences and {} samples; the runner was "
             "planned for {} tokens and {} sequences (the scheduler config it was built with)",
             T, B, S, token_cap_, seq_cap_);
  VERL_CHECK(
      b.max_blocks_per_seq == W_,
      "CudaModelRunner: block tables {} wide, planned for {} (max_model_len {} / block_size {})",
      b.max_blocks_per_seq, W_, sched_.max_model_len, sched_.block_size);
  acquire();
  apply_block_copies(b);
  ++counters_.steps;
  if (T == 0) {
    VERL_CHECK(S == 0, "CudaModelRunner: a step with no tokens cannot sample");
    return;
  }

  // A pure decode step (one token and one sample per item, in item order) replays a graph.
  bool decode = b.decode();
  for (int64_t s = 0; decode && s < S; ++s) decode = b.sample_token_indices[s] == s;
  size_t bucket = buckets_.size();
  if (decode && !opts_.enforce_eager && !timer_ && ctx_.stream != nullptr) {
    bucket = static_cast<size_t>(std::lower_bound(buckets_.begin(), buckets_.end(), B) -
                                 buckets_.begin());
  }
  const bool graph = bucket < buckets_.size();
  const int64_t Tp = graph ? buckets_[bucket] : T, Bp = graph ? Tp : B, Sp = graph ? Tp : S;

  // Metadata into the pinned staging, packed for (Tp, Bp, Sp) and padded to the bucket: padding
  // rows are one-token items at position 0 over block 0 that write no KV (slot -1) and sample
  // greedily; their results are dropped.
  const size_t meta_used = place_metadata(Tp, Bp, Sp);
  std::copy(b.input_ids.begin(), b.input_ids.end(), h_ids_);
  std::copy(b.positions.begin(), b.positions.end(), h_pos_);
  std::copy(b.slot_mapping.begin(), b.slot_mapping.end(), h_slots_);
  std::copy(b.cu_seqlens.begin(), b.cu_seqlens.end(), h_cu_);
  std::copy(b.block_tables.begin(), b.block_tables.end(), h_tables_);
  std::copy(b.sample_token_indices.begin(), b.sample_token_indices.end(), h_sidx_);
  for (int64_t t = T; t < Tp; ++t) {
    h_ids_[t] = 0;
    h_pos_[t] = 0;
    h_slots_[t] = -1;
    h_cu_[t + 1] = static_cast<int32_t>(t + 1);
  }
  if (Bp > B)
    std::memset(h_tables_ + B * W_, 0, static_cast<size_t>((Bp - B) * W_) * sizeof(int32_t));
  for (int64_t s = 0; s < Sp; ++s) {
    if (s >= S) {
      h_sidx_[s] = static_cast<int32_t>(s);
      h_params_[s] = SampleParamsDevice{0.0f, -1, 1.0f, 0, 0, 0, 0};
      continue;
    }
    const rollout::Sequence& seq = *b.sample_seqs[s];
    const rollout::SamplingParams& sp = seq.params();
    h_params_[s] = SampleParamsDevice{sp.temperature,
                                      sp.top_k,
                                      sp.top_p,
                                      0,
                                      sp.seed,
                                      seq.rng_stream(),
                                      static_cast<uint64_t>(seq.num_output_tokens())};
  }
  if (batch_invariant()) {
    // One log-prob temperature per step (the trainer scores a batch at one temperature); a decode
    // graph bakes it in, so a new one re-captures.
    float t = S > 0 ? b.sample_seqs[0]->params().temperature : 1.0f;
    for (int64_t s = 1; s < S; ++s) {
      VERL_CHECK(b.sample_seqs[s]->params().temperature == t,
                 "CudaModelRunner: batch_invariant scores one temperature per step; sequence {} "
                 "samples at {} and sequence {} at {}",
                 b.sample_seqs[0]->id(), t, b.sample_seqs[s]->id(),
                 b.sample_seqs[s]->params().temperature);
    }
    if (t <= 0.0f) t = 1.0f;  // greedy: the log-prob of the untempered distribution
    if (t != logprob_temperature_) {
      destroy_graphs();
      logprob_temperature_ = t;
    }
  }
  cudaStream_t st = ctx_.stream;
  // Profiling: the GPU waits while the host enqueues the step (a decode step is a few hundred
  // launches), so the section events time kernels back to back, as a graph replay runs them.
  if (timer_) gpu_spin(ctx_, 20000);
  mark("upload");
  VERL_CUDA_CHECK(cudaMemcpyAsync(d_meta_, h_meta_, meta_used, cudaMemcpyHostToDevice, st));

  bool captured_now = false;
  if (graph && graphs_[bucket] != nullptr) {
    VERL_CUDA_CHECK(cudaGraphLaunch(graphs_[bucket], st));
    ++counters_.graph_steps;
  } else if (graph) {
    forward(Tp, Bp, Sp, decode_plan(Bp));  // the bucket's first step runs eagerly; captured below
    captured_now = true;
  } else {
    PagedAttentionPlan plan = decode_plan(B);
    plan.max_context = b.max_context_len;
    plan.decode = false;
    for (int64_t i = 0; i < B && !plan.decode; ++i)
      plan.decode = b.cu_seqlens[i + 1] - b.cu_seqlens[i] == 1;
    plan.prefill = b.max_seqlen_q > 1;
    if (plan.prefill && training_prefill()) {
      ++counters_.training_prefill_steps;
    }
    forward(T, B, S, plan);
  }
  mark("download");
  VERL_CUDA_CHECK(cudaMemcpyAsync(h_res_, d_res_, static_cast<size_t>(2 * Sp) * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, st));
  if (timer_) timer_->stop(st);
  const auto t1 = Clock::now();
  VERL_CUDA_CHECK(cudaStreamSynchronize(st));
  const auto t2 = Clock::now();
  if (captured_now) capture(bucket);

  const float* h_lp = reinterpret_cast<const float*>(h_res_ + Sp);
  for (int64_t s = 0; s < S; ++s) {
    VERL_CHECK(h_res_[s] >= 0 && h_res_[s] < cfg_.vocab_size,
               "CudaModelRunner: the logits of sequence {} are not finite (sample {} of the step)",
               b.sample_seqs[s]->id(), s);
    tokens[s] = h_res_[s];
    logprobs[s] = h_lp[s];
  }
  if (decode) ++counters_.decode_steps;
  if (observer_) {
    std::vector<std::pair<std::string, double>> sections;
    StepRecord r;
    r.decode = decode;
    r.graph = graph && !captured_now;
    r.tokens = T;
    r.items = B;
    r.samples = S;
    for (int64_t i = 0; i < B; ++i) r.context_tokens += b.context_lens[i];
    r.entry = t0;
    r.enqueued = t1;
    r.synced = t2;
    if (timer_) {
      sections = timer_->take();
      r.sections = &sections;
    }
    r.done = Clock::now();
    observer_->on_step(r);
  }
}

DeviceBuffer<bf16> upload_weights_bf16(const CudaContext& ctx, const model::Weights& w) {
  const int64_t n = w.layout.total;
  VERL_CHECK(static_cast<int64_t>(w.data.size()) == n,
             "upload_weights_bf16: {} floats for a layout of {}", w.data.size(), n);
  DeviceBuffer<bf16> out(static_cast<size_t>(n));
  const int64_t chunk = std::min<int64_t>(n, int64_t{1} << 26);  // 256 MiB of fp32 staging at most
  DeviceBuffer<float> staging(static_cast<size_t>(chunk));
  for (int64_t off = 0; off < n; off += chunk) {
    const int64_t len = std::min(chunk, n - off);
    VERL_CUDA_CHECK(cudaMemcpyAsync(staging.data(), w.data.data() + off,
                                    static_cast<size_t>(len) * sizeof(float),
                                    cudaMemcpyHostToDevice, ctx.stream));
    convert(ctx, out.data() + off, staging.data(), len);
    VERL_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));  // before the staging is refilled
  }
  return out;
}

}  // namespace verl::rollout::cuda
