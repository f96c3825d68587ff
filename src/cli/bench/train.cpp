// `verl bench train`: times training steps of a causal LM and prints one JSON line.
// One step = forward + backward of the mean next-token NLL, -(1/N) sum_t logprob[t] over the
// N = B*(S-1) targets of B random sequences of S tokens as one packed micro-batch, then
// clip_grad_norm_(1.0) and AdamW: the step tools/bench_train_hf.py runs in transformers
// (bench/train_cuda.sh runs both). It runs the trainer's actor update path: the policy that
// the actor worker's update loop drives (trainer/update_loop.cpp; trainer::make_policy: the model
// over its flat training state, PolicyModel::forward / backward / optimizer_step), on --device cuda
// or cpu.
//   model_flops_per_step = 6 * params * B*S + 6 * layers * B * S^2 * H * D
// (docs/benchmarks.md says what each term counts), tflops = that / step time, mfu = tflops /
// --peak-tflops. `verl bench grpo-step` (cmd_bench_grpo.cpp) hangs under the same `bench` command.
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/bench/bench.h"
#include "cli/bench/shapes.h"
#include "cli/command.h"
#include "core/device.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/timer.h"
#include "dist/communicator.h"
#include "model/batch.h"
#include "model/weights.h"
#include "trainer/policy_model.h"

namespace verl::cli {
namespace {

struct TrainOpts {
  std::string shape, model, device = "cuda";
  int64_t batch = 8, seq = 1024, lm_head_chunk = 4096;
  int64_t layers = 0;  // > 0: the shape with this many layers
  int steps = 10, warmup = 2;
  float lr = 1e-5f;
  double peak_tflops = 800.0;
  bool recompute = false;
  bool profile = false;
};

// What the step loop measured.
struct StepStats {
  double step_ms = 0, step_ms_min = 0;  // mean and fastest of the timed steps
  int64_t peak_memory_bytes = 0;
  int64_t arena_bytes = -1;  // CUDA only: the policy's device bytes (state + arena)
  double loss = 0, grad_norm = 0;
  std::string device_name;
  std::vector<std::pair<std::string, double>> profile;  // CUDA --profile: ms per step by section
};

void validate(const TrainOpts& o) {
  VERL_CHECK(o.device == "cuda" || o.device == "cpu", "--device must be cuda or cpu, got '{}'",
             o.device);
  VERL_CHECK(o.model.empty() || o.shape.empty(), "--shape and --model exclude each other");
  VERL_CHECK(o.layers >= 0 && (o.layers == 0 || o.model.empty()),
             "--layers {}: a layer count >= 1 for a --shape (not with --model)", o.layers);
  VERL_CHECK(!o.model.empty() || o.shape.empty() || find_bench_shape(o.shape) != nullptr,
             "--shape '{}' is not a known shape; choose one of {} (or --model DIR)", o.shape,
             bench_shape_names());
  VERL_CHECK(o.batch >= 1, "--batch must be >= 1, got {}", o.batch);
  VERL_CHECK(o.seq >= 2, "--seq must be >= 2 (a sequence needs a next token), got {}", o.seq);
  VERL_CHECK(o.batch * o.seq <= std::numeric_limits<int32_t>::max(),
             "--batch x --seq = {} tokens does not fit the int32 token offsets", o.batch * o.seq);
  VERL_CHECK(o.steps >= 1, "--steps must be >= 1, got {}", o.steps);
  VERL_CHECK(o.warmup >= 0, "--warmup must be >= 0, got {}", o.warmup);
  VERL_CHECK(o.lm_head_chunk >= 1, "--lm-head-chunk must be >= 1, got {}", o.lm_head_chunk);
  VERL_CHECK(o.peak_tflops > 0 && std::isfinite(o.peak_tflops),
             "--peak-tflops must be a positive number, got {}", o.peak_tflops);
  VERL_CHECK(o.lr >= 0 && std::isfinite(o.lr), "--lr must be >= 0, got {}", o.lr);
  if (o.device == "cuda") {
#ifdef VERL_HAVE_CUDA
    VERL_CHECK(cuda_device_count() > 0,
               "--device cuda: no CUDA device is visible (no driver or no GPU); use --device cpu");
#else
    VERL_FAIL("--device cuda: this verl was built without CUDA (VERL_CUDA=OFF); use --device cpu");
#endif
  }
}

// N(0, std) into x[0, n): element pair k comes from Philox block (seed, stream, k) by Box-Muller,
// so the values do not depend on the thread count. Much faster than Weights::init_random, which
// matters at 7B parameters (the values differ from it; a benchmark does not care).
void fill_normal(float* x, int64_t n, uint64_t seed, uint64_t stream, float std) {
  constexpr double kTwoPi = 6.283185307179586;
  const int64_t pairs = (n + 1) / 2;
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < pairs; ++k) {
    const std::array<uint32_t, 4> r = philox4x32(seed, stream, static_cast<uint64_t>(k));
    const double u1 = 1.0 - static_cast<double>(((uint64_t{r[0]} << 32) | r[1]) >> 11) * 0x1p-53;
    const double u2 = static_cast<double>(((uint64_t{r[2]} << 32) | r[3]) >> 11) * 0x1p-53;
    const double radius = std * std::sqrt(-2.0 * std::log(u1));
    x[2 * k] = static_cast<float>(radius * std::cos(kTwoPi * u2));
    if (2 * k + 1 < n) x[2 * k + 1] = static_cast<float>(radius * std::sin(kTwoPi * u2));
  }
}

// B sequences of S uniform random token ids.
model::PackedBatch random_batch(int64_t B, int64_t S, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<std::vector<int32_t>> seqs(static_cast<size_t>(B), std::vector<int32_t>(S));
  for (auto& s : seqs)
    for (auto& t : s) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
  return model::PackedBatch::from_sequences(seqs);
}

// Times steps [warmup, warmup + steps); `step` runs one whole step and returns when it is done.
// `after_step` runs after every step, warm-up included (memory probes).
template <typename Step, typename After>
void time_steps(const TrainOpts& o, Step&& step, After&& after_step, StepStats& st) {
  double total = 0, best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    Timer timer;
    step();
    const double ms = timer.seconds() * 1e3;
    after_step();
    if (i >= o.warmup) {
      total += ms;
      best = std::min(best, ms);
    }
  }
  st.step_ms = total / o.steps;
  st.step_ms_min = best;
}

