// The CUDA model runner of the rollout engine (rollout_cuda.h). Per layer, the CPU runner's steps
// (src/rollout/model_runner.cpp) on the GPU:
//   xn = rmsnorm(x);  qkv = xn Wqkv^T + bqkv;  q, k = [Qwen3: rmsnorm_D] rope(q, k) at the positions,
//   k, v -> cache at the slot mapping (one fused kernel);  att = paged_attention(q, cache)
//   x += att Wo^T (+ bo);  xn = rmsnorm(x);  x += (silu(g) * u) Wdown^T,  g|u = xn Wgu^T
// then the final norm and the LM head only for the sampled rows (gathered first), fp32 logits
// [S, V], and sampling on the GPU. Host code (fmt for messages); kernels live in the .cu files.
#include "ops/cuda/rollout_cuda.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/glue.h"

namespace verl::ops::cuda {
namespace {

constexpr size_t kAlign = 256;
size_t round_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

}  // namespace

int64_t kv_cache_bytes_per_block(const model::ModelConfig& cfg, int32_t block_size) {
  return 2 * cfg.num_hidden_layers * static_cast<int64_t>(block_size) * cfg.kv_dim() *
         static_cast<int64_t>(sizeof(bf16));
}

int64_t kv_cache_budget_from_utilization(double fraction) {
  VERL_CHECK(fraction > 0.0 && fraction <= 1.0,
             "gpu_memory_utilization must be in (0, 1], got {}", fraction);
  size_t free_b = 0, total_b = 0;
  VERL_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const double budget = fraction * static_cast<double>(total_b) - static_cast<double>(total_b - free_b);
  VERL_CHECK(budget > 0.0,
             "gpu_memory_utilization {} leaves no KV cache: {:.2f} of {:.2f} GiB are already in use; "
             "raise it, or give the rollout a byte budget",
             fraction, static_cast<double>(total_b - free_b) / (1 << 30),
             static_cast<double>(total_b) / (1 << 30));
  return static_cast<int64_t>(budget);
}

// ---- CudaKVCache ------------------------------------------------------------------------------------

CudaKVCache::CudaKVCache(const model::ModelConfig& cfg, int32_t block_size, int64_t budget_bytes)
    : num_layers_(cfg.num_hidden_layers),
      block_elems_(static_cast<int64_t>(block_size) * cfg.kv_dim()),
      block_size_(block_size) {
  VERL_CHECK(block_size > 0 && num_layers_ > 0 && cfg.kv_dim() > 0,
             "CudaKVCache: block_size {} with {} layers of kv_dim {}", block_size, num_layers_,
             cfg.kv_dim());
  const int64_t per_block = kv_cache_bytes_per_block(cfg, block_size);
  const int64_t blocks = budget_bytes / per_block;
  VERL_CHECK(blocks >= 1,
             "KV cache budget of {} bytes holds no block ({} bytes per block of {} tokens)",
             budget_bytes, per_block, block_size);
  num_blocks_ = static_cast<int32_t>(std::min<int64_t>(blocks, INT32_MAX));
  array_elems_ = static_cast<int64_t>(num_blocks_) * block_elems_;
}

void CudaKVCache::allocate() {
  if (allocated()) return;
  buf_ = DeviceBuffer<bf16>(static_cast<size_t>(num_arrays() * array_elems_));
  // Zeroed once: graph padding rows read block 0, which must hold finite values.
  VERL_CUDA_CHECK(cudaMemset(buf_.data(), 0, buf_.bytes()));
}

void CudaKVCache::release() { buf_.reset(); }

// ---- CudaModelRunner --------------------------------------------------------------------------------

CudaModelRunner::CudaModelRunner(const CudaContext& ctx, const model::ModelConfig& cfg,
                                 const model::ParamLayout& layout, const bf16* weights,
                                 const std::vector<float>& inv_freq,
                                 const rollout::SchedulerConfig& sched,
                                 const CudaRunnerOptions& options)
    : ctx_(ctx), cfg_(cfg), layout_(layout), w_(weights), sched_(sched), opts_(options),
      inv_freq_host_(inv_freq) {
  VERL_CHECK(cfg_.head == model::HeadKind::CausalLM,
             "CudaModelRunner: the rollout needs a causal LM, got {}", cfg_.architecture);
  VERL_CHECK(w_ != nullptr, "CudaModelRunner: no weights");
  VERL_CHECK(static_cast<int64_t>(inv_freq.size()) * 2 == cfg_.head_dim,
             "CudaModelRunner: {} RoPE frequencies for head_dim {}", inv_freq.size(), cfg_.head_dim);
  VERL_CHECK(sched_.max_num_seqs > 0 && sched_.max_num_batched_tokens > 0 &&
                 sched_.max_model_len > 0 && sched_.block_size > 0,
             "CudaModelRunner: max_num_seqs {}, max_num_batched_tokens {}, max_model_len {} and "
             "block_size {} must be positive",
             sched_.max_num_seqs, sched_.max_num_batched_tokens, sched_.max_model_len,
             sched_.block_size);
  VERL_CHECK(opts_.decode_partition > 0 && opts_.decode_partition % 64 == 0,
             "CudaModelRunner: decode_partition {} must be a positive multiple of 64",
             opts_.decode_partition);
  token_cap_ = std::max(sched_.max_num_batched_tokens, sched_.max_num_seqs);
  seq_cap_ = sched_.max_num_seqs;
  W_ = (sched_.max_model_len + sched_.block_size - 1) / sched_.block_size;
  for (int32_t b = 1; b < seq_cap_; b *= 2) buckets_.push_back(b);
  buckets_.push_back(static_cast<int32_t>(seq_cap_));
  graphs_.assign(buckets_.size(), nullptr);
  attn_ws_bytes_ = paged_attention_workspace_bytes(seq_cap_, cfg_.num_attention_heads,
                                                   cfg_.head_dim, sched_.max_model_len,
                                                   opts_.decode_partition);

  // Pinned staging: the per-step metadata going up and the sampled tokens coming down.
  const int64_t T = token_cap_, S = seq_cap_;
  auto host_slices = [&](auto&& take) {
    take(h_ids_, T);
    take(h_pos_, T);
    take(h_slots_, T);
    take(h_cu_, T + 1);
    take(h_tables_, S * W_);
    take(h_sidx_, S);
    take(h_copies_, 2 * S);
    take(h_tokens_, S);
    take(h_logprobs_, S);
    take(h_params_, S);
  };
  size_t pinned_bytes = 0;
  host_slices([&](auto*& p, int64_t n) { pinned_bytes += round_up(static_cast<size_t>(n) * sizeof(*p)); });
  VERL_CUDA_CHECK(cudaHostAlloc(&pinned_, pinned_bytes, cudaHostAllocDefault));
  size_t used = 0;
  host_slices([&](auto*& p, int64_t n) {
    p = reinterpret_cast<std::remove_reference_t<decltype(p)>>(static_cast<uint8_t*>(pinned_) + used);
    used += round_up(static_cast<size_t>(n) * sizeof(*p));
  });

  scratch_bytes_ = carve(nullptr);
  try {
    arena_ = DeviceArena("rollout_scratch", scratch_bytes_);
    carve(&arena_);
    VERL_CUDA_CHECK(cudaMemcpy(inv_freq_, inv_freq_host_.data(),
                               inv_freq_host_.size() * sizeof(float), cudaMemcpyHostToDevice));
    // The KV budget is measured with the scratch already taken (vLLM profiles before sizing).
    const int64_t budget = opts_.kv_cache_bytes > 0
                               ? opts_.kv_cache_bytes
                               : kv_cache_budget_from_utilization(opts_.gpu_memory_utilization);
    cache_ = std::make_unique<CudaKVCache>(cfg_, sched_.block_size, budget);
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
  const int64_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), Q3 = qd + 2 * kvd, V = cfg_.vocab_size;
  size_t bytes = round_up(attn_ws_bytes_);
  attn_ws_ = arena != nullptr ? arena->alloc(attn_ws_bytes_) : nullptr;
  auto take = [&](auto*& p, int64_t n) {
    using E = std::remove_reference_t<decltype(*p)>;
    bytes += round_up(static_cast<size_t>(n) * sizeof(E));
    p = arena != nullptr ? arena->alloc_n<E>(static_cast<size_t>(n)) : nullptr;
  };
  take(x_, T * C);
  take(xn_, T * C);
  take(qkv_, T * Q3);
  take(q_, T * qd);
  take(att_, T * qd);
  take(gu_, T * 2 * F);
  take(act_, T * F);
  take(rows_, S * C);
  take(hn_, S * C);
  take(logits_, S * V);
  take(inv_freq_, static_cast<int64_t>(inv_freq_host_.size()));
  take(d_ids_, T);
  take(d_pos_, T);
  take(d_slots_, T);
  take(d_cu_, T + 1);
  take(d_tables_, S * W_);
  take(d_sidx_, S);
  take(d_copies_, 2 * S);
  take(d_tokens_, S);
  take(d_logprobs_, S);
  take(d_params_, S);
  return bytes;
}

void CudaModelRunner::acquire() {
  if (arena_.capacity() == 0) {
    arena_ = DeviceArena("rollout_scratch", scratch_bytes_);
    carve(&arena_);
    VERL_CUDA_CHECK(cudaMemcpy(inv_freq_, inv_freq_host_.data(),
                               inv_freq_host_.size() * sizeof(float), cudaMemcpyHostToDevice));
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

void CudaModelRunner::begin_generate() { acquire(); }

void CudaModelRunner::end_generate() {
  if (opts_.free_cache_engine) release_memory();
}

void CudaModelRunner::apply_block_copies(const rollout::ScheduledBatch& b) {
  const std::vector<rollout::BlockCopy>& copies = b.block_copies;
  if (copies.empty()) return;
  // Copies run concurrently unless one's destination is another's source (then one by one, in order).
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

PagedAttentionPlan CudaModelRunner::graph_plan() const {
  PagedAttentionPlan plan;
  plan.max_context = sched_.max_model_len;
  plan.decode = true;
  plan.prefill = false;
  plan.partition = opts_.decode_partition;
  return plan;
}

void CudaModelRunner::forward(int64_t T, int64_t B, int64_t S, const PagedAttentionPlan& plan) {
  const model::ModelConfig& c = cfg_;
  const int64_t C = c.hidden_size, F = c.intermediate_size, V = c.vocab_size;
  const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), Q3 = qd + 2 * kvd;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  embedding_forward(ctx_, x_, d_ids_, W(layout_.embed), T, C, V);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const model::LayerParams& p = layout_.layers[l];
    rmsnorm_forward(ctx_, xn_, nullptr, x_, W(p.attn_norm), T, C, eps);
    linear_forward(ctx_, qkv_, xn_, W(p.wqkv), W(p.bqkv), T, C, Q3);
    qkv_rope_paged_write(ctx_, q_, cache_->k(l), cache_->v(l), qkv_, W(p.q_norm), W(p.k_norm), eps,
                         d_pos_, inv_freq_, d_slots_, T, H, Hkv, D);
    paged_attention(ctx_, att_, q_, cache_->k(l), cache_->v(l), d_tables_, W_, d_cu_, d_pos_, B, T,
                    H, Hkv, D, cache_->block_size(), scale, plan, attn_ws_, attn_ws_bytes_);
    linear_forward(ctx_, x_, att_, W(p.wo), W(p.bo), x_, T, qd, C);  // x += att Wo^T (+ bo)
    rmsnorm_forward(ctx_, xn_, nullptr, x_, W(p.mlp_norm), T, C, eps);
    linear_forward(ctx_, gu_, xn_, W(p.wgu), W(p.bgu), T, C, 2 * F);
    swiglu_forward(ctx_, act_, gu_, T, F);
    linear_forward(ctx_, x_, act_, W(p.wdown), W(p.bdown), x_, T, F, C);  // x += act Wdown^T
  }
  // Only the sampled rows go through the final norm and the LM head: gather them (a row gather is
  // an embedding lookup into x), then logits [S, V] fp32 = hn W_lm^T.
  embedding_forward(ctx_, rows_, d_sidx_, x_, S, C, T);
  rmsnorm_forward(ctx_, hn_, nullptr, rows_, W(layout_.final_norm), S, C, eps);
  const int lm = layout_.lm_head >= 0 ? layout_.lm_head : layout_.embed;
  detail::run_gemm(ctx_,
                   detail::Gemm{CUBLAS_OP_T, CUBLAS_OP_N, V, S, C, W(lm), C, hn_, C, CUDA_R_16BF,
                                logits_, V, CUDA_R_32F, 0.0f},
                   "rollout lm_head");
  sample_tokens(ctx_, d_tokens_, d_logprobs_, logits_, V, d_params_, S, V);
}

void CudaModelRunner::capture(size_t bucket) {
  const int64_t Bp = buckets_[bucket];
  cudaGraph_t graph = nullptr;
  VERL_CUDA_CHECK(cudaStreamBeginCapture(ctx_.stream, cudaStreamCaptureModeThreadLocal));
  try {
    forward(Bp, Bp, Bp, graph_plan());
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
  ++stats_.graphs_captured;
}

void CudaModelRunner::step(const rollout::ScheduledBatch& b, std::span<int32_t> tokens,
                           std::span<float> logprobs) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t T = b.num_tokens(), B = b.num_seqs(), S = b.num_samples();
  VERL_CHECK(static_cast<int64_t>(tokens.size()) == S && static_cast<int64_t>(logprobs.size()) == S,
             "CudaModelRunner: {} samples, {} token and {} log-prob slots", S, tokens.size(),
             logprobs.size());
  VERL_CHECK(T <= token_cap_ && B <= seq_cap_ && S <= seq_cap_,
             "CudaModelRunner: a step of {} tokens, {} sequences and {} samples; the runner was "
             "planned for {} tokens and {} sequences (the scheduler config it was built with)",
             T, B, S, token_cap_, seq_cap_);
  VERL_CHECK(b.max_blocks_per_seq == W_,
             "CudaModelRunner: block tables {} wide, planned for {} (max_model_len {} / block_size {})",
             b.max_blocks_per_seq, W_, sched_.max_model_len, sched_.block_size);
  acquire();
  apply_block_copies(b);
  ++stats_.steps;
  if (T == 0) {
    VERL_CHECK(S == 0, "CudaModelRunner: a step with no tokens cannot sample");
    return;
  }

  // A pure decode step (one token and one sample per item, in item order) replays a graph.
  bool decode = T == B && S == B;
  for (int64_t s = 0; decode && s < S; ++s) decode = b.sample_token_indices[s] == s;
  size_t bucket = buckets_.size();
  if (decode && !opts_.enforce_eager && ctx_.stream != nullptr) {
    bucket = static_cast<size_t>(std::lower_bound(buckets_.begin(), buckets_.end(), B) - buckets_.begin());
  }
  const bool graph = bucket < buckets_.size();
  const int64_t Tp = graph ? buckets_[bucket] : T, Bp = graph ? Tp : B, Sp = graph ? Tp : S;

  // Metadata into the pinned staging, padded to the bucket: padding rows are one-token items at
  // position 0 over block 0 that write no KV (slot -1) and sample greedily; their results are dropped.
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
  if (Bp > B) std::memset(h_tables_ + B * W_, 0, static_cast<size_t>((Bp - B) * W_) * sizeof(int32_t));
  for (int64_t s = 0; s < Sp; ++s) {
    if (s >= S) {
      h_sidx_[s] = static_cast<int32_t>(s);
      h_params_[s] = SampleParamsDevice{0.0f, -1, 1.0f, 0, 0, 0, 0};
      continue;
    }
    const rollout::Sequence& seq = *b.sample_seqs[s];
    const rollout::SamplingParams& sp = seq.params();
    h_params_[s] = SampleParamsDevice{sp.temperature, sp.top_k, sp.top_p, 0, sp.seed, seq.rng_stream(),
                                      static_cast<uint64_t>(seq.num_output_tokens())};
  }
  cudaStream_t st = ctx_.stream;
  auto up = [&](auto* dst, const auto* src, int64_t n) {
    VERL_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(*src), cudaMemcpyHostToDevice, st));
  };
  up(d_ids_, h_ids_, Tp);
  up(d_pos_, h_pos_, Tp);
  up(d_slots_, h_slots_, Tp);
  up(d_cu_, h_cu_, Bp + 1);
  up(d_tables_, h_tables_, Bp * W_);
  up(d_sidx_, h_sidx_, Sp);
  up(d_params_, h_params_, Sp);

