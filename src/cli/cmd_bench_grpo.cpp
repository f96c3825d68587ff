// `verl bench grpo-step`: times whole GRPO steps on the GPU at a real model scale and prints one
// JSON line; tools/bench_grpo_hf.py is its transformers peer (same keys). One step, in the order
// of PpoTrainer::step (src/trainer/ppo_trainer.cpp), on random prompts:
//   gen           CudaModelRunner + rollout::Engine over the actor's own bf16 weights
//                 (CudaTransformer::weights_bf16()), prompts x n samples, temperature 1, EOS
//                 ignored; the runner and its KV cache are built for the phase and destroyed after.
//   reward        synthetic and deterministic: the fraction of even token ids in the response
//                 (timed inside adv: it is a few microseconds).
//   old_log_prob  actor forward (for_backward = false) over prompt + response, packed into
//                 micro-batches of at most --micro-tokens tokens (verl's rearrange_micro_batches).
//   ref           (--ref) the same with a frozen trainable=false copy of the initial weights.
//   adv           GRPO group-normalised advantages (core_algos).
//   update_actor  one PPO-clip epoch over one mini-batch (the whole batch): per micro-batch a
//                 forward, compute_actor_loss (plus the k3 KL loss with --ref), backward; then one
//                 AdamW step (grad clip 1.0).
// tokens_per_s = (prompt + response tokens of the step) / step seconds, verl's perf/throughput.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "cli/bench_grpo.h"
#include "cli/bench_shapes.h"
#include "cli/command.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/timer.h"
#include "data/seqlen_balancing.h"
#include "model/batch.h"
#include "rollout/engine.h"
#include "trainer/core_algos.h"

#ifdef VERL_HAVE_CUDA
#include <cuda_runtime.h>

#include "ops/cuda/device.h"
#include "ops/cuda/rollout_cuda.h"
#include "ops/cuda/transformer_cuda.h"
#endif