double mean_nll(const float* logprob, const model::PackedBatch& b) {
  double sum = 0;
  int64_t n = 0;
  for (int64_t t = 0; t < b.num_tokens(); ++t) {
    if (b.targets[t] < 0) continue;
    sum -= logprob[t];
    ++n;
  }
  return sum / static_cast<double>(n);
}

StepStats run_policy(const TrainOpts& o, model::Weights& w, const model::PackedBatch& b,
                     const std::vector<float>& d_lp) {
  StepStats st;
  const bool cuda = o.device == "cuda";
  st.device_name = cuda ? cuda_device_name() : "cpu";
  if (cuda) {
    const size_t free_b = device_memory_total() - device_memory_in_use();
    // fp32 master weights, gradients, AdamW m and v, plus the bf16 compute copy: 18 bytes a
    // parameter before any activation. Say so plainly instead of failing inside a cudaMalloc.
    const double gib = double(1ull << 30);
    const double static_bytes = 18.0 * static_cast<double>(w.layout.total);
    VERL_CHECK(static_bytes < static_cast<double>(free_b),
               "{}: {} parameters need {:.1f} GiB of device memory for weights, gradients and "
               "AdamW moments (18 bytes each) before activations, but {} has {:.1f} GiB free",
               o.model.empty() ? "--shape " + o.shape : "--model " + o.model, w.layout.total,
               static_bytes / gib, st.device_name, static_cast<double>(free_b) / gib);
  }
  trainer::PolicyOptions po;
  po.optim.lr = o.lr;
  po.optim.weight_decay = 0.01f;
  po.optim.grad_clip = 1.0f;
  po.max_tokens = b.num_tokens();
  po.max_seqs = b.num_seqs();
  po.lm_head_chunk = o.lm_head_chunk;
  po.recompute = o.recompute;
  std::unique_ptr<trainer::PolicyModel> policy =
      trainer::make_policy(cuda ? Device::Cuda : Device::Cpu, std::move(w), po);
  if (cuda) st.arena_bytes = static_cast<int64_t>(policy->device_bytes());
  dist::SingleProcess comm;
  std::vector<float> logprob;

  auto step = [&] {
    policy->zero_grad();
    policy->forward(b, 1.0f, logprob, nullptr);
    policy->backward(d_lp.data(), nullptr);
    st.grad_norm = policy->optimizer_step(o.lr, comm);
    policy->synchronize();  // the update may still run after the norm was read back
  };
  auto probe = [&] {
    if (cuda) {
      st.peak_memory_bytes =
          std::max(st.peak_memory_bytes, static_cast<int64_t>(device_memory_in_use()));
    }
  };
  time_steps(o, step, probe, st);
  st.loss = mean_nll(logprob.data(), b);
  if (!cuda) {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    st.peak_memory_bytes = static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
  }
  if (o.profile && cuda) {
    // Two more steps with an event around each op family (after the timed ones, which ran
    // without events).
    constexpr int kProfiled = 2;
    policy->set_profiling(true);
    for (int i = 0; i < kProfiled; ++i) step();
    st.profile = policy->take_profile();
    for (auto& section : st.profile) section.second /= kProfiled;
    policy->set_profiling(false);
  }
  return st;
}

