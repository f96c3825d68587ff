// ---- sampling.cu: the rollout sampler on the GPU
// ----------------------------------------------------- The same definition as the CPU Sampler
// (src/rollout/sampler.cpp, the oracle), one block per logits row, on device data, so a decode step
// needs no host round trip but the S sampled tokens and log-probs. Per row, with m = max logits and
// w_i = exp((l_i - m) / T) (fp32, as the CPU):
//   T == 0    greedy: argmax, ties -> lowest id; log-prob = -log sum_j exp(l_j - m) (T = 1)
//   T  > 0    keep the top_k largest logits (ties -> lower id), then the smallest prefix in that
//             order whose weight reaches top_p of the top-k weight; u in [0, 1) (53 bits) from the
//             Philox4x32-10 block (seed, stream, counter), exactly as the CPU builds it; the token
//             is the first kept one (vocabulary order when nothing is truncated, descending logits
//             otherwise) whose cumulative weight exceeds u * (kept weight).
//             log-prob = (l - m) / T - log sum_j w_j over the FULL vocabulary.
// No sort of the vocabulary: cumulative weights are exact integer sums of w_i in fixed point
// (w_i * 2^s rounded, s chosen so that V * 2^s < 2^63), so every decision is exact and
// deterministic; it differs from the CPU's double sums only by ~V * 2^-s relative (< 1e-8 for a
// 152K vocabulary), i.e. at near-ties. Truncation finds the cut tokens by radix descent over a
// 64-bit key (order-preserving bits of the logit, then the inverted id): 8 bits per pass, a
// shared-memory histogram of counts and weights, stopping as soon as the chosen bin holds one
// token. Untruncated sampling walks the vocabulary in id order with one pass for 32 pieces' sums
// and two small refinement passes. A row whose logits are not finite (max or sum of exp not finite)
// yields token -1 and a NaN log-prob; the caller reports it (the CPU sampler throws).
#pragma once

#include <cstdint>

#include "ops/cuda/ops_cuda.h"

namespace verl::ops::cuda {

// Per-row sampling parameters, filled on the host from each sequence (rollout::SampleRow).
struct SampleParamsDevice {
  float temperature = 1.0f;  // 0 = greedy
  int32_t top_k = -1;        // <= 0 or >= V: off
  float top_p = 1.0f;        // in (0, 1]; 1 = off
  uint32_t reserved = 0;
  uint64_t seed = 0;     // Philox key
  uint64_t stream = 0;   // Philox counter words 2-3
  uint64_t counter = 0;  // Philox counter words 0-1: tokens the sequence generated before
};
static_assert(sizeof(SampleParamsDevice) == 40,
              "SampleParamsDevice is a 40-byte host/device record");

// Device bytes of sample_tokens' split path for S rows of V logits: three [S, ceil(V / 4096)]
// arrays of 8-byte per-tile partials.
size_t sample_workspace_bytes(int64_t S, int64_t V);

// tokens [S] int32 and logprobs [S] fp32 (may be null) from logits [S, V] fp32 with row stride
// ld >= V and params [S]; all device pointers. Enqueued on ctx.stream.
// Without a workspace every row runs on one 512-thread block (the reference path). With one of
// sample_workspace_bytes(S, V) (S < 65536), greedy rows and temperature rows without top-k / top-p
// are split over 4096-id tiles, one block each (tile maxima, then tile sums, then a select kernel
// per row), so S = 256 rows of 152K fill the GPU; they pick the same token as the reference path,
// bit for bit (integer sums), and the same log-prob up to the order of a double sum. Truncated
// rows still run on the one-block kernel.
void sample_tokens(const CudaContext& ctx, int32_t* tokens, float* logprobs, const float* logits,
                   int64_t ld, const SampleParamsDevice* params, int64_t S, int64_t V,
                   void* workspace = nullptr, size_t workspace_bytes = 0);

// out[4 i .. 4 i + 3] = philox4x32(keys[3 i], keys[3 i + 1], keys[3 i + 2]) (seed, stream, counter)
// for i < n, the device twin of verl::philox4x32 (src/core/rng.h); for tests.
void philox4x32_batch(const CudaContext& ctx, uint32_t* out, const uint64_t* keys, int64_t n);

}  // namespace verl::ops::cuda