namespace verl::cli {
namespace {

struct GrpoOpts {
  std::string shape, model;
  int64_t prompts = 32;
  int32_t n = 8;
  int32_t prompt_len = 256;
  int32_t new_tokens = 256;
  int steps = 3, warmup = 1;
  int64_t micro_tokens = 8192;  // actor.ppo_max_token_len_per_gpu
  bool ref = false;
  float lr = 1e-6f;                       // actor.optim.lr
  int32_t max_num_seqs = 1024;            // rollout.max_num_seqs
  int32_t max_num_batched_tokens = 8192;  // rollout.max_num_batched_tokens
  bool enforce_eager = false;
  bool batch_invariant = false;  // rollout.batch_invariant: rollout log-probs = old_log_prob bitwise
  bool match_trainer = true;     // rollout.match_trainer_numerics: log-probs within rounding noise
  uint64_t seed = 1;
};

constexpr const char* kPhases[] = {"gen", "old_log_prob", "ref", "adv", "update_actor"};
enum Phase { kGen, kOldLogProb, kRef, kAdv, kUpdate, kNumPhases };

void validate(const GrpoOpts& o) {
  VERL_CHECK(o.model.empty() || o.shape.empty(), "--shape and --model exclude each other");
  VERL_CHECK(!o.model.empty() || o.shape.empty() || find_bench_shape(o.shape) != nullptr,
             "--shape '{}' is not a known shape; choose one of {} (or --model DIR)", o.shape,
             bench_shape_names());
  VERL_CHECK(o.prompts >= 1, "--prompts must be >= 1, got {}", o.prompts);
  VERL_CHECK(o.n >= 2, "--n must be >= 2 (GRPO normalises rewards within a prompt's group), got {}",
             o.n);
  VERL_CHECK(o.prompt_len >= 1, "--prompt-len must be >= 1, got {}", o.prompt_len);
  VERL_CHECK(o.new_tokens >= 1, "--new-tokens must be >= 1, got {}", o.new_tokens);
  VERL_CHECK(o.steps >= 1, "--steps must be >= 1, got {}", o.steps);
  VERL_CHECK(o.warmup >= 0, "--warmup must be >= 0, got {}", o.warmup);
  const int64_t seq = int64_t{o.prompt_len} + o.new_tokens;
  VERL_CHECK(o.micro_tokens >= seq,
             "--micro-tokens {} is below one sequence of --prompt-len + --new-tokens = {} tokens",
             o.micro_tokens, seq);
  VERL_CHECK(o.micro_tokens <= INT32_MAX, "--micro-tokens {} does not fit the int32 token offsets",
             o.micro_tokens);
  VERL_CHECK(o.max_num_seqs >= 1, "--max-num-seqs must be >= 1, got {}", o.max_num_seqs);
  VERL_CHECK(o.max_num_batched_tokens >= o.prompt_len,
             "--max-num-batched-tokens {} must hold one --prompt-len {} prompt",
             o.max_num_batched_tokens, o.prompt_len);
  VERL_CHECK(o.lr >= 0 && std::isfinite(o.lr), "--lr must be >= 0, got {}", o.lr);
}

// A failure that is the machine's, not the flags' (no CUDA build, no device): one JSON line with
// "error", as the peer prints, so a driver script reading JSON sees why.
int json_error(const GrpoOpts& o, const std::string& what) {
  nlohmann::json j = {
      {"bench", "grpo_step"}, {"impl", "verl.cpp"}, {"shape", o.shape}, {"error", what}};
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
  return 1;
}

// The synthetic reward: the fraction of even token ids in the response. Deterministic, cheap, and
// it varies between the samples of a group, so GRPO's advantages are not all zero.
[[maybe_unused]] float even_token_fraction(const std::vector<int32_t>& response) {
  if (response.empty()) return 0.0f;
  const auto even =
      std::count_if(response.begin(), response.end(), [](int32_t t) { return t % 2 == 0; });
  return static_cast<float>(even) / static_cast<float>(response.size());
}

#ifdef VERL_HAVE_CUDA

int64_t device_used_bytes() {
  size_t free_b = 0, total_b = 0;
  VERL_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<int64_t>(total_b - free_b);
}

// One step's batch: B = G n rows, row b = sample b % n of prompt b / n (verl's repeat-interleave).
struct StepData {
  std::vector<std::vector<int32_t>> prompts;    // [G]
  std::vector<std::vector<int32_t>> responses;  // [B]
  int64_t L = 0;                                // longest response: the [B, L] padding
  std::vector<float> mask, old_log_prob, ref_log_prob, advantages;  // [B, L]
  std::vector<float> rollout_log_prob;                              // [B, L], the sampler's
  std::vector<float> scores;                                        // [B]
};

// What the last step left to report.
struct StepResult {
  double seconds[kNumPhases] = {}, step = 0, generate = 0;
  int64_t output_tokens = 0, tokens = 0, micro_batches = 0;
  double rollout_logprob_diff_max = 0, rollout_logprob_diff_mean = 0;  // |rollout - old_log_prob|
  double reward_mean = 0, pg_loss = 0, pg_clipfrac = 0, ppo_kl = 0, kl_loss = 0, grad_norm = 0;
};

class GrpoStepBench {
 public:
  GrpoStepBench(const GrpoOpts& o, const ops::cuda::CudaContext& ctx,
                ops::cuda::CudaSession& session, ops::cuda::CudaTransformer& actor,
                ops::cuda::CudaTransformer* ref)
      : o_(o), ctx_(ctx), session_(session), actor_(actor), ref_(ref) {}

  // Runs step `step` (its prompts and sampling seeds derive from it); peak[p] keeps the largest
  // device memory in use seen at the end of phase p.
  StepResult run(int step, int64_t peak[kNumPhases]) {
    StepResult r;
    StepData d;
    Timer step_timer;
    auto phase_end = [&](Phase p, const Timer& t) {
      session_.synchronize();
      r.seconds[p] = t.seconds();
    };

    {  // gen
      Timer t;
      generate(step, d, r, peak[kGen]);
      phase_end(kGen, t);
    }
    {  // old_log_prob
      Timer t;
      log_probs(actor_, d, d.old_log_prob);
      phase_end(kOldLogProb, t);
      compare_rollout(d, r);
      peak[kOldLogProb] = std::max(peak[kOldLogProb], device_used_bytes());
    }
    if (ref_) {
      Timer t;
      log_probs(*ref_, d, d.ref_log_prob);
      phase_end(kRef, t);
      peak[kRef] = std::max(peak[kRef], device_used_bytes());
    }
    {  // reward + adv
      Timer t;
      advantages(d, r);
      r.seconds[kAdv] = t.seconds();
      peak[kAdv] = std::max(peak[kAdv], device_used_bytes());
    }
    {  // update_actor
      Timer t;
      update(d, r);
      phase_end(kUpdate, t);
      peak[kUpdate] = std::max(peak[kUpdate], device_used_bytes());
    }
    r.step = step_timer.seconds();
    for (const auto& p : d.prompts) r.tokens += static_cast<int64_t>(p.size()) * o_.n;
    for (const auto& s : d.responses) r.tokens += static_cast<int64_t>(s.size());
    return r;
  }

