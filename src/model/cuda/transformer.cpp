// The causal LM on CUDA (model/cuda/transformer.h): the layers' forward and backward through the
// decoder (model/cuda/decoder.h, the recipe and its kernels) over this model's saved activations
// and gradient scratch; the heads on the batch and their backward here.
#include "model/cuda/transformer.h"

#include <algorithm>
#include <string>
#include <type_traits>

#include "core/dtype.h"
#include "core/dump.h"
#include "ops/cuda/glue.h"
#include "ops/cuda/lm_head.h"
#include "ops/cuda/value_head.h"

namespace verl::model::cuda {
using namespace ops::cuda;  // the kernels' wrappers and device memory
namespace {

constexpr size_t kAlign = 256;
size_t round_up(size_t x) {
  return (x + kAlign - 1) / kAlign * kAlign;
}

// The model's outputs are written on its own stream: a copy on that stream and a wait for it alone
// (no device-wide synchronisation, so a log-prob pass on a worker thread neither waits for nor
// disturbs the rollout's stream, which may be capturing a graph: trainer.token_level_pipeline).
template <typename T>
std::vector<T> download_n(cudaStream_t stream, const T* p, int64_t n) {
  std::vector<T> h(static_cast<size_t>(std::max<int64_t>(n, 0)));
  if (h.empty()) return h;
  VERL_CUDA_CHECK(
      cudaMemcpyAsync(h.data(), p, h.size() * sizeof(T), cudaMemcpyDeviceToHost, stream));
  VERL_CUDA_CHECK(cudaStreamSynchronize(stream));
  return h;
}

// The profile's sections (the benchmarks report these names).
constexpr SectionNames kSections = [] {
  SectionNames n{};
  auto set = [&n](Section s, const char* name) { n[static_cast<size_t>(s)] = name; };
  set(Section::Embed, "embedding");
  set(Section::AttnNorm, "norm_fwd");
  set(Section::QkvProj, "gemm_fwd");
  set(Section::QkRope, "elementwise_fwd");
  set(Section::QkNorm, "norm_fwd");
  set(Section::Attention, "attention_fwd");
  set(Section::OProj, "gemm_fwd");
  set(Section::Residual, "elementwise_fwd");
  set(Section::MlpNorm, "norm_fwd");
  set(Section::GateUp, "gemm_fwd");
  set(Section::Swiglu, "elementwise_fwd");
  set(Section::Down, "gemm_fwd");
  set(Section::FinalNorm, "norm_fwd");
  set(Section::LmHead, "lm_head_fwd");
  set(Section::MemsetBwd, "memset_bwd");
  set(Section::GemmBwd, "gemm_bwd");
  set(Section::ElementwiseBwd, "elementwise_bwd");
  set(Section::AttentionBwd, "attention_bwd");
  set(Section::NormBwd, "norm_bwd");
  return n;
}();

}  // namespace

CudaTransformer::CudaTransformer(const CudaContext& ctx, const model::ModelConfig& cfg,
                                 const model::ParamLayout& layout, const bf16* weights,
                                 float* grads, const CudaTransformerOptions& options)
    : ctx_(ctx),
      cfg_(cfg),
      layout_(layout),
      opts_(options),
      decoder_(ctx, cfg, layout, weights,
               CudaDecoderOptions{options.numerics, options.quantized,
                                  options.quant_fused_max_tokens, options.lora}),
      max_tokens_(options.max_tokens),
      max_seqs_(options.max_seqs),
      chunk_(options.lm_head_chunk <= 0 || options.lm_head_chunk > options.max_tokens
                 ? options.max_tokens
                 : options.lm_head_chunk),
      w_(weights),
      g_(grads) {
  const int64_t max_tokens = max_tokens_, max_seqs = max_seqs_;
  VERL_CUDA_REQUIRE(cfg_.head != model::HeadKind::SequenceClassification || !opts_.trainable,
                    "CudaTransformer: a sequence-classification model (reward model) is forward "
                    "only here; training one runs on the CPU");
  VERL_CUDA_REQUIRE(max_tokens > 0 && max_seqs > 0,
                    "CudaTransformer: max_tokens and max_seqs must be positive");
  VERL_CUDA_REQUIRE(w_ != nullptr, "CudaTransformer: no weights");
  // A trainable model writes gradients: the base's, or with LoRA the adapters' (a frozen base).
  const bool lora_grads = opts_.lora != nullptr && opts_.lora->grads() != nullptr;
  VERL_CUDA_REQUIRE(opts_.trainable ? g_ != nullptr || lora_grads : g_ == nullptr,
                    opts_.trainable ? "CudaTransformer: a trainable model needs its gradients"
                                    : "CudaTransformer: a forward-only model takes no gradients");
  lm_param_ = layout_.lm_head >= 0 ? layout_.lm_head : layout_.embed;
  const QuantizedLinears* qs = opts_.quantized;
  if (qs != nullptr) {
    VERL_CUDA_REQUIRE(!opts_.trainable,
                      "CudaTransformer: quantised linear layers are forward only (a reference "
                      "policy or a reward model); a trained model keeps bf16 weights");
    // The decoder checked the set's shapes.
  }
  // The stronger of the context's and the options' modes (Fast < MatchTrainer < BatchInvariant).
  ctx_.numerics = std::max(ctx_.numerics, opts_.numerics);
  inv_freq_ = DeviceBuffer<float>(model::rope_inv_freq(cfg_));

  // Arena plan: one pass counts the bytes, the second takes the slices.
  const int64_t T = max_tokens_, C = cfg_.hidden_size, F = cfg_.intermediate_size;
  const int64_t H = cfg_.num_attention_heads, Hkv = cfg_.num_key_value_heads;
  const int64_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), Q3 = qd + 2 * kvd;
  const int64_t L = cfg_.num_hidden_layers;
  const bool qkn = cfg_.qk_norm;
  // Saved activations: every layer's own buffers for a plain trainable model; one shared set when
  // recomputing (backward refills it per layer) or forward-only. A forward-only model keeps two
  // residual-stream buffers and alternates; the others keep every layer's input.
  const bool own_layers = opts_.trainable && !opts_.recompute;
  x_.assign(static_cast<size_t>(opts_.trainable ? L + 1 : 2), nullptr);
  layers_.assign(static_cast<size_t>(own_layers ? L : 1), LayerActs{});
  const bool causal = cfg_.head == model::HeadKind::CausalLM;
  const int64_t NL = causal ? 0 : cfg_.num_labels;  // value head outputs per token
  const bool keep_probs = causal && opts_.trainable && opts_.lm_head_keep_probs;
  lm_scratch_bytes_ =
      !causal ? 0
              : std::max(lm_head_forward_scratch_bytes(T, cfg_.vocab_size, chunk_),
                         keep_probs
                             ? lm_head_backward_from_probs_scratch_bytes(T, cfg_.vocab_size, chunk_)
                             : lm_head_backward_scratch_bytes(T, cfg_.vocab_size, chunk_));
  auto carve = [&](auto&& take) {
    take(tokens_, T);
    take(positions_, T);
    take(targets_, T);
    take(cu_, max_seqs_ + 1);
    for (auto& p : x_) take(p, T * C);
    for (auto& a : layers_) {
      take(a.xn1, T * C);
      take(a.rstd1, T);
      if (qkn) {
        take(a.q_pre, T * qd);
        take(a.k_pre, T * kvd);
        take(a.rstd_q, T * H);
        take(a.rstd_k, T * Hkv);
      }
      take(a.q, T * qd);
      take(a.k, T * kvd);
      take(a.v, T * kvd);
      take(a.att, T * qd);
      take(a.lse, T * H);
      take(a.x_mid, T * C);
      take(a.xn2, T * C);
      take(a.rstd2, T);
      take(a.gu, T * 2 * F);
      take(a.act, T * F);
    }
    take(qkv_, T * Q3);
    take(h_final_, T * C);
    take(rstd_final_, T);
    take(logprob_, T);
    take(entropy_, T);
    take(lse_head_, T);
    if (causal) {
      take(head_rows_, T);
      take(targets_head_, T);
      take(h_head_, T * C);
      take(logprob_head_, T);
      take(entropy_head_, T);
    }
    if (NL > 0) take(values_, T * NL);
    if (qs != nullptr && T > opts_.quant_fused_max_tokens)
      take(quant_scratch_, qs->max_matrix_elems());
    if (opts_.lora != nullptr) take(lora_u_, T * opts_.lora->rank());
    if (!opts_.trainable) return;  // the rest is for backward
    if (opts_.lora != nullptr) take(d_lora_u_, T * opts_.lora->rank());
    if (NL > 0) take(d_values_, T * NL);
    if (keep_probs) take(lm_probs_, T * cfg_.vocab_size);
    take(d_lp_, T);
    take(d_ent_, T);
    if (causal) {
      take(d_lp_head_, T);
      take(d_ent_head_, T);
      take(d_h_head_, T * C);
    }
    take(d_x_, T * C);
    take(d_xn_, T * C);
    take(d_act_, T * F);
    take(d_gu_, T * 2 * F);
    take(d_att_, T * qd);
    take(d_q_, T * qd);
    take(d_k_, T * kvd);
    take(d_v_, T * kvd);
    if (qkn) {
      take(d_q_bf_, T * qd);
      take(d_k_bf_, T * kvd);
      take(d_qpre_, T * qd);
      take(d_kpre_, T * kvd);
    }
  };
  size_t bytes = round_up(lm_scratch_bytes_);
  carve(
      [&](auto*& p, int64_t count) { bytes += round_up(static_cast<size_t>(count) * sizeof(*p)); });
  arena_ = DeviceArena("cuda_transformer", bytes);
  carve([&](auto*& p, int64_t count) {
    using T_ = std::remove_reference_t<decltype(*p)>;
    p = arena_.alloc_n<T_>(static_cast<size_t>(count));
  });
  lm_scratch_ = arena_.alloc(lm_scratch_bytes_);
  if (!opts_.trainable) {
    // Alternate the two residual buffers: layer l reads x_[l % 2] and writes x_[(l + 1) % 2].
    const std::vector<bf16*> two = x_;
    x_.assign(static_cast<size_t>(L + 1), nullptr);
    for (int64_t l = 0; l <= L; ++l) x_[l] = two[l % 2];
  }
  VERL_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
}

