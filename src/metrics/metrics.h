// One training step's metrics under verl's names (`critic/score/mean`, `timing_s/gen`, ...), the
// stats helpers of verl's compute_data_metrics, and a thread-safe StageTimer that records when each
// named pipeline stage ran so overlapping stages (reward scoring during generation) can be
// measured.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace verl::metrics {

// A step's metrics: name -> value, iterated in name order (deterministic output for every logger).
class Metrics {
 public:
  using Map = std::map<std::string, double, std::less<>>;

  void set(std::string_view name, double value);
  bool contains(std::string_view name) const;
  // The value of `name`; throws verl::Error naming the metric when it is missing.
  double get(std::string_view name) const;
  double get_or(std::string_view name, double fallback) const;
  // Copies every entry of `other`, overwriting equal names.
  void merge(const Metrics& other);

  // `<prefix>/mean`, `<prefix>/max`, `<prefix>/min` of `values`, as verl's compute_data_metrics.
  // An empty `values` adds nothing (verl skips a statistic when there is nothing to reduce).
  void add_stats(std::string_view prefix, std::span<const double> values);
  void add_stats(std::string_view prefix, std::span<const float> values);
  // Length statistics as verl's `response_length/*` and `prompt_length/*`: mean/max/min plus
  // `clip_ratio`, the share of sequences whose length reached `max_length` (they were truncated).
  void add_length_stats(std::string_view prefix, std::span<const int64_t> lengths,
                        int64_t max_length);

  const Map& values() const { return values_; }
  size_t size() const { return values_.size(); }
  bool empty() const { return values_.empty(); }
  Map::const_iterator begin() const { return values_.begin(); }
  Map::const_iterator end() const { return values_.end(); }

 private:
  Map values_;
};

// verl's compute_throughout_metrics: perf/total_num_tokens, perf/time_per_step and
// perf/throughput = tokens / (seconds * n_gpus), i.e. tokens per second per GPU.
void add_throughput(Metrics& m, int64_t total_num_tokens, double step_seconds, int n_gpus);

// Rank of a metric's section in verl's display order (actor/, critic/, response_length/, ...,
// timing_s/, perf/, ...); unknown sections sort last. Used to order console tables.
int section_rank(std::string_view name);
// Names of `m` sorted by section rank, then by name.
std::vector<std::string> sorted_names(const Metrics& m);

// One run of a stage: seconds since the step started.
struct StageSpan {
  std::string stage;
  double start_s = 0.0;
  double end_s = 0.0;
  double seconds() const { return end_s - start_s; }
};

// Wall-clock length of the union of `stage`'s spans (a stage run in several chunks, or on several
// threads at once, counts each instant once).
double stage_seconds(std::span<const StageSpan> timeline, std::string_view stage);
// Seconds during which stage `a` and stage `b` both ran (intersection of their span unions).
double overlap_seconds(std::span<const StageSpan> timeline, std::string_view a, std::string_view b);
// Seconds during which at least one stage of the timeline ran.
double busy_seconds(std::span<const StageSpan> timeline);

// Times the named stages of one step (verl's `gen`, `reward`, `old_log_prob`, `ref`, `values`,
// `adv`, `update_critic`, `update_actor`, `step`, ...). Safe to use from several threads at once.
//
//   StageTimer t;                         // the step starts now
//   { auto s = t.scope("gen"); ... }      // or t.record("gen", start_s, end_s)
//   t.add_to(metrics);                    // timing_s/gen = union length of gen's spans
class StageTimer {
 public:
  using Clock = std::chrono::steady_clock;

  StageTimer();
  // Starts a new step: clears the timeline and takes now as time zero.
  void reset();
  // Seconds since the step started.
  double now_s() const;

  // Records a finished span, in seconds since the step started (tests inject synthetic times).
  void record(std::string_view stage, double start_s, double end_s);

  // RAII: the span runs from construction to destruction (or to stop()).
  class Scope {
   public:
    Scope(StageTimer& timer, std::string stage);
    Scope(Scope&& other) noexcept;
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    Scope& operator=(Scope&&) = delete;
    ~Scope();
    // Ends the span now; returns its length in seconds. Later calls do nothing and return 0.
    double stop();

   private:
    StageTimer* timer_;
    std::string stage_;
    double start_s_;
  };
  Scope scope(std::string stage) { return Scope(*this, std::move(stage)); }

  // All spans recorded since the step started, sorted by start time.
  std::vector<StageSpan> timeline() const;
  double seconds(std::string_view stage) const;
  double overlap(std::string_view a, std::string_view b) const;
  // timing_s/<stage> for every stage seen (union length of its spans).
  void add_to(Metrics& m) const;

 private:
  mutable std::mutex mu_;
  Clock::time_point step_start_;
  std::vector<StageSpan> spans_;
};

}  // namespace verl::metrics