 private:
  void generate(int step, StepData& d, StepResult& r, int64_t& peak) {
    const model::ModelConfig& cfg = actor_.config();
    const int64_t G = o_.prompts, n = o_.n, B = G * n;
    Rng rng(o_.seed + 17, static_cast<uint64_t>(step));
    std::vector<rollout::Request> reqs(static_cast<size_t>(G));
    d.prompts.resize(static_cast<size_t>(G));
    for (int64_t i = 0; i < G; ++i) {
      rollout::Request& q = reqs[i];
      q.prompt.resize(static_cast<size_t>(o_.prompt_len));
      for (auto& t : q.prompt)
        t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(cfg.vocab_size)));
      q.params.temperature = 1.0f;
      q.params.max_tokens = o_.new_tokens;
      q.params.ignore_eos = true;
      q.params.seed =
          (o_.seed * 1000003 + static_cast<uint64_t>(step)) * 1000003 + static_cast<uint64_t>(i);
      q.n = o_.n;
      d.prompts[i] = q.prompt;
    }
    // The KV cache holds every sequence at once, sized as PpoTrainer::generate sizes it.
    rollout::EngineConfig ec;
    ec.scheduler.block_size = 16;
    ec.scheduler.max_model_len = o_.prompt_len + o_.new_tokens;
    ec.scheduler.max_num_seqs = o_.max_num_seqs;
    ec.scheduler.max_num_batched_tokens = o_.max_num_batched_tokens;
    const int64_t total_tokens = B * (int64_t{o_.prompt_len} + o_.new_tokens);
    ec.scheduler.num_blocks = static_cast<int32_t>((total_tokens + 15) / 16 + B + 16);
    ops::cuda::CudaRunnerOptions ro;
    ro.kv_cache_bytes = static_cast<int64_t>(ec.scheduler.num_blocks) *
                        ops::cuda::kv_cache_bytes_per_block(cfg, 16);
    ro.enforce_eager = o_.enforce_eager;
    ro.batch_invariant = o_.batch_invariant;
    ro.match_trainer_numerics = o_.match_trainer;
    std::vector<rollout::Completion> out;
    {
      ops::cuda::CudaModelRunner runner(ctx_, cfg, actor_.layout(), actor_.weights_bf16(),
                                        ec.scheduler, ro);
      rollout::Engine engine(runner, ec);
      Timer t;
      out = engine.generate(reqs);
      r.generate = t.seconds();
      r.output_tokens = engine.stats().output_tokens;
      peak = std::max(peak, device_used_bytes());  // with the KV cache held
    }  // the runner and its KV cache are given back before the log-prob phases
    d.responses.assign(static_cast<size_t>(B), {});
    for (rollout::Completion& c : out) d.responses[c.request * n + c.sample] = std::move(c.tokens);
    d.L = 0;
    for (const auto& s : d.responses) d.L = std::max<int64_t>(d.L, static_cast<int64_t>(s.size()));
    d.mask.assign(static_cast<size_t>(B * d.L), 0.0f);
    d.rollout_log_prob.assign(static_cast<size_t>(B * d.L), 0.0f);
    for (const rollout::Completion& c : out) {
      const int64_t b = c.request * n + c.sample;
      std::copy(c.logprobs.begin(), c.logprobs.end(), d.rollout_log_prob.begin() + b * d.L);
    }
    for (int64_t b = 0; b < B; ++b)
      std::fill_n(d.mask.begin() + b * d.L, d.responses[b].size(), 1.0f);
  }

