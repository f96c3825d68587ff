// The CUDA decoder (model/cuda/decoder.h): the layer recipe once, with the packed (training) and
// paged (rollout) contexts choosing kernels where they differ. Host code; kernels live in
// src/ops/cuda.
#include "model/cuda/decoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "core/dump.h"
#include "ops/cuda/attention.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/glue.h"
#include "ops/cuda/lm_head.h"
#include "ops/cuda/value_head.h"

namespace verl::model::cuda {
using namespace ops::cuda;  // the kernels' wrappers and device memory

CudaDecoder::CudaDecoder(const CudaContext& ctx, const model::ModelConfig& cfg,
                         const model::ParamLayout& layout, const bf16* weights,
                         const CudaDecoderOptions& options)
    : ctx_(ctx), cfg_(cfg), layout_(layout), w_(weights), opts_(options) {
  // The stronger of the context's and the options' modes (Fast < MatchTrainer < BatchInvariant).
  ctx_.numerics = std::max(ctx_.numerics, opts_.numerics);
  const QuantizedLinears* qs = opts_.quantized;
  if (opts_.lora != nullptr) {
    VERL_CUDA_REQUIRE(qs == nullptr,
                      "CudaDecoder: LoRA adapters run on bf16 base weights, not a "
                      "quantised set");
    VERL_CUDA_REQUIRE(opts_.lora->num_layers() == cfg_.num_hidden_layers,
                      "CudaDecoder: an adapter of " + std::to_string(opts_.lora->num_layers()) +
                          " layers for a model of " + std::to_string(cfg_.num_hidden_layers));
  }
  if (qs == nullptr) return;
  VERL_CUDA_REQUIRE(qs->num_layers() == cfg_.num_hidden_layers,
                    "CudaDecoder: " + std::to_string(qs->num_layers()) +
                        " quantised layers for a model of " +
                        std::to_string(cfg_.num_hidden_layers));
  const int64_t C = cfg_.hidden_size, F = cfg_.intermediate_size;
  const int64_t qd = cfg_.q_dim(), Q3 = qd + 2 * cfg_.kv_dim();
  for (int64_t l = 0; l < qs->num_layers(); ++l) {
    const QuantizedLinears::Layer& q = qs->layer(l);
    const auto fits = [](const QuantMatrixView& v, int64_t n, int64_t k) {
      return v.rows == n && v.cols == k;
    };
    VERL_CUDA_REQUIRE(
        fits(q.wqkv, Q3, C) && fits(q.wo, C, qd) && fits(q.wgu, 2 * F, C) && fits(q.wdown, C, F),
        "CudaDecoder: layer " + std::to_string(l) +
            "'s quantised matrices do not have the config's shapes");
  }
}

void CudaDecoder::embed(const DecoderStep& s, bf16* x) const {
  mark(s, Section::Embed);
  embedding_forward(ctx_, x, s.ids, weight(layout_.embed), s.T, cfg_.hidden_size, cfg_.vocab_size);
  if (s.paged == nullptr && verl::dump::enabled()) {
    dump_tensor("embed", -1, x, s.T, cfg_.hidden_size);
  }
}

void CudaDecoder::project(const DecoderStep& s, bf16* y, const bf16* x, int w,
                          const QuantMatrixView* q, int b, int64_t K, int64_t N, int l,
                          LoraSite site) const {
  if (q == nullptr) {
    linear_forward(ctx_, y, x, weight(w), weight(b), s.T, K, N);
    // PEFT: base(x) (its bias included), then the adapters added (none while switched off).
    if (opts_.lora != nullptr) opts_.lora->forward(ctx_, l, site, y, x, s.T, K, N, s.lora_u);
    return;
  }
  VERL_CUDA_REQUIRE(q->codes != nullptr,
                    "CudaDecoder: the quantised matrices are asleep (wake them first)");
  quant_linear_forward(ctx_, y, x, *q, weight(b), s.T, K, N, s.quant_scratch, QuantPath::Auto,
                       opts_.quant_fused_max_tokens);
}

void CudaDecoder::project_backward(const DecoderStep& s, const LayerGradBufs& g, bf16* d_x,
                                   float* grads, const bf16* d_y, const bf16* x, int w, int b,
                                   int64_t K, int64_t N, int l, LoraSite site) const {
  const auto G = [&](int i) {
    return grads != nullptr && i >= 0 ? grads + layout_.params[i].offset : nullptr;
  };
  mark(s, Section::GemmBwd);
  linear_backward(ctx_, d_x, G(w), G(b), d_y, x, weight(w), s.T, K, N, /*accumulate_dx=*/false);
  if (opts_.lora != nullptr) {
    opts_.lora->backward(ctx_, l, site, d_x, d_y, x, s.T, K, N, s.lora_u, g.d_lora_u);
  }
}

void CudaDecoder::layer_forward(const DecoderStep& s, int l, LayerActs& a, const bf16* x_in,
                                bf16* x_out, bool full) const {
  const model::LayerParams& p = layout_.layers[l];
  const int64_t T = s.T, C = cfg_.hidden_size, F = cfg_.intermediate_size;
  const int64_t H = cfg_.num_attention_heads, Hkv = cfg_.num_key_value_heads, D = cfg_.head_dim;
  const int64_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), Q3 = qd + 2 * kvd;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const QuantizedLinears::Layer* ql = opts_.quantized ? &opts_.quantized->layer(l) : nullptr;
  const PagedKv* kv = s.paged;
  // Named intermediates (core/dump.h), the CPU model's names: the packed path only (a paged step
  // may be under graph capture), and not inside backward's recompute.
  const bool dumping = kv == nullptr && full && verl::dump::enabled();

