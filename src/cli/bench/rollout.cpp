// `verl bench-rollout`: rollout throughput of the CUDA engine (scheduler + CudaModelRunner), on a
// model shape with random weights (--shape) or an HF model (--model): G prompts of random tokens,
// n samples each, a fixed number of new tokens (EOS ignored). One JSON line: output tokens/s over
// the whole generate() (prefill included), the decode steps' achieved memory bandwidth (bf16
// weights plus the live KV read by each decode step, summed, over the decode steps' time) against
// the H200's 4.8 TB/s HBM3e peak, memory, host time per decode step, and with --profile the GPU
// time per section of an (eager) decode step. The runner's steps are counted by RunnerStats
// (runner_stats.h) through the runner's observer hook.
#include <omp.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/bench/bench.h"
#include "cli/bench/runner_stats.h"
#include "cli/bench/shapes.h"
#include "cli/command.h"
#include "core/device.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/timer.h"
#include "model/weights.h"
#include "rollout/engine.h"
#include "rollout/kv_sizing.h"
#ifdef VERL_HAVE_CUDA
#include "rollout/cuda/model_runner.h"
#endif

namespace verl::cli {
namespace {

constexpr double kH200HbmBytesPerSecond = 4.8e12;  // H200 HBM3e peak (NVIDIA spec sheet)

struct RolloutOpts {
  std::string shape = "qwen2.5-0.5b";
  std::string model;
  int64_t layers = 0;  // > 0: the shape with this many layers
  int64_t prompts = 256;
  int32_t n = 1;
  int32_t prompt_len = 256;
  int32_t new_tokens = 256;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = -1;
  bool enforce_eager = false;
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 8192;
  int32_t block_size = 16;
  double gpu_memory_utilization = 0.5;
  double kv_cache_gb = 0.0;
  int32_t decode_partition = 64;
  int32_t decode_max_partitions = 0;
  bool split_sampling = true;
  bool training_prefill_attention = true;
  bool match_trainer_numerics = true;  // the config's default
  bool batch_invariant = false;
  bool profile = false;
  int warmup = 1;
  uint64_t seed = 1;
};

#ifdef VERL_HAVE_CUDA

int run_bench_rollout(const RolloutOpts& o) {
  VERL_CHECK(o.prompts >= 1 && o.n >= 1 && o.prompt_len >= 1 && o.new_tokens >= 1,
             "bench-rollout: --prompts {}, --n {}, --prompt-len {}, --new-tokens {} must be >= 1",
             o.prompts, o.n, o.prompt_len, o.new_tokens);
  VERL_CHECK(cuda_device_count() > 0, "bench-rollout: no CUDA device is visible");
  model::Weights w;
  std::string name = o.model;
  if (!o.model.empty()) {
    w = model::Weights::load(o.model);
  } else {
    const BenchShape* s = find_bench_shape(o.shape);
    VERL_CHECK(s != nullptr, "bench-rollout: unknown --shape '{}' (known: {})", o.shape,
               bench_shape_names());
    VERL_CHECK(o.layers >= 0, "bench-rollout: --layers {} must be >= 1", o.layers);
    w = bench_random_weights(bench_shape_config(*s, o.layers), o.seed);
    name = o.shape;
  }
  const model::ModelConfig cfg = w.config;
  const model::ParamLayout layout = w.layout;

  ops::cuda::CudaSession session;
  ops::cuda::DeviceBuffer<ops::cuda::bf16> wbf =
      rollout::cuda::upload_weights_bf16(session.ctx(), w);
  w.data = {};  // the GPU copy is all the runner reads

  rollout::EngineConfig ec;
  ec.scheduler.max_num_seqs = o.max_num_seqs;
  ec.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  ec.scheduler.max_model_len = o.prompt_len + o.new_tokens;
  ec.scheduler.block_size = o.block_size;
  rollout::cuda::CudaRunnerOptions ro;
  ro.kv_cache_bytes = static_cast<int64_t>(o.kv_cache_gb * (1ll << 30));
  ro.gpu_memory_utilization = o.gpu_memory_utilization;
  ro.enforce_eager = o.enforce_eager;
  ro.decode_partition = o.decode_partition;
  ro.decode_max_partitions = o.decode_max_partitions;
  ro.split_sampling = o.split_sampling;
  ro.training_prefill_attention = o.training_prefill_attention;
  ro.numerics = numerics_from_flags(o.batch_invariant, o.match_trainer_numerics);
  rollout::cuda::CudaModelRunner runner(session.ctx(), cfg, layout, wbf.data(), ec.scheduler, ro);
  rollout::Engine engine(runner, ec);

  Rng rng(o.seed + 17);
  std::vector<rollout::Request> reqs(static_cast<size_t>(o.prompts));
  for (size_t i = 0; i < reqs.size(); ++i) {
    rollout::Request& r = reqs[i];
    r.prompt.resize(static_cast<size_t>(o.prompt_len));
    for (auto& t : r.prompt)
      t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(cfg.vocab_size)));
    r.params.temperature = o.temperature;
    r.params.top_p = o.top_p;
    r.params.top_k = o.top_k;
    r.params.max_tokens = o.new_tokens;
    r.params.ignore_eos = true;
    r.params.seed = o.seed * 1000003 + i;
    r.n = o.n;
  }
  // Warm-up runs of the same workload: kernels loaded, GEMM plans made, every decode bucket's CUDA
  // graph captured, so the timed run measures steady state.
  for (int i = 0; i < o.warmup; ++i) engine.generate(reqs);
  runner.reset_counters();
  RunnerStats rs;
  runner.set_observer(&rs, o.profile);  // the timed run only (profiled steps run eagerly)
  Timer timer;
  engine.generate(reqs);
  const double seconds = timer.seconds();
  runner.set_observer(nullptr, false);
  const rollout::EngineStats& es = engine.stats();
  const rollout::cuda::CudaRunnerCounters& rc = runner.counters();