  // The sampler's log-probs against the trainer's (PPO's old_log_prob) on every response token:
  // equal with --batch-invariant, within bf16 rounding otherwise.
  static void compare_rollout(const StepData& d, StepResult& r) {
    double worst = 0, sum = 0, n = 0;
    for (size_t i = 0; i < d.mask.size(); ++i) {
      if (d.mask[i] == 0.0f) continue;
      const double e = std::fabs(double(d.rollout_log_prob[i]) - d.old_log_prob[i]);
      worst = std::max(worst, e);
      sum += e;
      n += 1;
    }
    r.rollout_logprob_diff_max = worst;
    r.rollout_logprob_diff_mean = n > 0 ? sum / n : 0.0;
  }

  // Micro-batches of at most --micro-tokens tokens over all B rows (verl's dynamic batch size).
  std::vector<std::vector<int64_t>> micro_batches(const StepData& d) const {
    std::vector<int64_t> lens(d.responses.size());
    for (size_t b = 0; b < lens.size(); ++b)
      lens[b] = static_cast<int64_t>(d.prompts[b / static_cast<size_t>(o_.n)].size() +
                                     d.responses[b].size());
    data::MicroBatchOptions mo;
    mo.max_token_len = o_.micro_tokens;
    return data::rearrange_micro_batches(lens, mo).micro_batches;
  }

  model::PackedBatch pack(const StepData& d, const std::vector<int64_t>& rows) const {
    std::vector<std::vector<int32_t>> seqs;
    seqs.reserve(rows.size());
    for (int64_t b : rows) {
      std::vector<int32_t> s = d.prompts[b / o_.n];
      s.insert(s.end(), d.responses[b].begin(), d.responses[b].end());
      seqs.push_back(std::move(s));
    }
    return model::PackedBatch::from_sequences(seqs);
  }

  // Packed index of the log-prob of row rows[i]'s first response token (predicted by the last
  // prompt token).
  int64_t response_base(const StepData& d, const model::PackedBatch& pb, size_t i,
                        int64_t b) const {
    return pb.cu_seqlens[i] + static_cast<int64_t>(d.prompts[b / o_.n].size()) - 1;
  }

  void log_probs(ops::cuda::CudaTransformer& tf, const StepData& d, std::vector<float>& out) {
    const int64_t L = d.L;
    out.assign(d.responses.size() * static_cast<size_t>(L), 0.0f);
    for (const auto& rows : micro_batches(d)) {
      const model::PackedBatch pb = pack(d, rows);
      tf.forward(pb, 1.0f, /*for_backward=*/false);
      const std::vector<float> lp = tf.download_logprob();
      for (size_t i = 0; i < rows.size(); ++i) {
        const int64_t b = rows[i], base = response_base(d, pb, i, b);
        for (size_t j = 0; j < d.responses[b].size(); ++j) out[b * L + j] = lp[base + j];
      }
    }
  }

  void advantages(StepData& d, StepResult& r) {
    const int64_t B = static_cast<int64_t>(d.responses.size()), L = d.L;
    std::vector<float> rewards(static_cast<size_t>(B * L), 0.0f);  // the score on the last token
    std::vector<int64_t> index(static_cast<size_t>(B));
    d.scores.resize(static_cast<size_t>(B));
    double sum = 0;
    for (int64_t b = 0; b < B; ++b) {
      d.scores[b] = even_token_fraction(d.responses[b]);
      sum += d.scores[b];
      index[b] = b / o_.n;
      if (!d.responses[b].empty())
        rewards[b * L + static_cast<int64_t>(d.responses[b].size()) - 1] = d.scores[b];
    }
    r.reward_mean = sum / static_cast<double>(B);
    d.advantages =
        trainer::compute_grpo_outcome_advantage({B, L}, rewards, d.mask, index).advantages;
  }

  // Rows `rows` of a [B, L] matrix.
  static std::vector<float> gather_rows(const std::vector<float>& m,
                                        const std::vector<int64_t>& rows, int64_t L) {
    std::vector<float> out(rows.size() * static_cast<size_t>(L));
    for (size_t i = 0; i < rows.size(); ++i)
      std::copy_n(m.begin() + rows[i] * L, L, out.begin() + static_cast<int64_t>(i) * L);
    return out;
  }