  // Attention block. The paged stream takes the previous block's output inside the norm
  // (add_rmsnorm_forward: the bits of the trainer's add_inplace + rmsnorm_forward, one launch).
  mark(s, Section::AttnNorm);
  if (kv == nullptr) {
    rmsnorm_forward(ctx_, a.xn1, a.rstd1, x_in, weight(p.attn_norm), T, C, eps);
  } else if (l == 0) {
    rmsnorm_forward(ctx_, a.xn1, nullptr, x_out, weight(p.attn_norm), T, C, eps);
  } else {
    add_rmsnorm_forward(ctx_, a.xn1, nullptr, x_out, a.y, weight(p.attn_norm), T, C, eps);
  }
  mark(s, Section::QkvProj);
  project(s, s.qkv, a.xn1, p.wqkv, ql ? &ql->wqkv : nullptr, p.bqkv, C, Q3, l, LoraSite::Qkv);
  mark(s, Section::QkRope);
  if (kv != nullptr) {
    // One kernel: [Qwen3: q/k norm], RoPE, q out, k and v into the cache at the slot mapping.
    qkv_rope_paged_write(ctx_, a.q, kv->k + l * kv->layer_stride, kv->v + l * kv->layer_stride,
                         s.qkv, weight(p.q_norm), weight(p.k_norm), eps, s.positions, s.inv_freq,
                         kv->slots, T, H, Hkv, D);
  } else if (cfg_.qk_norm) {
    split_qkv(ctx_, a.q_pre, a.k_pre, a.v, s.qkv, T, qd, kvd);
    mark(s, Section::QkNorm);
    rmsnorm_forward(ctx_, a.q, a.rstd_q, a.q_pre, weight(p.q_norm), T * H, D, eps);
    rmsnorm_forward(ctx_, a.k, a.rstd_k, a.k_pre, weight(p.k_norm), T * Hkv, D, eps);
    mark(s, Section::QkRope);
    rope_forward(ctx_, a.q, s.positions, s.inv_freq, T, H, D);
    rope_forward(ctx_, a.k, s.positions, s.inv_freq, T, Hkv, D);
  } else {
    split_qkv_rope(ctx_, a.q, a.k, a.v, s.qkv, s.positions, s.inv_freq, T, H, Hkv, D);
  }
  if (dumping) {
    dump_tensor("attn_norm", l, a.xn1, T, C);
    dump_tensor("q", l, a.q, T, qd);
    dump_tensor("k", l, a.k, T, kvd);
    dump_tensor("v", l, a.v, T, kvd);
  }
  mark(s, Section::Attention);
  attention(s, l, a);
  mark(s, Section::OProj);
  project(s, kv != nullptr ? a.y : a.x_mid, a.att, p.wo, ql ? &ql->wo : nullptr, p.bo, qd, C, l,
          LoraSite::O);
  if (kv != nullptr) {
    mark(s, Section::MlpNorm);
    add_rmsnorm_forward(ctx_, a.xn2, nullptr, x_out, a.y, weight(p.mlp_norm), T, C, eps);
  } else {
    mark(s, Section::Residual);
    add_inplace(ctx_, a.x_mid, x_in, T * C);
    mark(s, Section::MlpNorm);
    rmsnorm_forward(ctx_, a.xn2, a.rstd2, a.x_mid, weight(p.mlp_norm), T, C, eps);
  }