int run_train(TrainOpts o) {
  validate(o);
  if (o.model.empty() && o.shape.empty()) o.shape = "qwen2.5-0.5b";

  model::Weights w;
  if (!o.model.empty()) {
    w = model::Weights::load(o.model);
    VERL_CHECK(w.config.head == model::HeadKind::CausalLM,
               "--model {}: bench train needs a causal LM, but config.json has {}", o.model,
               w.config.architecture);
  } else {
    w = bench_random_weights(bench_shape_config(*find_bench_shape(o.shape), o.layers), 1);
  }
  const model::ModelConfig c = w.config;
  const int64_t params = w.layout.total;

  const model::PackedBatch b = random_batch(o.batch, o.seq, c.vocab_size, 2);
  const int64_t T = b.num_tokens();
  const int64_t n_targets = T - o.batch;
  // d loss / d logprob[t] for loss = -(1/N) sum_t logprob[t]; zero at each sequence's last token.
  std::vector<float> d_lp(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t)
    d_lp[t] = b.targets[t] >= 0 ? -1.0f / static_cast<float>(n_targets) : 0.0f;

  if (o.device == "cpu" && o.recompute) {
    std::fprintf(stderr, "warning: --recompute has no effect on --device cpu\n");
  }
  const StepStats st = run_policy(o, w, b, d_lp);

  const double S = static_cast<double>(o.seq), Bd = static_cast<double>(o.batch);
  const double flops = 6.0 * static_cast<double>(params) * static_cast<double>(T) +
                       6.0 * static_cast<double>(c.num_hidden_layers) * Bd * S * S *
                           static_cast<double>(c.num_attention_heads) *
                           static_cast<double>(c.head_dim);
  const double secs = st.step_ms / 1e3;
  const double tflops = flops / secs / 1e12;
  nlohmann::json j = {
      {"bench", "train"},
      {"impl", "verl.cpp"},
      {"device", o.device},
      {"device_name", st.device_name},
      {"shape", o.model.empty() ? nlohmann::json(o.shape) : nlohmann::json(nullptr)},
      {"model", o.model.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.model)},
      {"params", params},
      {"layers", c.num_hidden_layers},
      {"batch", o.batch},
      {"seq", o.seq},
      {"tokens_per_step", T},
      {"steps", o.steps},
      {"warmup", o.warmup},
      {"lm_head_chunk", o.lm_head_chunk},
      {"step_ms", st.step_ms},
      {"step_ms_min", st.step_ms_min},
      {"tokens_per_s", static_cast<double>(T) / secs},
      {"model_flops_per_step", flops},
      {"tflops", tflops},
      {"mfu", tflops / o.peak_tflops},
      {"peak_tflops", o.peak_tflops},
      {"peak_memory_bytes", st.peak_memory_bytes},
      {"recompute", o.recompute},
      {"loss", st.loss},
      {"grad_norm", st.grad_norm}};
  if (o.device == "cuda") {
    j["policy_device_bytes"] = st.arena_bytes;           // training state + the model's arena
    j["device_used_peak_bytes"] = st.peak_memory_bytes;  // the key the HF peer reports too
    if (!st.profile.empty()) {
      nlohmann::json prof = nlohmann::json::object();
      for (const auto& [name, ms] : st.profile) prof[name] = ms;
      j["profile_ms_per_step"] = prof;
    }
  }
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
  return 0;
}