  size_t free_b = 0, total_b = 0;
  VERL_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const double weight_bytes = 2.0 * static_cast<double>(layout.total);
  const double kv_token_bytes = static_cast<double>(rollout::kv_block_bytes(cfg, 1, 2));
  const double decode_bytes = static_cast<double>(rs.decode_steps) * weight_bytes +
                              static_cast<double>(rs.decode_context_tokens) * kv_token_bytes;
  const double bandwidth = rs.decode_seconds > 0 ? decode_bytes / rs.decode_seconds : 0.0;
  nlohmann::json j = {
      {"bench", "rollout"},
      {"device", cuda_device_name()},
      {"model", name},
      {"layers", cfg.num_hidden_layers},
      {"params", layout.total},
      {"prompts", o.prompts},
      {"n", o.n},
      {"sequences", o.prompts * o.n},
      {"prompt_len", o.prompt_len},
      {"new_tokens", o.new_tokens},
      {"temperature", o.temperature},
      {"top_p", o.top_p},
      {"top_k", o.top_k},
      {"enforce_eager", o.enforce_eager},
      {"batch_invariant", o.batch_invariant},
      {"max_num_seqs", o.max_num_seqs},
      {"max_num_batched_tokens", o.max_num_batched_tokens},
      {"seconds", seconds},
      {"output_tokens", es.output_tokens},
      {"output_tokens_per_s", static_cast<double>(es.output_tokens) / seconds},
      {"steps", es.steps},
      {"prompt_tokens_computed", es.prompt_tokens_computed},
      {"preemptions", es.preemptions},
      {"decode_steps", rs.decode_steps},
      {"graph_steps", rc.graph_steps},
      {"decode_seconds", rs.decode_seconds},
      {"decode_bytes", decode_bytes},
      {"decode_bandwidth_bytes_per_s", bandwidth},
      {"hbm_peak_bytes_per_s", kH200HbmBytesPerSecond},
      {"bandwidth_fraction_of_peak", bandwidth / kH200HbmBytesPerSecond},
      {"weights_bytes", weight_bytes},
      {"kv_cache_bytes", runner.cache().bytes()},
      {"kv_blocks", runner.cache().num_blocks()},
      {"scratch_bytes", runner.scratch_bytes()},
      {"device_used_bytes", static_cast<int64_t>(total_b - free_b)},  // all allocations are static:
      {"peak_memory_bytes",
       static_cast<int64_t>(total_b - free_b)},  // the peak is what is held now
      {"device_total_bytes", static_cast<int64_t>(total_b)}};
  // Host time per decode step (std::chrono in the runner; RunnerStats says what each covers).
  const double per = rs.decode_steps > 0 ? 1e3 / static_cast<double>(rs.decode_steps) : 0.0;
  const double between =
      rs.between_steps > 0 ? 1e3 * rs.between_steps_seconds / static_cast<double>(rs.between_steps)
                           : 0.0;
  j["decode_step_ms"] = rs.decode_seconds * per;
  j["host_ms_per_decode_step"] = {
      {"between_steps_scheduler_postprocess", between},
      {"prep_staging_upload_launch", rs.host_prep_seconds * per},
      {"sync_wait", rs.sync_wait_seconds * per},
      {"post_results", rs.host_post_seconds * per},
      {"host_overhead_total", between + (rs.host_prep_seconds + rs.host_post_seconds) * per}};
  j["decode_partition"] = o.decode_partition;
  j["decode_max_partitions"] = o.decode_max_partitions;
  j["split_sampling"] = o.split_sampling;
  j["training_prefill_attention"] = o.training_prefill_attention;
  j["match_trainer_numerics"] = o.match_trainer_numerics;
  j["training_prefill_steps"] = rc.training_prefill_steps;
  if (o.profile) {
    nlohmann::json prof = nlohmann::json::object(), other = nlohmann::json::object();
    double sum = 0.0;
    for (const auto& [section, ms] : rs.decode_profile_ms) {
      const double v =
          rs.profiled_decode_steps > 0 ? ms / static_cast<double>(rs.profiled_decode_steps) : 0.0;
      prof[section] = v;
      sum += v;
    }
    prof["total_gpu"] = sum;
    for (const auto& [section, ms] : rs.other_profile_ms) other[section] = ms;
    j["profile_ms_per_step"] = prof;  // decode steps, eager (graphs are off while profiling)
    j["profile_decode_steps"] = rs.profiled_decode_steps;
    j["profile_other_steps_ms_total"] = other;  // prefill / mixed steps, summed
    j["profile_other_steps"] = rs.profiled_other_steps;
    j["profile_note"] =
        "cudaEvent sections per eager decode step (graphs off while profiling); a section also "
        "holds any GPU idle time before its next mark, so launch-bound gaps land in it";
  }
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
  return 0;
}