  // Feed-forward block: dense SwiGLU (a mixture of experts would route here).
  mark(s, Section::GateUp);
  project(s, a.gu, a.xn2, p.wgu, ql ? &ql->wgu : nullptr, p.bgu, C, 2 * F, l, LoraSite::Gu);
  mark(s, Section::Swiglu);
  swiglu_forward(ctx_, a.act, a.gu, T, F);
  if (!full) return;
  mark(s, Section::Down);
  // Paged: the output waits in y for the next norm.
  project(s, kv != nullptr ? a.y : x_out, a.act, p.wdown, ql ? &ql->wdown : nullptr, p.bdown, F, C,
          l, LoraSite::Down);
  if (kv != nullptr) return;
  mark(s, Section::Residual);
  add_inplace(ctx_, x_out, a.x_mid, T * C);
  if (dumping) {
    dump_tensor("attn", l, a.att, T, qd);
    dump_tensor("attn_res", l, a.x_mid, T, C);
    dump_tensor("mlp_norm", l, a.xn2, T, C);
    dump_tensor("gate_up", l, a.gu, T, 2 * F);
    dump_tensor("act", l, a.act, T, F);
    dump_tensor("out", l, x_out, T, C);
  }
}

void CudaDecoder::layer_backward(const DecoderStep& s, int l, const LayerActs& a, const bf16* x_in,
                                 const LayerGradBufs& g, float* grads) const {
  const model::LayerParams& p = layout_.layers[l];
  const int64_t T = s.T, B = s.B, C = cfg_.hidden_size, F = cfg_.intermediate_size;
  const int64_t H = cfg_.num_attention_heads, Hkv = cfg_.num_key_value_heads, D = cfg_.head_dim;
  const int64_t qd = cfg_.q_dim(), kvd = cfg_.kv_dim();
  // A frozen base (null grads, LoRA training) writes no base gradient at all.
  const auto G = [&](int i) {
    return grads != nullptr && i >= 0 ? grads + layout_.params[i].offset : nullptr;
  };
  const auto W = [&](int i) { return weight(i); };
  auto zero = [&](void* ptr, size_t bytes) {
    mark(s, Section::MemsetBwd);
    VERL_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, ctx_.stream));
  };

  // MLP branch. On entry d_x = dL/dx_out, also the residual part of dL/dx_mid.
  project_backward(s, g, g.d_act, grads, g.d_x, a.act, p.wdown, p.bdown, F, C, l, LoraSite::Down);
  mark(s, Section::ElementwiseBwd);
  swiglu_backward(ctx_, g.d_gu, g.d_act, a.gu, T, F, /*accumulate=*/false);
  project_backward(s, g, g.d_xn, grads, g.d_gu, a.xn2, p.wgu, p.bgu, C, 2 * F, l, LoraSite::Gu);
  mark(s, Section::NormBwd);
  rmsnorm_backward(ctx_, g.d_x, G(p.mlp_norm), g.d_xn, a.x_mid, W(p.mlp_norm), a.rstd2, T, C);

  // Attention branch. Now d_x = dL/dx_mid, also the residual part of dL/dx_in.
  project_backward(s, g, g.d_att, grads, g.d_x, a.att, p.wo, p.bo, qd, C, l, LoraSite::O);
  zero(g.d_q, T * qd * sizeof(float));
  zero(g.d_k, T * kvd * sizeof(float));
  zero(g.d_v, T * kvd * sizeof(float));
  mark(s, Section::AttentionBwd);
  attention_backward(ctx_, g.d_q, g.d_k, g.d_v, g.d_att, a.q, a.k, a.v, a.att, a.lse, s.cu_seqlens,
                     B, T, H, Hkv, D, 1.0f / std::sqrt(static_cast<float>(D)));
  mark(s, Section::ElementwiseBwd);
  bf16* d_qkv = s.qkv;  // the forward's qkv scratch is free now
  if (cfg_.qk_norm) {
    rope_backward(ctx_, g.d_q, s.positions, s.inv_freq, T, H, D);
    rope_backward(ctx_, g.d_k, s.positions, s.inv_freq, T, Hkv, D);
    convert(ctx_, g.d_q_bf, g.d_q, T * qd);
    convert(ctx_, g.d_k_bf, g.d_k, T * kvd);
    mark(s, Section::NormBwd);
    rmsnorm_backward(ctx_, g.d_qpre, G(p.q_norm), g.d_q_bf, a.q_pre, W(p.q_norm), a.rstd_q, T * H,
                     D, /*accumulate_dx=*/false);
    rmsnorm_backward(ctx_, g.d_kpre, G(p.k_norm), g.d_k_bf, a.k_pre, W(p.k_norm), a.rstd_k, T * Hkv,
                     D, /*accumulate_dx=*/false);
    mark(s, Section::ElementwiseBwd);
    pack_qkv(ctx_, d_qkv, g.d_qpre, g.d_kpre, g.d_v, T, qd, kvd);
  } else {
    rope_backward_pack_qkv(ctx_, d_qkv, g.d_q, g.d_k, g.d_v, s.positions, s.inv_freq, T, H, Hkv, D);
  }
  project_backward(s, g, g.d_xn, grads, d_qkv, a.xn1, p.wqkv, p.bqkv, C, qd + 2 * kvd, l,
                   LoraSite::Qkv);
  mark(s, Section::NormBwd);
  rmsnorm_backward(ctx_, g.d_x, G(p.attn_norm), g.d_xn, x_in, W(p.attn_norm), a.rstd1, T, C);
}