  bool captured_now = false;
  if (graph && graphs_[bucket] != nullptr) {
    VERL_CUDA_CHECK(cudaGraphLaunch(graphs_[bucket], st));
    ++stats_.graph_steps;
  } else if (graph) {
    forward(Tp, Bp, Sp, graph_plan());  // the bucket's first step runs eagerly; captured below
    captured_now = true;
  } else {
    PagedAttentionPlan plan;
    plan.max_context = b.max_context_len;
    plan.decode = false;
    for (int64_t i = 0; i < B && !plan.decode; ++i) plan.decode = b.cu_seqlens[i + 1] - b.cu_seqlens[i] == 1;
    plan.prefill = b.max_seqlen_q > 1;
    plan.partition = opts_.decode_partition;
    forward(T, B, S, plan);
  }
  VERL_CUDA_CHECK(cudaMemcpyAsync(h_tokens_, d_tokens_, static_cast<size_t>(S) * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, st));
  VERL_CUDA_CHECK(cudaMemcpyAsync(h_logprobs_, d_logprobs_, static_cast<size_t>(S) * sizeof(float),
                                  cudaMemcpyDeviceToHost, st));
  VERL_CUDA_CHECK(cudaStreamSynchronize(st));
  if (captured_now) capture(bucket);

  for (int64_t s = 0; s < S; ++s) {
    VERL_CHECK(h_tokens_[s] >= 0 && h_tokens_[s] < cfg_.vocab_size,
               "CudaModelRunner: the logits of sequence {} are not finite (sample {} of the step)",
               b.sample_seqs[s]->id(), s);
    tokens[s] = h_tokens_[s];
    logprobs[s] = h_logprobs_[s];
  }
  if (decode) {
    ++stats_.decode_steps;
    for (int64_t i = 0; i < B; ++i) stats_.decode_context_tokens += b.context_lens[i];
    stats_.decode_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
}

DeviceBuffer<bf16> upload_weights_bf16(const CudaContext& ctx, const model::Weights& w) {
  const int64_t n = w.layout.total;
  VERL_CHECK(static_cast<int64_t>(w.data.size()) == n, "upload_weights_bf16: {} floats for a layout of {}",
             w.data.size(), n);
  DeviceBuffer<bf16> out(static_cast<size_t>(n));
  const int64_t chunk = std::min<int64_t>(n, int64_t{1} << 26);  // 256 MiB of fp32 staging at most
  DeviceBuffer<float> staging(static_cast<size_t>(chunk));
  for (int64_t off = 0; off < n; off += chunk) {
    const int64_t len = std::min(chunk, n - off);
    VERL_CUDA_CHECK(cudaMemcpyAsync(staging.data(), w.data.data() + off, static_cast<size_t>(len) * sizeof(float),
                                    cudaMemcpyHostToDevice, ctx.stream));
    convert(ctx, out.data() + off, staging.data(), len);
    VERL_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));  // before the staging is refilled
  }
  return out;
}

}  // namespace verl::ops::cuda
