// Metrics map, verl's data-metric reductions, section ordering, and the stage timer with its
// interval arithmetic (union and intersection of span sets).
#include "metrics/metrics.h"

#include <algorithm>
#include <array>

#include "core/error.h"

namespace verl::metrics {

void Metrics::set(std::string_view name, double value) {
  VERL_CHECK(!name.empty(), "metrics: empty metric name");
  auto it = values_.find(name);
  if (it == values_.end()) {
    values_.emplace(std::string(name), value);
  } else {
    it->second = value;
  }
}

bool Metrics::contains(std::string_view name) const {
  return values_.find(name) != values_.end();
}

double Metrics::get(std::string_view name) const {
  auto it = values_.find(name);
  VERL_CHECK(it != values_.end(), "metrics: no metric named '{}'", name);
  return it->second;
}

double Metrics::get_or(std::string_view name, double fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

void Metrics::merge(const Metrics& other) {
  for (const auto& [k, v] : other.values_) set(k, v);
}

namespace {

template <typename T>
void add_stats_impl(Metrics& m, std::string_view prefix, std::span<const T> values) {
  if (values.empty()) return;
  double sum = 0.0;
  double mx = static_cast<double>(values[0]);
  double mn = mx;
  for (T x : values) {
    const double v = static_cast<double>(x);
    sum += v;
    mx = std::max(mx, v);
    mn = std::min(mn, v);
  }
  const std::string p(prefix);
  m.set(p + "/mean", sum / static_cast<double>(values.size()));
  m.set(p + "/max", mx);
  m.set(p + "/min", mn);
}

}  // namespace

void Metrics::add_stats(std::string_view prefix, std::span<const double> values) {
  add_stats_impl(*this, prefix, values);
}

void Metrics::add_stats(std::string_view prefix, std::span<const float> values) {
  add_stats_impl(*this, prefix, values);
}

void Metrics::add_length_stats(std::string_view prefix, std::span<const int64_t> lengths,
                               int64_t max_length) {
  if (lengths.empty()) return;
  add_stats_impl(*this, prefix, lengths);
  int64_t clipped = 0;
  for (int64_t n : lengths) clipped += (n >= max_length) ? 1 : 0;
  set(std::string(prefix) + "/clip_ratio",
      static_cast<double>(clipped) / static_cast<double>(lengths.size()));
}

void add_throughput(Metrics& m, int64_t total_num_tokens, double step_seconds, int n_gpus) {
  VERL_CHECK(n_gpus > 0, "metrics: add_throughput needs n_gpus > 0, got {}", n_gpus);
  m.set("perf/total_num_tokens", static_cast<double>(total_num_tokens));
  m.set("perf/time_per_step", step_seconds);
  if (step_seconds > 0.0) {
    m.set("perf/throughput", static_cast<double>(total_num_tokens) / (step_seconds * n_gpus));
  }
}

int section_rank(std::string_view name) {
  // The order a verl user reads a step in: losses first, then data, then where the time went.
  static constexpr std::array<std::string_view, 13> kSections = {
      "training/", "actor/",   "critic/", "response_length/", "prompt_length/",
      "val-core/", "val-aux/", "val/",    "timing_s/",        "timing_per_token_ms/",
      "perf/",     "data/",    "rollout/"};
  for (size_t i = 0; i < kSections.size(); ++i) {
    if (name.starts_with(kSections[i])) return static_cast<int>(i);
  }
  return static_cast<int>(kSections.size());
}

std::vector<std::string> sorted_names(const Metrics& m) {
  std::vector<std::string> names;
  names.reserve(m.size());
  for (const auto& [k, v] : m) names.push_back(k);
  std::stable_sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
    return section_rank(a) < section_rank(b);
  });
  return names;
}

