// `verl doctor --run DIR`: a finished run's GPU utilisation from its metrics.jsonl, and when it is
// low, the stage that takes most of the step and what shortens it.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli/doctor/doctor.h"
#include "cli/io.h"
#include "core/error.h"

namespace verl::cli::doctor {

namespace fs = std::filesystem;

RunMetrics read_run(const std::string& dir) {
  std::error_code ec;
  VERL_CHECK(fs::is_directory(dir, ec),
             "--run {}: not a directory (give a run's trainer.default_local_dir)", dir);
  RunMetrics run;
  run.path = (fs::path(dir) / "metrics.jsonl").string();
  InputLines in(run.path, "--run metrics file");
  std::string line;
  while (in.next(line)) {
    const nlohmann::json j = in.json(line);
    VERL_CHECK(j.is_object(), "{}: expected a JSON object of metrics", in.where());
    if (auto it = j.find("perf/gpu_util_mean"); it != j.end() && it->is_number())
      run.gpu_util.push_back(it->get<double>());
    auto step = j.find("timing_s/step");
    if (step == j.end() || !step->is_number()) continue;
    run.step_seconds += step->get<double>();
    for (const auto& [k, v] : j.items()) {
      // Overlap spans (timing_s/reward_overlap_gen) count time already inside another stage.
      if (k.starts_with("timing_s/") && k != "timing_s/step" &&
          k.find("overlap") == std::string::npos && v.is_number())
        run.stage_seconds[k] += v.get<double>();
    }
  }
  return run;
}

void check_run(Report& r, const RunMetrics& run) {
  const std::string name = "gpu utilisation";
  if (run.gpu_util.empty()) {
    r.warn(
        name,
        fmt::format("perf/gpu_util_mean absent from {} (a CPU run, or NVML was not loadable)",
                    run.path),
        "GPU utilisation is unknown: train on a GPU with libnvidia-ml.so.1 loadable to record it");
    return;
  }
  double sum = 0;
  for (double u : run.gpu_util) sum += u;
  const double mean = sum / static_cast<double>(run.gpu_util.size());
  std::string found = fmt::format("perf/gpu_util_mean averages {:.1f}% over {} steps of {}", mean,
                                  run.gpu_util.size(), run.path);
  if (mean >= 85.0) {
    r.pass(name, found);
    return;
  }
  // Name the stage that takes the most of the step, and what shortens that stage's host gaps.
  static const std::map<std::string, std::string> kFixes = {
      {"timing_s/gen",
       "more sequences per round (data.train_batch_size, actor_rollout_ref.rollout.max_num_seqs)"},
      {"timing_s/reward", "trainer.actor_reward_parallel=true and a faster reward function"},
      {"timing_s/data", "data.dataloader_num_workers=2 or more"},
      {"timing_s/save", "a larger trainer.save_freq"},
      {"timing_s/testing", "a larger trainer.test_freq"},
      {"timing_s/update_actor",
       "actor_rollout_ref.actor.use_dynamic_bsz=true with a larger ppo_max_token_len_per_gpu"},
      {"timing_s/old_log_prob",
       "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true with a larger "
       "log_prob_max_token_len_per_gpu"},
  };
  std::string advice =
      "consider data.dataloader_num_workers=2 or more, trainer.actor_reward_parallel=true, "
      "actor_rollout_ref.actor.use_dynamic_bsz=true, larger batches";
  found += ", under 85%";
  if (!run.stage_seconds.empty() && run.step_seconds > 0) {
    const auto top =
        std::max_element(run.stage_seconds.begin(), run.stage_seconds.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    found += fmt::format("; {} takes {:.0f}% of the step time", top->first,
                         100.0 * top->second / run.step_seconds);
    if (auto fix = kFixes.find(top->first); fix != kFixes.end()) advice = "consider " + fix->second;
  }
  r.warn(name, found, advice);
}

}  // namespace verl::cli::doctor
