// LoRA adapter GEMMs on CUDA (model/cuda/lora.h): the forward's two GEMMs per adapted module and
// the backward's four, all through ops::cuda's cuBLASLt helper. Host code.
#include "model/cuda/lora.h"

#include <algorithm>
#include <string>

#include "ops/cuda/gemm.h"
#include "ops/cuda/ops_cuda.h"

namespace verl::model::cuda {
using ops::cuda::detail::Gemm;
using ops::cuda::detail::run_gemm;

namespace {

// The adapters' forward GEMMs. Batch-invariant mode: on gemm_invariant.cu, whose row bits hold at
// any row count by construction (run_gemm would take it for the beta = 1 GEMM anyway; x A^T has
// m = r, a shape the cuBLASLt equivalence test does not cover, so it goes there too).
void forward_gemm(const CudaContext& ctx, const Gemm& g, const char* what) {
  if (ctx.batch_invariant()) {
    ops::cuda::detail::run_gemm_invariant(ctx, g, what);
  } else {
    run_gemm(ctx, g, what);
  }
}

}  // namespace

CudaLora::CudaLora(const model::LoraWeights& lora)
    : r_(lora.rank()), numel_(lora.layout.total), scale_(lora.scale()) {
  const int64_t L = lora.base.num_hidden_layers;
  VERL_CUDA_REQUIRE(static_cast<int64_t>(lora.a.size()) == L && r_ > 0,
                    "CudaLora: an adapter of rank " + std::to_string(r_) + " with " +
                        std::to_string(lora.a.size()) + " layers for a base of " +
                        std::to_string(L));
  sites_.assign(static_cast<size_t>(L), {});
  layer_begin_.assign(static_cast<size_t>(L) + 1, 0);
  // Which of the decoder's projections each HF module feeds.
  constexpr LoraSite kSiteOf[kNumLoraTargets] = {LoraSite::Qkv, LoraSite::Qkv, LoraSite::Qkv,
                                                 LoraSite::O,   LoraSite::Gu,  LoraSite::Gu,
                                                 LoraSite::Down};
  int64_t at = 0;
  for (int64_t l = 0; l < L; ++l) {
    layer_begin_[static_cast<size_t>(l)] = at;
    for (int t = 0; t < kNumLoraTargets; ++t) {
      const int ia = lora.a[static_cast<size_t>(l)][t], ib = lora.b[static_cast<size_t>(l)][t];
      if (ia < 0) continue;
      const model::ParamInfo &pa = lora.layout.params[ia], &pb = lora.layout.params[ib];
      // LoraWeights::create lays the adapters out layer by layer: a layer's gradients are one
      // range, which data parallelism reduces when that layer's backward is done.
      VERL_CUDA_REQUIRE(pa.offset >= layer_begin_[static_cast<size_t>(l)],
                        "CudaLora: the adapter layout is not in layer order at " + pa.name);
      at = std::max({at, pa.offset + pa.numel, pb.offset + pb.numel});
      Site& s = sites_[static_cast<size_t>(l)][static_cast<size_t>(kSiteOf[t])];
      const auto target = static_cast<LoraTarget>(t);
      s.seg[static_cast<size_t>(s.count++)] =
          Segment{pa.offset, pb.offset, lora.base_row0(target), lora.out_features(target)};
    }
  }
  layer_begin_[static_cast<size_t>(L)] = at;
  VERL_CUDA_REQUIRE(at == numel_, "CudaLora: the adapter layout has elements outside its layers");
}

void CudaLora::x_a(const CudaContext& ctx, bf16* u, const bf16* x, const bf16* a, int64_t T,
                   int64_t K) const {
  // u^T [r, T] = op_T(A^T: [K, r]) x^T [K, T], the linear layer's forward form.
  forward_gemm(ctx,
               Gemm{CUBLAS_OP_T, CUBLAS_OP_N, r_, T, K, a, K, x, K, CUDA_R_16BF, u, r_, CUDA_R_16BF,
                    /*beta=*/0.0f, nullptr},
               "lora (x A^T)");
}

void CudaLora::forward(const CudaContext& ctx, int l, LoraSite where, bf16* y, const bf16* x,
                       int64_t T, int64_t K, int64_t N, bf16* u) const {
  const Site& s = site(l, where);
  if (!active() || s.count == 0 || T == 0) return;
  VERL_CUDA_REQUIRE(u != nullptr, "CudaLora::forward: no scratch for x A^T");
  for (int i = 0; i < s.count; ++i) {
    const Segment& g = s.seg[static_cast<size_t>(i)];
    x_a(ctx, u, x, w_ + g.a, T, K);
    // y[:, col0 : col0 + cols] (ld N) += scale u B^T, B [cols, r]: in column-major terms
    // y_seg^T [cols, T] = scale op_T(B^T: [r, cols]) u^T [r, T] + y_seg^T.
    forward_gemm(ctx,
                 Gemm{CUBLAS_OP_T, CUBLAS_OP_N, g.cols, T, r_, w_ + g.b, r_, u, r_, CUDA_R_16BF,
                      y + g.col0, N, CUDA_R_16BF, /*beta=*/1.0f, nullptr, /*alpha=*/scale_},
                 "lora forward (u B^T)");
  }
}

void CudaLora::backward(const CudaContext& ctx, int l, LoraSite where, bf16* d_x, const bf16* d_y,
                        const bf16* x, int64_t T, int64_t K, int64_t N, bf16* u, bf16* d_u) const {
  const Site& s = site(l, where);
  VERL_CUDA_REQUIRE(enabled_,
                    "CudaLora::backward: the adapters are switched off (log-prob "
                    "passes only)");
  if (w_ == nullptr || s.count == 0 || T == 0) return;
  VERL_CUDA_REQUIRE(u != nullptr && d_u != nullptr, "CudaLora::backward: no scratch");
  for (int i = 0; i < s.count; ++i) {
    const Segment& g = s.seg[static_cast<size_t>(i)];
    const bf16 *A = w_ + g.a, *B = w_ + g.b;
    const bf16* dy = d_y + g.col0;  // g's columns of d_y, ld N
    x_a(ctx, u, x, A, T, K);        // the forward's bits
    if (g_ != nullptr) {
      // d_B^T [r, cols] += scale u^T [r, T] op_T(dy^T: [cols, T]), fp32.
      run_gemm(ctx,
               Gemm{CUBLAS_OP_N, CUBLAS_OP_T, r_, g.cols, T, u, r_, dy, N, CUDA_R_16BF, g_ + g.b,
                    r_, CUDA_R_32F, /*beta=*/1.0f, nullptr, /*alpha=*/scale_},
               "lora backward (d_B)");
    }
    // d_u^T [r, T] = scale B^T [r, cols] dy^T [cols, T], bf16.
    run_gemm(ctx,
             Gemm{CUBLAS_OP_N, CUBLAS_OP_N, r_, T, g.cols, B, r_, dy, N, CUDA_R_16BF, d_u, r_,
                  CUDA_R_16BF, /*beta=*/0.0f, nullptr, /*alpha=*/scale_},
             "lora backward (d_u)");
    // d_x += d_u A and d_A += d_u^T x: the linear layer's backward with A as its weight.
    ops::cuda::linear_backward(ctx, d_x, g_ != nullptr ? g_ + g.a : nullptr, nullptr, d_u, x, A, T,
                               K, r_, /*accumulate_dx=*/true);
  }
}

}  // namespace verl::model::cuda
