// Tolerances of the CPU op tests, in one place. fp32 forward against a double reference: a few
// ulps times the reduction length; finite differences: truncation O(eps^2) plus fp32 rounding of
// the loss divided by 2*eps, so they are compared relative to the largest gradient entry.
#pragma once

namespace verl::ops::test {

struct Tol {
  double atol, rtol;
};

// |got - want| <= atol + rtol * |want|
inline constexpr Tol kForwardF32{1e-5, 1e-5};    // fp32 op vs double reference
inline constexpr Tol kAttentionRef{1e-5, 1e-5};  // attention vs naive masked softmax
inline constexpr Tol kLmHeadRef{2e-5, 1e-5};     // lm_head vs naive full logits (V-long sums)
inline constexpr Tol kSameMath{1e-6, 1e-6};      // one op run two ways (chunking, packing)
inline constexpr Tol kAdamW{1e-7, 1e-6};         // a few fp32 ops per element

// Central finite differences: step, and the error allowed relative to max |grad| of that tensor.
inline constexpr double kFdEps = 1e-3;
inline constexpr double kFdRel = 1e-2;

}  // namespace verl::ops::test
