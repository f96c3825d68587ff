// The causal LM on CUDA (model/cuda/transformer.h): the CPU model's layer steps (src/model/transformer.cpp)
// with the CUDA ops. Per layer:
//   xn1 = rmsnorm(x);  q,k,v = split(xn1 Wqkv^T + bqkv);  [Qwen3: q,k = rmsnorm_D(q), rmsnorm_D(k)]
//   q,k = rope(q), rope(k);  att = causal_gqa(q,k,v);  x_mid = x + att Wo^T (+ bo)
//   xn2 = rmsnorm(x_mid);  gu = xn2 Wgu^T;  x_out = x_mid + (silu(g) * u) Wdown^T
#include "model/cuda/transformer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/dtype.h"
#include "core/dump.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/glue.h"
#include "ops/cuda/lm_head.h"
#include "ops/cuda/quant_linear.h"
#include "ops/cuda/value_head.h"

namespace verl::model::cuda {
using namespace ops::cuda;  // the kernels' wrappers and device memory
namespace {

constexpr size_t kAlign = 256;
size_t round_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// The model's outputs are written on its own stream: a copy on that stream and a wait for it alone
// (no device-wide synchronisation, so a log-prob pass on a worker thread neither waits for nor
// disturbs the rollout's stream, which may be capturing a graph: trainer.token_level_pipeline).
template <typename T>
std::vector<T> download_n(cudaStream_t stream, const T* p, int64_t n) {
  std::vector<T> h(static_cast<size_t>(std::max<int64_t>(n, 0)));
  if (h.empty()) return h;
  VERL_CUDA_CHECK(cudaMemcpyAsync(h.data(), p, h.size() * sizeof(T), cudaMemcpyDeviceToHost, stream));
  VERL_CUDA_CHECK(cudaStreamSynchronize(stream));
  return h;
}

}  // namespace

CudaTransformer::CudaTransformer(const CudaContext& ctx, const model::ModelConfig& cfg,
                                 const model::ParamLayout& layout, const bf16* weights,
                                 float* grads, const CudaTransformerOptions& options)
    : ctx_(ctx),
      cfg_(cfg),
      layout_(layout),
      opts_(options),
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
  VERL_CUDA_REQUIRE((g_ != nullptr) == opts_.trainable,
                    opts_.trainable ? "CudaTransformer: a trainable model needs its gradients"
                                    : "CudaTransformer: a forward-only model takes no gradients");
  lm_param_ = layout_.lm_head >= 0 ? layout_.lm_head : layout_.embed;
  const QuantizedLinears* qs = opts_.quantized;
  if (qs != nullptr) {
    VERL_CUDA_REQUIRE(!opts_.trainable,
                      "CudaTransformer: quantised linear layers are forward only (a reference "
                      "policy or a reward model); a trained model keeps bf16 weights");
    VERL_CUDA_REQUIRE(qs->num_layers() == cfg_.num_hidden_layers,
                      "CudaTransformer: " + std::to_string(qs->num_layers()) +
                          " quantised layers for a model of " +
                          std::to_string(cfg_.num_hidden_layers));
    const int64_t C = cfg_.hidden_size, F = cfg_.intermediate_size;
    const int64_t qd = cfg_.q_dim(), Q3 = qd + 2 * cfg_.kv_dim();
    for (int64_t l = 0; l < qs->num_layers(); ++l) {
      const QuantizedLinears::Layer& q = qs->layer(l);
      const auto fits = [](const ops::cuda::QuantMatrixView& v, int64_t n, int64_t k) {
        return v.rows == n && v.cols == k;
      };
      VERL_CUDA_REQUIRE(
          fits(q.wqkv, Q3, C) && fits(q.wo, C, qd) && fits(q.wgu, 2 * F, C) && fits(q.wdown, C, F),
          "CudaTransformer: layer " + std::to_string(l) +
              "'s quantised matrices do not have the config's shapes");
    }
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
  layers_.assign(static_cast<size_t>(own_layers ? L : 1), LayerBufs{});
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
    if (!opts_.trainable) return;  // the rest is for backward
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
  carve([&](auto*& p, int64_t count) { bytes += round_up(static_cast<size_t>(count) * sizeof(*p)); });
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

void CudaTransformer::dump(const char* name, int64_t layer, const bf16* x, int64_t rows,
                           int64_t cols) const {
  std::vector<uint16_t> h(static_cast<size_t>(rows * cols));
  copy_to_host(h.data(), x, h.size() * sizeof(uint16_t));
  const int64_t shape[2] = {rows, cols};
  const std::string n = layer >= 0 ? fmt::format("L{}.{}", layer, name) : std::string(name);
  verl::dump::tensor("cuda", n, h.data(), shape);
}

void CudaTransformer::dump(const char* name, int64_t layer, const float* x, int64_t rows,
                           int64_t cols) const {
  std::vector<float> h(static_cast<size_t>(rows * std::max<int64_t>(cols, 1)));
  copy_to_host(h.data(), x, h.size() * sizeof(float));
  const int64_t shape[2] = {rows, cols};
  const std::string n = layer >= 0 ? fmt::format("L{}.{}", layer, name) : std::string(name);
  verl::dump::tensor("cuda", n, h.data(), std::span<const int64_t>(shape, cols == 0 ? 1 : 2));
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
  mark("embedding");
  embedding_forward(ctx_, x_[0], tokens_, W(layout_.embed), T, C, V);
  if (dumping) dump("embed", -1, x_[0], T, C);
  for (int64_t l = 0; l < L; ++l) layer_forward(static_cast<int>(l));
  mark("norm_fwd");
  rmsnorm_forward(ctx_, h_final_, rstd_final_, x_[L], W(layout_.final_norm), T, C,
                  static_cast<float>(cfg_.rms_norm_eps));
  if (dumping) dump("final_norm", -1, h_final_, T, C);
  backward_ready_ = for_backward;
  if (cfg_.head != model::HeadKind::CausalLM) {
    // Token classification: every token's values. Sequence classification (a reward model) is
    // the same head read at each sequence's last token (values_at_last_tokens).
    mark("value_head_fwd");
    value_head_forward(ctx_, values_, h_final_, W(layout_.score), W(layout_.score_bias), T, C,
                       cfg_.num_labels);
    if (dumping) dump("value_head.values", -1, values_, T, cfg_.num_labels);
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
                        "the batch (entry " + std::to_string(i) + " is " +
                            std::to_string(b.head_rows[i]) + ", " + std::to_string(T) + " rows)");
    }
    VERL_CUDA_CHECK(cudaMemcpyAsync(head_rows_, b.head_rows.data(), n_head_ * 4,
                                    cudaMemcpyHostToDevice, s));
    gather_rows(ctx_, h_head_, h_final_, head_rows_, n_head_, C);
    gather_rows(ctx_, targets_head_, targets_, head_rows_, n_head_, 1);
  }
  const int64_t Th = n_head_ > 0 ? n_head_ : T;
  const bf16* h = n_head_ > 0 ? h_head_ : h_final_;
  const int32_t* tg = n_head_ > 0 ? targets_head_ : targets_;
  float* lp = n_head_ > 0 ? logprob_head_ : logprob_;
  float* ent = n_head_ > 0 ? entropy_head_ : entropy_;
  if (lm_probs_ != nullptr && for_backward) {
    lm_head_forward_keep_probs(ctx_, lp, ent, lse_head_, lm_probs_, h, W(lm_param_), tg, Th, C, V,
                               temperature, chunk_, lm_scratch_, lm_scratch_bytes_);
  } else {
    lm_head_forward(ctx_, lp, ent, lse_head_, h, W(lm_param_), tg, Th, C, V, temperature, chunk_,
                    lm_scratch_, lm_scratch_bytes_);
  }
  if (n_head_ > 0) {
    VERL_CUDA_CHECK(cudaMemsetAsync(logprob_, 0, T * sizeof(float), s));
    VERL_CUDA_CHECK(cudaMemsetAsync(entropy_, 0, T * sizeof(float), s));
    scatter_rows(ctx_, logprob_, logprob_head_, head_rows_, n_head_, 1);
    scatter_rows(ctx_, entropy_, entropy_head_, head_rows_, n_head_, 1);
  }
  if (dumping) {
    dump("lm_head.logprob", -1, logprob_, T, 0);
    dump("lm_head.entropy", -1, entropy_, T, 0);
  }
  mark("other");
}

