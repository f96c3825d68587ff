// data.dynamic_batch: the length filter, the packing with communication_sensitivity and the
// memory-driven token budget (dynamic_batch.h has the rules).
#include "data/dynamic_batch.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "config/config.h"
#include "core/error.h"

namespace verl::data {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kShrinkFactor = 0.5;   // multiplicative decrease above the threshold
constexpr double kGrowFraction = 0.25;  // additive increase, as a share of the ceiling

int64_t sum_of(const std::vector<int64_t>& idx, const std::vector<int64_t>& seqlens) {
  int64_t s = 0;
  for (int64_t i : idx) s += seqlens[static_cast<size_t>(i)];
  return s;
}

// F bins filled in turn, each with every remaining row (longest first) that still fits, then the
// rest split over k - F bins by Karmarkar-Karp; empty when that breaks the budget or leaves a bin
// empty. `rows` index `seqlens`.
Partitions full_then_balanced(const std::vector<int64_t>& rows, const std::vector<int64_t>& seqlens,
                              int64_t budget, int64_t k, int64_t full) {
  std::vector<int64_t> order = rows;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return seqlens[static_cast<size_t>(a)] > seqlens[static_cast<size_t>(b)];
  });
  std::vector<bool> used(order.size(), false);
  Partitions out;
  for (int64_t f = 0; f < full; ++f) {
    std::vector<int64_t> bin;
    int64_t load = 0;
    for (size_t j = 0; j < order.size(); ++j) {
      const int64_t len = seqlens[static_cast<size_t>(order[j])];
      if (used[j] || load + len > budget) continue;
      bin.push_back(order[j]);
      load += len;
      used[j] = true;
    }
    if (bin.empty()) return {};
    out.push_back(std::move(bin));
  }
  std::vector<int64_t> rest, rest_lens;
  for (size_t j = 0; j < order.size(); ++j) {
    if (used[j]) continue;
    rest.push_back(order[j]);
    rest_lens.push_back(seqlens[static_cast<size_t>(order[j])]);
  }
  const int64_t left = k - full;
  if (left == 0) return rest.empty() ? out : Partitions{};
  if (static_cast<int64_t>(rest.size()) < left) return {};
  for (const auto& part : get_seqlen_balanced_partitions(rest_lens, left, false)) {
    std::vector<int64_t> bin;
    for (int64_t p : part) bin.push_back(rest[static_cast<size_t>(p)]);
    if (sum_of(bin, seqlens) > budget) return {};
    out.push_back(std::move(bin));
  }
  return out;
}

}  // namespace

DynamicBatchConfig DynamicBatchConfig::from_config(const config::Config& cfg) {
  const std::string k = "data.dynamic_batch.";
  DynamicBatchConfig c;
  c.enable = cfg.get<bool>(k + "enable");
  // Disabled, the other keys change nothing: leave them unread
  // (tests/trainer/test_config_reads.cpp).
  if (!c.enable) return c;
  c.base_batch_size = cfg.get<int64_t>(k + "base_batch_size");
  c.max_sequence_length = cfg.get<int64_t>(k + "max_sequence_length");
  c.min_sequence_length = cfg.get<int64_t>(k + "min_sequence_length");
  c.memory_threshold_gb = cfg.get<double>(k + "memory_threshold_gb");
  c.communication_sensitivity = cfg.get<double>(k + "communication_sensitivity");
  // The schema's ranges check each key alone; these hold for structs built in code too.
  VERL_CHECK(c.base_batch_size >= 1, "data.dynamic_batch.base_batch_size must be >= 1, got {}",
             c.base_batch_size);
  VERL_CHECK(c.max_sequence_length >= 1,
             "data.dynamic_batch.max_sequence_length must be >= 1, got {}", c.max_sequence_length);
  VERL_CHECK(c.min_sequence_length >= 0,
             "data.dynamic_batch.min_sequence_length must be >= 0, got {}", c.min_sequence_length);
  VERL_CHECK(c.min_sequence_length <= c.max_sequence_length,
             "data.dynamic_batch.min_sequence_length ({}) must not exceed "
             "data.dynamic_batch.max_sequence_length ({}): "
             "every sample would be dropped",
             c.min_sequence_length, c.max_sequence_length);
  VERL_CHECK(c.memory_threshold_gb >= 0,
             "data.dynamic_batch.memory_threshold_gb must be >= 0, got {}", c.memory_threshold_gb);
  VERL_CHECK(c.communication_sensitivity >= 0 && c.communication_sensitivity <= 1,
             "data.dynamic_batch.communication_sensitivity must be in [0, 1], got {}",
             c.communication_sensitivity);
  return c;
}