Command reg("bench",
            "Benchmarks (bench train: training-step throughput and MFU; bench rollout: generation "
            "throughput on the GPU; bench grpo-step: one whole GRPO step on the GPU; bench "
            "quant-linear / bench score: the quantised reward model's kernels and scoring pass)",
            [](CLI::App& app) -> Action {
              app.require_subcommand(1);
              auto o = std::make_shared<TrainOpts>();
              CLI::App* train = app.add_subcommand(
                  "train",
                  "Time training steps (forward + backward of the mean token NLL, grad clip 1.0, "
                  "AdamW) on random tokens; prints one JSON line");
              train->add_option("--shape", o->shape,
                                "model shape with random N(0, 0.02) weights: " +
                                    bench_shape_names() + " (default qwen2.5-0.5b)");
              train->add_option("--model", o->model, "HF model directory instead of --shape");
              train->add_option("--layers", o->layers,
                                "--shape with this many decoder layers (per-layer timings)");
              train->add_option("--batch", o->batch, "sequences per step (default 8)");
              train->add_option("--seq", o->seq, "tokens per sequence (default 1024)");
              train->add_option("--steps", o->steps, "timed steps (default 10)");
              train->add_option("--warmup", o->warmup, "untimed steps first (default 2)");
              train->add_option(
                  "--lm-head-chunk", o->lm_head_chunk,
                  "token rows of fp32 logits alive at once in the LM head "
                  "(default 4096: fewer, larger GEMMs; 4096 x V x 6 bytes of scratch)");
              train->add_option("--device", o->device,
                                "cuda (default) or cpu (fp32 CPU model; use small shapes)");
              train->add_flag("--profile", o->profile,
                              "CUDA: after the timed steps, time each op family (attention, GEMMs, "
                              "LM head, norms, element-wise, optimizer) over two more steps");
              train->add_flag("--recompute", o->recompute,
                              "CUDA: activation recomputation (keep each layer's input, recompute "
                              "its activations in backward)");
              train->add_option("--peak-tflops", o->peak_tflops,
                                "dense bf16 peak for MFU in TFLOP/s (default 800: the H200's "
                                "measured dense bf16 GEMM peak)");
              train->add_option("--lr", o->lr, "AdamW learning rate (default 1e-5)");
              Action grpo_step = add_bench_grpo_step(app);
              Action rollout = add_bench_rollout(app);
              Action grad_sync = add_bench_grad_sync(app);
              Action quant_linear = add_bench_quant_linear(app);
              Action score = add_bench_score(app);
              return [o, train, grpo_step, rollout, grad_sync, quant_linear, score] {
                if (train->parsed()) return run_train(*o);
                for (const Action& a : {grpo_step, rollout, grad_sync, quant_linear, score}) {
                  const int rc = a();
                  if (rc != 0) return rc;
                }
                return 0;
              };
            });

}  // namespace

// The HF-style init of Weights::init_random (matrices N(0, 0.02), norms one, biases zero).
model::Weights bench_random_weights(const model::ModelConfig& c, uint64_t seed) {
  model::Weights w = model::Weights::from_config(c);
  for (size_t i = 0; i < w.layout.params.size(); ++i) {
    const model::ParamInfo& p = w.layout.params[i];
    float* x = w.data.data() + p.offset;
    if (p.shape.size() == 2) {
      fill_normal(x, p.numel, seed, i, 0.02f);
    } else {
      const bool is_norm = p.name.find("norm") != std::string::npos;
      std::fill(x, x + p.numel, is_norm ? 1.0f : 0.0f);
    }
  }
  return w;
}

}  // namespace verl::cli