  void update(const StepData& d, StepResult& r) {
    const int64_t L = d.L, B = static_cast<int64_t>(d.responses.size());
    trainer::ActorLossConfig lc;  // verl's defaults: clip 0.2, token-mean, k3 KL at 0.001
    lc.use_kl_loss = ref_ != nullptr;
    lc.policy.norm.batch_num_tokens = std::accumulate(d.mask.begin(), d.mask.end(), 0.0);
    lc.policy.norm.global_batch_size = static_cast<double>(B);
    lc.policy.norm.loss_scale_factor = static_cast<double>(o_.new_tokens);
    const double n_tokens = std::max(1.0, *lc.policy.norm.batch_num_tokens);
    r.pg_loss = r.pg_clipfrac = r.ppo_kl = r.kl_loss = 0;
    actor_.zero_grad();
    const auto micro = micro_batches(d);
    r.micro_batches = static_cast<int64_t>(micro.size());
    for (const auto& rows : micro) {
      const model::PackedBatch pb = pack(d, rows);
      actor_.forward(pb, 1.0f, /*for_backward=*/true);
      const std::vector<float> lp = actor_.download_logprob();
      const int64_t bm = static_cast<int64_t>(rows.size());
      std::vector<float> logp(static_cast<size_t>(bm * L), 0.0f);
      for (int64_t i = 0; i < bm; ++i) {
        const int64_t b = rows[i], base = response_base(d, pb, i, b);
        for (size_t j = 0; j < d.responses[b].size(); ++j) logp[i * L + j] = lp[base + j];
      }
      const std::vector<float> old = gather_rows(d.old_log_prob, rows, L);
      const std::vector<float> adv = gather_rows(d.advantages, rows, L);
      const std::vector<float> mask = gather_rows(d.mask, rows, L);
      const std::vector<float> refl =
          ref_ ? gather_rows(d.ref_log_prob, rows, L) : std::vector<float>{};
      const trainer::ActorLossOutput out =
          trainer::compute_actor_loss({bm, L}, old, logp, adv, mask, {}, refl, lc);
      std::vector<float> d_lp(static_cast<size_t>(pb.num_tokens()), 0.0f);
      for (int64_t i = 0; i < bm; ++i) {
        const int64_t b = rows[i], base = response_base(d, pb, i, b);
        for (size_t j = 0; j < d.responses[b].size(); ++j)
          d_lp[base + j] = out.d_log_prob[i * L + j];
      }
      actor_.backward_host(d_lp.data(), nullptr);
      const double share = std::accumulate(mask.begin(), mask.end(), 0.0) / n_tokens;
      r.pg_loss += out.pg_loss;
      r.kl_loss += out.kl_loss;
      r.pg_clipfrac += out.pg_clipfrac * share;
      r.ppo_kl += out.ppo_kl * share;
    }
    r.grad_norm = actor_.optimizer_step(o_.lr, 0.9f, 0.999f, 1e-8f, 0.01f, 1.0f);
  }

  const GrpoOpts& o_;
  const ops::cuda::CudaContext& ctx_;
  ops::cuda::CudaSession& session_;
  ops::cuda::CudaTransformer& actor_;
  ops::cuda::CudaTransformer* ref_;
};