namespace {

// Merged, disjoint, sorted intervals of the spans of `stage` (all spans when stage is empty).
std::vector<std::pair<double, double>> merged(std::span<const StageSpan> timeline,
                                              std::string_view stage, bool all) {
  std::vector<std::pair<double, double>> iv;
  for (const auto& s : timeline) {
    if ((all || s.stage == stage) && s.end_s > s.start_s) iv.emplace_back(s.start_s, s.end_s);
  }
  std::sort(iv.begin(), iv.end());
  std::vector<std::pair<double, double>> out;
  for (const auto& x : iv) {
    if (!out.empty() && x.first <= out.back().second) {
      out.back().second = std::max(out.back().second, x.second);
    } else {
      out.push_back(x);
    }
  }
  return out;
}

double total_length(const std::vector<std::pair<double, double>>& iv) {
  double t = 0.0;
  for (const auto& [a, b] : iv) t += b - a;
  return t;
}

}  // namespace

double stage_seconds(std::span<const StageSpan> timeline, std::string_view stage) {
  return total_length(merged(timeline, stage, false));
}

double busy_seconds(std::span<const StageSpan> timeline) {
  return total_length(merged(timeline, {}, true));
}

double overlap_seconds(std::span<const StageSpan> timeline, std::string_view a,
                       std::string_view b) {
  const auto ia = merged(timeline, a, false);
  const auto ib = merged(timeline, b, false);
  // Two-pointer sweep over the two disjoint sorted interval lists.
  double t = 0.0;
  size_t i = 0, j = 0;
  while (i < ia.size() && j < ib.size()) {
    const double lo = std::max(ia[i].first, ib[j].first);
    const double hi = std::min(ia[i].second, ib[j].second);
    if (hi > lo) t += hi - lo;
    if (ia[i].second < ib[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return t;
}

StageTimer::StageTimer() : step_start_(Clock::now()) {}

void StageTimer::reset() {
  std::lock_guard lock(mu_);
  step_start_ = Clock::now();
  spans_.clear();
}

double StageTimer::now_s() const {
  std::lock_guard lock(mu_);
  return std::chrono::duration<double>(Clock::now() - step_start_).count();
}

void StageTimer::record(std::string_view stage, double start_s, double end_s) {
  VERL_CHECK(!stage.empty(), "StageTimer: empty stage name");
  VERL_CHECK(end_s >= start_s, "StageTimer: stage '{}' ends ({}) before it starts ({})", stage,
             end_s, start_s);
  std::lock_guard lock(mu_);
  spans_.push_back(StageSpan{std::string(stage), start_s, end_s});
}

StageTimer::Scope::Scope(StageTimer& timer, std::string stage)
    : timer_(&timer), stage_(std::move(stage)), start_s_(timer.now_s()) {}

StageTimer::Scope::Scope(Scope&& other) noexcept
    : timer_(other.timer_), stage_(std::move(other.stage_)), start_s_(other.start_s_) {
  other.timer_ = nullptr;
}

StageTimer::Scope::~Scope() {
  try {
    stop();
  } catch (...) {
    // A destructor must not throw; a span that cannot be recorded is dropped.
  }
}

double StageTimer::Scope::stop() {
  if (timer_ == nullptr) return 0.0;
  StageTimer* t = timer_;
  timer_ = nullptr;
  const double end = std::max(t->now_s(), start_s_);
  t->record(stage_, start_s_, end);
  return end - start_s_;
}

std::vector<StageSpan> StageTimer::timeline() const {
  std::vector<StageSpan> out;
  {
    std::lock_guard lock(mu_);
    out = spans_;
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const StageSpan& a, const StageSpan& b) { return a.start_s < b.start_s; });
  return out;
}

double StageTimer::seconds(std::string_view stage) const {
  const auto tl = timeline();
  return stage_seconds(tl, stage);
}

double StageTimer::overlap(std::string_view a, std::string_view b) const {
  const auto tl = timeline();
  return overlap_seconds(tl, a, b);
}

void StageTimer::add_to(Metrics& m) const {
  const auto tl = timeline();
  std::vector<std::string_view> seen;
  for (const auto& s : tl) {
    if (std::find(seen.begin(), seen.end(), s.stage) != seen.end()) continue;
    seen.push_back(s.stage);
    m.set("timing_s/" + s.stage, stage_seconds(tl, s.stage));
  }
}

}  // namespace verl::metrics