void CudaDecoder::attention(const DecoderStep& s, int l, LayerActs& a) const {
  const int64_t T = s.T, B = s.B;
  const int64_t H = cfg_.num_attention_heads, Hkv = cfg_.num_key_value_heads, D = cfg_.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const PagedKv* kv = s.paged;
  if (kv == nullptr) {
    attention_forward(ctx_, a.att, a.lse, a.q, a.k, a.v, s.cu_seqlens, B, T, H, Hkv, D, scale);
    return;
  }
  const bf16* k = kv->k + l * kv->layer_stride;
  const bf16* v = kv->v + l * kv->layer_stride;
  // Items on the training kernel's arithmetic (attention_forward_paged: the trainer's bits row
  // for row) and the rest on the paged kernels.
  const bool train_decode = kv->plan.decode && kv->training_decode;
  const bool train_prefill = kv->plan.prefill && kv->training_prefill;
  if (train_decode || train_prefill) {
    attention_forward_paged(ctx_, a.att, a.q, k, v, kv->block_tables, kv->W, kv->block_size,
                            s.cu_seqlens, s.positions, B, T, H, Hkv, D, scale, train_decode,
                            train_prefill);
  }
  PagedAttentionPlan rest = kv->plan;
  rest.decode = kv->plan.decode && !train_decode;
  rest.prefill = kv->plan.prefill && !train_prefill;
  if (rest.decode || rest.prefill) {
    paged_attention(ctx_, a.att, a.q, k, v, kv->block_tables, kv->W, s.cu_seqlens, s.positions, B,
                    T, H, Hkv, D, kv->block_size, scale, rest, kv->workspace, kv->workspace_bytes);
  }
}

void CudaDecoder::final_norm(const DecoderStep& s, bf16* h, float* rstd, const bf16* x) const {
  mark(s, Section::FinalNorm);
  rmsnorm_forward(ctx_, h, rstd, x, weight(layout_.final_norm), s.T, cfg_.hidden_size,
                  static_cast<float>(cfg_.rms_norm_eps));
  if (s.paged == nullptr && verl::dump::enabled()) {
    dump_tensor("final_norm", -1, h, s.T, cfg_.hidden_size);
  }
}

