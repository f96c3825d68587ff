// One step's experience (the trainer's per-response [B, L] matrices) and the one conversion
// between them and a packed micro-batch's per-token arrays [T]: a micro-batch packs rows
// prompt + response with no padding (model::PackedBatch), the model's outputs are per packed
// token, the losses are per response token.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/rl_dataset.h"
#include "dist/communicator.h"
#include "model/batch.h"
#include "rollout/step_runner.h"
#include "trainer/core_algos.h"

namespace verl::trainer {

// One step's experience: B responses, per-token matrices [B, L] (L = longest response).
struct Experience {
  int64_t B = 0, L = 0;
  std::vector<int64_t> group;                  // [B] prompt index within the global batch
  std::vector<const data::Sample*> sample;     // [B]
  std::vector<std::vector<int32_t>> response;  // [B]
  std::vector<std::string> finish_reason;      // [B]
  std::vector<float> mask;                     // [B, L] response mask
  std::vector<float> rollout_log_prob;         // [B, L]
  std::vector<float> scores;                   // [B] sequence reward
  // The reward manager's extra info per row (verl's reward_extra_info): the scorer's acc and its
  // score before any penalty, and the dapo manager's overlong penalty (0 without one).
  std::vector<float> acc, raw_score, overlong_reward;  // [B]
  // The other numbers a reward command or Python reward returned, by key, [B] each (NaN where a
  // row lacks the key): reward_extra/<key> metrics and GDPO's reward components.
  std::map<std::string, std::vector<float>> reward_extra;
  std::vector<float> rollout_is_weights;  // [B, L] rollout correction's weights (empty: none)
  std::vector<float> token_level_scores, token_level_rewards;  // [B, L]
  std::vector<float> old_log_prob, ref_log_prob, values;       // [B, L] (empty when unused)
  std::vector<float> advantages, returns;                      // [B, L]
  // What the rollout engine's runner did for these rows on this rank (steps, CUDA graphs).
  rollout::StepRunnerStats runner_stats;
  Shape shape() const { return {B, L}; }
  // Row b's prompt + response tokens (its sequence's length in a packed batch).
  int64_t tokens(int64_t b) const {
    return static_cast<int64_t>(sample[b]->prompt_ids.size() + response[b].size());
  }
};

// Rows `idx` of the experience packed as one micro-batch. Response token j of row rows()[i] sits
// at packed position base(i) + 1 + j; the model's outputs for it (the log-prob of that token, the
// critic's value of the state before it, as verl's values[:, -response_length - 1 : -1]) sit at
// base(i) + j, the position before it.
class PackedResponses {
 public:
  PackedResponses(const Experience& exp, std::vector<int64_t> rows);

  const model::PackedBatch& batch() const { return batch_; }
  const std::vector<int64_t>& rows() const { return rows_; }
  int64_t L() const { return L_; }

  // The response tokens' entries of a packed [T] array as a [rows, L] matrix (zero past each
  // response's end).
  std::vector<float> gather(const std::vector<float>& packed) const;
  // The same written into the rows' lines of a [B, L] matrix.
  void gather_into(const std::vector<float>& packed, std::vector<float>& matrix) const;
  // Row rows()[i]'s response entries of a packed [T] array (its response's length).
  std::vector<float> row(const std::vector<float>& packed, size_t i) const;
  // A packed [T] array holding a [rows, L] matrix's response entries (zero elsewhere): how a
  // loss's gradient reaches the model's outputs. An empty matrix gives an empty array.
  std::vector<float> scatter(const std::vector<float>& per_row) const;

 private:
  std::vector<int64_t> rows_, base_, len_;
  int64_t L_;
  model::PackedBatch batch_;
};

// verl's _balance_batch across data-parallel ranks (trainer.balance_batch): after generation and
// scoring, the global batch's rows are repartitioned by Karmarkar-Karp on their workload
// (data::balance_across_ranks) into equal-size sets with similar totals, and each rank receives
// its set through one all-to-all. A row moves as its prompt index, finish reason, score and its
// response's token ids, rollout log-probs, mask and token scores: a few bytes a token, never a
// hidden- or vocabulary-size tensor. `batch` is the step's whole prompt batch (every rank holds
// it): a received row's sample points into it. Every rank computes the same partition, so the
// result does not depend on timing. Returns the bytes this rank sent; `metrics` receives verl's
// global_seqlen/* statistics (before and after).
struct BalanceResult {
  size_t bytes_sent = 0;
  std::map<std::string, double> metrics;
};
BalanceResult balance_across_ranks(Experience& exp, const std::vector<data::Sample>& batch,
                                   dist::Communicator& comm);

// This rank's equal share of a step's prompts and the global index of its first one (a prompt's n
// samples stay on one rank).
std::pair<std::vector<data::Sample>, int64_t> rank_share(const std::vector<data::Sample>& all,
                                                         const dist::Communicator& comm);

// A step's [B, L] per-token matrices over every data-parallel rank: each rank holds B rows (the
// same B everywhere) of up to its own L; the global view stacks the ranks' rows in rank order
// (rank r's rows are the global batch's rows r B .. r B + B - 1: its prompts' samples in prompt
// order, or the set balance_batch gave it) padded to the longest L. One rank: the matrices
// themselves, nothing copied through a communicator.
class GlobalRows {
 public:
  GlobalRows(dist::Communicator& comm, const Experience& exp);

  Shape shape() const { return {B_ * comm_.world_size(), Lg_}; }
  // A local [B, L] matrix as the global [W B, Lg] one (empty stays empty).
  std::vector<float> gather(const std::vector<float>& m);
  // One value per row, [B] -> [W B].
  std::vector<float> gather_per_row(const std::vector<float>& v);
  // Rows' (global) prompt indices.
  std::vector<int64_t> gather_index(const std::vector<int64_t>& group);
  // This rank's rows of a global [W B, Lg] matrix, as a local [B, L] one.
  std::vector<float> mine(const std::vector<float>& global) const;
  size_t bytes_sent() const { return bytes_; }

 private:
  dist::Communicator& comm_;
  int64_t B_, L_, Lg_;
  size_t bytes_ = 0;
};

}  // namespace verl::trainer