CudaTransformer::~CudaTransformer() = default;

void CudaTransformer::require_trainable(const char* what) const {
  VERL_CUDA_REQUIRE(opts_.trainable, std::string("CudaTransformer::") + what +
                                         ": this model was built forward-only (trainable = false)");
}

void CudaTransformer::mark(const char* section) {
  if (timer_) timer_->mark(ctx_.stream, section);
}

void CudaTransformer::set_profiling(bool on) {
  if (on && !timer_) timer_ = std::make_unique<SectionTimer>();
  if (!on) timer_.reset();
}

std::vector<std::pair<std::string, double>> CudaTransformer::take_profile() {
  if (!timer_) return {};
  timer_->stop(ctx_.stream);
  return timer_->take();
}

size_t CudaTransformer::device_bytes() const {
  return inv_freq_.bytes() + arena_.capacity();
}

DecoderStep CudaTransformer::step() const {
  DecoderStep s;
  s.T = T_;
  s.B = B_;
  s.ids = tokens_;
  s.positions = positions_;
  s.cu_seqlens = cu_;
  s.inv_freq = inv_freq_.data();
  s.qkv = qkv_;
  s.quant_scratch = quant_scratch_;
  s.lora_u = lora_u_;
  s.timer = timer_.get();
  s.names = &kSections;
  return s;
}