#else

int run_bench_rollout(const RolloutOpts&) {
  VERL_FAIL("bench-rollout: this verl was built without CUDA (VERL_CUDA=OFF)");
}

#endif

// The flags of `verl bench rollout` (and of its older spelling `verl bench-rollout`).
Action add_rollout_flags(CLI::App& app) {
  auto o = std::make_shared<RolloutOpts>();
  app.add_option("--shape", o->shape,
                 "model shape with random N(0, 0.02) weights: " + bench_shape_names() +
                     " (default qwen2.5-0.5b)");
  app.add_option("--model", o->model, "HF model directory instead of --shape");
  app.add_option("--layers", o->layers,
                 "--shape with this many decoder layers (per-layer timings)");
  app.add_option("--prompts", o->prompts, "prompts (default 256)");
  app.add_option("--n", o->n, "samples per prompt (default 1)");
  app.add_option("--prompt-len", o->prompt_len, "tokens per prompt (default 256)");
  app.add_option("--new-tokens", o->new_tokens, "tokens generated per sample (default 256)");
  app.add_option("--temperature", o->temperature, "sampling temperature (default 1; 0 = greedy)");
  app.add_option("--top-p", o->top_p, "nucleus sampling (default 1: off)");
  app.add_option("--top-k", o->top_k, "top-k sampling (default -1: off)");
  app.add_flag("--enforce-eager", o->enforce_eager, "no CUDA graphs for decode steps");
  app.add_flag("--batch-invariant", o->batch_invariant,
               "batch-invariant GEMMs, attention and LM-head log-probs (the "
               "bitwise-trainer mode)");
  app.add_option("--max-num-seqs", o->max_num_seqs, "running sequences at most (default 256)");
  app.add_option("--max-num-batched-tokens", o->max_num_batched_tokens,
                 "new tokens per step at most (default 8192)");
  app.add_option("--block-size", o->block_size, "KV block size in tokens (default 16)");
  app.add_option("--gpu-memory-utilization", o->gpu_memory_utilization,
                 "fraction of device memory the rollout may hold (default 0.5)");
  app.add_option("--kv-cache-gb", o->kv_cache_gb,
                 "KV cache size in GiB instead of --gpu-memory-utilization");
  app.add_option("--decode-partition", o->decode_partition,
                 "keys per split-K partition of decode attention while the partition "
                 "count allows (default 64)");
  app.add_option("--decode-max-partitions", o->decode_max_partitions,
                 "cap on split-K partitions per item (default 0: by batch size)");
  app.add_flag("!--no-split-sampling", o->split_sampling,
               "sample every row with one block (the reference kernel)");
  app.add_flag("!--paged-prefill", o->training_prefill_attention,
               "prefill attention with the paged prefill kernel instead of the training kernel "
               "over the paged cache");
  app.add_flag("--match-trainer,!--no-match-trainer", o->match_trainer_numerics,
               "decode attention on the training kernel's arithmetic and GEMMs that never split "
               "k, so log-probs match the trainer's (actor_rollout_ref.rollout."
               "match_trainer_numerics; on by default); --no-match-trainer: the split-K decode "
               "attention and cuBLASLt's split-K choices");
  app.add_flag("--profile", o->profile,
               "GPU ms per section of a decode step (cudaEvents; the timed run's "
               "steps run eagerly) in profile_ms_per_step");
  app.add_option("--warmup", o->warmup, "untimed runs of the same workload first (default 1)");
  app.add_option("--seed", o->seed, "weights and prompts seed (default 1)");

  return [o] { return run_bench_rollout(*o); };
}

Command reg("bench-rollout",
            "Rollout throughput of the CUDA engine (the same as `verl bench rollout`); prints one "
            "JSON line",
            [](CLI::App& app) -> Action { return add_rollout_flags(app); });

}  // namespace

Action add_bench_rollout(CLI::App& bench) {
  CLI::App* s = bench.add_subcommand(
      "rollout",
      "Rollout throughput of the CUDA engine on random or HF weights; prints one JSON line");
  Action run = add_rollout_flags(*s);
  return [s, run]() -> int { return s->parsed() ? run() : 0; };
}

}  // namespace verl::cli