double DynamicPack::token_utilisation() const {
  return data::token_utilisation(tokens, static_cast<int64_t>(micro_batches.size()), budget);
}

double DynamicPack::spread() const {
  if (token_counts.empty() || budget <= 0) return 0.0;
  const auto [lo, hi] = std::minmax_element(token_counts.begin(), token_counts.end());
  return static_cast<double>(*hi - *lo) / static_cast<double>(budget);
}

DynamicPack pack_micro_batches(const std::vector<int64_t>& seqlens, const std::vector<bool>& keep,
                               int64_t budget, int64_t filler_cap, double sensitivity,
                               const DpMax& dp_max) {
  VERL_CHECK(keep.size() == seqlens.size(), "pack_micro_batches: {} keep flags for {} sequences",
             keep.size(), seqlens.size());
  VERL_CHECK(budget >= 1, "pack_micro_batches: the token budget must be >= 1, got {}", budget);
  DynamicPack out;
  out.budget = budget;
  std::vector<int64_t> kept, dropped;
  for (size_t i = 0; i < seqlens.size(); ++i)
    (keep[i] ? kept : dropped).push_back(static_cast<int64_t>(i));
  out.dropped = static_cast<int64_t>(dropped.size());
  const auto n_kept = static_cast<int64_t>(kept.size());

  // 1. The agreed count: exactly one dp_max call on every path.
  int64_t agreed = 0;
  if (n_kept == 0) {
    agreed = dp_max ? dp_max(0) : 0;
  } else {
    std::vector<int64_t> lens;
    for (int64_t i : kept) {
      lens.push_back(seqlens[static_cast<size_t>(i)]);
      VERL_CHECK(
          lens.back() <= budget,
          "a kept sequence of {} tokens exceeds the micro-batch token budget {}: lower "
          "data.dynamic_batch.max_sequence_length or raise the pass's *_max_token_len_per_gpu",
          lens.back(), budget);
    }
    MicroBatchOptions mo;
    mo.max_token_len = budget;
    // This rank makes at most its kept rows into micro-batches; fillers make up the rest.
    if (dp_max)
      mo.dp_max = [&](int64_t k) {
        agreed = dp_max(k);
        return std::min(agreed, n_kept);
      };
    MicroBatches bal = rearrange_micro_batches(lens, mo);
    if (!dp_max) agreed = static_cast<int64_t>(bal.micro_batches.size());
    const auto k = static_cast<int64_t>(bal.micro_batches.size());
    // 2. communication_sensitivity: F full micro-batches, the rest balanced.
    Partitions chosen;
    std::vector<int64_t> local(lens.size());
    std::iota(local.begin(), local.end(), int64_t{0});
    for (auto full =
             static_cast<int64_t>(std::floor((1.0 - sensitivity) * static_cast<double>(k) + 1e-9));
         full > 0; --full) {
      chosen = full_then_balanced(local, lens, budget, k, full);
      if (!chosen.empty()) break;
    }
    if (chosen.empty()) chosen = std::move(bal.micro_batches);
    for (auto& mb : chosen) {
      std::vector<int64_t> rows;
      for (int64_t j : mb) rows.push_back(kept[static_cast<size_t>(j)]);
      std::sort(rows.begin(), rows.end());
      out.micro_batches.push_back(std::move(rows));
    }
    out.tokens = std::accumulate(lens.begin(), lens.end(), int64_t{0});
  }
  // 3. Fillers: this rank's micro-batches up to the agreed count (at least one overall).
  agreed = std::max<int64_t>(agreed, 1);
  std::stable_sort(dropped.begin(), dropped.end(), [&](int64_t a, int64_t b) {
    return seqlens[static_cast<size_t>(a)] < seqlens[static_cast<size_t>(b)];
  });
  for (size_t f = 0; static_cast<int64_t>(out.micro_batches.size()) < agreed; ++f) {
    VERL_CHECK(f < dropped.size(),
               "data.dynamic_batch: {} micro-batches agreed over the ranks but this rank has only "
               "{} sequences",
               agreed, seqlens.size());
    const int64_t len = seqlens[static_cast<size_t>(dropped[f])];
    VERL_CHECK(
        len <= filler_cap,
        "data.dynamic_batch: a dropped sequence of {} tokens must fill a micro-batch (the ranks "
        "run as many "
        "micro-batches) but exceeds the pass's token key ({}); raise ppo_max_token_len_per_gpu / "
        "log_prob_max_token_len_per_gpu",
        len, filler_cap);
    out.micro_batches.push_back({dropped[f]});
    ++out.fillers;
  }
  // Heaviest first by attention cost, as rearrange_micro_batches (ties: larger first index first).
  auto key = [&](const std::vector<int64_t>& mb) {
    int64_t sq = 0;
    for (int64_t i : mb) sq += seqlens[static_cast<size_t>(i)] * seqlens[static_cast<size_t>(i)];
    return std::pair<int64_t, int64_t>(sq, mb.front());
  };
  std::stable_sort(out.micro_batches.begin(), out.micro_batches.end(),
                   [&](const auto& a, const auto& b) { return key(a) > key(b); });
  for (const auto& mb : out.micro_batches) out.token_counts.push_back(sum_of(mb, seqlens));
  return out;
}