void CudaDecoder::final_norm_rows(const DecoderStep& s, bf16* h, bf16* gx, bf16* gy, const bf16* x,
                                  const bf16* y, const int32_t* rows, int64_t n) const {
  const int64_t C = cfg_.hidden_size;
  mark(s, Section::FinalNorm);
  // A row gather is an embedding lookup with the stream as the table.
  embedding_forward(ctx_, gx, rows, x, n, C, s.T);
  embedding_forward(ctx_, gy, rows, y, n, C, s.T);
  add_rmsnorm_forward(ctx_, h, nullptr, gx, gy, weight(layout_.final_norm), n, C,
                      static_cast<float>(cfg_.rms_norm_eps));
}

void CudaDecoder::lm_head_logits(float* logits, const bf16* h, int64_t n) const {
  const int64_t C = cfg_.hidden_size, V = cfg_.vocab_size;
  detail::run_gemm(ctx_,
                   detail::Gemm{CUBLAS_OP_T, CUBLAS_OP_N, V, n, C, weight(lm_head_param()), C, h, C,
                                CUDA_R_16BF, logits, V, CUDA_R_32F, 0.0f},
                   "rollout lm_head");
}

void CudaDecoder::lm_head_logprobs(float* logprob, float* entropy, float* lse, bf16* probs,
                                   const bf16* h, const int32_t* targets, int64_t n,
                                   float temperature, int64_t chunk, void* scratch,
                                   size_t scratch_bytes) const {
  const int64_t C = cfg_.hidden_size, V = cfg_.vocab_size;
  const bf16* w = weight(lm_head_param());
  if (probs != nullptr) {
    lm_head_forward_keep_probs(ctx_, logprob, entropy, lse, probs, h, w, targets, n, C, V,
                               temperature, chunk, scratch, scratch_bytes);
  } else {
    lm_head_forward(ctx_, logprob, entropy, lse, h, w, targets, n, C, V, temperature, chunk,
                    scratch, scratch_bytes);
  }
}

size_t CudaDecoder::lm_head_scratch_bytes(int64_t n, int64_t chunk) const {
  return lm_head_forward_scratch_bytes(n, cfg_.vocab_size, chunk);
}

void CudaDecoder::value_head(float* values, const bf16* h, int64_t n) const {
  value_head_forward(ctx_, values, h, weight(layout_.score), weight(layout_.score_bias), n,
                     cfg_.hidden_size, cfg_.num_labels);
}

void CudaDecoder::forward_paged(const DecoderStep& s, LayerActs& a, bf16* x, const int32_t* rows,
                                int64_t n, bf16* gx, bf16* gy, bf16* h, float* logits) const {
  embed(s, x);
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) {
    layer_forward(s, static_cast<int>(l), a, x, x);
  }
  // Only the sampled rows go through the last residual add, the final norm and the LM head.
  final_norm_rows(s, h, gx, gy, x, a.y, rows, n);
  mark(s, Section::LmHead);
  lm_head_logits(logits, h, n);
}

void dump_tensor(const char* name, int64_t layer, const bf16* x, int64_t rows, int64_t cols) {
  std::vector<uint16_t> host(static_cast<size_t>(rows * cols));
  copy_to_host(host.data(), x, host.size() * sizeof(uint16_t));
  const int64_t shape[2] = {rows, cols};
  const std::string n = layer >= 0 ? fmt::format("L{}.{}", layer, name) : std::string(name);
  verl::dump::tensor("cuda", n, host.data(), shape);
}

void dump_tensor(const char* name, int64_t layer, const float* x, int64_t rows, int64_t cols) {
  std::vector<float> host(static_cast<size_t>(rows * std::max<int64_t>(cols, 1)));
  copy_to_host(host.data(), x, host.size() * sizeof(float));
  const int64_t shape[2] = {rows, cols};
  const std::string n = layer >= 0 ? fmt::format("L{}.{}", layer, name) : std::string(name);
  verl::dump::tensor("cuda", n, host.data(), std::span<const int64_t>(shape, cols == 0 ? 1 : 2));
}

}  // namespace verl::model::cuda
