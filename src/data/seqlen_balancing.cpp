// Karmarkar-Karp partitioning, token-budget micro-batches and data-parallel balancing.
// Tie-breaking follows verl's Python exactly so that the same lengths give the same partitions.
#include "data/seqlen_balancing.h"

#include <algorithm>
#include <numeric>
#include <queue>
#include <utility>

#include "core/error.h"

namespace verl::data {

namespace {

// A partition under construction: its sum and (index, length) items in insertion order.
struct KkSet {
  int64_t sum = 0;
  std::vector<std::pair<int64_t, int64_t>> items;
};

// verl's Set.__lt__: by sum, then item count, then the item lists lexicographically.
bool set_less(const KkSet& a, const KkSet& b) {
  if (a.sum != b.sum) return a.sum < b.sum;
  if (a.items.size() != b.items.size()) return a.items.size() < b.items.size();
  return a.items < b.items;
}

// k sets kept in decreasing order; spread = largest sum - smallest sum.
struct KkState {
  std::vector<KkSet> sets;
  int64_t spread() const { return sets.front().sum - sets.back().sum; }
  void sort_desc() {
    std::stable_sort(sets.begin(), sets.end(),
                     [](const KkSet& a, const KkSet& b) { return set_less(b, a); });
  }
};

// verl's State.__lt__ for a min-heap: the largest spread pops first, then the larger first set.
bool state_pops_first(const KkState& a, const KkState& b) {
  if (a.spread() != b.spread()) return a.spread() > b.spread();
  return set_less(b.sets.front(), a.sets.front());
}

}  // namespace

Partitions karmarkar_karp(const std::vector<int64_t>& seqlens, int64_t k, bool equal_size) {
  const auto n = static_cast<int64_t>(seqlens.size());
  VERL_CHECK(k >= 1, "karmarkar_karp: k_partitions must be >= 1, got {}", k);
  if (n == 0) return Partitions(static_cast<size_t>(k));
  // (length, index) ascending, as Python's sorted() on tuples.
  std::vector<std::pair<int64_t, int64_t>> sorted(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) sorted[i] = {seqlens[i], i};
  std::sort(sorted.begin(), sorted.end());

  std::vector<KkState> states;
  auto new_state = [&](int64_t first, int64_t count) {
    KkState s;
    s.sets.resize(static_cast<size_t>(k));
    for (int64_t j = 0; j < count; ++j) {
      auto [len, idx] = sorted[first + j];
      s.sets[j].items.emplace_back(idx, len);
      s.sets[j].sum += len;
    }
    s.sort_desc();
    states.push_back(std::move(s));
  };
  if (equal_size) {
    VERL_CHECK(n % k == 0, "karmarkar_karp: {} items do not split into {} equal partitions", n, k);
    for (int64_t off = 0; off < n; off += k) new_state(off, k);
  } else {
    for (int64_t i = 0; i < n; ++i) new_state(i, 1);
  }

  // Heap of state ids; the comparator puts the state that pops first on top.
  auto lower_priority = [&](int64_t a, int64_t b) {
    return state_pops_first(states[b], states[a]);
  };
  std::priority_queue<int64_t, std::vector<int64_t>, decltype(lower_priority)> heap(lower_priority);
  for (int64_t i = 0; i < static_cast<int64_t>(states.size()); ++i) heap.push(i);
  while (heap.size() > 1) {
    const int64_t a = heap.top();
    heap.pop();
    const int64_t b = heap.top();
    heap.pop();
    // Largest set of one with the smallest of the other: the differencing step.
    KkState& s0 = states[a];
    KkState& s1 = states[b];
    for (int64_t i = 0; i < k; ++i) {
      KkSet& dst = s0.sets[i];
      const KkSet& src = s1.sets[k - 1 - i];
      dst.items.insert(dst.items.end(), src.items.begin(), src.items.end());
      dst.sum += src.sum;
    }
    s0.sort_desc();
    s1.sets.clear();
    s1.sets.shrink_to_fit();
    heap.push(a);
  }
  const KkState& final_state = states[heap.top()];
  Partitions out(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i)
    for (const auto& [idx, len] : final_state.sets[i].items) out[i].push_back(idx);
  if (equal_size)
    for (const auto& p : out)
      VERL_CHECK(static_cast<int64_t>(p.size()) * k == n,
                 "karmarkar_karp: unequal partition of {} items", p.size());
  return out;
}

Partitions greedy_partition(const std::vector<int64_t>& seqlens, int64_t k, bool equal_size) {
  VERL_CHECK(k >= 1, "greedy_partition: k_partitions must be >= 1, got {}", k);
  const auto n = static_cast<int64_t>(seqlens.size());
  // A bias larger than any total makes count dominate the sum: equal sizes when n % k == 0.
  const int64_t bias =
      equal_size ? std::accumulate(seqlens.begin(), seqlens.end(), int64_t{0}) + 1 : 0;
  Partitions out(static_cast<size_t>(k));
  std::vector<int64_t> sums(static_cast<size_t>(k), 0);
  for (int64_t i = 0; i < n; ++i) {
    const auto j = std::min_element(sums.begin(), sums.end()) - sums.begin();
    out[j].push_back(i);
    sums[j] += seqlens[i] + bias;
  }
  if (equal_size)
    for (const auto& p : out)
      VERL_CHECK(static_cast<int64_t>(p.size()) * k == n,
                 "greedy_partition: {} items do not split into {} "
                 "equal partitions",
                 n, k);
  return out;
}

Partitions get_seqlen_balanced_partitions(const std::vector<int64_t>& seqlens, int64_t k,
                                          bool equal_size) {
  const auto n = static_cast<int64_t>(seqlens.size());
  VERL_CHECK(k >= 1 && n >= k, "get_seqlen_balanced_partitions: {} items cannot fill {} partitions",
             n, k);
  Partitions parts = karmarkar_karp(seqlens, k, equal_size);
  std::vector<uint8_t> seen(static_cast<size_t>(n), 0);
  for (size_t p = 0; p < parts.size(); ++p) {
    VERL_CHECK(!parts[p].empty(), "get_seqlen_balanced_partitions: partition {} of {} is empty", p,
               k);
    for (int64_t idx : parts[p]) {
      VERL_CHECK(idx >= 0 && idx < n && !seen[idx],
                 "get_seqlen_balanced_partitions: index {} repeated", idx);
      seen[idx] = 1;
    }
    std::sort(parts[p].begin(), parts[p].end());
  }
  VERL_CHECK(std::all_of(seen.begin(), seen.end(), [](uint8_t s) { return s != 0; }),
             "get_seqlen_balanced_partitions: an index is missing from the partitions");
  return parts;
}

std::map<std::string, double> log_seqlen_unbalance(const std::vector<int64_t>& seqlens,
                                                   const Partitions& partitions,
                                                   const std::string& prefix) {
  const auto n = static_cast<int64_t>(seqlens.size());
  const auto k = static_cast<int64_t>(partitions.size());
  VERL_CHECK(k >= 1 && n >= k, "log_seqlen_unbalance: {} items in {} partitions", n, k);
  // Before balancing: the contiguous chunks that a plain split would give each rank.
  const int64_t chunk = n / k;
  int64_t lo = INT64_MAX, hi = INT64_MIN, total = 0;
  for (int64_t off = 0; off < n; off += chunk) {
    int64_t s = 0;
    for (int64_t i = off; i < std::min(off + chunk, n); ++i) s += seqlens[i];
    lo = std::min(lo, s);
    hi = std::max(hi, s);
    total += s;
  }
  int64_t blo = INT64_MAX, bhi = INT64_MIN;
  for (const auto& p : partitions) {
    int64_t s = 0;
    for (int64_t idx : p) s += seqlens[idx];
    blo = std::min(blo, s);
    bhi = std::max(bhi, s);
  }
  return {{prefix + "/min", static_cast<double>(lo)},
          {prefix + "/max", static_cast<double>(hi)},
          {prefix + "/minmax_diff", static_cast<double>(hi - lo)},
          {prefix + "/balanced_min", static_cast<double>(blo)},
          {prefix + "/balanced_max", static_cast<double>(bhi)},
          {prefix + "/mean", static_cast<double>(total) / static_cast<double>(k)}};
}

Partitions first_fit_decreasing(const std::vector<int64_t>& seqlens, int64_t max_token_len) {
  const auto n = static_cast<int64_t>(seqlens.size());
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), int64_t{0});
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int64_t a, int64_t b) { return seqlens[a] > seqlens[b]; });
  Partitions bins;
  std::vector<int64_t> loads;
  for (int64_t i : idx) {
    VERL_CHECK(seqlens[i] <= max_token_len,
               "first_fit_decreasing: sequence {} has {} tokens, more than the "
               "budget of {}",
               i, seqlens[i], max_token_len);
    size_t b = 0;
    while (b < bins.size() && loads[b] + seqlens[i] > max_token_len) ++b;
    if (b == bins.size()) {
      bins.emplace_back();
      loads.push_back(0);
    }
    bins[b].push_back(i);
    loads[b] += seqlens[i];
  }
  return bins;
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