int run_cuda(const GrpoOpts& o, model::Weights& w) {
  ops::cuda::CudaSession session;
  const ops::cuda::CudaContext& ctx = session.ctx();
  const model::ModelConfig cfg = w.config;
  const int64_t params = w.layout.total;
  const int64_t B = o.prompts * o.n, seq = int64_t{o.prompt_len} + o.new_tokens;

  // Planned for the largest micro-batch: --micro-tokens tokens (or the whole batch when smaller),
  // in at most as many sequences as fit it.
  ops::cuda::CudaTransformerOptions topts;
  topts.max_tokens = std::min(o.micro_tokens, B * seq);
  topts.max_seqs = std::clamp<int64_t>(topts.max_tokens / (int64_t{o.prompt_len} + 1), 1, B);
  topts.batch_invariant = o.batch_invariant;
  topts.unsplit_k = o.match_trainer;
  ops::cuda::CudaTransformer actor(ctx, w, topts);
  std::unique_ptr<ops::cuda::CudaTransformer> ref;
  if (o.ref) {
    ops::cuda::CudaTransformerOptions ropts = topts;
    ropts.trainable = false;
    ropts.batch_invariant = false;  // only the actor's log-probs meet the rollout's
    ref = std::make_unique<ops::cuda::CudaTransformer>(ctx, w, ropts);
  }
  w.data.clear();  // the device holds the weights now
  w.data.shrink_to_fit();
  session.synchronize();
  const int64_t static_bytes = device_used_bytes();

  GrpoStepBench bench(o, ctx, session, actor, ref.get());
  int64_t peak[kNumPhases] = {};
  double sum[kNumPhases] = {}, step_sum = 0, step_min = 1e300, gen_sum = 0;
  double tokens_sum = 0, first_step_s = 0;
  StepResult last;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    last = bench.run(i, peak);
    if (i == 0) first_step_s = last.step;
    if (i < o.warmup) continue;
    for (int p = 0; p < kNumPhases; ++p) sum[p] += last.seconds[p];
    step_sum += last.step;
    step_min = std::min(step_min, last.step);
    gen_sum += last.generate;
    tokens_sum += static_cast<double>(last.tokens);
  }
  const double steps = static_cast<double>(o.steps);
  const double step_s = step_sum / steps;

  cudaDeviceProp prop{};
  int dev = 0;
  VERL_CUDA_CHECK(cudaGetDevice(&dev));
  VERL_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  nlohmann::json phase_s = nlohmann::json::object(), memory = nlohmann::json::object();
  for (int p = 0; p < kNumPhases; ++p) {
    phase_s[kPhases[p]] = sum[p] / steps;
    if (p != kRef || o.ref) memory[kPhases[p]] = peak[p];
  }
  phase_s["step"] = step_s;
  nlohmann::json share = nlohmann::json::object();
  for (int p = 0; p < kNumPhases; ++p) share[kPhases[p]] = sum[p] / step_sum;
  const int64_t peak_all = *std::max_element(peak, peak + kNumPhases);
  nlohmann::json j = {
      {"bench", "grpo_step"},
      {"impl", "verl.cpp"},
      {"device_name", prop.name},
      {"shape", o.model.empty() ? nlohmann::json(o.shape) : nlohmann::json(nullptr)},
      {"model", o.model.empty() ? nlohmann::json(nullptr) : nlohmann::json(o.model)},
      {"params", params},
      {"prompts", o.prompts},
      {"n", o.n},
      {"sequences", B},
      {"prompt_len", o.prompt_len},
      {"new_tokens", o.new_tokens},
      {"micro_tokens", o.micro_tokens},
      {"micro_batches", last.micro_batches},
      {"ref", o.ref},
      {"steps", o.steps},
      {"warmup", o.warmup},
      {"phase_s", phase_s},
      {"phase_share", share},
      {"step_s", step_s},
      {"step_s_min", step_min},
      {"first_step_s", first_step_s},
      {"tokens_per_step", tokens_sum / steps},
      {"tokens_per_s", tokens_sum / step_sum},
      {"rollout_output_tokens", last.output_tokens},
      {"rollout_generate_s", gen_sum / steps},
      {"rollout_output_tokens_per_s", static_cast<double>(last.output_tokens) / (gen_sum / steps)},
      // cudaMemGetInfo total - free at the end of each phase (gen: with the KV cache still held),
      // the largest over all steps; the peer reports the same measure as device_used_bytes.
      {"peak_memory_bytes", memory},
      {"device_used_bytes", memory},
      {"peak_memory_bytes_max", peak_all},
      {"static_memory_bytes", static_bytes},
      {"actor_arena_bytes", static_cast<int64_t>(actor.arena_bytes())},
      {"reward_mean", last.reward_mean},
      {"pg_loss", last.pg_loss},
      {"pg_clipfrac", last.pg_clipfrac},
      {"ppo_kl", last.ppo_kl},
      {"kl_loss", o.ref ? nlohmann::json(last.kl_loss) : nlohmann::json(nullptr)},
      {"grad_norm", last.grad_norm},
      {"lr", o.lr},
      {"enforce_eager", o.enforce_eager},
      {"batch_invariant", o.batch_invariant},
      {"match_trainer_numerics", o.match_trainer},
      {"rollout_vs_old_logprob_max_abs_diff", last.rollout_logprob_diff_max},
      {"rollout_vs_old_logprob_mean_abs_diff", last.rollout_logprob_diff_mean},
      {"max_num_seqs", o.max_num_seqs},
      {"max_num_batched_tokens", o.max_num_batched_tokens}};
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
  return 0;
}

