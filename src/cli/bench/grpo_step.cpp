// `verl bench grpo-step CONFIG [key=value ...]`: times the trainer's own GRPO / PPO step. It builds
// the PpoTrainer that `verl train` builds from the same config (verl's ppo_trainer.yaml keys and
// overrides) and runs PpoTrainer::train_step on the trainer's own batches, --warmup untimed steps
// then --steps timed ones, and prints one JSON line: the mean seconds of each stage the trainer
// times (verl's timing_s/<stage>: gen, reward, old_log_prob, ref, values, adv, update_critic,
// update_actor, step), tokens per second (verl's perf/throughput), device memory per phase (at its
// end and at its peak, the most over the steps warm-up included) and the
// rollout vs old log-prob agreement, next to the last step's whole metrics map. No stage is
// re-implemented here: the numbers are the ones `verl train` logs for the same config.
// tools/bench_grpo_hf.py is its transformers peer (a TRL-style loop at the same workload).
#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/bench/bench.h"
#include "cli/command.h"
#include "cli/io.h"
#include "config/config.h"
#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "trainer/ppo_trainer.h"

namespace verl::cli {
namespace {

struct GrpoOpts {
  std::vector<std::string> args;  // CONFIG.yaml and/or key=value overrides
  int steps = 3, warmup = 1;
  std::string length_dist;  // --length-dist
};

// --length-dist none | lognormal:MEAN[:CAP[:SIGMA]] as the rollout.length_dist overrides.
std::vector<std::string> length_dist_overrides(const std::string& spec) {
  const std::string k = "actor_rollout_ref.rollout.length_dist.";
  if (spec.empty()) return {};
  if (spec == "none") return {k + "type=none"};
  std::vector<std::string> parts;
  for (size_t at = 0;;) {
    const size_t colon = spec.find(':', at);
    parts.push_back(spec.substr(at, colon == std::string::npos ? std::string::npos : colon - at));
    if (colon == std::string::npos) break;
    at = colon + 1;
  }
  VERL_CHECK(
      parts[0] == "lognormal" && parts.size() >= 2 && parts.size() <= 4,
      "--length-dist '{}': expected none or lognormal:MEAN[:CAP[:SIGMA]], e.g. lognormal:300:1024",
      spec);
  std::vector<std::string> o = {k + "type=lognormal", k + "mean=" + parts[1]};
  if (parts.size() >= 3) o.push_back(k + "cap=" + parts[2]);
  if (parts.size() >= 4) o.push_back(k + "sigma=" + parts[3]);
  return o;
}

constexpr const char* kStages[] = {"gen",          "gen_wait",  "reward", "old_log_prob",
                                   "ref",          "values",    "adv",    "update_critic",
                                   "update_actor", "grad_sync", "step"};

int run_grpo_step(const GrpoOpts& o) {
  VERL_CHECK(o.steps >= 1, "--steps must be >= 1, got {}", o.steps);
  VERL_CHECK(o.warmup >= 0, "--warmup must be >= 0, got {}", o.warmup);
  auto [path, overrides] = split_config_args(o.args);
  VERL_CHECK(
      !path.empty(),
      "bench grpo-step needs a config (CONFIG.yaml [key=value ...]), e.g. "
      "configs/examples/grpo_qwen2_5_0_5b_h200.yaml; it times the trainer that config builds");
  // Timing only: no checkpoints, no validation, no files beyond what the trainer always writes.
  overrides.push_back("trainer.total_training_steps=" + std::to_string(o.warmup + o.steps));
  for (std::string& x : length_dist_overrides(o.length_dist)) overrides.push_back(std::move(x));
  config::Config cfg = config::load_config(path, overrides);
  trainer::PpoTrainer trainer(cfg);

  std::map<std::string, double> sum;
  std::map<std::string, double> memory_gib, peak_memory_gib;  // per phase: at its end, at its peak
  double step_min = std::numeric_limits<double>::infinity(), first_step = 0, tokens = 0;
  double probs_diff_max = 0, sync_bytes = 0, sync_bytes_dense = 0;
  metrics::Metrics last;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    std::optional<data::Batch> batch = trainer.next_batch();
    VERL_CHECK(batch.has_value(),
               "bench grpo-step: the training set of {} ran out of batches after {} steps; give it "
               "more rows or fewer --steps",
               path, i);
    last = trainer.train_step(*batch);
    const double step = last.get("timing_s/step");
    log::info("bench grpo-step: step {} took {:.3f} s{}", i, step,
              i < o.warmup ? " (warm-up)" : "");
    if (i == 0) first_step = step;
    for (const auto& [name, value] : last) {
      for (auto [prefix, into] :
           {std::pair{std::string("perf/device_memory_gib/"), &memory_gib},
            std::pair{std::string("perf/device_memory_peak_gib/"), &peak_memory_gib}}) {
        if (name.rfind(prefix, 0) != 0) continue;
        double& x = (*into)[name.substr(prefix.size())];
        x = std::max(x, value);
      }
    }
    if (i < o.warmup) continue;
    for (const char* stage : kStages)
      sum[stage] += last.get_or(std::string("timing_s/") + stage, 0.0);
    step_min = std::min(step_min, step);
    tokens += last.get("perf/total_num_tokens");
    sync_bytes += last.get_or("perf/grad_sync_bytes", 0.0);
    sync_bytes_dense += last.get_or("perf/grad_sync_bytes_dense", 0.0);
    probs_diff_max = std::max(probs_diff_max, last.get_or("training/rollout_probs_diff_max", 0.0));
  }
  const double steps = static_cast<double>(o.steps);
  nlohmann::json stage_s = nlohmann::json::object(), share = nlohmann::json::object();
  for (const char* stage : kStages) {
    if (sum[stage] <= 0 && std::string(stage) != "step") continue;  // a stage this config skips
    stage_s[stage] = sum[stage] / steps;
    share[stage] = sum[stage] / sum["step"];
  }
  nlohmann::json metrics = nlohmann::json::object();
  for (const auto& [name, value] : last) metrics[name] = value;
  nlohmann::json j = {
      {"bench", "grpo_step"},
      {"impl", "verl.cpp"},
      {"config", path},
      {"overrides", overrides},
      {"device", to_string(trainer.device())},
      {"device_name", trainer.device() == Device::Cuda ? cuda_device_name() : "cpu"},
      {"params", trainer.actor_params()},
      {"prompts", cfg.get<int64_t>("data.train_batch_size")},
      {"n", cfg.get<int64_t>("actor_rollout_ref.rollout.n")},
      {"steps", o.steps},
      {"warmup", o.warmup},
      {"phase_s", stage_s},
      {"phase_share", share},
      {"step_s", sum["step"] / steps},
      {"step_s_min", step_min},
      {"first_step_s", first_step},
      {"tokens_per_step", tokens / steps},
      {"tokens_per_s", tokens / sum["step"]},
      {"grad_sync_bytes", sync_bytes / steps},  // per step, this rank
      {"grad_sync_bytes_dense", sync_bytes_dense / steps},
      {"device_memory_gib", memory_gib},
      {"device_memory_peak_gib", peak_memory_gib},
      {"host_pinned_gib", last.get_or("perf/host_pinned_gib", 0.0)},
      {"rollout_probs_diff_max", probs_diff_max},
      {"last_step_metrics", metrics}};
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

Action add_bench_grpo_step(CLI::App& bench) {
  auto o = std::make_shared<GrpoOpts>();
  CLI::App* s = bench.add_subcommand(
      "grpo-step",
      "Time the trainer's own GRPO / PPO step (PpoTrainer::train_step, as `verl train` runs it) "
      "on a config; prints one JSON line of per-stage seconds");
  s->add_option("args", o->args, "CONFIG.yaml and/or key=value overrides (as `verl train`)");
  s->add_option("--steps", o->steps, "timed steps (default 3)");
  s->add_option("--warmup", o->warmup, "untimed steps first (default 1)");
  s->add_option(
      "--length-dist", o->length_dist,
      "long-tailed response lengths: none | lognormal:MEAN[:CAP[:SIGMA]] (rollout.length_dist; "
      "e.g. lognormal:300:1024 with response_length 1024)");
  return [o, s]() -> int { return s->parsed() ? run_grpo_step(*o) : 0; };
}

}  // namespace verl::cli
