// The [B, L] layout every algorithm shares, verl's masked reductions
// (verl/utils/torch_functional.py masked_mean / masked_var / masked_whiten) and its loss
// aggregation (verl/trainer/ppo/ core_algos.py agg_loss, with verl's global_batch_info normalisers
// for data parallelism).
//
// Layout: a batch of B responses is padded to L slots; every per-token array is a row-major
// [B, L] float matrix (index b * L + t) and `response_mask` is 1 on response tokens and 0 on
// padding, exactly verl's (bs, response_length) tensors. Scalars are returned in double; the
// arithmetic runs in double and per-token outputs are stored as float.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

namespace verl::trainer {

// [B, L] of every per-token matrix in one call.
struct Shape {
  int64_t batch = 0;   // B
  int64_t length = 0;  // L, the padded response length
  int64_t numel() const { return batch * length; }
};

// A [B, L] mask from per-response lengths: 1 for t < lengths[b], else 0.
std::vector<float> response_mask_from_lengths(std::span<const int64_t> lengths, int64_t length);

// ---------------------------------------------------------------------------------------------
// Masked reductions (verl_F.masked_sum / masked_mean / masked_var / masked_whiten).

// sum(values * mask).
double masked_sum(std::span<const float> values, std::span<const float> mask);
// sum(values * mask) / (sum(mask) + 1e-8).
double masked_mean(std::span<const float> values, std::span<const float> mask);
// masked_mean((values - masked_mean(values))^2); with `unbiased` times n / (n - 1), n = sum(mask)
// (torch.std's Bessel correction). Throws when unbiased and n is 0 or 1, as verl raises.
double masked_var(std::span<const float> values, std::span<const float> mask, bool unbiased = true);
// (values - mean) * rsqrt(var + 1e-8) with the masked mean and unbiased variance, applied to every
// element (masked ones too, as verl does); shift_mean = false adds the mean back.
std::vector<float> masked_whiten(std::span<const float> values, std::span<const float> mask,
                                 bool shift_mean = true);

// ---------------------------------------------------------------------------------------------
// Loss aggregation (actor.loss_agg_mode / critic.loss_agg_mode).

enum class LossAggMode { TokenMean, SeqMeanTokenSum, SeqMeanTokenMean, SeqMeanTokenSumNorm };
// "token-mean" | "seq-mean-token-sum" | "seq-mean-token-mean" | "seq-mean-token-sum-norm".
LossAggMode parse_loss_agg_mode(std::string_view name);
std::string_view to_string(LossAggMode m);

// Global normalisers for data-parallel training (verl's global_batch_info). Each rank aggregates
// its own micro-batch but divides by counts over the whole global mini-batch and multiplies by
// dp_size, so that the all-reduce MEAN of the ranks' gradients equals the gradient of the global
// loss. Left empty, a count defaults to the local one (what verl does at dp_size 1; with
// dp_size > 1 verl requires them, and so do we).
struct AggNorm {
  int64_t dp_size = 1;
  std::optional<double> batch_num_tokens;   // token-mean: mask tokens over the global batch
  std::optional<double> global_batch_size;  // seq-mean-*: non-empty responses, global batch
  std::optional<double> loss_scale_factor;  // seq-mean-token-sum-norm: default L
};

// The aggregation is linear in the loss matrix: loss = sum_t w_t * loss_mat_t. These are the w_t
// ([B, L]), which are also d loss / d loss_mat_t:
//   token-mean:              mask_t / N_tokens * dp
//   seq-mean-token-sum:      mask_t * [len_b > 0] / N_seqs * dp
//   seq-mean-token-mean:     mask_t / (len_b + 1e-8) * [len_b > 0] / N_seqs * dp
//   seq-mean-token-sum-norm: mask_t * [len_b > 0] / N_seqs * dp / loss_scale_factor
// A normaliser of 0 (nothing to average) gives zero weights (verl would produce 0/0).
std::vector<float> agg_loss_weights(Shape s, std::span<const float> loss_mask, LossAggMode mode,
                                    const AggNorm& norm = {});
double agg_loss(Shape s, std::span<const float> loss_mat, std::span<const float> loss_mask,
                LossAggMode mode, const AggNorm& norm = {});

}  // namespace verl::trainer
