// Tolerances of the CUDA op tests, in one place: |got - want| <= atol + rtol |want|, where want is
// the CPU op (fp32) run on the same bf16-rounded inputs the GPU sees. So the only differences
// are the rounding of the GPU's bf16 outputs and the order of fp32 operations.
#pragma once

namespace verl::ops::cuda::test {

struct Tol {
  double atol, rtol;
};

// A bf16 result computed in fp32 and rounded once: half an ulp is 2^-8 of the value; a different
// fp32 summation order can move it across a rounding boundary, so allow one ulp (2^-7).
inline constexpr Tol kBf16Out{1e-5, 1.0 / 128};
// bf16 GEMM output: fp32 accumulation over K in cuBLASLt's order, then one bf16 rounding.
inline constexpr Tol kBf16Gemm{1e-4, 1.0 / 128};
// fp32 GEMM output (d_w) from bf16 operands: the products are exact in fp32, only the order of
// the T-long sums differs.
inline constexpr Tol kF32Gemm{1e-4, 1e-4};
// fp32 storage kernels vs the CPU op: reduction order, fused multiply-adds, 1-2 ulp sin/cos/exp.
inline constexpr Tol kF32Kernel{1e-5, 1e-5};
// fp32 sums over hundreds of rows (weight gradients) in another order: cancellation between terms
// makes the relative error of the sum larger than that of its terms (seen: 7e-5 over 257 rows).
inline constexpr Tol kF32RowSum{1e-5, 2e-4};
// A bf16 output that accumulates (d_x += update): it is rounded to bf16 at the magnitude of its
// operands, so the bound is relative to |initial| + |update|, not to the (possibly cancelled) sum.
inline constexpr Tol kBf16Accumulate{1e-4, 1.0 / 64};
// AdamW: a few fp32 operations per element, contracted into FMAs differently on each side.
inline constexpr Tol kAdamW{1e-6, 1e-5};
// Sums of squares accumulated in double.
inline constexpr Tol kF64Sum{0.0, 1e-12};

}  // namespace verl::ops::cuda::test
// Attention out (bf16): a p-weighted mean of v rounded once; exp differs (CPU fast_exp vs expf) and
// the sums run in another order, so a value can cross a rounding boundary (seen on H200: 0.5 of
// this).
namespace verl::ops::cuda::test {
inline constexpr Tol kAttnOut{2e-5, 1.0 / 128};
}
// Attention d_q / d_k / d_v (fp32, accumulated): sums of hundreds of p (dp - D) terms in another
// order, with exp from two implementations (seen on H200 over 257 rows: at most 0.08 of this).
namespace verl::ops::cuda::test {
inline constexpr Tol kAttnGrad{2e-5, 2e-4};
}
// LM head forward (logprob, entropy, lse; fp32): the same fp32 logits up to the GEMM's summation
// order, then fp32 sums over V (the CPU op sums in double) and expf vs the CPU's 2-ulp exp.
namespace verl::ops::cuda::test {
inline constexpr Tol kLmHeadForward{1e-4, 1e-5};
}
// LM head d_h (bf16, accumulated) and d_w (fp32, accumulated), used with a scale of
// |init| + |update| + sum of |terms|: one bf16 rounding of d_h (2^-8 of |init| + |update|) plus the
// bf16 storage of d_z (at most 2^-9 of the summed term magnitudes, lm_head.h).
namespace verl::ops::cuda::test {
inline constexpr Tol kLmHeadGrad{1e-5, 1.0 / 128};
}
// Whole model on CUDA (bf16 weights and activations, fp32 accumulation) against the CPU model
// (fp32, on the same bf16-rounded weights), tests/cuda/test_transformer_cuda.cpp, and against the
// transformers fp32 dumps. Log-probs and entropies: absolute (nats), a few bf16 roundings per layer
// (activations, and P in the tensor-core attention) over a tiny golden model whose logits spread
// over ~10 nats. Measured on the H200 (2026-11-29): at most 0.066 at temperature 1 and 0.088 at 0.7
// against transformers, 0.064 against the CPU model.
namespace verl::ops::cuda::test {
inline constexpr Tol kModelLogprob{1e-1, 0.0};
}
// Parameter gradients of sum(logprob): max |gpu - cpu| over a tensor relative to max |cpu|.
// Measured on the H200 (2026-11-29, LM head keeping bf16 p): 2.4% against the CPU model; 5.4%
// (qwen2), 3.9% (llama3), 4.9% (qwen3) against the transformers fp32 dumps, whose weights the GPU
// also rounds to bf16.
namespace verl::ops::cuda::test {
inline constexpr double kModelGradRel = 7.5e-2;
}
// One AdamW step from the same weights: the first step moves each weight by about lr sign(g), so
// where the two gradients differ in sign the weights differ by up to 2 lr; bound = this times lr.
namespace verl::ops::cuda::test {
inline constexpr double kModelAdamWInLr = 2.05;
}
// ... and only a small fraction of the weights may differ by more than one lr.
namespace verl::ops::cuda::test {
inline constexpr double kModelAdamWFarFraction = 0.10;
}
// GPU sampler vs the CPU Sampler on the same fp32 logits (tests/cuda/test_sampling.cpp): the
// log-prob is log softmax at the temperature with fp32 exp (CUDA expf vs glibc, 1-2 ulp) summed in
// double on both sides, so it agrees far below this.
namespace verl::ops::cuda::test {
inline constexpr double kSampleLogprob = 1e-5;
}
// The GPU's cumulative weights are fixed-point integer sums (relative error < 1e-8 at V = 152K,
// sampling.h); a token may differ from the CPU's only where the CPU's cumulative weight is this
// close (relative to the kept mass) to u * kept mass or to the top-p threshold.
namespace verl::ops::cuda::test {
inline constexpr double kSampleNearTie = 1e-4;
}
// Attention on tensor cores (src/ops/cuda/attention.cu) rounds P (out, d_v) and dS (d_q, d_k) to
// bf16 as mma operands: each term p_ij v_j, p_ij d_out_i, ds_ij k_j, ds_ij q_i of those fp32 sums
// is off by at most half a bf16 ulp, 2^-8 of itself. test_attention.cpp adds this times the sum of
// the terms' magnitudes (computed on the CPU) to the kAttnOut / kAttnGrad bound of each element.
namespace verl::ops::cuda::test {
inline constexpr double kAttnBf16Operand = 1.0 / 256;
}
// Greedy rollout on the CUDA runner vs the CPU engine (tests/cuda/test_rollout_cuda.cpp): bf16
// activations move each logit by up to kModelLogprob (measured 0.05-0.09 nats on the golden
// models), so the two argmax chains may part where the CPU's top-2 logits are closer than that;
// never elsewhere. (Measured on the H200: the largest gap where they parted was 0.036.)
namespace verl::ops::cuda::test {
inline constexpr double kRolloutNearTie = kModelLogprob.atol;
}
// Paged prefill attention on tensor cores rounds p to bf16 as the P V operand (paged_attention.h):
// each term p_j v_j is off by at most 2^-9 of itself; test_paged_attention.cpp adds this times
// sum_j p_j |v_j| to the kAttnOut bound (twice the worst case, for the fp32 sums' reordering).
namespace verl::ops::cuda::test {
inline constexpr double kPagedAttnBf16P = 1.0 / 256;
}
// LM head d_h / d_w from the kept bf16 probabilities (lm_head_backward_from_probs), used with a
// scale of |init| + |update| + sum_j b_j |w_j| (b_j of lm_head.h bounds |d_z_j| and the p-terms):
// d_h's bf16 rounding (u = 2^-8 of |init| + |update|), d_z's bf16 storage (u of |d_z_j| <= b_j) and
// p's (u (1 + u) of the p-terms, <= b_j) add up to (2 + u) u of the scale at first order; plus
// fp32 noise (GEMM order, exp, ~1e-6 relative). 1/100 = 2.56 u leaves room for those.
namespace verl::ops::cuda::test {
inline constexpr Tol kLmHeadGradKeptProbs{1e-5, 1.0 / 100};
}
// Batch-invariant GEMM (src/ops/cuda/gemm_invariant.cu) vs the CPU fp32 linear on the same bf16
// inputs (tests/cuda/test_gemm_invariant.cpp): the products x_k w_k are exact in fp32 on both
// sides, only the order of the sums differs (a chain of ceil(K/16) tensor-core steps vs OpenBLAS's
// blocking). A chain of s fp32 additions is within s ulps of its running sums, each at most
// sum_k |x_k w_k|: for the GPU (K/16 + 4) 2^-23 = 3.7e-5 of that at K = 4864, the largest K tested,
// counting a whole ulp per step (in case the tensor core truncates). The test adds this times
// sum_k |x_k w_k| (times |alpha|, plus |beta c| + |bias|) to the output bound (kBf16Out for bf16,
// kF32Kernel for fp32). Dropping or repeating one term costs ~1/K of that sum, 5x this at K = 4864.
namespace verl::ops::cuda::test {
inline constexpr double kInvariantGemmSum = 4e-5;
}