void CudaTransformer::forward(const model::PackedBatch& b, float temperature, bool for_backward) {
  const int64_t T = b.num_tokens(), B = b.num_seqs();
  VERL_CUDA_REQUIRE(T > 0 && B > 0 && T <= max_tokens_ && B <= max_seqs_ &&
                        b.cu_seqlens.back() == T && b.positions.size() == b.tokens.size() &&
                        b.targets.size() == b.tokens.size(),
                    "CudaTransformer::forward: batch of " + std::to_string(T) + " tokens, " +
                        std::to_string(B) + " sequences (planned for " +
                        std::to_string(max_tokens_) + ", " + std::to_string(max_seqs_) + ")");
  const int64_t V = cfg_.vocab_size;
  for (int32_t id : b.tokens) {
    VERL_CUDA_REQUIRE(id >= 0 && id < V, "CudaTransformer::forward: token id out of range");
  }
  T_ = T;
  B_ = B;
  temperature_ = temperature;
  cudaStream_t s = ctx_.stream;
  VERL_CUDA_CHECK(cudaMemcpyAsync(tokens_, b.tokens.data(), T * 4, cudaMemcpyHostToDevice, s));
  VERL_CUDA_CHECK(
      cudaMemcpyAsync(positions_, b.positions.data(), T * 4, cudaMemcpyHostToDevice, s));
  VERL_CUDA_CHECK(cudaMemcpyAsync(targets_, b.targets.data(), T * 4, cudaMemcpyHostToDevice, s));
  VERL_CUDA_CHECK(
      cudaMemcpyAsync(cu_, b.cu_seqlens.data(), (B + 1) * 4, cudaMemcpyHostToDevice, s));

  const int64_t C = cfg_.hidden_size, L = cfg_.num_hidden_layers;
  const bool dumping = verl::dump::enabled();
  const DecoderStep st = step();
  decoder_.embed(st, x_[0]);
  for (int64_t l = 0; l < L; ++l) layer_forward(static_cast<int>(l));
  decoder_.final_norm(st, h_final_, rstd_final_, x_[L]);
  backward_ready_ = for_backward;
  adapters_off_ = opts_.lora != nullptr && !opts_.lora->enabled();
  if (cfg_.head != model::HeadKind::CausalLM) {
    // Token classification: every token's values. Sequence classification (a reward model) is
    // the same head read at each sequence's last token (values_at_last_tokens).
    mark("value_head_fwd");
    decoder_.value_head(values_, h_final_, T);
    if (dumping) dump_tensor("value_head.values", -1, values_, T, cfg_.num_labels);
    mark("other");
    return;
  }
  mark("lm_head_fwd");
  // The head on the batch's head_rows alone when they are fewer than T: gathered in, scattered
  // out with 0 at the other rows.
  const auto n_rows = static_cast<int64_t>(b.head_rows.size());
  n_head_ = n_rows > 0 && n_rows < T ? n_rows : 0;
  if (n_head_ > 0) {
    for (int64_t i = 0; i < n_head_; ++i) {
      VERL_CUDA_REQUIRE(b.head_rows[i] >= 0 && b.head_rows[i] < T &&
                            (i == 0 || b.head_rows[i] > b.head_rows[i - 1]),
                        "CudaTransformer::forward: head_rows must be strictly increasing rows of "
                        "the batch (entry " +
                            std::to_string(i) + " is " + std::to_string(b.head_rows[i]) + ", " +
                            std::to_string(T) + " rows)");
    }
    VERL_CUDA_CHECK(
        cudaMemcpyAsync(head_rows_, b.head_rows.data(), n_head_ * 4, cudaMemcpyHostToDevice, s));
    gather_rows(ctx_, h_head_, h_final_, head_rows_, n_head_, C);
    gather_rows(ctx_, targets_head_, targets_, head_rows_, n_head_, 1);
  }
  const int64_t Th = n_head_ > 0 ? n_head_ : T;
  const bf16* h = n_head_ > 0 ? h_head_ : h_final_;
  const int32_t* tg = n_head_ > 0 ? targets_head_ : targets_;
  float* lp = n_head_ > 0 ? logprob_head_ : logprob_;
  float* ent = n_head_ > 0 ? entropy_head_ : entropy_;
  decoder_.lm_head_logprobs(lp, ent, lse_head_, for_backward ? lm_probs_ : nullptr, h, tg, Th,
                            temperature, chunk_, lm_scratch_, lm_scratch_bytes_);
  if (n_head_ > 0) {
    VERL_CUDA_CHECK(cudaMemsetAsync(logprob_, 0, T * sizeof(float), s));
    VERL_CUDA_CHECK(cudaMemsetAsync(entropy_, 0, T * sizeof(float), s));
    scatter_rows(ctx_, logprob_, logprob_head_, head_rows_, n_head_, 1);
    scatter_rows(ctx_, entropy_, entropy_head_, head_rows_, n_head_, 1);
  }
  if (dumping) {
    dump_tensor("lm_head.logprob", -1, logprob_, T, 0);
    dump_tensor("lm_head.entropy", -1, entropy_, T, 0);
  }
  mark("other");
}