bool fits(const Partitions& parts, const std::vector<int64_t>& seqlens, int64_t budget) {
  for (const auto& p : parts) {
    int64_t s = 0;
    for (int64_t idx : p) s += seqlens[idx];
    if (s > budget) return false;
  }
  return true;
}

// Grows a valid packing to exactly k non-empty bins (k <= n) by moving single sequences out of
// the fullest multi-item bins; moving only lowers loads, so the budget still holds.
Partitions split_to(Partitions parts, const std::vector<int64_t>& seqlens, int64_t k) {
  auto load = [&](const std::vector<int64_t>& p) {
    int64_t s = 0;
    for (int64_t idx : p) s += seqlens[idx];
    return s;
  };
  while (static_cast<int64_t>(parts.size()) < k) {
    size_t src = parts.size();
    for (size_t b = 0; b < parts.size(); ++b)
      if (parts[b].size() >= 2 && (src == parts.size() || load(parts[b]) > load(parts[src])))
        src = b;
    VERL_CHECK(src < parts.size(), "rearrange_micro_batches: cannot split into {} micro-batches",
               k);
    // Move the largest sequence of that bin.
    auto& from = parts[src];
    auto big = std::max_element(from.begin(), from.end(),
                                [&](int64_t a, int64_t b) { return seqlens[a] < seqlens[b]; });
    const int64_t moved = *big;
    from.erase(big);
    parts.push_back({moved});
  }
  return parts;
}

}  // namespace