void CudaTransformer::layer_forward(int l, bool full) {
  const model::LayerParams& p = layout_.layers[l];
  LayerBufs& a = bufs(l);
  const int64_t T = T_, B = B_, C = cfg_.hidden_size, F = cfg_.intermediate_size;
  const int64_t H = cfg_.num_attention_heads, Hkv = cfg_.num_key_value_heads, D = cfg_.head_dim;
  const int64_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), Q3 = qd + 2 * kvd;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const bf16* x_in = x_[l];
  bf16* x_out = x_[l + 1];
  const QuantizedLinears::Layer* ql = opts_.quantized ? &opts_.quantized->layer(l) : nullptr;

  mark("norm_fwd");
  rmsnorm_forward(ctx_, a.xn1, a.rstd1, x_in, W(p.attn_norm), T, C, eps);
  mark("gemm_fwd");
  project(qkv_, a.xn1, p.wqkv, ql ? &ql->wqkv : nullptr, p.bqkv, T, C, Q3);
  mark("elementwise_fwd");
  if (cfg_.qk_norm) {
    split_qkv(ctx_, a.q_pre, a.k_pre, a.v, qkv_, T, qd, kvd);
    mark("norm_fwd");
    rmsnorm_forward(ctx_, a.q, a.rstd_q, a.q_pre, W(p.q_norm), T * H, D, eps);
    rmsnorm_forward(ctx_, a.k, a.rstd_k, a.k_pre, W(p.k_norm), T * Hkv, D, eps);
    mark("elementwise_fwd");
    rope_forward(ctx_, a.q, positions_, inv_freq_.data(), T, H, D);
    rope_forward(ctx_, a.k, positions_, inv_freq_.data(), T, Hkv, D);
  } else {
    split_qkv_rope(ctx_, a.q, a.k, a.v, qkv_, positions_, inv_freq_.data(), T, H, Hkv, D);
  }
  // Named intermediates (core/dump.h), the CPU model's names; not inside backward's recompute.
  const bool dumping = full && verl::dump::enabled();
  if (dumping) {
    dump("attn_norm", l, a.xn1, T, C);
    dump("q", l, a.q, T, qd);
    dump("k", l, a.k, T, kvd);
    dump("v", l, a.v, T, kvd);
  }
  mark("attention_fwd");
  attention_forward(ctx_, a.att, a.lse, a.q, a.k, a.v, cu_, B, T, H, Hkv, D,
                    1.0f / std::sqrt(static_cast<float>(D)));
  mark("gemm_fwd");
  project(a.x_mid, a.att, p.wo, ql ? &ql->wo : nullptr, p.bo, T, qd, C);
  mark("elementwise_fwd");
  add_inplace(ctx_, a.x_mid, x_in, T * C);

  mark("norm_fwd");
  rmsnorm_forward(ctx_, a.xn2, a.rstd2, a.x_mid, W(p.mlp_norm), T, C, eps);
  mark("gemm_fwd");
  project(a.gu, a.xn2, p.wgu, ql ? &ql->wgu : nullptr, p.bgu, T, C, 2 * F);
  mark("elementwise_fwd");
  swiglu_forward(ctx_, a.act, a.gu, T, F);
  if (!full) return;
  mark("gemm_fwd");
  project(x_out, a.act, p.wdown, ql ? &ql->wdown : nullptr, p.bdown, T, F, C);
  mark("elementwise_fwd");
  add_inplace(ctx_, x_out, a.x_mid, T * C);
  if (dumping) {
    dump("attn", l, a.att, T, qd);
    dump("attn_res", l, a.x_mid, T, C);
    dump("mlp_norm", l, a.xn2, T, C);
    dump("gate_up", l, a.gu, T, 2 * F);
    dump("act", l, a.act, T, F);
    dump("out", l, x_out, T, C);
  }
}