void CudaTransformer::layer_forward(int l, bool full) {
  decoder_.layer_forward(step(), l, bufs(l), x_[l], x_[l + 1], full);
}

void CudaTransformer::backward_host(const float* d_logprob, const float* d_entropy) {
  check_backward(model::HeadKind::CausalLM, "backward_host");
  VERL_CUDA_REQUIRE(T_ > 0, "CudaTransformer::backward before a forward");
  if (d_logprob) {
    VERL_CUDA_CHECK(
        cudaMemcpyAsync(d_lp_, d_logprob, T_ * sizeof(float), cudaMemcpyHostToDevice, ctx_.stream));
  }
  if (d_entropy) {
    VERL_CUDA_CHECK(cudaMemcpyAsync(d_ent_, d_entropy, T_ * sizeof(float), cudaMemcpyHostToDevice,
                                    ctx_.stream));
  }
  backward(d_logprob ? d_lp_ : nullptr, d_entropy ? d_ent_ : nullptr);
}

void CudaTransformer::check_backward(model::HeadKind head, const char* what) const {
  require_trainable(what);
  VERL_CUDA_REQUIRE(cfg_.head == head, std::string("CudaTransformer::") + what +
                                           ": not this model's head (a causal LM takes backward, "
                                           "a token-classification model backward_values)");
  VERL_CUDA_REQUIRE(T_ > 0, std::string("CudaTransformer::") + what + " before a forward");
  VERL_CUDA_REQUIRE(backward_ready_, std::string("CudaTransformer::") + what +
                                         ": the last forward ran with for_backward = false");
  VERL_CUDA_REQUIRE(!adapters_off_ && (opts_.lora == nullptr || opts_.lora->enabled()),
                    std::string("CudaTransformer::") + what +
                        ": the LoRA adapters are switched off (the base alone is for log-prob "
                        "passes)");
}

