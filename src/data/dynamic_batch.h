// The seed's DynamicBatchSampler (data.dynamic_batch.*): micro-batches cut by a token budget that
// follows the memory in use, samples outside [min_sequence_length, max_sequence_length] dropped,
// and communication_sensitivity choosing between balanced and full micro-batches. Pure CPU logic:
// the memory reading is injected, so the controller is tested with a fake one (docs/data.md).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "data/seqlen_balancing.h"

namespace verl::config {
class Config;
}

namespace verl::data {

struct DynamicBatchConfig {
  bool enable = false;
  int64_t base_batch_size = 64;        // sequences of planned length one micro-batch's budget holds
  int64_t max_sequence_length = 4096;  // longer samples (prompt + response tokens) are dropped
  int64_t min_sequence_length = 0;     // shorter samples are dropped; 0: no lower bound
  double memory_threshold_gb = 70.0;   // GiB (2^30 bytes, as perf/device_memory_gib) in use
  double communication_sensitivity = 0.8;  // 0..1, see pack_micro_batches
  // data.dynamic_batch.* (only `enable` when it is false); an Error names the key when a value is
  // out of range (min > max names both).
  static DynamicBatchConfig from_config(const config::Config& cfg);
};

// Bytes of memory in use now (on cuda the device's, on cpu the process's resident set).
using MemoryReading = std::function<double()>;
// All-reduce MAX of a micro-batch count over the data-parallel ranks (unset on one rank).
using DpMax = std::function<int64_t(int64_t)>;

// The micro-batches of one pass over a set of rows.
struct DynamicPack {
  Partitions micro_batches;           // indices into the seqlens given, ascending inside each
  std::vector<int64_t> token_counts;  // tokens per micro-batch (fillers included)
  int64_t budget = 0;                 // the token budget they were cut by
  int64_t tokens = 0;                 // tokens of the kept rows (fillers excluded)
  int64_t dropped = 0;                // rows outside the length bounds
  int64_t fillers = 0;  // dropped rows packed only so that every rank has as many micro-batches
  // Kept tokens / (micro-batches x budget); 0 with no micro-batch.
  double token_utilisation() const;
  // (largest - smallest micro-batch tokens) / budget: 0 when perfectly even.
  double spread() const;
};

// Packs the rows with keep[i] into micro-batches of at most `budget` tokens:
//  1. the count K is verl's rearrange_micro_batches count (ceil(tokens / budget), raised until the
//     Karmarkar-Karp partition respects the budget), agreed over the ranks with ONE dp_max call
//     in every case (also when this rank keeps no row), so every rank runs K micro-batches: the
//     gradient sync of the last micro-batch and ZeRO-3's per-forward weight gathers are
//     collectives that must pair up across ranks (trainer/update_loop.cpp);
//  2. communication_sensitivity s decides how the tokens spread over those K micro-batches:
//     F = floor((1 - s) K) micro-batches are filled in turn as full as the budget allows (each
//     takes, longest first, every remaining row that still fits: first-fit decreasing), and the
//     remaining rows are split over the other K - F by Karmarkar-Karp (balanced sums). If that
//     split breaks the budget or leaves a micro-batch empty, F is lowered by one until it works;
//     F = 0 is exactly rearrange_micro_batches. So s = 1 gives every micro-batch of a rank
//     about its tokens / K (with trainer.balance_batch evening the ranks' totals, micro-batch i
//     then takes about as long on every rank), s = 0 packs micro-batches to the budget and
//     leaves the rest in a light tail. The count, hence the token utilisation, does not depend
//     on s;
//  3. when the agreed K exceeds this rank's kept rows (another rank needs more micro-batches, or
//     no rank kept any row: then K = 1), each missing micro-batch holds one dropped row, shortest
//     first (a "filler", computed with its response mask zeroed, so it changes no gradient). A
//     filler must fit `filler_cap` (the token key the model is planned for).
// Micro-batches come heaviest first by sum of squared lengths (verl's use_dynamic_bsz_balance).
// A kept row longer than the budget is an Error naming its length and the budget.
DynamicPack pack_micro_batches(const std::vector<int64_t>& seqlens, const std::vector<bool>& keep,
                               int64_t budget, int64_t filler_cap, double sensitivity,
                               const DpMax& dp_max);

// The seed's fixed base batch for comparison: `kept_rows` in micro-batches of `per_micro`
// sequences, each sized for per_micro x planned_length tokens; their total capacity
// ceil(kept_rows / per_micro) x per_micro x planned_length.
double fixed_count_capacity(int64_t kept_rows, int64_t per_micro, int64_t planned_length);
// Kept tokens / fixed_count_capacity(kept rows, ...): the token utilisation of that batching.
double fixed_count_token_utilisation(const std::vector<int64_t>& seqlens,
                                     const std::vector<bool>& keep, int64_t per_micro,
                                     int64_t planned_length);

// Statistics of the packings since the last take_stats().
struct DynamicBatchStats {
  int64_t packings = 0, micro_batches = 0, tokens = 0, dropped = 0, fillers = 0;
  double capacity = 0;        // sum of micro-batches x budget
  double fixed_capacity = 0;  // the same for fixed micro-batches of base_batch_size sequences
  double spread = 0;          // sum over packings of DynamicPack::spread()
  int64_t shrinks = 0, grows = 0;
};

// The token-budget controller. The budget starts at the ceiling, min(cap, base_batch_size x
// planned_length), where planned_length = min(max_sequence_length, the longest sequence the run
// makes: max_prompt_length + response_length) and cap is the largest micro-batch the model is
// planned for (actor.ppo_max_token_len_per_gpu). Before every packing it reads the memory:
// above memory_threshold_gb the budget halves (multiplicative decrease), at or below it grows by
// a quarter of the ceiling (additive increase), always within [floor, ceiling], floor =
// min(planned_length, cap): one longest kept sequence still fits.
class DynamicBatchSampler {
 public:
  // `memory` empty: no adaptation (the budget stays at the ceiling).
  DynamicBatchSampler(const DynamicBatchConfig& cfg, int64_t planned_length, int64_t cap,
                      MemoryReading memory);

  // Whether a sample of `seqlen` tokens (prompt + response) is kept.
  bool keeps(int64_t seqlen) const;
  std::vector<bool> keeps(const std::vector<int64_t>& seqlens) const;
  int64_t budget() const { return budget_; }
  int64_t floor() const { return floor_; }
  int64_t ceiling() const { return ceiling_; }
  int64_t planned_length() const { return planned_; }
  const DynamicBatchConfig& config() const { return cfg_; }

  // One memory reading and the budget's step; returns the new budget.
  int64_t adapt();
  // adapt(), then pack_micro_batches with budget min(budget(), pass_cap) (pass_cap: the token key
  // of the pass: ppo_max_token_len_per_gpu, log_prob_max_token_len_per_gpu, ...).
  DynamicPack pack(const std::vector<int64_t>& seqlens, int64_t pass_cap, const DpMax& dp_max);
  // Statistics since the last call, then reset.
  DynamicBatchStats take_stats();

 private:
  DynamicBatchConfig cfg_;
  MemoryReading memory_;
  int64_t planned_ = 0, floor_ = 0, ceiling_ = 0, budget_ = 0;
  DynamicBatchStats stats_;
};

}  // namespace verl::data