void CudaTransformer::project(bf16* y, const bf16* x, int w, const QuantMatrixView* q, int b,
                              int64_t T, int64_t K, int64_t N) {
  if (q == nullptr) {
    linear_forward(ctx_, y, x, W(w), W(b), T, K, N);
  } else {
    VERL_CUDA_REQUIRE(
        q->codes != nullptr,
        "CudaTransformer::forward: the quantised matrices are asleep (wake them first)");
    quant_linear_forward(ctx_, y, x, *q, W(b), T, K, N, quant_scratch_, QuantPath::Auto,
                         opts_.quant_fused_max_tokens);
  }
}

void CudaTransformer::backward_host(const float* d_logprob, const float* d_entropy) {
  check_backward(model::HeadKind::CausalLM, "backward_host");
  VERL_CUDA_REQUIRE(T_ > 0, "CudaTransformer::backward before a forward");
  if (d_logprob) {
    VERL_CUDA_CHECK(cudaMemcpyAsync(d_lp_, d_logprob, T_ * sizeof(float), cudaMemcpyHostToDevice,
                                    ctx_.stream));
  }
  if (d_entropy) {
    VERL_CUDA_CHECK(cudaMemcpyAsync(d_ent_, d_entropy, T_ * sizeof(float),
                                    cudaMemcpyHostToDevice, ctx_.stream));
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
    lm_head_backward(ctx_, d_hh, G(lm_param_), d_logprob, d_entropy, h, W(lm_param_), tg,
                     lse_head_, ent, Th, C, V, temperature_, chunk_, lm_scratch_,
                     lm_scratch_bytes_);
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
  grads_ready(head_begin, layout_.total, -1);
  for (int64_t l = L - 1; l >= 0; --l) {
    if (opts_.recompute) layer_forward(static_cast<int>(l), /*full=*/false);
    layer_backward(static_cast<int>(l));
    const int64_t end = l + 1 < L ? param_begin(layout_.layers[l + 1].attn_norm) : head_begin;
    grads_ready(param_begin(layout_.layers[l].attn_norm), end, static_cast<int>(l));
  }
  mark("embedding_bwd");
  embedding_backward(ctx_, G(layout_.embed), d_x_, tokens_, T, C, V);
  grads_ready(param_begin(layout_.embed),
              param_begin(layout_.embed) + layout_.params[layout_.embed].numel, -1);
  mark("other");
}

void CudaTransformer::layer_backward(int l) {
  const model::LayerParams& p = layout_.layers[l];
  LayerBufs& a = bufs(l);
  const int64_t T = T_, B = B_, C = cfg_.hidden_size, F = cfg_.intermediate_size;
  const int64_t H = cfg_.num_attention_heads, Hkv = cfg_.num_key_value_heads, D = cfg_.head_dim;
  const int64_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim();
  cudaStream_t s = ctx_.stream;
  auto zero = [&](void* ptr, size_t bytes) {
    mark("memset_bwd");
    VERL_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, s));
  };

  // MLP branch. On entry d_x = dL/dx_out, also the residual part of dL/dx_mid.
  mark("gemm_bwd");
  linear_backward(ctx_, d_act_, G(p.wdown), G(p.bdown), d_x_, a.act, W(p.wdown), T, F, C,
                  /*accumulate_dx=*/false);
  mark("elementwise_bwd");
  swiglu_backward(ctx_, d_gu_, d_act_, a.gu, T, F, /*accumulate=*/false);
  mark("gemm_bwd");
  linear_backward(ctx_, d_xn_, G(p.wgu), G(p.bgu), d_gu_, a.xn2, W(p.wgu), T, C, 2 * F,
                  /*accumulate_dx=*/false);
  mark("norm_bwd");
  rmsnorm_backward(ctx_, d_x_, G(p.mlp_norm), d_xn_, a.x_mid, W(p.mlp_norm), a.rstd2, T, C);

  // Attention branch. Now d_x = dL/dx_mid, also the residual part of dL/dx_in.
  mark("gemm_bwd");
  linear_backward(ctx_, d_att_, G(p.wo), G(p.bo), d_x_, a.att, W(p.wo), T, qd, C,
                  /*accumulate_dx=*/false);
  zero(d_q_, T * qd * sizeof(float));
  zero(d_k_, T * kvd * sizeof(float));
  zero(d_v_, T * kvd * sizeof(float));
  mark("attention_bwd");
  attention_backward(ctx_, d_q_, d_k_, d_v_, d_att_, a.q, a.k, a.v, a.att, a.lse, cu_, B, T, H,
                     Hkv, D, 1.0f / std::sqrt(static_cast<float>(D)));
  mark("elementwise_bwd");
  bf16* d_qkv = qkv_;  // the forward's qkv scratch is free now
  if (cfg_.qk_norm) {
    rope_backward(ctx_, d_q_, positions_, inv_freq_.data(), T, H, D);
    rope_backward(ctx_, d_k_, positions_, inv_freq_.data(), T, Hkv, D);
    convert(ctx_, d_q_bf_, d_q_, T * qd);
    convert(ctx_, d_k_bf_, d_k_, T * kvd);
    mark("norm_bwd");
    rmsnorm_backward(ctx_, d_qpre_, G(p.q_norm), d_q_bf_, a.q_pre, W(p.q_norm), a.rstd_q, T * H,
                     D, /*accumulate_dx=*/false);
    rmsnorm_backward(ctx_, d_kpre_, G(p.k_norm), d_k_bf_, a.k_pre, W(p.k_norm), a.rstd_k,
                     T * Hkv, D, /*accumulate_dx=*/false);
    mark("elementwise_bwd");
    pack_qkv(ctx_, d_qkv, d_qpre_, d_kpre_, d_v_, T, qd, kvd);
  } else {
    rope_backward_pack_qkv(ctx_, d_qkv, d_q_, d_k_, d_v_, positions_, inv_freq_.data(), T, H,
                           Hkv, D);
  }
  mark("gemm_bwd");
  linear_backward(ctx_, d_xn_, G(p.wqkv), G(p.bqkv), d_qkv, a.xn1, W(p.wqkv), T, C,
                  qd + 2 * kvd, /*accumulate_dx=*/false);
  mark("norm_bwd");
  rmsnorm_backward(ctx_, d_x_, G(p.attn_norm), d_xn_, x_[l], W(p.attn_norm), a.rstd1, T, C);
}

// Downloads go through copy_to_host, which waits for the queued work of every stream first.
std::vector<float> CudaTransformer::download_logprob() const {
  return download_n(ctx_.stream, logprob_, T_);
}
std::vector<float> CudaTransformer::download_entropy() const {
  return download_n(ctx_.stream, entropy_, T_);
}
}  // namespace verl::model::cuda