void CudaTransformer::backward_values(const float* d_values) {
  check_backward(model::HeadKind::TokenClassification, "backward_values");
  const int64_t T = T_, C = cfg_.hidden_size;
  bf16* d_h = d_xn_;
  mark("memset_bwd");
  VERL_CUDA_CHECK(cudaMemsetAsync(d_h, 0, T * C * sizeof(bf16), ctx_.stream));
  mark("value_head_bwd");
  value_head_backward(ctx_, d_h, G(layout_.score), G(layout_.score_bias), d_values, h_final_,
                      W(layout_.score), T, C, cfg_.num_labels);
  backward_trunk(d_h);
}

void CudaTransformer::backward_values_host(const float* d_values) {
  check_backward(model::HeadKind::TokenClassification, "backward_values_host");
  VERL_CUDA_CHECK(cudaMemcpyAsync(d_values_, d_values, T_ * cfg_.num_labels * sizeof(float),
                                  cudaMemcpyHostToDevice, ctx_.stream));
  backward_values(d_values_);
}

std::vector<float> CudaTransformer::download_values() const {
  VERL_CUDA_REQUIRE(values_ != nullptr, "CudaTransformer::download_values: not a value model");
  return download_n(ctx_.stream, values_, T_ * cfg_.num_labels);
}