#endif  // VERL_HAVE_CUDA

int run_grpo_step(GrpoOpts o) {
  validate(o);
  if (o.model.empty() && o.shape.empty()) o.shape = "qwen2.5-0.5b";
#ifndef VERL_HAVE_CUDA
  return json_error(o,
                    "bench grpo-step needs CUDA: this verl was built without it (VERL_CUDA=OFF)");
#else
  if (ops::cuda::device_count() == 0)
    return json_error(o, "bench grpo-step: no CUDA device is visible (no driver or no GPU)");
  model::Weights w;
  if (!o.model.empty()) {
    w = model::Weights::load(o.model);
    VERL_CHECK(w.config.head == model::HeadKind::CausalLM,
               "--model {}: bench grpo-step needs a causal LM, but config.json has {}", o.model,
               w.config.architecture);
  } else {
    w = bench_random_weights(bench_shape_config(*find_bench_shape(o.shape)), o.seed);
  }
  return run_cuda(o, w);
#endif
}

}  // namespace

Action add_bench_grpo_step(CLI::App& bench) {
  auto o = std::make_shared<GrpoOpts>();
  CLI::App* s = bench.add_subcommand(
      "grpo-step",
      "Time whole GRPO steps on the GPU (rollout, old and ref log-probs, GRPO advantages, one "
      "PPO-clip update with AdamW) on random prompts; prints one JSON line");
  s->add_option("--shape", o->shape,
                "model shape with random N(0, 0.02) weights: " + bench_shape_names() +
                    " (default qwen2.5-0.5b)");
  s->add_option("--model", o->model, "HF model directory instead of --shape");
  s->add_option("--prompts", o->prompts, "prompts per step (default 32)");
  s->add_option("--n", o->n, "samples per prompt, the GRPO group (default 8)");
  s->add_option("--prompt-len", o->prompt_len, "tokens per random prompt (default 256)");
  s->add_option("--new-tokens", o->new_tokens,
                "tokens generated per sample, EOS ignored (default 256)");
  s->add_option("--steps", o->steps, "timed steps (default 3)");
  s->add_option("--warmup", o->warmup, "untimed steps first (default 1)");
  s->add_option("--micro-tokens", o->micro_tokens,
                "token budget of a log-prob / update micro-batch (ppo_max_token_len_per_gpu; "
                "default 8192)");
  s->add_flag("--ref", o->ref,
              "a frozen reference model: ref log-probs and the k3 KL loss (coef 0.001)");
  s->add_option("--lr", o->lr, "AdamW learning rate (default 1e-6)");
  s->add_option("--max-num-seqs", o->max_num_seqs,
                "rollout: running sequences at most (default 1024)");
  s->add_option("--max-num-batched-tokens", o->max_num_batched_tokens,
                "rollout: new tokens per engine step at most (default 8192)");
  s->add_flag("--enforce-eager", o->enforce_eager, "rollout: no CUDA graphs for decode steps");
  s->add_flag("--batch-invariant", o->batch_invariant,
              "batch-invariant kernels in the rollout and the actor's forward "
              "(actor_rollout_ref.rollout.batch_invariant)");
  s->add_flag("--match-trainer,!--no-match-trainer", o->match_trainer,
              "the rollout's decode attention on the training kernel's arithmetic and GEMMs that "
              "never split k in the rollout and the actor (actor_rollout_ref.rollout."
              "match_trainer_numerics; on by default); --no-match-trainer: split-K kernels");
  s->add_option("--seed", o->seed, "weights, prompts and sampling seed (default 1)");
  return [o, s]() -> int { return s->parsed() ? run_grpo_step(*o) : 0; };
}

}  // namespace verl::cli