std::vector<int64_t> MicroBatches::order() const {
  std::vector<int64_t> out;
  for (const auto& mb : micro_batches) out.insert(out.end(), mb.begin(), mb.end());
  return out;
}

std::vector<int64_t> MicroBatches::restore_index() const {
  return get_reverse_idx(order());
}

double MicroBatches::token_utilisation() const {
  return data::token_utilisation(total_tokens, static_cast<int64_t>(micro_batches.size()),
                                 max_token_len);
}

double token_utilisation(int64_t real_tokens, int64_t num_micro_batches, int64_t max_token_len) {
  if (num_micro_batches <= 0 || max_token_len <= 0) return 0.0;
  return static_cast<double>(real_tokens) /
         (static_cast<double>(num_micro_batches) * static_cast<double>(max_token_len));
}

std::vector<int64_t> get_reverse_idx(const std::vector<int64_t>& idx_map) {
  std::vector<int64_t> rev(idx_map.size(), -1);
  for (size_t i = 0; i < idx_map.size(); ++i) {
    const int64_t idx = idx_map[i];
    VERL_CHECK(idx >= 0 && idx < static_cast<int64_t>(idx_map.size()) && rev[idx] < 0,
               "get_reverse_idx: {} is not a permutation entry", idx);
    rev[idx] = static_cast<int64_t>(i);
  }
  return rev;
}

