// A step's metrics and per-phase memory figures (verl's metric_utils names), reduced over ranks.
#include "trainer/step_metrics.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <span>

#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"
#include "tokenizer/tokenizer.h"

namespace verl::trainer {
namespace {

// Statistics over every data-parallel rank's values (Metrics::add_stats / add_length_stats on
// one rank).
void add_global_stats(dist::Communicator& comm, metrics::Metrics& m, std::string_view prefix,
                      const std::vector<double>& x) {
  if (comm.world_size() == 1) {
    m.add_stats(prefix, x);
    return;
  }
  double sums[2] = {0, static_cast<double>(x.size())};
  double hi[1] = {-std::numeric_limits<double>::infinity()},
         lo[1] = {std::numeric_limits<double>::infinity()};
  for (double v : x) {
    sums[0] += v;
    hi[0] = std::max(hi[0], v);
    lo[0] = std::min(lo[0], v);
  }
  comm.all_reduce(std::span<double>(sums), dist::ReduceOp::Sum);
  comm.all_reduce(std::span<double>(hi), dist::ReduceOp::Max);
  comm.all_reduce(std::span<double>(lo), dist::ReduceOp::Min);
  if (sums[1] == 0) return;  // nothing to reduce anywhere: no statistic, as add_stats
  m.set(std::string(prefix) + "/mean", sums[0] / sums[1]);
  m.set(std::string(prefix) + "/max", hi[0]);
  m.set(std::string(prefix) + "/min", lo[0]);
}

void add_global_length_stats(dist::Communicator& comm, metrics::Metrics& m, std::string_view prefix,
                             const std::vector<int64_t>& len, int64_t max_length) {
  if (comm.world_size() == 1) {
    m.add_length_stats(prefix, len, max_length);
    return;
  }
  std::vector<double> x(len.begin(), len.end());
  add_global_stats(comm, m, prefix, x);
  double clipped[2] = {0, static_cast<double>(len.size())};
  for (int64_t l : len) clipped[0] += l >= max_length ? 1.0 : 0.0;
  comm.all_reduce(std::span<double>(clipped), dist::ReduceOp::Sum);
  if (clipped[1] > 0) m.set(std::string(prefix) + "/clip_ratio", clipped[0] / clipped[1]);
}

}  // namespace

std::pair<size_t, size_t> MemoryRecorder::host_state_bytes() const {
  size_t state = 0, gather = 0;
  for (PolicyModel* p : models_) {
    if (!p) continue;
    state += p->state().host_bytes() + p->strategy().host_bytes();
    gather += p->strategy().take_peak_gather_bytes();
  }
  return {state, gather};
}

void MemoryRecorder::end_of_gen() {
  gen_device_bytes_ = device_memory_in_use();
  gen_state_bytes_ = host_state_bytes();
}

void MemoryRecorder::record(metrics::Metrics& m, const char* phase, size_t tracked_peak) const {
  const bool gen = std::string_view(phase) == "gen";
  if (device_ != Device::Cuda) {
    const auto [state, gather] = gen ? gen_state_bytes_ : host_state_bytes();
    m.set(std::string("perf/host_state_gib/") + phase,
          static_cast<double>(state + gather) / (1 << 30));
    if (gather > 0)
      m.set(std::string("perf/host_gather_gib/") + phase, static_cast<double>(gather) / (1 << 30));
    return;
  }
  constexpr double kGiB = 1 << 30;
  const size_t in_use = device_memory_in_use();
  m.set(std::string("perf/device_memory_gib/") + phase,
        static_cast<double>(gen ? gen_device_bytes_ : in_use) / kGiB);
  if (gen) m.set("perf/device_memory_gib/after_gen_free", static_cast<double>(in_use) / kGiB);
  // The phase's peak: the most our allocators held since the phase began, plus what they do not
  // count (the CUDA context, cuBLASLt's and NCCL's own memory: in use minus tracked, taken as
  // constant through the phase), and never below what was seen in use.
  const size_t untracked = in_use - std::min(in_use, tracked_device_memory());
  const size_t tracked = std::max(tracked_peak, take_tracked_device_peak());
  size_t peak = untracked + tracked;
  if (gen) peak = std::max(peak, gen_device_bytes_);  // the decode graphs' pools are untracked
  m.set(std::string("perf/device_memory_peak_gib/") + phase,
        static_cast<double>(std::max(peak, in_use)) / kGiB);
  // This process's own allocations at the phase's peak (the CUDA context left out): one rank's
  // figure where ranks share a GPU, whose in-use count is every rank's (RunPlan's per-rank plan
  // minus MemoryPlan::context).
  m.set(std::string("perf/device_memory_rank_peak_gib/") + phase,
        static_cast<double>(tracked) / kGiB);
}

void ProbsDiff::add(const std::vector<float>& rollout, const std::vector<float>& old,
                    const std::vector<float>& mask) {
  for (size_t i = 0; i < mask.size(); ++i) {
    if (mask[i] == 0.0f) continue;
    const double d = std::fabs(std::exp(double(rollout[i])) - std::exp(double(old[i])));
    worst = std::max(worst, d);
    sum += d;
    sq += d * d;
    n += 1;
  }
}

void ProbsDiff::reduce(dist::Communicator& comm) {
  if (comm.world_size() == 1) return;
  double sums[3] = {sum, sq, n};
  comm.all_reduce(std::span<double>(sums), dist::ReduceOp::Sum);
  double w[1] = {worst};
  comm.all_reduce(std::span<double>(w), dist::ReduceOp::Max);
  sum = sums[0];
  sq = sums[1];
  n = sums[2];
  worst = w[0];
}

void ProbsDiff::report(metrics::Metrics& m) const {
  if (n == 0) return;
  const double mean = sum / n;
  m.set("training/rollout_probs_diff_max", worst);
  m.set("training/rollout_probs_diff_mean", mean);
  m.set("training/rollout_probs_diff_std", std::sqrt(std::max(0.0, sq / n - mean * mean)));
}

void add_dynamic_batch_metrics(const data::DynamicBatchStats& other,
                               const data::DynamicBatchStats& update, dist::Communicator& comm,
                               int64_t budget, metrics::Metrics& m) {
  double s[4] = {static_cast<double>(update.tokens), update.capacity, update.fixed_capacity,
                 static_cast<double>(update.fillers)};
  if (comm.world_size() > 1) comm.all_reduce(std::span<double>(s), dist::ReduceOp::Sum);
  if (s[1] > 0) m.set("perf/token_utilisation", s[0] / s[1]);
  if (s[2] > 0) m.set("dynamic_batch/fixed_count_token_utilisation", s[0] / s[2]);
  m.set("dynamic_batch/filler_samples", s[3]);
  m.set("dynamic_batch/token_budget", static_cast<double>(budget));
  m.set("dynamic_batch/shrinks", static_cast<double>(other.shrinks + update.shrinks));
  m.set("dynamic_batch/grows", static_cast<double>(other.grows + update.grows));
  m.set("dynamic_batch/micro_batches", static_cast<double>(update.micro_batches));
  if (update.packings > 0)
    m.set("dynamic_batch/micro_batch_spread",
          comm.mean(update.spread / static_cast<double>(update.packings)));
}

void add_data_metrics(const Experience& exp, dist::Communicator& comm, int64_t response_length,
                      int64_t max_prompt_length, metrics::Metrics& m) {
  const int64_t L = exp.L;
  std::vector<double> seq_score(exp.B), seq_reward(exp.B), adv, ret, val;
  std::vector<int64_t> resp_len(exp.B), prompt_len(exp.B);
  for (int64_t b = 0; b < exp.B; ++b) {
    double s = 0, r = 0;
    for (int64_t j = 0; j < L; ++j) {
      s += exp.token_level_scores[b * L + j];
      r += exp.token_level_rewards[b * L + j];
      if (exp.mask[b * L + j] > 0) {
        adv.push_back(exp.advantages[b * L + j]);
        ret.push_back(exp.returns[b * L + j]);
        if (!exp.values.empty()) val.push_back(exp.values[b * L + j]);
      }
    }
    seq_score[b] = s;
    seq_reward[b] = r;
    resp_len[b] = static_cast<int64_t>(exp.response[b].size());
    prompt_len[b] = static_cast<int64_t>(exp.sample[b]->prompt_ids.size());
  }
  add_global_stats(comm, m, "critic/score", seq_score);
  add_global_stats(comm, m, "critic/rewards", seq_reward);
  add_global_stats(comm, m, "critic/advantages", adv);
  add_global_stats(comm, m, "critic/returns", ret);
  if (!val.empty()) {
    add_global_stats(comm, m, "critic/values", val);
    // vf_explained_var = 1 - var(returns - values) / var(returns), over valid tokens (of every
    // rank).
    std::vector<double> diff(ret.size());
    for (size_t i = 0; i < ret.size(); ++i) diff[i] = ret[i] - val[i];
    if (comm.world_size() == 1) {
      auto var = [](const std::vector<double>& x) {
        double mean = std::accumulate(x.begin(), x.end(), 0.0) / x.size(), v = 0;
        for (double e : x) v += (e - mean) * (e - mean);
        return v / x.size();
      };
      m.set("critic/vf_explained_var", 1.0 - var(diff) / (var(ret) + 1e-5));
    } else {
      double s[5] = {static_cast<double>(ret.size()), 0, 0, 0,
                     0};  // n, sum and sum of squares of ret, diff
      for (size_t i = 0; i < ret.size(); ++i) {
        s[1] += ret[i];
        s[2] += ret[i] * ret[i];
        s[3] += diff[i];
        s[4] += diff[i] * diff[i];
      }
      comm.all_reduce(std::span<double>(s), dist::ReduceOp::Sum);
      const double var_ret = s[2] / s[0] - (s[1] / s[0]) * (s[1] / s[0]);
      const double var_diff = s[4] / s[0] - (s[3] / s[0]) * (s[3] / s[0]);
      m.set("critic/vf_explained_var", 1.0 - var_diff / (var_ret + 1e-5));
    }
  }
  add_global_length_stats(comm, m, "response_length", resp_len, response_length);
  add_global_length_stats(comm, m, "prompt_length", prompt_len, max_prompt_length);
}

void add_rollout_metrics(const Experience& exp, int64_t vocab_size, dist::Communicator& comm,
                         metrics::Metrics& m) {
  // Sampled ids past the tokenizer (a padded embedding's extra rows) have no text; counted here.
  int64_t out_of_vocab = 0;
  for (const auto& r : exp.response)
    for (int32_t id : r) out_of_vocab += id >= vocab_size ? 1 : 0;
  m.set("rollout/out_of_vocab_tokens", static_cast<double>(comm.sum(out_of_vocab)));
  // This rank's rollout engine: its steps, and on the GPU the decode steps replayed from CUDA
  // graphs and the graphs it captured (a runner lives one rollout, so they are captured anew each
  // step) with the host time that took.
  m.set("rollout/engine_steps", static_cast<double>(exp.runner_stats.steps));
  m.set("rollout/decode_steps", static_cast<double>(exp.runner_stats.decode_steps));
  if (exp.runner_stats.gpu) {
    m.set("rollout/graph_steps", static_cast<double>(exp.runner_stats.graph_steps));
    m.set("rollout/graphs_captured", static_cast<double>(exp.runner_stats.graphs_captured));
    m.set("timing_s/gen_graph_capture", exp.runner_stats.graph_capture_s);
  }
}

void add_sync_metrics(const std::vector<PolicyModel*>& trained, metrics::Metrics& m) {
  // This rank's gradient sync in the step's updates (optim/grad_sync.h): bytes it sent and the
  // seconds backward did not hide.
  optim::SyncStats sync;
  optim::GatherStats gather;
  bool first = true;
  for (PolicyModel* p : trained) {
    if (!p) continue;
    if (first) {
      sync = p->strategy().take_sync_stats();
    } else {
      sync.add(p->strategy().take_sync_stats());
    }
    first = false;
  }
  m.set("perf/grad_sync_bytes", sync.bytes);
  // The layout's ZeRO stage as the strategy runs it (0 on one rank), beside parallel/dp.
  for (PolicyModel* p : trained)
    if (p) {
      m.set("parallel/zero_stage", static_cast<double>(p->strategy().zero_stage()));
      break;
    }
  // ZeRO-3: the weight gathers of the step's passes (bytes this rank sent, seconds it waited).
  first = true;
  for (PolicyModel* p : trained) {
    if (!p) continue;
    const optim::GatherStats c = p->strategy().take_gather_stats();
    if (first) {
      gather = c;
    } else {
      gather.bytes += c.bytes;
      gather.seconds += c.seconds;
      gather.gathers += c.gathers;
    }
    first = false;
  }
  if (gather.gathers > 0) {
    m.set("perf/zero3_gather_bytes", gather.bytes);
    m.set("timing_s/zero3_gather", gather.seconds);
  }
  m.set("perf/grad_sync_bytes_dense", sync.dense_bytes);
  m.set("timing_s/grad_sync", sync.seconds);
}

void add_timing_metrics(const metrics::StageTimer& timer, bool token_pipeline, bool critic_overlap,
                        metrics::Metrics& m) {
  for (const char* stage : {"gen", "gen_setup", "reshard", "reward", "balance", "old_log_prob",
                            "ref", "values", "adv", "update_critic", "update_actor", "step"}) {
    const double s = timer.seconds(stage);
    if (s > 0 || std::string(stage) == "gen" || std::string(stage) == "step")
      m.set(std::string("timing_s/") + stage, s);
  }
  m.set("timing_s/reward_overlap_gen", timer.overlap("gen", "reward"));
  for (const char* stage :
       {"old_log_prob", "ref", "values"})  // the token pipeline's share of each pass
    if (token_pipeline)
      m.set(std::string("timing_s/") + stage + "_overlap_gen", timer.overlap("gen", stage));
  if (critic_overlap)
    m.set("timing_s/update_critic_overlap_actor", timer.overlap("update_actor", "update_critic"));
}

std::vector<GenerationRow> generation_rows(const tokenizer::Tokenizer& tok, const Experience& exp) {
  std::vector<GenerationRow> out(static_cast<size_t>(exp.B));
  for (int64_t b = 0; b < exp.B; ++b) {
    out[b] = {tok.decode(exp.sample[b]->prompt_ids, true), tok.decode(exp.response[b], true),
              exp.sample[b]->ground_truth_json, exp.scores[b]};
  }
  return out;
}

void dump_generations(const std::string& dir, const std::string& key, int64_t step,
                      const std::vector<GenerationRow>& rows, const dist::Communicator& comm) {
  std::filesystem::create_directories(dir);
  const std::string name = comm.world_size() == 1
                               ? fmt::format("{}.jsonl", step)
                               : fmt::format("{}_rank{}.jsonl", step, comm.rank());
  const std::string path = (std::filesystem::path(dir) / name).string();
  std::ofstream f(path, std::ios::trunc);
  VERL_CHECK(f.good(), "{}={}: cannot write {}", key, dir, path);
  for (const GenerationRow& r : rows) {
    nlohmann::ordered_json j = {{"input", r.input},
                                {"output", r.output},
                                {"gts", r.gts},
                                {"score", r.score},
                                {"step", step}};
    f << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << '\n';
  }
  f.close();
  VERL_CHECK(!f.fail(), "{}={}: writing {} failed (disk full?)", key, dir, path);
}

void log_val_generations(std::vector<GenerationRow> rows, int64_t n, int64_t step) {
  if (n <= 0 || rows.empty()) return;
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.input < b.input; });
  Rng rng(42);
  for (size_t i = rows.size() - 1; i > 0; --i) std::swap(rows[i], rows[rng.below(i + 1)]);
  rows.resize(std::min<size_t>(rows.size(), static_cast<size_t>(n)));
  for (size_t i = 0; i < rows.size(); ++i)
    log::info("validation sample {} of step {} (score {}):\n[input] {}\n[output] {}", i + 1, step,
              rows[i].score, rows[i].input, rows[i].output);
}

}  // namespace verl::trainer