double fixed_count_capacity(int64_t kept_rows, int64_t per_micro, int64_t planned_length) {
  const int64_t micros = (kept_rows + per_micro - 1) / per_micro;
  return static_cast<double>(micros) * static_cast<double>(per_micro) *
         static_cast<double>(planned_length);
}

double fixed_count_token_utilisation(const std::vector<int64_t>& seqlens,
                                     const std::vector<bool>& keep, int64_t per_micro,
                                     int64_t planned_length) {
  int64_t n = 0, tokens = 0;
  for (size_t i = 0; i < seqlens.size(); ++i) {
    if (!keep[i]) continue;
    ++n;
    tokens += seqlens[i];
  }
  const double capacity = fixed_count_capacity(n, per_micro, planned_length);
  return capacity > 0 ? static_cast<double>(tokens) / capacity : 0.0;
}

DynamicBatchSampler::DynamicBatchSampler(const DynamicBatchConfig& cfg, int64_t planned_length,
                                         int64_t cap, MemoryReading memory)
    : cfg_(cfg), memory_(std::move(memory)) {
  VERL_CHECK(planned_length >= 1 && cap >= 1,
             "DynamicBatchSampler: planned length {} and cap {} must be >= 1", planned_length, cap);
  planned_ = std::min(cfg_.max_sequence_length, planned_length);
  floor_ = std::min(planned_, cap);
  // base_batch_size x planned may overflow nothing in practice, but clamp before multiplying.
  ceiling_ = cfg_.base_batch_size >= (cap + planned_ - 1) / planned_
                 ? cap
                 : cfg_.base_batch_size * planned_;
  ceiling_ = std::max(ceiling_, floor_);
  budget_ = ceiling_;
}

bool DynamicBatchSampler::keeps(int64_t seqlen) const {
  return seqlen <= cfg_.max_sequence_length &&
         (cfg_.min_sequence_length == 0 || seqlen >= cfg_.min_sequence_length);
}

std::vector<bool> DynamicBatchSampler::keeps(const std::vector<int64_t>& seqlens) const {
  std::vector<bool> k(seqlens.size());
  for (size_t i = 0; i < seqlens.size(); ++i) k[i] = keeps(seqlens[i]);
  return k;
}

int64_t DynamicBatchSampler::adapt() {
  if (!memory_) return budget_;
  const double used = memory_();
  const int64_t before = budget_;
  if (used > cfg_.memory_threshold_gb * kGiB) {
    budget_ = std::max(floor_, static_cast<int64_t>(static_cast<double>(budget_) * kShrinkFactor));
    if (budget_ < before) ++stats_.shrinks;
  } else {
    const auto step =
        std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(ceiling_) * kGrowFraction));
    budget_ = std::min(ceiling_, budget_ + step);
    if (budget_ > before) ++stats_.grows;
  }
  return budget_;
}

DynamicPack DynamicBatchSampler::pack(const std::vector<int64_t>& seqlens, int64_t pass_cap,
                                      const DpMax& dp_max) {
  adapt();
  const std::vector<bool> keep = keeps(seqlens);
  DynamicPack p = pack_micro_batches(seqlens, keep, std::min(budget_, pass_cap), pass_cap,
                                     cfg_.communication_sensitivity, dp_max);
  ++stats_.packings;
  stats_.micro_batches += static_cast<int64_t>(p.micro_batches.size());
  stats_.tokens += p.tokens;
  stats_.dropped += p.dropped;
  stats_.fillers += p.fillers;
  stats_.capacity += static_cast<double>(p.micro_batches.size()) * static_cast<double>(p.budget);
  const int64_t n_kept = static_cast<int64_t>(seqlens.size()) - p.dropped;
  stats_.fixed_capacity += fixed_count_capacity(n_kept, cfg_.base_batch_size, planned_);
  stats_.spread += p.spread();
  return p;
}

DynamicBatchStats DynamicBatchSampler::take_stats() {
  DynamicBatchStats s = stats_;
  stats_ = {};
  return s;
}

}  // namespace verl::data