MicroBatches rearrange_micro_batches(const std::vector<int64_t>& seqlens,
                                     const MicroBatchOptions& opts) {
  const auto n = static_cast<int64_t>(seqlens.size());
  const int64_t budget = opts.max_token_len;
  VERL_CHECK(budget >= 1, "rearrange_micro_batches: max_token_len must be >= 1, got {}", budget);
  VERL_CHECK(n >= 1, "rearrange_micro_batches: empty batch");
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) {
    VERL_CHECK(seqlens[i] >= 0, "rearrange_micro_batches: sequence {} has negative length {}", i,
               seqlens[i]);
    VERL_CHECK(seqlens[i] <= budget,
               "rearrange_micro_batches: sequence {} has {} tokens, more than max_token_len "
               "{}; raise ppo_max_token_len_per_gpu to at least prompt + response length",
               i, seqlens[i], budget);
    total += seqlens[i];
  }

  // Local count: verl's formula, then raised until Karmarkar-Karp respects the budget. One or two
  // tries suffice in practice; past kk_attempts, first-fit decreasing gives a valid count.
  int64_t k = std::min(n, std::max<int64_t>(1, ceil_div(total, budget)));
  if (opts.min_num_micro_batch) k = std::max(k, *opts.min_num_micro_batch);
  VERL_CHECK(k <= n, "rearrange_micro_batches: min_num_micro_batch {} exceeds the {} sequences", k,
             n);
  Partitions local;
  bool local_is_kk = false;
  for (int64_t tries = 0; tries < opts.kk_attempts && k + tries <= n; ++tries) {
    Partitions p = get_seqlen_balanced_partitions(seqlens, k + tries, false);
    if (fits(p, seqlens, budget)) {
      local = std::move(p);
      local_is_kk = true;
      break;
    }
  }
  if (!local_is_kk) {
    local = first_fit_decreasing(seqlens, budget);
    if (static_cast<int64_t>(local.size()) < k) local = split_to(std::move(local), seqlens, k);
  }
  k = static_cast<int64_t>(local.size());

  if (opts.same_micro_num_in_dp && opts.dp_max) {
    const int64_t agreed = opts.dp_max(k);
    VERL_CHECK(
        agreed >= k,
        "rearrange_micro_batches: dp_max returned {} for a local count of {}; it must be the "
        "maximum over ranks",
        agreed, k);
    k = agreed;
  }
  if (opts.num_batches_divided_by && *opts.num_batches_divided_by > 1)
    k = ceil_div(k, *opts.num_batches_divided_by) * *opts.num_batches_divided_by;
  VERL_CHECK(
      k <= n,
      "rearrange_micro_batches: {} micro-batches (after agreeing across ranks / rounding) but only "
      "{} sequences on this rank",
      k, n);

  MicroBatches out;
  out.max_token_len = budget;
  out.total_tokens = total;
  if (k == static_cast<int64_t>(local.size())) {
    out.micro_batches = std::move(local);
    out.used_fallback = !local_is_kk;
  } else {
    Partitions p =
        opts.kk_attempts > 0 ? get_seqlen_balanced_partitions(seqlens, k, false) : Partitions{};
    if (opts.kk_attempts > 0 && fits(p, seqlens, budget)) {
      out.micro_batches = std::move(p);
    } else {
      out.micro_batches = split_to(std::move(local), seqlens, k);
      out.used_fallback = true;
    }
  }
  for (auto& mb : out.micro_batches) std::sort(mb.begin(), mb.end());

  if (opts.use_dynamic_bsz_balance) {
    // Attention cost grows with length squared: heaviest micro-batches first (verl), ties by
    // the larger smallest index first (Python's reverse sort on (sum_sq, min_idx)).
    auto key = [&](const std::vector<int64_t>& mb) {
      int64_t sq = 0;
      for (int64_t idx : mb) sq += seqlens[idx] * seqlens[idx];
      return std::pair<int64_t, int64_t>(sq, mb.empty() ? 0 : mb.front());
    };
    std::stable_sort(out.micro_batches.begin(), out.micro_batches.end(),
                     [&](const auto& a, const auto& b) { return key(a) > key(b); });
  }
  for (const auto& mb : out.micro_batches) {
    int64_t s = 0;
    for (int64_t idx : mb) s += seqlens[idx];
    out.token_counts.push_back(s);
  }
  return out;
}

RankBalance balance_across_ranks(const std::vector<int64_t>& seqlens, int64_t world_size,
                                 const BalanceOptions& opts) {
  const auto n = static_cast<int64_t>(seqlens.size());
  VERL_CHECK(world_size >= 1, "balance_across_ranks: world_size must be >= 1, got {}", world_size);
  VERL_CHECK(n % world_size == 0 && n >= world_size,
             "balance_across_ranks: a batch of {} sequences does not "
             "split evenly over {} data-parallel ranks; make the batch size (x rollout.n) a "
             "multiple of it",
             n, world_size);
  std::vector<int64_t> weight(seqlens.size());
  for (int64_t i = 0; i < n; ++i)
    weight[i] = opts.use_workload ? calculate_workload(seqlens[i]) : seqlens[i];

  RankBalance out;
  out.partitions = get_seqlen_balanced_partitions(weight, world_size, true);
  if (opts.pipeline_order) {
    for (auto& p : out.partitions) {
      std::sort(p.begin(), p.end(), [&](int64_t a, int64_t b) {
        return std::pair(weight[a], a) < std::pair(weight[b], b);
      });
      std::vector<int64_t> ordered, odd;
      for (size_t i = 0; i < p.size(); ++i) (i % 2 == 0 ? ordered : odd).push_back(p[i]);
      ordered.insert(ordered.end(), odd.rbegin(), odd.rend());
      p = std::move(ordered);
    }
  }
  for (const auto& p : out.partitions) out.order.insert(out.order.end(), p.begin(), p.end());
  out.metrics = log_seqlen_unbalance(seqlens, out.partitions, opts.prefix);
  return out;
}

}  // namespace verl::data
