// Sequence-length balancing (verl/utils/seqlen_balancing.py and RayPPOTrainer._balance_batch):
// splitting a batch into token-budget micro-batches with balanced token counts (dynamic batch
// size), and reordering a batch so every data-parallel rank gets a similar amount of work.
// Indices refer to positions in the `seqlens` vector given; results never depend on timing.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace verl::data {

using Partitions = std::vector<std::vector<int64_t>>;

// The largest differencing method (Karmarkar-Karp) for k-way number partitioning, with verl's
// tie-breaking, so the partitions equal verl's. equal_size: every partition gets n/k items (n
// must divide by k). Partitions come in the order of the final state (largest sum first), the
// indices inside in merge order.
Partitions karmarkar_karp(const std::vector<int64_t>& seqlens, int64_t k, bool equal_size);
// verl's greedy_partition: items in the given order, each into the partition with the smallest sum.
Partitions greedy_partition(const std::vector<int64_t>& seqlens, int64_t k, bool equal_size);
// karmarkar_karp, checked (k <= n, no empty partition, every index exactly once), with the
// indices of each partition sorted ascending.
Partitions get_seqlen_balanced_partitions(const std::vector<int64_t>& seqlens, int64_t k,
                                          bool equal_size);

// verl's log_seqlen_unbalance: {prefix}/min, /max, /minmax_diff (token sums of the contiguous
// chunks before balancing), /balanced_min, /balanced_max (after), /mean.
std::map<std::string, double> log_seqlen_unbalance(const std::vector<int64_t>& seqlens,
                                                   const Partitions& partitions,
                                                   const std::string& prefix);

// First-fit decreasing bin packing: the fewest bins it finds with every bin's sum <= max_token_len
// (at most 11/9 OPT + 1 bins). Every item must fit alone.
Partitions first_fit_decreasing(const std::vector<int64_t>& seqlens, int64_t max_token_len);

struct MicroBatchOptions {
  int64_t max_token_len = 0;  // token budget of one micro-batch (ppo_max_token_len_per_gpu)
  std::optional<int64_t> min_num_micro_batch;  // at least this many (pipeline parallelism)
  std::optional<int64_t>
      num_batches_divided_by;  // round the count up to a multiple (virtual pipeline)
  bool same_micro_num_in_dp = true;
  // All-reduce MAX of the count over the data-parallel group; unset on a single rank.
  std::function<int64_t(int64_t)> dp_max;
  // Order micro-batches by sum of squared lengths, heaviest first (verl's use_dynamic_bsz_balance).
  bool use_dynamic_bsz_balance = true;
  // Karmarkar-Karp tries, each with one more micro-batch, before falling back to first-fit
  // decreasing when a micro-batch is over budget (0: pack with first-fit decreasing directly).
  int64_t kk_attempts = 8;
};

struct MicroBatches {
  Partitions micro_batches;           // indices per micro-batch, ascending inside each
  std::vector<int64_t> token_counts;  // tokens per micro-batch
  int64_t total_tokens = 0;
  int64_t max_token_len = 0;
  bool used_fallback = false;  // Karmarkar-Karp exceeded the budget and a packing was used instead

  // All indices in micro-batch order (verl's `indices` flattened).
  std::vector<int64_t> order() const;
  // restore[i] = position of original item i in order(): outputs gathered micro-batch by
  // micro-batch are put back in the original order by out[i] = gathered[restore[i]].
  std::vector<int64_t> restore_index() const;
  // real tokens / (micro-batches * budget): the share of the token budget that holds data.
  double token_utilisation() const;
};

// verl's rearrange_micro_batches on sequence lengths: count = min(n, ceil(total / budget)),
// raised to min_num_micro_batch, made equal across dp ranks (dp_max), rounded up to a multiple
// of num_batches_divided_by; then Karmarkar-Karp balances the token sums. Unlike verl, the
// result is guaranteed to respect the budget: when Karmarkar-Karp leaves a micro-batch over it,
// the count is raised (before the dp agreement, so all ranks still agree), and if the agreed
// count still does not fit, a first-fit-decreasing packing split into that many micro-batches
// is used. A sequence longer than the budget is an Error naming its index and length.
MicroBatches rearrange_micro_batches(const std::vector<int64_t>& seqlens,
                                     const MicroBatchOptions& opts);

// verl's get_reverse_idx: reverse[idx_map[i]] = i.
std::vector<int64_t> get_reverse_idx(const std::vector<int64_t>& idx_map);

// Puts per-sequence outputs gathered in micro-batch order back in the original order.
template <typename T>
std::vector<T> restore_order(const std::vector<T>& gathered, const MicroBatches& mb) {
  const std::vector<int64_t> restore = mb.restore_index();
  std::vector<T> out;
  out.reserve(restore.size());
  for (int64_t pos : restore) out.push_back(gathered[static_cast<size_t>(pos)]);
  return out;
}

// verl's calculate_workload: FLOPs of a dense 7B block up to a constant,
// 12 h^2 s + 2 h s^2 with h = 4096, i.e. proportional to 24576 s + s^2.
inline int64_t calculate_workload(int64_t seqlen) {
  return 24576 * seqlen + seqlen * seqlen;
}

struct BalanceOptions {
  // Balance estimated FLOPs (calculate_workload) rather than token counts, as current verl does.
  bool use_workload = true;
  // Inside each rank, light sequences at both ends and heavy ones in the middle (verl: fewer
  // pipeline bubbles): sort ascending, take even positions, then odd positions reversed.
  bool pipeline_order = true;
  std::string prefix = "global_seqlen";
};

struct RankBalance {
  Partitions partitions;       // rows of each rank
  std::vector<int64_t> order;  // the batch reordered: rank r gets order[r*n/w, (r+1)*n/w)
  std::map<std::string, double> metrics;  // log_seqlen_unbalance under `prefix`
};

// verl's _balance_batch: equal-size partitions (n must divide by world_size) with similar
// totals, so that splitting the reordered batch into world_size contiguous chunks balances ranks.
RankBalance balance_across_ranks(const std::vector<int64_t>& seqlens, int64_t world_size,
                                 const BalanceOptions& opts = {});

// Token utilisation of a set of micro-batches: real tokens / (num_micro * max_token_len).
double token_utilisation(int64_t real_tokens, int64_t num_micro_batches, int64_t max_token_len);

}  // namespace verl::data