void CudaTransformer::backward(const float* d_logprob, const float* d_entropy) {
  check_backward(model::HeadKind::CausalLM, "backward");
  const int64_t T = T_, C = cfg_.hidden_size, V = cfg_.vocab_size;
  bf16* d_h = d_xn_;
  mark("memset_bwd");
  VERL_CUDA_CHECK(cudaMemsetAsync(d_h, 0, T * C * sizeof(bf16), ctx_.stream));
  mark("lm_head_bwd");
  // With head rows the head's backward runs on the compact rows (their d_logprob / d_entropy
  // gathered) and its d_h is scattered into the full d_h, zero at the other rows.
  const int64_t n = n_head_, Th = n > 0 ? n : T;
  bf16* d_hh = d_h;
  const bf16* h = h_final_;
  const int32_t* tg = targets_;
  const float* ent = entropy_;
  if (n > 0) {
    if (d_logprob) gather_rows(ctx_, d_lp_head_, d_logprob, head_rows_, n, 1);
    if (d_entropy) gather_rows(ctx_, d_ent_head_, d_entropy, head_rows_, n, 1);
    d_logprob = d_logprob ? d_lp_head_ : nullptr;
    d_entropy = d_entropy ? d_ent_head_ : nullptr;
    d_hh = d_h_head_;
    VERL_CUDA_CHECK(cudaMemsetAsync(d_hh, 0, n * C * sizeof(bf16), ctx_.stream));
    h = h_head_;
    tg = targets_head_;
    ent = entropy_head_;
  }
  if (lm_probs_ != nullptr) {
    lm_head_backward_from_probs(ctx_, d_hh, G(lm_param_), d_logprob, d_entropy, lm_probs_, h,
                                W(lm_param_), tg, ent, Th, C, V, temperature_, chunk_, lm_scratch_,
                                lm_scratch_bytes_);
  } else {
    lm_head_backward(ctx_, d_hh, G(lm_param_), d_logprob, d_entropy, h, W(lm_param_), tg, lse_head_,
                     ent, Th, C, V, temperature_, chunk_, lm_scratch_, lm_scratch_bytes_);
  }
  if (n > 0) scatter_rows(ctx_, d_h, d_hh, head_rows_, n, C);
  backward_trunk(d_h);
}

void CudaTransformer::backward_trunk(const bf16* d_h) {
  const int64_t T = T_, C = cfg_.hidden_size, V = cfg_.vocab_size, L = cfg_.num_hidden_layers;
  mark("memset_bwd");
  VERL_CUDA_CHECK(cudaMemsetAsync(d_x_, 0, T * C * sizeof(bf16), ctx_.stream));
  mark("norm_bwd");
  rmsnorm_backward(ctx_, d_x_, G(layout_.final_norm), d_h, x_[L], W(layout_.final_norm),
                   rstd_final_, T, C);
  // The layout is embed, layer 0 .. L-1, final norm, head (model/weights.cpp): the head and the
  // final norm are done now, each layer when its backward is, the embedding last (a tied LM head
  // adds to it above).
  const auto param_begin = [&](int i) { return layout_.params[i].offset; };
  const int64_t head_begin = param_begin(layout_.final_norm);
  // A frozen base under LoRA: the gradients are the adapters', one range per layer.
  const bool frozen = g_ == nullptr;
  if (!frozen) grads_ready(head_begin, layout_.total, -1);
  for (int64_t l = L - 1; l >= 0; --l) {
    if (opts_.recompute) layer_forward(static_cast<int>(l), /*full=*/false);
    layer_backward(static_cast<int>(l));
    if (frozen) {
      const auto [begin, end] = opts_.lora->layer_range(static_cast<int>(l));
      grads_ready(begin, end, static_cast<int>(l));
      continue;
    }
    const int64_t end = l + 1 < L ? param_begin(layout_.layers[l + 1].attn_norm) : head_begin;
    grads_ready(param_begin(layout_.layers[l].attn_norm), end, static_cast<int>(l));
  }
  if (!frozen) {
    mark("embedding_bwd");
    embedding_backward(ctx_, G(layout_.embed), d_x_, tokens_, T, C, V);
    grads_ready(param_begin(layout_.embed),
                param_begin(layout_.embed) + layout_.params[layout_.embed].numel, -1);
  }
  mark("other");
}

void CudaTransformer::layer_backward(int l) {
  LayerGradBufs g;
  g.d_x = d_x_;
  g.d_xn = d_xn_;
  g.d_act = d_act_;
  g.d_gu = d_gu_;
  g.d_att = d_att_;
  g.d_q = d_q_;
  g.d_k = d_k_;
  g.d_v = d_v_;
  g.d_q_bf = d_q_bf_;
  g.d_k_bf = d_k_bf_;
  g.d_qpre = d_qpre_;
  g.d_kpre = d_kpre_;
  g.d_lora_u = d_lora_u_;
  decoder_.layer_backward(step(), l, bufs(l), x_[l], g, g_);
}

// Downloads go through copy_to_host, which waits for the queued work of every stream first.
std::vector<float> CudaTransformer::download_logprob() const {
  return download_n(ctx_.stream, logprob_, T_);
}
std::vector<float> CudaTransformer::download_entropy() const {
  return download_n(ctx_.stream, entropy_, T_);
}
}  // namespace verl::model::cuda
