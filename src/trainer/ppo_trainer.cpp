// The step dataflow of verl's RayPPOTrainer.fit on our engine (the actor, the reference policy and
// the rollout on trainer.device; the critic on the CPU). Names of stages, metrics and
// config keys are verl's (verl/trainer/ppo/ray_trainer.py, metric_utils.py).
#include "trainer/ppo_trainer.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <exception>
#include <filesystem>
#include <functional>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <string_view>
#include <thread>

#include "core/error.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/run_lock.h"
#include "core/signals.h"
#include "core/rng.h"
#include "core/timer.h"
#include "data/dynamic_batch.h"
#include "data/seqlen_balancing.h"
#include "metrics/gpu_monitor.h"
#include "metrics/logger.h"
#include "model/generation_config.h"
#include "model/quantize.h"
#include "reward/command_reward.h"
#include "reward/score.h"
#include "rollout/engine.h"
#include "rollout/kv_sizing.h"
#include "tokenizer/tokenizer.h"
#include "trainer/checkpoint.h"
#include "trainer/ranks.h"

namespace verl::trainer {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finaliser: decorrelates derived seeds
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A model's AdamW settings from its `<prefix>.optim.*` keys.
AdamWConfig optim_config(const config::Config& cfg, const std::string& prefix, double grad_clip) {
  AdamWConfig oc;
  oc.lr = static_cast<float>(cfg.get<double>(prefix + ".optim.lr"));
  auto betas = cfg.get<std::vector<double>>(prefix + ".optim.betas");
  VERL_CHECK(betas.size() == 2, "{}.optim.betas must hold two numbers", prefix);
  oc.beta1 = static_cast<float>(betas[0]);
  oc.beta2 = static_cast<float>(betas[1]);
  oc.weight_decay = static_cast<float>(cfg.get<double>(prefix + ".optim.weight_decay"));
  oc.grad_clip = static_cast<float>(grad_clip);
  return oc;
}

// A model's offload (optim::OffloadConfig): `ratio` of its master weights and moments in pinned
// host memory (`ratio_key`, actor_rollout_ref.actor_offload_ratio, the seed's knob; null for the
// models without one), and verl's `<fsdp>param_offload` / `optimizer_offload` switches (the latter
// where the section has it), each the whole of its part. On the CPU a model lives in host memory
// already: the keys change nothing there, and say so.
optim::OffloadConfig offload_config(const config::Config& cfg, Device device, const std::string& fsdp, double ratio,
                                    const char* ratio_key) {
  optim::OffloadConfig o;
  o.params = cfg.get<bool>(fsdp + "param_offload") ? 1.0 : ratio;
  const bool has_optimizer = cfg.has(fsdp + "optimizer_offload");
  o.optimizer = has_optimizer && cfg.get<bool>(fsdp + "optimizer_offload") ? 1.0 : ratio;
  if (device != Device::Cuda && o.any()) {
    log::warn("{}{}param_offload{}: trainer.device=cpu keeps the model in host memory already; nothing to offload",
              ratio_key ? fmt::format("{} / ", ratio_key) : "", fsdp,
              has_optimizer ? fmt::format(" / {}optimizer_offload", fsdp) : "");
    return {};
  }
  return o;
}

// make_policy, with what to do when a model's state does not fit on the GPU: the allocator's
// out-of-memory error gains the device's figures and the keys that move state to the host.
std::unique_ptr<PolicyModel> build_policy(Device device, model::Weights w, const PolicyOptions& opts,
                                          const char* what, const char* keys) {
  const double params = static_cast<double>(w.layout.total);
  try {
    return make_policy(device, std::move(w), opts);
  } catch (const Error& e) {
    if (device != Device::Cuda || std::string_view(e.what()).find("out of memory") == std::string_view::npos) throw;
    constexpr double kGiB = 1 << 30;
    VERL_FAIL("the {} ({:.2f}B parameters: {:.1f} GiB for a trained state at 18 bytes a parameter, {:.1f} GiB for "
              "bf16 weights alone) does not fit on the GPU beside the {:.1f} GiB already in use of {:.1f} GiB; "
              "consider {} (docs/memory.md). The allocator said: {}",
              what, params / 1e9, 18 * params / kGiB, 2 * params / kGiB,
              static_cast<double>(device_memory_in_use()) / kGiB, static_cast<double>(device_memory_total()) / kGiB,
              keys, e.what());
  }
}

// A model's learning-rate schedule from its `<prefix>.optim.*` keys.
optim::LrSchedule lr_schedule(const config::Config& cfg, const std::string& prefix, int64_t total_steps) {
  optim::LrSchedule s;
  s.type = cfg.get<std::string>(prefix + ".optim.lr_scheduler_type");
  s.total_steps = total_steps;
  s.warmup_steps = optim::LrSchedule::resolve_warmup(cfg.get<int64_t>(prefix + ".optim.lr_warmup_steps"),
                                              cfg.get<double>(prefix + ".optim.lr_warmup_steps_ratio"), total_steps);
  s.min_lr_ratio = cfg.get<std::optional<double>>(prefix + ".optim.min_lr_ratio").value_or(0.0);
  s.num_cycles = cfg.get<double>(prefix + ".optim.num_cycles");
  return s;
}

// Sequences per update micro-batch without use_dynamic_bsz: `<prefix>ppo_micro_batch_size_per_gpu`,
// else verl's deprecated global ppo_micro_batch_size divided among the ranks, else the mini-batch.
int64_t update_micro_seqs(const config::Config& cfg, const std::string& prefix, int world, int64_t mini) {
  const auto per_gpu = cfg.get<std::optional<int64_t>>(prefix + "ppo_micro_batch_size_per_gpu");
  const auto global = cfg.get<std::optional<int64_t>>(prefix + "ppo_micro_batch_size");
  if (per_gpu) return *per_gpu;
  return global ? std::max<int64_t>(1, *global / world) : mini;
}

// How a forward-only pass (old_log_prob, ref, values) cuts the step's sequences, verl's keys:
// under `<prefix>log_prob_use_dynamic_bsz` (the critic: use_dynamic_bsz) token budgets of
// log_prob_max_token_len_per_gpu (forward_max_token_len_per_gpu); otherwise
// log_prob_micro_batch_size_per_gpu (forward_micro_batch_size_per_gpu) sequences, or the deprecated
// global size divided among the ranks. Neither size set: the token budget still cuts the batch.
struct ForwardBatching {
  bool dynamic = true;
  int64_t max_tokens = 0, max_seqs = 0;
};
ForwardBatching forward_batching(const config::Config& cfg, const std::string& prefix, int world) {
  const bool critic = prefix == "critic.";
  const std::string dyn = critic ? "use_dynamic_bsz" : "log_prob_use_dynamic_bsz";
  const std::string tokens = critic ? "forward_max_token_len_per_gpu" : "log_prob_max_token_len_per_gpu";
  const std::string micro = critic ? "forward_micro_batch_size" : "log_prob_micro_batch_size";
  ForwardBatching f;
  f.max_tokens = cfg.get<int64_t>(prefix + tokens);
  if (cfg.get<bool>(prefix + dyn)) return f;
  auto per_gpu = cfg.get<std::optional<int64_t>>(prefix + micro + "_per_gpu");
  if (auto global = cfg.get<std::optional<int64_t>>(prefix + micro); global && !per_gpu)
    per_gpu = std::max<int64_t>(1, *global / world);
  if (!per_gpu) return f;
  f.dynamic = false;
  f.max_seqs = *per_gpu;
  return f;
}

// The largest micro-batch the trainer packs for a policy, from the config alone, so that the CUDA
// model plans its memory once: its forward-only pass (`fwd`: rollout. for the actor's
// old_log_prob, ref. for the reference policy, critic. for the values; forward_batching) over the
// step's data.gen_batch_size x rollout.n sequences and, for a trained model (update = true), the
// update, which cuts each mini-batch by ppo_max_token_len_per_gpu under use_dynamic_bsz, else into
// ppo_micro_batch_size_per_gpu sequences; a sequence holds at most max_prompt_length +
// rollout.response_length tokens.
struct MicroBatchPlan {
  int64_t max_tokens = 0, max_seqs = 0;
};
MicroBatchPlan plan_micro_batches(const config::Config& cfg, int64_t n, int world, bool update,
                                  const std::string& a, const std::string& fwd) {
  const int64_t seq_len = cfg.get<int64_t>("data.max_prompt_length") +
                          cfg.get<int64_t>("actor_rollout_ref.rollout.response_length");
  const int64_t step_seqs = cfg.get<int64_t>("data.gen_batch_size") * n / world;  // this rank's share
  const ForwardBatching fb = forward_batching(cfg, fwd, world);
  MicroBatchPlan p;
  p.max_tokens = std::min(fb.max_tokens, step_seqs * seq_len);
  if (!fb.dynamic) p.max_tokens = std::max(p.max_tokens, std::min(fb.max_seqs, step_seqs) * seq_len);
  if (update) p.max_tokens = std::max(p.max_tokens, std::min(cfg.get<int64_t>(a + "ppo_max_token_len_per_gpu"),
                                                             step_seqs * seq_len));
  if (update && !cfg.get<bool>(a + "use_dynamic_bsz")) {
    const int64_t mini = std::min(cfg.get<int64_t>(a + "ppo_mini_batch_size") * n / world, step_seqs);
    const int64_t micro = std::min(update_micro_seqs(cfg, a, world, mini), mini);
    p.max_tokens = std::max(p.max_tokens, micro * seq_len);
  }
  p.max_seqs = std::min(step_seqs, p.max_tokens);  // a sequence has at least one token
  return p;
}

// verl's training/rollout_probs_diff_{max,mean,std}: |exp(rollout log-prob) - exp(old log-prob)|
// over response tokens. 0 with actor_rollout_ref.rollout.batch_invariant on cuda; on cpu both are
// fp32 models that sum in other orders (about 1e-6 on the demo).
struct ProbsDiff {
  double worst = 0, sum = 0, sq = 0, n = 0;
  void add(const std::vector<float>& rollout, const std::vector<float>& old, const std::vector<float>& mask) {
    for (size_t i = 0; i < mask.size(); ++i) {
      if (mask[i] == 0.0f) continue;
      const double d = std::fabs(std::exp(double(rollout[i])) - std::exp(double(old[i])));
      worst = std::max(worst, d);
      sum += d;
      sq += d * d;
      n += 1;
    }
  }
  // Over every rank's tokens.
  void reduce(dist::Communicator& comm) {
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
  void report(metrics::Metrics& m) const {
    if (n == 0) return;
    const double mean = sum / n;
    m.set("training/rollout_probs_diff_max", worst);
    m.set("training/rollout_probs_diff_mean", mean);
    m.set("training/rollout_probs_diff_std", std::sqrt(std::max(0.0, sq / n - mean * mean)));
  }
};

// data.dynamic_batch's metrics of a step: `update` holds the actor update's packings, `other` the
// step's earlier ones (their budget steps count too). Token sums over every rank.
void add_dynamic_batch_metrics(const data::DynamicBatchStats& other, const data::DynamicBatchStats& update,
                               dist::Communicator& comm, int64_t budget, metrics::Metrics& m) {
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
    m.set("dynamic_batch/micro_batch_spread", comm.mean(update.spread / static_cast<double>(update.packings)));
}

// A micro-batch beyond the plan (a CUDA model's max_tokens / max_seqs) is a config problem: name the keys.
void check_plan(const PolicyModel& policy, const model::PackedBatch& pb) {
  if (policy.max_tokens() == 0) return;  // the CPU model grows its buffers
  VERL_CHECK(pb.num_tokens() <= policy.max_tokens() && pb.num_seqs() <= policy.max_seqs(),
             "a micro-batch of {} tokens in {} sequences exceeds the {} tokens / {} sequences the {} model was "
             "planned for from actor_rollout_ref.actor.ppo_max_token_len_per_gpu, ppo_micro_batch_size_per_gpu "
             "(without use_dynamic_bsz), data.gen_batch_size x actor_rollout_ref.rollout.n and "
             "data.max_prompt_length + data.max_response_length; check those keys",
             pb.num_tokens(), pb.num_seqs(), policy.max_tokens(), policy.max_seqs(), to_string(policy.device()));
}

// Rows `idx` of a [B, L] matrix, as a contiguous [idx.size(), L] matrix.
std::vector<float> rows(const std::vector<float>& m, const std::vector<int64_t>& idx, int64_t L) {
  std::vector<float> out;
  if (m.empty()) return out;
  out.reserve(idx.size() * L);
  for (int64_t b : idx) out.insert(out.end(), m.begin() + b * L, m.begin() + (b + 1) * L);
  return out;
}

// A step's [B, L] per-token matrices over every data-parallel rank: each rank holds B rows (the
// same B everywhere) of up to its own L; the global view stacks the ranks' rows in rank order
// (rank r's rows are the global batch's rows r B .. r B + B - 1: its prompts' samples in prompt
// order, or the set balance_batch gave it) padded to the longest L. One rank: the matrices themselves, nothing copied through a communicator.
class GlobalRows {
 public:
  GlobalRows(dist::Communicator& comm, const Experience& exp)
      : comm_(comm), B_(exp.B), L_(exp.L),
        Lg_(comm.world_size() > 1 ? comm.max(exp.L) : exp.L) {}

  Shape shape() const { return {B_ * comm_.world_size(), Lg_}; }
  // A local [B, L] matrix as the global [W B, Lg] one (empty stays empty).
  std::vector<float> gather(const std::vector<float>& m) {
    if (comm_.world_size() == 1 || m.empty()) return m;
    std::vector<float> padded(static_cast<size_t>(B_ * Lg_), 0.0f);
    for (int64_t b = 0; b < B_; ++b) std::copy_n(m.begin() + b * L_, L_, padded.begin() + b * Lg_);
    std::vector<float> out(padded.size() * comm_.world_size());
    comm_.all_gather<float>(padded, out);
    bytes_ += padded.size() * sizeof(float);
    return out;
  }
  // One value per row, [B] -> [W B].
  std::vector<float> gather_per_row(const std::vector<float>& v) {
    if (comm_.world_size() == 1) return v;
    std::vector<float> out(v.size() * comm_.world_size());
    comm_.all_gather<float>(v, out);
    bytes_ += v.size() * sizeof(float);
    return out;
  }
  // Rows' (global) prompt indices.
  std::vector<int64_t> gather_index(const std::vector<int64_t>& group) {
    if (comm_.world_size() == 1) return group;
    std::vector<int64_t> out(group.size() * comm_.world_size());
    comm_.all_gather<int64_t>(group, out);
    bytes_ += group.size() * sizeof(int64_t);
    return out;
  }
  // This rank's rows of a global [W B, Lg] matrix, as a local [B, L] one.
  std::vector<float> mine(const std::vector<float>& global) const {
    if (comm_.world_size() == 1 || global.empty()) return global;
    std::vector<float> out(static_cast<size_t>(B_ * L_));
    const int64_t row0 = comm_.rank() * B_;
    for (int64_t b = 0; b < B_; ++b) std::copy_n(global.begin() + (row0 + b) * Lg_, L_, out.begin() + b * L_);
    return out;
  }
  size_t bytes_sent() const { return bytes_; }

 private:
  dist::Communicator& comm_;
  int64_t B_, L_, Lg_;
  size_t bytes_ = 0;
};

// trainer.gradient_sync_method and trainer.lightweight_sync_config: LightweightSync's settings, or
// none for the dense all-reduce.
std::optional<optim::LightweightConfig> lightweight_sync_config(const config::Config& cfg) {
  const std::string method = cfg.get<std::string>("trainer.gradient_sync_method");
  const std::string k = "trainer.lightweight_sync_config.";
  optim::LightweightConfig lw;
  lw.top_k = cfg.get<double>(k + "top_k");
  lw.values = optim::sync_values_named(cfg.get<std::string>(k + "compression_dtype"), "trainer.lightweight_sync_config.compression_dtype");
  lw.interval = cfg.get<int64_t>(k + "sync_interval_steps");
  lw.error_feedback = cfg.get<bool>(k + "error_feedback");
  if (method != "lightweight") return std::nullopt;
  return lw;
}

// <prefix>quantization_bits / <prefix>quantization_group_size /
// <prefix>quantization_calibration_samples (the reward model's, the reference policy's): quantises
// w's linear layers once at load (model/quantize.h) and logs what it did. Returns the quantised
// matrices when `keep` (a GPU model computes with them instead of bf16 copies), else none.
std::vector<model::QuantizedLayer> quantize_as_configured(const config::Config& cfg,
                                                          const std::string& prefix,
                                                          model::Weights& w, const char* what,
                                                          bool keep) {
  const auto bits = static_cast<int>(cfg.get<int64_t>(prefix + "quantization_bits"));
  const int64_t group = cfg.get<int64_t>(prefix + "quantization_group_size");
  VERL_CHECK(bits != 4 || group % 2 == 0, "{}quantization_group_size={}: must be even", prefix, group);
  const int64_t samples = cfg.get<int64_t>(prefix + "quantization_calibration_samples");
  VERL_CHECK(samples >= 0 && samples <= model::kMaxCalibrationSamples,
             "{}quantization_calibration_samples={}: want 0 (round to nearest) to {}", prefix, samples,
             model::kMaxCalibrationSamples);
  model::QuantizeOptions opt;
  opt.bits = bits;
  opt.group = group;
  opt.calibration_samples = samples;
  std::vector<model::QuantizedLayer> kept;
  const model::QuantizeReport q = model::quantize_linear_weights(w, opt, keep ? &kept : nullptr);
  if (q.matrices > 0)
    log::info("{}: {}{}", what, model::describe(q, bits, group),
              keep ? "; on the GPU the linear layers compute from the quantised codes" : "");
  return kept;
}

// Data parallelism for a trained model (optim/train_state.h): gradients reduced in buckets during
// backward, with ZeRO stage `key` (1: this rank keeps its shard of the AdamW moments; 2: also only
// its shard of the gradients). One rank has nothing to shard: a warning says the key changes
// nothing.
void setup_data_parallel(const config::Config& cfg, const char* key, PolicyModel& model, dist::Communicator& comm) {
  const int64_t stage = cfg.get<int64_t>(key);
  if (comm.world_size() == 1) {
    if (stage > 0)
      log::warn("{}={}: one rank has nothing to shard; the whole optimizer state stays here", key, stage);
    const std::optional<optim::LightweightConfig> lw = lightweight_sync_config(cfg);
    // A one-rank NCCL communicator still reduces (through NCCL): its buckets go as with more, and
    // LightweightSync compresses them (what one GPU can show of it).
    if (comm.distributed()) {
      model.state().enable_data_parallel(comm, 0);
      if (lw) model.state().use_lightweight_sync(*lw);
    } else if (lw) {
      log::warn("trainer.gradient_sync_method=lightweight: one rank sends no gradients; the update uses the whole "
                "gradient, as with allreduce");
    }
    return;
  }
  optim::TrainState& st = model.state();
  st.enable_data_parallel(comm, static_cast<int>(stage));
  if (const std::optional<optim::LightweightConfig> lw = lightweight_sync_config(cfg)) {
    VERL_CHECK(stage < 2, "trainer.gradient_sync_method=lightweight with {}={}: LightweightSync compresses each rank's "
               "whole gradient (its top-k and carry), which ZeRO-{} does not keep; use {}=1 (sharded moments) or 0",
               key, stage, stage, key);
    st.use_lightweight_sync(*lw);
    const std::string_view model_key(key);
    log::info("LightweightSync for {}: top_k {}, {} values, a sync every {} optimizer step(s), error feedback {}",
              model_key.substr(0, model_key.rfind('.')), lw->top_k, optim::to_string(lw->values), lw->interval, lw->error_feedback ? "on" : "off");
  }
  if (stage == 0) return;
  log::info("ZeRO-{} ({}): rank {} of {} keeps the {}AdamW moments{} of elements [{}, {}) of {}", stage, key,
            comm.rank(), comm.world_size(), stage == 3 ? "weights, " : "", stage >= 2 ? " and gradients" : "",
            st.shard().begin, st.shard().end, st.numel());
}

// ZeRO-3's reshard for a phase that reads the whole weights (the rollout engine, checkpoints): the
// shards all-gathered in buckets of `bucket` floats (rollout.update_weights_bucket_megabytes) on
// entry (a collective: every rank enters), the whole copy dropped on exit. Other ZeRO stages hold
// the whole weights: nothing happens.
class FullWeights {
 public:
  FullWeights(PolicyModel& p, int64_t bucket) : st_(p.state()), held_(!st_.has_full_weights()) {
    if (held_) st_.gather_full_weights(bucket);
  }
  ~FullWeights() {
    if (held_) st_.drop_full_weights();
  }
  FullWeights(const FullWeights&) = delete;
  FullWeights& operator=(const FullWeights&) = delete;

 private:
  optim::TrainState& st_;
  bool held_;
};

// algorithm.rollout_correction in bypass mode for one micro-batch (verl's
// compute_policy_loss_bypass_mode): the rejection mask and weights come from the current policy's
// log-probs against the rollout's (= old); ppo_clip then takes PPO's ratio as the correction and
// no weights, reinforce takes -A log pi times the truncated weights (our gpg loss with weights).
// The micro-batch's rollout_corr/* metrics are summed into `metrics` (value, count).
void bypass_correction(const RolloutCorrectionConfig& rc, Shape s, const std::vector<float>& logp,
                       const std::vector<float>& rollout, std::vector<float>& mask, std::vector<float>& is_weights,
                       ActorLossConfig& lc, std::map<std::string, std::pair<double, int64_t>>& metrics) {
  if (std::all_of(mask.begin(), mask.end(), [](float v) { return v == 0.0f; })) return;
  RolloutCorrectionOutput out = compute_rollout_correction(s, logp, rollout, mask, rc);
  for (const auto& [k, v] : out.metrics) {
    metrics[k].first += v;
    metrics[k].second += 1;
  }
  mask = std::move(out.response_mask);
  if (rc.loss_type == "reinforce") {
    lc.policy.loss_mode = PolicyLossMode::Gpg;
    is_weights = std::move(out.rollout_is_weights);
  } else {
    is_weights.clear();
  }
}

// One generated sample as verl's _dump_generations writes it: the prompt and the response as text
// (special tokens skipped), the row's ground truth and the sample's score.
struct GenerationRow {
  std::string input, output;
  nlohmann::json gts;
  double score = 0;
};

std::vector<GenerationRow> generation_rows(const tokenizer::Tokenizer& tok, const Experience& exp) {
  std::vector<GenerationRow> out(static_cast<size_t>(exp.B));
  for (int64_t b = 0; b < exp.B; ++b) {
    out[b] = {tok.decode(exp.sample[b]->prompt_ids, true), tok.decode(exp.response[b], true),
              exp.sample[b]->ground_truth_json, exp.scores[b]};
  }
  return out;
}

// verl's _dump_generations (trainer.rollout_data_dir, trainer.validation_data_dir): DIR/<step>.jsonl
// with one {"input", "output", "gts", "score", "step"} line per sample. With several ranks each
// writes its own samples, to DIR/<step>_rank<r>.jsonl.
void dump_generations(const std::string& dir, const std::string& key, int64_t step,
                      const std::vector<GenerationRow>& rows, const dist::Communicator& comm) {
  std::filesystem::create_directories(dir);
  const std::string name = comm.world_size() == 1 ? fmt::format("{}.jsonl", step)
                                                  : fmt::format("{}_rank{}.jsonl", step, comm.rank());
  const std::string path = (std::filesystem::path(dir) / name).string();
  std::ofstream f(path, std::ios::trunc);
  VERL_CHECK(f.good(), "{}={}: cannot write {}", key, dir, path);
  for (const GenerationRow& r : rows) {
    nlohmann::ordered_json j = {{"input", r.input}, {"output", r.output}, {"gts", r.gts}, {"score", r.score},
                                {"step", step}};
    f << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << '\n';
  }
  f.close();
  VERL_CHECK(!f.fail(), "{}={}: writing {} failed (disk full?)", key, dir, path);
}

// verl's _maybe_log_val_generations (trainer.log_val_generations): `n` validation samples, sorted by
// input and shuffled with a fixed seed so that every validation shows the same prompts.
void log_val_generations(std::vector<GenerationRow> rows, int64_t n, int64_t step) {
  if (n <= 0 || rows.empty()) return;
  std::stable_sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.input < b.input; });
  Rng rng(42);
  for (size_t i = rows.size() - 1; i > 0; --i) std::swap(rows[i], rows[rng.below(i + 1)]);
  rows.resize(std::min<size_t>(rows.size(), static_cast<size_t>(n)));
  for (size_t i = 0; i < rows.size(); ++i)
    log::info("validation sample {} of step {} (score {}):\n[input] {}\n[output] {}", i + 1, step, rows[i].score,
              rows[i].input, rows[i].output);
}

}  // namespace

// trainer.one_step_off_policy: the next step's rollout, started from this step's weights.
struct PpoTrainer::Prefetch {
  data::Batch batch;                 // the step's prompts, as next_batch() hands them out
  nlohmann::json loader_state;      // the loader before `batch` was taken: a checkpoint resumes there
  std::vector<data::Sample> local;  // this rank's share (the experience's samples point here)
  int64_t first = 0;
  int64_t weights_step = 0;          // training steps whose updates the snapshot holds
  model::Weights weights;            // the snapshot the rollout reads (CPU)
  std::unique_ptr<PolicyModel::RolloutSnapshot> snapshot;  // the GPU's, on its own stream
  Experience exp;
  metrics::StageTimer timer;
  std::exception_ptr error;
  bool handed_out = false;
  std::thread thread;                // last: joined before the rest goes
  ~Prefetch() {
    if (thread.joinable()) thread.join();
  }
};

PpoTrainer::PpoTrainer(const config::Config& cfg) : cfg_(cfg) {
  // The ranks the launcher started (one process without a launcher: exactly as before). On GPUs
  // each rank takes its local rank's device and the device collectives go through NCCL.
  const std::string device = cfg_.get<std::string>("trainer.device");
  device_ = resolve_device(device);
  comm_ = start_ranks(cfg_, device_, cfg_.get<double>("actor_rollout_ref.nccl_timeout"));
  // What checkpoints hold, checked before the first step rather than at the first save.
  auto contents = [&](const std::string& key) {
    return parse_checkpoint_contents(cfg_.get<std::vector<std::string>>(key), key);
  };
  actor_save_ = contents("actor_rollout_ref.actor.checkpoint.save_contents");
  actor_load_ = contents("actor_rollout_ref.actor.checkpoint.load_contents");
  critic_save_ = contents("critic.checkpoint.save_contents");
  critic_load_ = contents("critic.checkpoint.load_contents");
  const int world = comm_->world_size();
  if (world > 1) {
    for (const char* key : {"data.train_batch_size", "data.gen_batch_size", "actor_rollout_ref.actor.ppo_mini_batch_size"}) {
      const int64_t v = cfg_.get<int64_t>(key);
      VERL_CHECK(v % world == 0, "{}={} must be a multiple of the {} data-parallel ranks (each takes an equal share)",
                 key, v, world);
    }
  }
  const std::string model_path = cfg_.get<std::string>("actor_rollout_ref.model.path");
  model::Weights actor_weights = model::Weights::load(model_path);
  VERL_CHECK(actor_weights.config.head == model::HeadKind::CausalLM,
             "actor_rollout_ref.model.path={}: the actor must be a causal LM, got {}", model_path,
             actor_weights.config.architecture);
  tokenizer_dir_ = cfg_.get<std::optional<std::string>>("data.tokenizer").value_or(model_path);
  tok_ = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::load(tokenizer_dir_));
  if (auto tpl = cfg_.get<std::optional<std::string>>("actor_rollout_ref.model.custom_chat_template"))
    tok_->set_chat_template(*tpl, "actor_rollout_ref.model.custom_chat_template");
  eos_ids_ = model::generation_eos_ids(model_path, actor_weights.config, tok_->eos_token_id());
  n_ = cfg_.get<int64_t>("actor_rollout_ref.rollout.n");
  {
    // A rank holds every sequence of its share of a step at once (prompt, tokens, log-probs): more
    // than 2^20 (a typo in n, say) would take turns in the KV cache for hours before failing.
    constexpr int64_t kMaxRankSequences = int64_t{1} << 20;
    const int64_t gen = cfg_.get<int64_t>("data.gen_batch_size");
    VERL_CHECK(gen / comm_->world_size() <= kMaxRankSequences / n_,
               "data.gen_batch_size {} x actor_rollout_ref.rollout.n {} = {} sequences a step over {} rank(s), "
               "more than the {} a rank holds; lower one of them", gen, n_, gen * n_, comm_->world_size(),
               kMaxRankSequences);
  }
  reshard_bucket_ = cfg_.get<int64_t>("actor_rollout_ref.rollout.update_weights_bucket_megabytes") * (1 << 20) /
                    static_cast<int64_t>(sizeof(float));
  temperature_ = static_cast<float>(cfg_.get<double>("actor_rollout_ref.rollout.temperature"));
  seed_ = static_cast<uint64_t>(cfg_.get<std::optional<int64_t>>("data.seed").value_or(1));

  // Rows the built-in scorers would reject fail at load, naming file:line (a command scores its own).
  const bool rule_rewards = !cfg_.get<std::optional<std::string>>("custom_reward_function.command");
  auto dataset_options = [&](bool validation) {
    data::DatasetOptions o = data::DatasetOptions::from_config(cfg_, validation);
    if (rule_rewards) o.check_reward_inputs = [](const std::string& ds, const nlohmann::json& gt) {
      reward::check_reward_inputs(ds, gt);
    };
    return o;
  };
  train_set_ = std::make_unique<data::RLDataset>(
      data::RLDataset::load(cfg_.get<std::vector<std::string>>("data.train_files"), *tok_, dataset_options(false)));
  if (auto vf = cfg_.get<std::optional<std::vector<std::string>>>("data.val_files")) {
    val_set_ = std::make_unique<data::RLDataset>(data::RLDataset::load(*vf, *tok_, dataset_options(true)));
  }
  train_loader_ = std::make_unique<data::DataLoader>(*train_set_, data::LoaderOptions::train_from_config(cfg_));
  total_steps_ = train_loader_->total_batches();
  if (auto t = cfg_.get<std::optional<int64_t>>("trainer.total_training_steps")) total_steps_ = std::min(total_steps_, *t);

  estimator_ = parse_adv_estimator(cfg_.get<std::string>("algorithm.adv_estimator"));
  const bool use_critic = estimator_ == AdvantageEstimator::GAE ||
                          cfg_.get<std::optional<bool>>("critic.enable").value_or(false);
  if (use_critic) {
    // The critic on trainer.device too; its micro-batches are planned from the critic.* keys.
    VERL_CHECK(cfg_.get<int64_t>("critic.ppo_mini_batch_size") % comm_->world_size() == 0,
               "critic.ppo_mini_batch_size={} must be a multiple of the {} data-parallel ranks",
               cfg_.get<int64_t>("critic.ppo_mini_batch_size"), comm_->world_size());
    PolicyOptions co;
    co.optim = optim_config(cfg_, "critic", cfg_.get<double>("critic.grad_clip"));
    co.recompute = cfg_.get<bool>("critic.model.enable_gradient_checkpointing");
    const MicroBatchPlan plan = plan_micro_batches(cfg_, n_, comm_->world_size(), /*update=*/true, "critic.", "critic.");
    co.max_tokens = plan.max_tokens;
    co.max_seqs = plan.max_seqs;
    co.offload = offload_config(cfg_, device_, "critic.model.fsdp_config.", 0.0, nullptr);
    critic_.emplace();
    critic_->base_lr = co.optim.lr;
    critic_->schedule = lr_schedule(cfg_, "critic", total_steps_);
    critic_->model = build_policy(device_, model::Weights::load_as_critic(cfg_.get<std::string>("critic.model.path"), seed_),
                                  co, "critic", "critic.model.fsdp_config.optimizer_offload=true / param_offload=true");
    setup_data_parallel(cfg_, "critic.zero_stage", *critic_->model, *comm_);
  }
  const bool use_kl_in_reward = cfg_.get<bool>("algorithm.use_kl_in_reward");
  actor_loss_.policy.clip_ratio = cfg_.get<double>("actor_rollout_ref.actor.clip_ratio");
  actor_loss_.policy.clip_ratio_low = cfg_.get<std::optional<double>>("actor_rollout_ref.actor.clip_ratio_low");
  actor_loss_.policy.clip_ratio_high = cfg_.get<std::optional<double>>("actor_rollout_ref.actor.clip_ratio_high");
  actor_loss_.policy.clip_ratio_c = cfg_.get<double>("actor_rollout_ref.actor.clip_ratio_c");
  {  // actor.policy_loss.* and SAPO's temperatures (verl's PolicyLossConfig / ActorConfig)
    const std::string pl = "actor_rollout_ref.actor.policy_loss.";
    actor_loss_.policy.loss_mode = parse_policy_loss_mode(cfg_.get<std::string>(pl + "loss_mode"));
    actor_loss_.policy.clip_cov_ratio = cfg_.get<double>(pl + "clip_cov_ratio");
    actor_loss_.policy.clip_cov_lb = cfg_.get<double>(pl + "clip_cov_lb");
    actor_loss_.policy.clip_cov_ub = cfg_.get<double>(pl + "clip_cov_ub");
    actor_loss_.policy.kl_cov_ratio = cfg_.get<double>(pl + "kl_cov_ratio");
    actor_loss_.policy.ppo_kl_coef = cfg_.get<double>(pl + "ppo_kl_coef");
    actor_loss_.policy.tau_pos = cfg_.get<double>("actor_rollout_ref.actor.tau_pos");
    actor_loss_.policy.tau_neg = cfg_.get<double>("actor_rollout_ref.actor.tau_neg");
  }
  actor_loss_.policy.loss_agg_mode = parse_loss_agg_mode(cfg_.get<std::string>("actor_rollout_ref.actor.loss_agg_mode"));
  actor_loss_.entropy_coeff = cfg_.get<double>("actor_rollout_ref.actor.entropy_coeff");
  actor_loss_.use_kl_loss = cfg_.get<bool>("actor_rollout_ref.actor.use_kl_loss");
  actor_loss_.kl_loss_coef = cfg_.get<double>("actor_rollout_ref.actor.kl_loss_coef");
  actor_loss_.kl_loss_type = parse_kl_type(cfg_.get<std::string>("actor_rollout_ref.actor.kl_loss_type"));
  // The actor and the frozen reference policy (the actor's starting weights) on trainer.device.
  // The reference model's log-probs meet nobody's: it takes the fast kernels.
  numerics_ = numerics_from_flags(cfg_.get<bool>("actor_rollout_ref.rollout.batch_invariant"),
                                  cfg_.get<bool>("actor_rollout_ref.rollout.match_trainer_numerics"));
  PolicyOptions po;
  po.recompute = cfg_.get<bool>("actor_rollout_ref.model.enable_gradient_checkpointing");
  if (actor_loss_.use_kl_loss || use_kl_in_reward) {
    PolicyOptions ro = po;
    ro.trainable = false;
    const MicroBatchPlan plan =
        plan_micro_batches(cfg_, n_, comm_->world_size(), /*update=*/false, "", "actor_rollout_ref.ref.");
    ro.max_tokens = plan.max_tokens;
    ro.max_seqs = plan.max_seqs;
    // ref.fsdp_config.param_offload: the bf16 weights on the host, on the device for the ref pass only.
    ro.offload = offload_config(cfg_, device_, "actor_rollout_ref.ref.fsdp_config.", 0.0, nullptr);
    model::Weights ref_weights = actor_weights;
    std::vector<model::QuantizedLayer> ref_q = quantize_as_configured(
        cfg_, "actor_rollout_ref.ref.", ref_weights, "reference policy", device_ == Device::Cuda);
    if (!ref_q.empty())
      ro.quantized = std::make_shared<const std::vector<model::QuantizedLayer>>(std::move(ref_q));
    ref_ = build_policy(device_, std::move(ref_weights), ro, "reference policy",
                        "actor_rollout_ref.ref.fsdp_config.param_offload=true (its weights on the host between ref passes)");
  }
  {
    po.numerics = numerics_;
    po.optim = optim_config(cfg_, "actor_rollout_ref.actor", cfg_.get<double>("actor_rollout_ref.actor.grad_clip"));
    const MicroBatchPlan plan = plan_micro_batches(cfg_, n_, comm_->world_size(), /*update=*/true,
                                                   "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.");
    po.max_tokens = plan.max_tokens;
    po.max_seqs = plan.max_seqs;
    po.offload = offload_config(cfg_, device_, "actor_rollout_ref.actor.fsdp_config.",
                                cfg_.get<double>("actor_rollout_ref.actor_offload_ratio"),
                                "actor_rollout_ref.actor_offload_ratio");
    actor_.base_lr = po.optim.lr;
    actor_.schedule = lr_schedule(cfg_, "actor_rollout_ref.actor", total_steps_);
    actor_.model = build_policy(device_, std::move(actor_weights), po, "actor",
                                "actor_rollout_ref.actor_offload_ratio (0.3 keeps 30% of the fp32 master weights and AdamW "
                                "moments in pinned host memory, 1.0 all of them) and "
                                "actor_rollout_ref.ref.fsdp_config.param_offload=true");
    setup_data_parallel(cfg_, "actor_rollout_ref.actor.zero_stage", *actor_.model, *comm_);
  }
  if (device_ == Device::Cuda) {
    log::info("trainer.device={}: actor{} on cuda, micro-batches of at most {} tokens, {:.2f} GiB of device memory "
              "in use; the rollout runs on the GPU from the actor's bf16 weights",
              device, ref_ ? " and reference policy" : "", actor_.model->max_tokens(),
              static_cast<double>(device_memory_in_use()) / (1 << 30));
  }
  if (use_kl_in_reward) {
    kl_ctrl_ = KlController::from_config(cfg_.get<std::string>("algorithm.kl_ctrl.type"),
                                         cfg_.get<double>("algorithm.kl_ctrl.kl_coef"),
                                         cfg_.get<double>("algorithm.kl_ctrl.target_kl"),
                                         cfg_.get<double>("algorithm.kl_ctrl.horizon"));
  }
  if (cfg_.get<bool>("reward_model.enable")) {
    const std::string rm_path = data::expand_user(cfg_.get<std::string>("reward_model.model.path"));
    model::Weights rm_weights = model::Weights::load(rm_path);
    require_reward_model(rm_weights.config, rm_path);
    std::vector<model::QuantizedLayer> rm_q = quantize_as_configured(
        cfg_, "reward_model.", rm_weights, "reward model", device_ == Device::Cuda);
    const int64_t seq_len =
        cfg_.get<int64_t>("data.max_prompt_length") + cfg_.get<int64_t>("data.max_response_length");
    rm_max_length_ = cfg_.get<std::optional<int64_t>>("reward_model.max_length").value_or(0);
    const std::optional<std::string> input_tok =
        cfg_.get<std::optional<std::string>>("reward_model.model.input_tokenizer");
    if (input_tok && std::filesystem::exists(rm_path + "/tokenizer.json"))
      rm_tok_ = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::load(rm_path));
    // A re-rendered input can outgrow the actor's tokens (another template): the budget allows
    // for reward_model.max_length, or twice the actor's longest sequence.
    const int64_t longest = rm_max_length_ > 0 ? rm_max_length_ : (rm_tok_ ? 2 * seq_len : seq_len);
    int64_t max_tokens = cfg_.get<int64_t>("reward_model.forward_max_token_len_per_gpu"), max_seqs = 0;
    const std::optional<int64_t> mbs = cfg_.get<std::optional<int64_t>>("reward_model.micro_batch_size_per_gpu");
    if (cfg_.get<bool>("reward_model.use_dynamic_bsz")) {
      VERL_CHECK(max_tokens >= longest,
                 "reward_model.forward_max_token_len_per_gpu={} is below the longest reward-model input "
                 "({} tokens: {}); raise it",
                 max_tokens, longest,
                 rm_max_length_ > 0 ? "reward_model.max_length"
                                    : "data.max_prompt_length + data.max_response_length");
      max_seqs = std::max<int64_t>(1, max_tokens / 8);
    } else {
      max_seqs = mbs.value_or(16);
      max_tokens = max_seqs * longest;
    }
    const bool rm_offload = offload_config(cfg_, device_, "reward_model.model.fsdp_config.", 0.0, nullptr).params > 0;
    reward_model_ = std::make_unique<RewardModel>(
        device_, std::move(rm_weights), rm_path, max_tokens, max_seqs, rm_offload, std::move(rm_q));
    log::info("reward model: {} ({}, {} parameters) on {}, {} tokens / {} sequences a forward{}", rm_path,
              reward_model_->config().architecture, reward_model_->parameter_count(), to_string(device_),
              max_tokens, max_seqs, rm_tok_ ? ", inputs re-rendered with its chat template" : "");
    if (command_reward_ || cfg_.get<std::string>("reward_model.reward_manager") == "dapo")
      log::warn("reward_model.enable=true: the reward model's scores are the reward (as verl's reward managers "
                "return rm_scores); {} is not used", command_reward_ ? "custom_reward_function" : "the dapo overlong buffer");
  }
  {  // reward_model.reward_manager, algorithm.filter_groups, algorithm.rollout_correction
    dapo_manager_ = cfg_.get<std::string>("reward_model.reward_manager") == "dapo";
    const std::string ob = "reward_model.overlong_buffer.";
    overlong_.enable = cfg_.get<bool>(ob + "enable");
    overlong_.log = cfg_.get<bool>(ob + "log");
    overlong_.len = cfg_.get<int64_t>(ob + "len");
    overlong_.penalty_factor = cfg_.get<double>(ob + "penalty_factor");
    if (overlong_.enable) {
      // verl's DAPORewardManager asserts the same (and divides by len).
      VERL_CHECK(dapo_manager_, "{}enable=true needs reward_model.reward_manager=dapo", ob);
      const int64_t max_resp = cfg_.get<int64_t>("data.max_response_length");
      VERL_CHECK(overlong_.len >= 1 && overlong_.len <= max_resp,
                 "{}len={} must be within 1..data.max_response_length ({})", ob, overlong_.len, max_resp);
    }
    if (!cfg_.get<bool>("algorithm.filter_groups.enable")) {
      // Settings of a switched-off filter change nothing: say so rather than ignore them.
      if (cfg_.get<std::optional<std::string>>("algorithm.filter_groups.metric") ||
          cfg_.get<int64_t>("algorithm.filter_groups.max_num_gen_batches") > 0)
        log::warn("algorithm.filter_groups.metric / max_num_gen_batches are set but algorithm.filter_groups.enable "
                  "is false: every group is kept");
    } else {
      const auto metric = cfg_.get<std::optional<std::string>>("algorithm.filter_groups.metric");
      VERL_CHECK(metric.has_value(), "algorithm.filter_groups.enable=true needs algorithm.filter_groups.metric "
                 "(acc, score, seq_reward or seq_final_reward)");
      VERL_CHECK(comm_->world_size() == 1,
                 "algorithm.filter_groups.enable=true runs on one rank for now ({} were started): the kept groups "
                 "would have to be redistributed over the ranks", comm_->world_size());
      VERL_CHECK(estimator_ != AdvantageEstimator::ReMax,
                 "algorithm.filter_groups.enable=true with algorithm.adv_estimator=remax is not supported (ReMax's "
                 "greedy baselines are generated per prompt batch)");
      VERL_CHECK(!(*metric == "seq_final_reward" && use_kl_in_reward),
                 "algorithm.filter_groups.metric=seq_final_reward with algorithm.use_kl_in_reward=true is not "
                 "supported (the KL penalty is applied after filtering here); use seq_reward");
    }
    const std::string rc = "algorithm.rollout_correction.";
    rollout_corr_ = parse_rollout_correction(
        cfg_.get<std::optional<std::string>>(rc + "rollout_is"), cfg_.get<double>(rc + "rollout_is_threshold"),
        cfg_.get<bool>(rc + "rollout_is_batch_normalize"), cfg_.get<std::optional<std::string>>(rc + "rollout_rs"),
        cfg_.get<std::optional<std::string>>(rc + "rollout_rs_threshold"), cfg_.get<bool>(rc + "bypass_mode"),
        cfg_.get<std::string>(rc + "loss_type"));
    VERL_CHECK(rollout_corr_.bypass_mode || rollout_corr_.loss_type == "ppo_clip",
               "{}loss_type={} applies to bypass mode only; set {}bypass_mode=true", rc, rollout_corr_.loss_type, rc);
  }
  // The seed's overlap switches (docs/overlap.md), where the run allows them.
  token_pipeline_ = cfg_.get<bool>("trainer.token_level_pipeline");
  if (token_pipeline_ && cfg_.get<bool>("algorithm.filter_groups.enable")) {
    log::warn("trainer.token_level_pipeline with algorithm.filter_groups: dynamic sampling drops and regenerates "
              "groups after generation, so the log-prob passes run after it (no pipeline)");
    token_pipeline_ = false;
  }
  if (token_pipeline_ && comm_->world_size() > 1 && cfg_.get<bool>("trainer.balance_batch")) {
    log::warn("trainer.token_level_pipeline with trainer.balance_batch on {} ranks: balancing moves rows between "
              "ranks after generation, so the log-prob passes run after it; set trainer.balance_batch=false to "
              "pipeline them", comm_->world_size());
    token_pipeline_ = false;
  }
  critic_actor_overlap_ = cfg_.get<bool>("trainer.critic_actor_overlap");
  if (critic_actor_overlap_ && cfg_.get<bool>("data.dynamic_batch.enable")) {
    log::warn("trainer.critic_actor_overlap with data.dynamic_batch.enable: both updates would adapt the one "
              "token budget at once; they run one after the other");
    critic_actor_overlap_ = false;
  }
  if (critic_actor_overlap_ && comm_->distributed()) {
    log::warn("trainer.critic_actor_overlap with a communicator ({} ranks): the two updates' gradient collectives "
              "would interleave in different orders on different ranks; they run one after the other",
              comm_->world_size());
    critic_actor_overlap_ = false;
  }
  // NVML sampling from the start on the GPU, so that a caller driving train_step itself (`verl
  // bench grpo-step`) gets perf/gpu_util_mean and perf/gpu_idle_share too.
  if (comm_->rank() == 0 && device_ == Device::Cuda) gpu_monitor_ = std::make_unique<metrics::GpuMonitor>();
  one_step_off_ = cfg_.get<bool>("trainer.one_step_off_policy");
  if (one_step_off_) {
    const std::string k = "trainer.one_step_off_policy";
    VERL_CHECK(!cfg_.get<bool>("algorithm.filter_groups.enable"), "{}=true with algorithm.filter_groups: dynamic "
               "sampling takes further batches from the loader inside a step, which the next step's rollout has "
               "already taken; turn one of them off", k);
    VERL_CHECK(cfg_.get<int64_t>("actor_rollout_ref.actor.zero_stage") < 3, "{}=true with "
               "actor_rollout_ref.actor.zero_stage=3: the rollout's whole weights are gathered with collectives, "
               "which a rollout beside training must not start; use zero_stage 0-2", k);
  }
  if (auto cmd = cfg_.get<std::optional<std::string>>("custom_reward_function.command")) {
    reward::CommandRewardConfig rc;
    rc.command = *cmd;
    rc.timeout_s = cfg_.get<double>("custom_reward_function.timeout_s");
    rc.on_error = reward::parse_on_error(cfg_.get<std::string>("custom_reward_function.on_error"));
    command_reward_ = std::make_unique<reward::CommandRewardFn>(rc);
  }
  if (const auto db = data::DynamicBatchConfig::from_config(cfg_); db.enable) {
    // The token budget follows the memory in use: the device's on cuda, the process's resident set
    // on cpu (where the CPU model's activations live); the fullest rank's, so all ranks agree.
    data::MemoryReading memory = [this] {
      const auto used = static_cast<int64_t>(device_ == Device::Cuda ? device_memory_in_use()
                                                                    : metrics::current_rss_bytes());
      return static_cast<double>(comm_->world_size() > 1 ? comm_->max(used) : used);
    };
    const int64_t planned = cfg_.get<int64_t>("data.max_prompt_length") +
                            cfg_.get<int64_t>("actor_rollout_ref.rollout.response_length");
    dyn_batch_ = std::make_unique<data::DynamicBatchSampler>(
        db, planned, cfg_.get<int64_t>("actor_rollout_ref.actor.ppo_max_token_len_per_gpu"), std::move(memory));
    log::info("data.dynamic_batch: samples of {}..{} tokens, micro-batches of {} tokens (floor {}), "
              "communication_sensitivity={}", db.min_sequence_length, db.max_sequence_length, dyn_batch_->ceiling(),
              dyn_batch_->floor(), db.communication_sensitivity);
  }
  log::info("PPO trainer: {} ({} parameters), {} training prompts, {} steps, adv_estimator={}{}{}",
            model_path, actor_.model->state().numel(), train_set_->size(), total_steps_, to_string(estimator_),
            critic_ ? ", critic" : "", ref_ ? ", reference model" : "");
}

PpoTrainer::~PpoTrainer() {
  prefetch_.reset();  // waits for a rollout still running for a step that will not come
  if (logger_) logger_->close();
}

// ---- generation and rewards ---------------------------------------------------------------------

namespace {
// A thread that takes rows as generation finishes them and hands each to `handle` in order;
// `flush` runs after the last one. finish() says no more rows come, waits for the thread and
// rethrows its first error (the rows after an error are dropped). The destructor, on a way out
// by exception, stops the thread the same way without rethrowing.
class RowWorker {
 public:
  explicit RowWorker(std::function<void(int64_t)> handle, std::function<void()> flush = {})
      : handle_(std::move(handle)), flush_(std::move(flush)), thread_([this] { run(); }) {}
  ~RowWorker() { stop(); }
  RowWorker(const RowWorker&) = delete;
  RowWorker& operator=(const RowWorker&) = delete;

  void push(int64_t row) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(row);
    }
    cv_.notify_one();
  }
  void finish() {
    stop();
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void run() {
    for (;;) {
      int64_t row = 0;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return done_ || !queue_.empty(); });
        if (queue_.empty()) break;
        row = queue_.front();
        queue_.pop_front();
      }
      if (error_) continue;
      try {
        handle_(row);
      } catch (...) {
        error_ = std::current_exception();
      }
    }
    if (flush_ && !error_) {
      try {
        flush_();
      } catch (...) {
        error_ = std::current_exception();
      }
    }
  }

  std::function<void(int64_t)> handle_;
  std::function<void()> flush_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int64_t> queue_;
  bool done_ = false;
  std::exception_ptr error_;  // the thread's own until finish() joins it
  std::thread thread_;        // last: it starts once the members above exist
};

// rollout.length_dist (the synthetic long-tailed workload): each of a request's n samples gets a
// length from a lognormal of the configured mean, drawn from the request's seed and the sample's
// index (so a sample's length does not depend on the world size or the batch); empty when off.
std::vector<int32_t> synthetic_lengths(const config::Config& cfg, uint64_t seed, int32_t n, int32_t max_tokens) {
  const std::string k = "actor_rollout_ref.rollout.length_dist.";
  const std::string type = cfg.get<std::string>(k + "type");
  if (type == "none") return {};
  const double mean = cfg.get<double>(k + "mean"), sigma = cfg.get<double>(k + "sigma");
  const int64_t cap = std::min<int64_t>(cfg.get<std::optional<int64_t>>(k + "cap").value_or(max_tokens), max_tokens);
  VERL_CHECK(cap >= 1, "{}cap must be >= 1, got {}", k, cap);
  const double mu = std::log(mean) - 0.5 * sigma * sigma;
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    Rng rng(seed ^ 0x6c656e67746873ull, static_cast<uint64_t>(i));
    const double len = std::exp(mu + sigma * static_cast<double>(rng.normal()));
    out[static_cast<size_t>(i)] = static_cast<int32_t>(std::clamp<double>(std::round(len), 1.0, static_cast<double>(cap)));
  }
  return out;
}
}  // namespace

void PpoTrainer::generate(const std::vector<data::Sample>& samples, int64_t first_index, Experience& exp,
                          metrics::StageTimer& timer, const GenOptions& opts) {
  const bool validation = opts.validation, greedy = opts.greedy;
  TokenPipeline* pipe = opts.pipe;
  const int64_t step = opts.step > 0 ? opts.step : global_step_ + 1;
  const std::string rk = validation ? "actor_rollout_ref.rollout.val_kwargs." : "actor_rollout_ref.rollout.";
  const int64_t n = greedy ? 1 : validation ? cfg_.get<int64_t>(rk + "n") : n_;
  rollout::SamplingParams sp;
  const bool do_sample = !greedy && cfg_.get<bool>(rk + "do_sample");
  sp.temperature = do_sample ? static_cast<float>(cfg_.get<double>(rk + "temperature")) : 0.0f;
  sp.top_k = static_cast<int32_t>(cfg_.get<int64_t>(rk + "top_k"));
  sp.top_p = static_cast<float>(cfg_.get<double>(rk + "top_p"));
  // verl's rollout.response_length (by default data.max_response_length) bounds every response,
  // validation's too; rollout.max_model_len (null: prompt_length + response_length) bounds prompt
  // plus response, as vLLM's does.
  const std::string rol = "actor_rollout_ref.rollout.";
  sp.max_tokens = static_cast<int32_t>(cfg_.get<int64_t>(rol + "response_length"));
  const int64_t prompt_limit = cfg_.get<int64_t>(rol + "prompt_length");
  const int64_t model_len =
      cfg_.get<std::optional<int64_t>>(rol + "max_model_len").value_or(prompt_limit + sp.max_tokens);
  sp.ignore_eos = cfg_.get<bool>("actor_rollout_ref.rollout.ignore_eos");
  sp.stop_token_ids = eos_ids_;
  std::vector<rollout::Request> reqs;
  int64_t longest = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const int64_t plen = static_cast<int64_t>(samples[i].prompt_ids.size());
    VERL_CHECK(plen <= prompt_limit && plen < model_len,
               "a prompt of {} tokens is longer than actor_rollout_ref.rollout.prompt_length={} allows (or does not "
               "fit rollout.max_model_len={}); raise them or lower data.max_prompt_length", plen, prompt_limit,
               model_len);
    rollout::Request r;
    r.prompt = samples[i].prompt_ids;
    r.params = sp;
    r.params.seed = mix(seed_ ^ mix(static_cast<uint64_t>(step - 1) * 2 + (validation ? 1 : 0)) ^
                        mix(static_cast<uint64_t>(first_index + static_cast<int64_t>(i)) + 0x51ed));
    r.n = static_cast<int32_t>(n);
    if (!validation && !greedy) r.eos_at = synthetic_lengths(cfg_, r.params.seed, r.n, sp.max_tokens);
    longest = std::max<int64_t>(longest, static_cast<int64_t>(r.prompt.size()));
    reqs.push_back(std::move(r));
  }
  // The rollout phase's KV cache is sized for every sequence at once and freed when the engine
  // goes out of scope, before training starts (phased memory).
  rollout::EngineConfig ec;
  ec.scheduler.block_size = 16;
  ec.scheduler.max_model_len = static_cast<int32_t>(std::min<int64_t>(longest + sp.max_tokens, model_len));
  ec.scheduler.max_num_seqs = static_cast<int32_t>(cfg_.get<int64_t>("actor_rollout_ref.rollout.max_num_seqs"));
  ec.scheduler.max_num_batched_tokens =
      static_cast<int32_t>(cfg_.get<int64_t>("actor_rollout_ref.rollout.max_num_batched_tokens"));
  ec.scheduler.num_blocks = static_cast<int32_t>(
      std::min<int64_t>(rollout::kv_blocks_to_hold(reqs, ec.scheduler.block_size), INT32_MAX));
  // On cuda the rollout runs on the GPU from the actor's own bf16 weights; its KV cache lives as
  // long as `runner` and is freed before the next phase. On cpu it reads the host weights.
  RolloutRunnerOptions ro;
  ro.gpu_memory_utilization = cfg_.get<double>("actor_rollout_ref.rollout.gpu_memory_utilization");
  ro.enforce_eager = cfg_.get<bool>("actor_rollout_ref.rollout.enforce_eager");
  // timing_s/gen_setup: the runner's KV cache, its plan and the engine, before the first step.
  std::optional<metrics::StageTimer::Scope> setup;
  setup.emplace(timer, "gen_setup");
  std::unique_ptr<rollout::StepRunner> runner =
      opts.snapshot ? opts.snapshot->make_rollout_runner(ec.scheduler, ro)
      : opts.weights ? nullptr
                     : actor_.model->make_rollout_runner(ec.scheduler, ro);
  std::optional<FullWeights> full;  // ZeRO-3: the rollout reads whole weights, gathered here
  if (!runner && !opts.weights && !opts.snapshot && !actor_.model->state().has_full_weights()) {
    setup.reset();  // the gather is timing_s/reshard's
    {
      auto s = timer.scope("reshard");
      full.emplace(*actor_.model, reshard_bucket_);
    }
    setup.emplace(timer, "gen_setup");
  }
  std::optional<rollout::Engine> engine_holder;
  if (runner) {
    engine_holder.emplace(*runner, ec);
  } else {
    // On cuda downloaded if a step changed them; one-step-off's snapshot when given.
    engine_holder.emplace(opts.weights ? *opts.weights : actor_.model->weights(), ec);
  }
  rollout::Engine& engine = *engine_holder;
  setup.reset();

  const int64_t B = static_cast<int64_t>(samples.size()) * n;
  exp = Experience{};
  exp.B = B;
  exp.group.resize(B);
  exp.sample.resize(B);
  exp.response.resize(B);
  exp.finish_reason.resize(B);
  exp.scores.assign(B, 0.0f);
  exp.acc.assign(B, 0.0f);
  exp.raw_score.assign(B, 0.0f);
  exp.overlong_reward.assign(B, 0.0f);
  std::vector<std::vector<float>> lps(B);

  // Rewards are scored by a worker while generation goes on (trainer.actor_reward_parallel): rule
  // scores row by row; a reward model's in forwards of its token budget, each run as soon as
  // finished rows fill it, the rest once generation ends (not with its param_offload, which would
  // upload its weights for every forward). A user command scores the whole batch afterwards.
  const bool parallel = cfg_.get<bool>("trainer.actor_reward_parallel") && !command_reward_ &&
                        (!reward_model_ || !reward_model_->offloaded());
  double reward_start = -1, reward_end = -1;  // the reward worker's alone
  std::vector<int64_t> rm_rows;  // finished rows waiting for the reward model's next forward
  int64_t rm_tokens = 0;
  const auto score_rm_rows = [&] {
    if (rm_rows.empty()) return;
    const double t0 = timer.now_s();
    score_with_reward_model(exp, std::exchange(rm_rows, {}));
    rm_tokens = 0;
    if (reward_start < 0) reward_start = t0;
    reward_end = timer.now_s();
  };
  // trainer.token_level_pipeline: finished rows gather into micro-batches of the passes' budget,
  // each run as soon as it is full; what is left runs once generation ends.
  std::vector<int64_t> pending;
  int64_t pending_tokens = 0;
  // Declared after the state their flushes use: a worker's destructor (an error in generation)
  // still runs its flush, which must find that state alive.
  std::optional<RowWorker> scorer, piper;
  if (parallel && reward_model_) {
    scorer.emplace(
        [&](int64_t b) {
          const int64_t t = exp.tokens(b);
          if (rm_tokens + t > reward_model_->max_tokens()) score_rm_rows();
          rm_rows.push_back(b);
          rm_tokens += t;
        },
        score_rm_rows);
  } else if (parallel) {
    scorer.emplace([&](int64_t b) {
      const double t0 = timer.now_s();
      exp.scores[b] = rule_score(exp, b);
      if (reward_start < 0) reward_start = t0;
      reward_end = timer.now_s();
    });
  }
  if (pipe != nullptr && pipe->any()) {
    for (auto* rows : {&pipe->old_rows, &pipe->ref_rows, &pipe->value_rows}) rows->assign(B, {});
    if (pipe->ref) ref_->wake();
    piper.emplace(
        [&](int64_t b) {
          const int64_t t = exp.tokens(b);
          const bool full = (pipe->max_tokens > 0 && pending_tokens + t > pipe->max_tokens) ||
                            (pipe->max_seqs > 0 && static_cast<int64_t>(pending.size()) >= pipe->max_seqs);
          if (full && !pending.empty()) {
            run_pipelined(*pipe, exp, std::exchange(pending, {}), timer);
            pending_tokens = 0;
          }
          pending.push_back(b);
          pending_tokens += t;
        },
        [&] {
          if (!pending.empty()) run_pipelined(*pipe, exp, std::exchange(pending, {}), timer);
        });
  }
  rollout::GenerateHooks hooks;
  hooks.on_finish = [&](const rollout::Completion& c) {
    fault_point("gen", step);  // tests make generation fail while rewards are scored
    const int64_t b = c.request * n + c.sample;
    exp.group[b] = first_index + c.request;  // global: balance_batch may move the row
    exp.sample[b] = &samples[c.request];
    exp.response[b] = c.tokens;
    exp.finish_reason[b] = std::string(rollout::to_string(c.finish_reason));
    lps[b] = c.logprobs;
    if (scorer) scorer->push(b);  // the workers read the row after this, through their queues' locks
    if (piper) piper->push(b);
  };
  {
    auto gen = timer.scope("gen");
    engine.generate(reqs, hooks);
  }
  exp.runner_stats = engine.runner_stats();
  // Device memory with the rollout's KV cache still held (the gen phase's peak), then the cache is
  // given back before the log-prob and update phases.
  gen_device_bytes_ = device_memory_in_use();
  gen_state_bytes_ = host_state_bytes();
  engine_holder.reset();
  runner.reset();
  full.reset();  // ZeRO-3: back to the shards
  if (piper) {
    piper->finish();
    for (PolicyModel* p : {pipe->old_log_prob ? actor_.model.get() : nullptr, pipe->ref ? ref_.get() : nullptr,
                           pipe->values ? critic_->model.get() : nullptr})
      if (p) p->release_activations();
    if (pipe->ref) ref_->sleep();
  }
  if (scorer) {
    scorer->finish();
    if (reward_start >= 0) timer.record("reward", reward_start, reward_end);
  } else {
    auto rs = timer.scope("reward");
    if (reward_model_) {
      score_with_reward_model(exp);
    } else {
      score_all(exp);
    }
  }
  // Per-token matrices.
  int64_t L = 1;
  for (const auto& r : exp.response) L = std::max<int64_t>(L, static_cast<int64_t>(r.size()));
  exp.L = L;
  exp.mask.assign(B * L, 0.0f);
  exp.rollout_log_prob.assign(B * L, 0.0f);
  exp.token_level_scores.assign(B * L, 0.0f);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = static_cast<int64_t>(exp.response[b].size());
    for (int64_t j = 0; j < len; ++j) {
      exp.mask[b * L + j] = 1.0f;
      exp.rollout_log_prob[b * L + j] = lps[b][j];
    }
    if (len > 0) exp.token_level_scores[b * L + len - 1] = exp.scores[b];  // the score sits on the last token
  }
  exp.token_level_rewards = exp.token_level_scores;
}

void PpoTrainer::run_pipelined(TokenPipeline& pipe, const Experience& exp, std::vector<int64_t> rows,
                               metrics::StageTimer& timer) {
  const PackedResponses mb(exp, std::move(rows));
  std::vector<float> out;
  const auto pass = [&](const char* stage, PolicyModel& model, std::vector<std::vector<float>>& into, bool values) {
    const double t0 = timer.now_s();
    check_plan(model, mb.batch());
    if (values) {
      model.forward_values(mb.batch(), out);
    } else {
      model.forward(mb.batch(), temperature_, out, nullptr, /*for_backward=*/false);
    }
    for (size_t i = 0; i < mb.rows().size(); ++i) into[static_cast<size_t>(mb.rows()[i])] = mb.row(out, i);
    timer.record(stage, t0, timer.now_s());
  };
  if (pipe.old_log_prob) pass("old_log_prob", *actor_.model, pipe.old_rows, false);
  if (pipe.ref) pass("ref", *ref_, pipe.ref_rows, false);
  if (pipe.values) pass("values", *critic_->model, pipe.value_rows, true);
}

float PpoTrainer::rule_score(Experience& exp, int64_t b) const {
  const data::Sample& s = *exp.sample[b];
  // The response alone is scored (verl's reward managers pass solution_str = the response).
  const std::string text = tok_->decode(exp.response[b], /*skip_special_tokens=*/true);
  const reward::ScoreResult r = reward::default_compute_score(s.data_source, text, s.ground_truth_json, s.extra_info);
  return manager_reward(exp, b, r.score, r.is_dict ? (r.acc ? 1.0 : 0.0) : r.score);
}

void PpoTrainer::score_all(Experience& exp) {
  if (!command_reward_) {
    for (int64_t b = 0; b < exp.B; ++b) exp.scores[b] = rule_score(exp, b);
    return;
  }
  std::vector<reward::RewardRow> rows(exp.B);
  for (int64_t b = 0; b < exp.B; ++b) {
    const data::Sample& s = *exp.sample[b];
    rows[b] = {s.data_source, tok_->decode(exp.response[b], true), s.ground_truth_json, s.extra_info};
  }
  reward::CommandBatchResult r = command_reward_->score(rows);
  // The first few failed rows by index, then a count: a broken program would otherwise print one
  // line per row of every batch.
  constexpr size_t kShown = 3;
  for (size_t i = 0; i < r.errors.size() && i < kShown; ++i) {
    log::warn("custom reward, step {}, row {}: {}", global_step_ + 1, r.errors[i].index, r.errors[i].message);
  }
  if (r.errors.size() > kShown) {
    log::warn("custom reward, step {}: {} more rows failed", global_step_ + 1, r.errors.size() - kShown);
  }
  // A command's score is a float: verl's dapo manager reports it as acc too.
  for (int64_t b = 0; b < exp.B; ++b) exp.scores[b] = manager_reward(exp, b, r.scores[b], r.scores[b]);
}

void PpoTrainer::score_with_reward_model(Experience& exp) {
  std::vector<int64_t> rows(static_cast<size_t>(exp.B));
  for (int64_t b = 0; b < exp.B; ++b) rows[static_cast<size_t>(b)] = b;
  score_with_reward_model(exp, rows);
}

void PpoTrainer::score_with_reward_model(Experience& exp, const std::vector<int64_t>& rows) {
  std::vector<std::vector<int32_t>> inputs(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t b = rows[i];
    const data::Sample& s = *exp.sample[b];
    std::vector<int32_t>& in = inputs[i];
    if (rm_tok_) {
      // verl's switch of chat template: the row's messages plus the decoded response as the
      // assistant's turn, rendered and tokenized by the reward model's tokenizer.
      nlohmann::ordered_json chat = s.messages;
      chat.push_back({{"role", "assistant"}, {"content", tok_->decode(exp.response[b], true)}});
      try {
        in = rm_tok_->encode(rm_tok_->apply_chat_template(chat, /*add_generation_prompt=*/false));
      } catch (const Error& e) {
        VERL_FAIL("reward model: rendering {}:{} with {}'s chat template: {}", s.file, s.line,
                  cfg_.get<std::string>("reward_model.model.path"), e.what());
      }
    } else {
      in = s.prompt_ids;
      in.insert(in.end(), exp.response[b].begin(), exp.response[b].end());
    }
    if (rm_max_length_ > 0 && static_cast<int64_t>(in.size()) > rm_max_length_) in.resize(rm_max_length_);
  }
  const std::vector<float> scores = reward_model_->score(inputs);
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t b = rows[i];
    exp.scores[b] = scores[i];
    exp.raw_score[b] = scores[i];
    exp.acc[b] = scores[i];
  }
}

// ---- forward passes over the experience -------------------------------------------------------------

std::vector<std::vector<int64_t>> PpoTrainer::micro_batches(const Experience& exp, const std::vector<int64_t>& idx,
                                                            bool dynamic, int64_t max_tokens,
                                                            int64_t max_seqs) const {
  std::vector<std::vector<int64_t>> out;
  if (dyn_batch_) {
    // data.dynamic_batch: the sampler's budget (at most this pass's token key), samples outside the
    // length bounds left out (their masks are zero: drop_by_length).
    std::vector<int64_t> lens;
    for (int64_t b : idx) lens.push_back(exp.tokens(b));
    data::DpMax dp_max;
    if (comm_->world_size() > 1) dp_max = [this](int64_t n) { return comm_->max(n); };
    for (const auto& part : dyn_batch_->pack(lens, max_tokens, dp_max).micro_batches) {
      out.emplace_back();
      for (int64_t i : part) out.back().push_back(idx[i]);
    }
    return out;
  }
  if (dynamic) {
    // verl's rearrange_micro_batches: as few micro-batches as the token budget allows, balanced
    // by Karmarkar-Karp.
    std::vector<int64_t> lens;
    for (int64_t b : idx) {
      lens.push_back(exp.tokens(b));
      VERL_CHECK(lens.back() <= max_tokens,
                 "a sequence of {} tokens exceeds the micro-batch token budget {} (ppo_max_token_len_per_gpu, "
                 "or for a forward-only pass log_prob_max_token_len_per_gpu / forward_max_token_len_per_gpu)",
                 lens.back(), max_tokens);
    }
    data::MicroBatchOptions mo;
    mo.max_token_len = max_tokens;
    if (comm_->world_size() > 1) mo.dp_max = [this](int64_t n) { return comm_->max(n); };
    for (const auto& part : data::rearrange_micro_batches(lens, mo).micro_batches) {
      out.emplace_back();
      for (int64_t i : part) out.back().push_back(idx[i]);
    }
    return out;
  }
  for (size_t i = 0; i < idx.size(); i += static_cast<size_t>(max_seqs)) {
    out.emplace_back(idx.begin() + i, idx.begin() + std::min(idx.size(), i + static_cast<size_t>(max_seqs)));
  }
  return out;
}

void PpoTrainer::compute_log_probs(PolicyModel& policy, const Experience& exp, std::vector<float>& logp,
                                   std::vector<float>* entropy) {
  const int64_t L = exp.L;
  logp.assign(exp.B * L, 0.0f);
  if (entropy) entropy->assign(exp.B * L, 0.0f);
  std::vector<int64_t> all(exp.B);
  std::iota(all.begin(), all.end(), 0);
  std::vector<float> lp, ent;  // [T] of one micro-batch
  // The reference policy's pass is cut by ref.log_prob_*, the actor's (old_log_prob) by rollout.log_prob_*.
  const ForwardBatching fb = forward_batching(
      cfg_, &policy == ref_.get() ? "actor_rollout_ref.ref." : "actor_rollout_ref.rollout.", comm_->world_size());
  for (auto& idx : micro_batches(exp, all, fb.dynamic, fb.max_tokens, fb.max_seqs)) {
    const PackedResponses mb(exp, std::move(idx));
    check_plan(policy, mb.batch());
    policy.forward(mb.batch(), temperature_, lp, entropy ? &ent : nullptr, /*for_backward=*/false);
    mb.gather_into(lp, logp);
    if (entropy) mb.gather_into(ent, *entropy);
  }
  policy.release_activations();
}

void PpoTrainer::compute_values(const Experience& exp, std::vector<float>& values) {
  const int64_t L = exp.L;
  values.assign(exp.B * L, 0.0f);
  std::vector<int64_t> all(exp.B);
  std::iota(all.begin(), all.end(), 0);
  std::vector<float> v;
  const ForwardBatching fb = forward_batching(cfg_, "critic.", comm_->world_size());
  for (auto& idx : micro_batches(exp, all, fb.dynamic, fb.max_tokens, fb.max_seqs)) {
    const PackedResponses mb(exp, std::move(idx));
    check_plan(*critic_->model, mb.batch());
    critic_->model->forward_values(mb.batch(), v);
    mb.gather_into(v, values);
  }
}

// ---- updates --------------------------------------------------------------------------------------

void PpoTrainer::update_actor(Experience& exp, metrics::Metrics& m) {
  const std::string a = "actor_rollout_ref.actor.";
  const int64_t L = exp.L;
  // verl scales it by rollout.n and divides it among the data-parallel ranks.
  const int64_t mini = cfg_.get<int64_t>(a + "ppo_mini_batch_size") * n_ / comm_->world_size();
  const int64_t epochs = cfg_.get<int64_t>(a + "ppo_epochs");
  const bool dynamic = cfg_.get<bool>(a + "use_dynamic_bsz");
  const int64_t max_tokens = cfg_.get<int64_t>(a + "ppo_max_token_len_per_gpu");
  const int64_t micro_seqs = update_micro_seqs(cfg_, a, comm_->world_size(), mini);
  const bool shuffle = cfg_.get<bool>(a + "shuffle");
  const int64_t num_mini = (exp.B + mini - 1) / mini;
  // Fully on-policy (one epoch over one mini-batch): the old policy is the current one, so the
  // update's own forward gives old_log_prob exactly.
  const bool on_policy = exp.old_log_prob.empty();
  VERL_CHECK(!on_policy || (epochs == 1 && num_mini == 1), "internal: old_log_prob was skipped off-policy");
  const float lr = static_cast<float>(actor_.base_lr * actor_.schedule.multiplier(global_step_));
  PolicyModel& actor = *actor_.model;
  std::vector<float> lp_tok, ent_tok;  // [T] of one micro-batch
  double pg_loss = 0, pg_clipfrac = 0, ppo_kl = 0, clip_lower = 0, ent = 0, kl_loss = 0, gnorm_sum = 0;
  // Mini-batches; updates applied (not kept for a later sync); of those, skipped (non-finite norm).
  int64_t updates = 0, applied = 0, skipped = 0;
  size_t pass_peak = 0, optimizer_peak = 0;  // tracked device memory at its most (core/device.h)
  std::vector<int64_t> order(exp.B);
  std::iota(order.begin(), order.end(), 0);
  // On policy, the update's own forward is old_log_prob: compare the rollout's with it there.
  ProbsDiff probs_diff;
  std::map<std::string, std::pair<double, int64_t>> bypass_metrics;  // rollout_corr/* per micro-batch
  for (int64_t ep = 0; ep < epochs; ++ep) {
    if (shuffle) {
      Rng rng(seed_ ^ 0xac7, static_cast<uint64_t>(global_step_ * 1000 + ep));
      for (int64_t i = exp.B - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
    }
    for (int64_t mb = 0; mb < num_mini; ++mb) {
      std::vector<int64_t> idx(order.begin() + mb * mini, order.begin() + std::min(exp.B, (mb + 1) * mini));
      // Global normalisers over the mini-batch: micro-batching then changes nothing but
      // float reassociation (the sum of the micro losses is the mini-batch loss).
      std::vector<float> mini_mask = rows(exp.mask, idx, L);
      const double mini_tokens = comm_->sum(std::accumulate(mini_mask.begin(), mini_mask.end(), 0.0));
      ActorLossConfig lc = actor_loss_;
      lc.policy.norm.dp_size = comm_->world_size();
      lc.policy.norm.batch_num_tokens = mini_tokens;
      lc.policy.norm.global_batch_size = comm_->sum(static_cast<double>(idx.size()));
      lc.policy.norm.loss_scale_factor = static_cast<double>(cfg_.get<int64_t>("data.max_response_length"));
      // Gradients accumulate over the micro-batches (on the policy's device) until the step.
      actor.zero_grad();
      // Every rank has as many micro-batches (equal shares; dynamic sizes agree on the count), so
      // the gradient buckets that the last one's backward reduces start in step on every rank.
      std::vector<std::vector<int64_t>> micros = micro_batches(exp, idx, dynamic, max_tokens, micro_seqs);
      for (size_t mi = 0; mi < micros.size(); ++mi) {
        const PackedResponses mb(exp, std::move(micros[mi]));
        const std::vector<int64_t>& micro = mb.rows();
        check_plan(actor, mb.batch());
        actor.forward(mb.batch(), temperature_, lp_tok, &ent_tok);
        const int64_t bm = static_cast<int64_t>(micro.size());
        std::vector<float> logp = mb.gather(lp_tok), entropy = mb.gather(ent_tok);
        std::vector<float> old = on_policy ? logp : rows(exp.old_log_prob, micro, L);
        if (on_policy) probs_diff.add(rows(exp.rollout_log_prob, micro, L), logp, rows(exp.mask, micro, L));
        std::vector<float> adv = rows(exp.advantages, micro, L), mask = rows(exp.mask, micro, L);
        std::vector<float> ref = rows(exp.ref_log_prob, micro, L);
        std::vector<float> is_weights = rows(exp.rollout_is_weights, micro, L);
        ActorLossConfig mlc = lc;
        if (rollout_corr_.bypass_mode) bypass_correction(rollout_corr_, {bm, L}, logp, old, mask, is_weights, mlc, bypass_metrics);
        ActorLossOutput out = compute_actor_loss({bm, L}, old, logp, adv, mask, entropy, ref, mlc, is_weights);
        const std::vector<float> d_lp = mb.scatter(out.d_log_prob), d_ent = mb.scatter(out.d_entropy);
        // Without an entropy bonus d_entropy is all zeros: pass null, which both models skip.
        actor.state().prepare_backward(mi + 1 == micros.size());
        actor.backward(d_lp.data(), lc.entropy_coeff == 0 || d_ent.empty() ? nullptr : d_ent.data());
        const double share = std::accumulate(mask.begin(), mask.end(), 0.0) / std::max(1.0, mini_tokens);
        pg_loss += out.pg_loss;
        // actor/entropy is the token-mean policy entropy, reported whatever entropy_coeff is.
        for (int64_t i = 0; i < bm * L; ++i) ent += entropy[i] * mask[i] / std::max(1.0, mini_tokens);
        kl_loss += out.kl_loss;
        pg_clipfrac += out.pg_clipfrac * share;
        ppo_kl += out.ppo_kl * share;
        clip_lower += out.pg_clipfrac_lower * share;
      }
      fault_point("train", global_step_ + 1);  // tests kill the process in the middle of a step
      pass_peak = std::max(pass_peak, take_tracked_device_peak());
      const double gnorm = actor.optimizer_step(lr, *comm_);  // all-reduces the gradients over comm_ first
      optimizer_peak = std::max(optimizer_peak, take_tracked_device_peak());
      // LightweightSync's interval: a step that only kept its gradients for the next sync has no norm.
      ++updates;
      if (!actor.state().step_deferred()) {
        gnorm_sum += gnorm;
        ++applied;
        if (!std::isfinite(gnorm)) ++skipped;
      }
    }
  }
  warn_skipped_updates("actor", skipped, applied);
  actor.release_activations();
  // The phase's memory: the micro-batches' peak (forward and backward) and the optimizer steps'
  // (an offloaded state's staging slots), apart.
  record_device_memory(m, "update_actor", pass_peak);
  record_device_memory(m, "optimizer", optimizer_peak);
  if (device_ == Device::Cuda) m.set("perf/host_pinned_gib", static_cast<double>(pinned_host_memory()) / (1 << 30));
  const double u = static_cast<double>(std::max<int64_t>(1, updates));
  // The losses carry verl's global normalisers times dp_size (so the ranks' mean gradient is the
  // global one): their mean over ranks is the global loss. The entropy and the fractions are
  // weighted by global token counts already: their sum over ranks is the global value.
  pg_loss = comm_->mean(pg_loss);
  kl_loss = comm_->mean(kl_loss);
  ent = comm_->sum(ent);
  pg_clipfrac = comm_->sum(pg_clipfrac);
  ppo_kl = comm_->sum(ppo_kl);
  clip_lower = comm_->sum(clip_lower);
  probs_diff.reduce(*comm_);
  probs_diff.report(m);
  // Bypass mode's rollout_corr/* metrics: the mean over micro-batches (verl's reduce_metrics), then
  // over ranks (every rank has the same keys).
  for (const auto& [k, v] : bypass_metrics) m.set(k, comm_->mean(v.first / static_cast<double>(v.second)));
  m.set("actor/pg_loss", pg_loss / u);
  m.set("actor/pg_clipfrac", pg_clipfrac / u);
  m.set("actor/ppo_kl", ppo_kl / u);
  m.set("actor/pg_clipfrac_lower", clip_lower / u);
  m.set("actor/entropy", ent / u);
  if (actor_loss_.use_kl_loss) {
    m.set("actor/kl_loss", kl_loss / u);
    m.set("actor/kl_coef", actor_loss_.kl_loss_coef);
  }
  if (applied > 0) m.set("actor/grad_norm", gnorm_sum / static_cast<double>(applied));
  m.set("actor/lr", lr);
}

void PpoTrainer::warn_skipped_updates(const char* role, int64_t skipped, int64_t applied) const {
  // Every rank saw the same norm; one line is enough.
  if (skipped == 0 || comm_->rank() != 0) return;
  log::warn("step {}: the {}'s gradient norm was not finite in {} of its {} optimizer steps; those updates "
            "were skipped, as verl does (the weights did not change). Check the rewards (critic/score/*) and "
            "the learning rate", global_step_ + 1, role, skipped, applied);
}

std::pair<size_t, size_t> PpoTrainer::host_state_bytes() const {
  size_t state = 0, gather = 0;
  for (PolicyModel* p : {actor_.model.get(), ref_.get(), critic_ ? critic_->model.get() : nullptr}) {
    if (!p) continue;
    state += p->state().host_bytes();
    gather += p->state().take_peak_gather_bytes();
  }
  return {state, gather};
}

void PpoTrainer::record_device_memory(metrics::Metrics& m, const char* phase, size_t tracked_peak) const {
  const bool gen = std::string_view(phase) == "gen";
  if (device_ != Device::Cuda) {
    const auto [state, gather] = gen ? gen_state_bytes_ : host_state_bytes();
    m.set(std::string("perf/host_state_gib/") + phase, static_cast<double>(state + gather) / (1 << 30));
    if (gather > 0) m.set(std::string("perf/host_gather_gib/") + phase, static_cast<double>(gather) / (1 << 30));
    return;
  }
  constexpr double kGiB = 1 << 30;
  const size_t in_use = device_memory_in_use();
  m.set(std::string("perf/device_memory_gib/") + phase, static_cast<double>(gen ? gen_device_bytes_ : in_use) / kGiB);
  if (gen) m.set("perf/device_memory_gib/after_gen_free", static_cast<double>(in_use) / kGiB);
  // The phase's peak: the most our allocators held since the phase began, plus what they do not
  // count (the CUDA context, cuBLASLt's and NCCL's own memory: in use minus tracked, taken as
  // constant through the phase), and never below what was seen in use.
  const size_t untracked = in_use - std::min(in_use, tracked_device_memory());
  size_t peak = untracked + std::max(tracked_peak, take_tracked_device_peak());
  if (gen) peak = std::max(peak, gen_device_bytes_);  // the decode graphs' pools are untracked
  m.set(std::string("perf/device_memory_peak_gib/") + phase, static_cast<double>(std::max(peak, in_use)) / kGiB);
}

bool PpoTrainer::needs_old_log_prob(int64_t rows, int64_t staleness) const {
  if (rollout_corr_.bypass_mode) return false;  // the rollout's log-probs serve as the old ones
  const std::string a = "actor_rollout_ref.actor.";
  const int64_t mini = cfg_.get<int64_t>(a + "ppo_mini_batch_size") * n_ / comm_->world_size();
  // A rollout from older weights (one-step-off) is never on-policy.
  const bool on_policy = staleness == 0 && cfg_.get<int64_t>(a + "ppo_epochs") == 1 && mini >= rows;
  return !on_policy || kl_ctrl_.has_value() || rollout_corr_.corrects();
}

PpoTrainer::TokenPipeline PpoTrainer::pipeline_plan(int64_t rows) const {
  TokenPipeline p;
  if (!token_pipeline_) return p;
  // The actor's pass shares its stream with the GPU rollout (which captures graphs on it), and a
  // ZeRO-3 model gathers its weights with collectives: those passes run after generation.
  p.old_log_prob = needs_old_log_prob(rows, /*staleness=*/0) && device_ == Device::Cpu &&
                   actor_.model->state().weight_source() == nullptr;
  p.ref = ref_ != nullptr;
  p.values = critic_.has_value() && critic_->model->state().weight_source() == nullptr;
  // One micro-batch fits every pass: the smallest of their token budgets and sequence counts.
  const auto take = [&](bool on, const std::string& prefix, const PolicyModel& model) {
    if (!on) return;
    const ForwardBatching fb = forward_batching(cfg_, prefix, comm_->world_size());
    const auto tighten = [](int64_t& x, int64_t v) {
      if (v > 0) x = x > 0 ? std::min(x, v) : v;
    };
    tighten(p.max_tokens, fb.dynamic ? fb.max_tokens : 0);
    tighten(p.max_seqs, fb.dynamic ? 0 : fb.max_seqs);
    tighten(p.max_tokens, model.max_tokens());  // the CUDA model's plan (0 on the CPU)
    tighten(p.max_seqs, model.max_seqs());
  };
  take(p.old_log_prob, "actor_rollout_ref.rollout.", *actor_.model);
  take(p.ref, "actor_rollout_ref.ref.", p.ref ? *ref_ : *actor_.model);
  take(p.values, "critic.", p.values ? *critic_->model : *actor_.model);
  return p;
}

void PpoTrainer::run_updates(Experience& exp, metrics::Metrics& m, metrics::StageTimer& timer) {
  // verl counts steps from 1 here: the actor updates once critic_warmup <= the step number.
  const bool actor = global_step_ + 1 >= cfg_.get<int64_t>("trainer.critic_warmup");
  const auto critic_update = [&](metrics::Metrics& into) {
    auto s = timer.scope("update_critic");
    (void)take_tracked_device_peak();
    update_critic(exp, into);
    record_device_memory(into, "update_critic");
  };
  const auto actor_update = [&] {
    auto s = timer.scope("update_actor");
    comm_->set_stage("update_actor");
    (void)take_tracked_device_peak();
    data::DynamicBatchStats before;
    if (dyn_batch_) before = dyn_batch_->take_stats();  // the forward passes' and the critic's packings
    update_actor(exp, m);  // records update_actor's and the optimizer's memory
    if (dyn_batch_) add_dynamic_batch_metrics(before, dyn_batch_->take_stats(), *comm_, dyn_batch_->budget(), m);
  };
  if (critic_ && actor && critic_actor_overlap_) {
    // The two updates read the step's experience and write nothing of it; each has its own model,
    // state and (on the GPU) stream. Their memory peaks share one counter, so each phase's peak
    // is the two together.
    metrics::Metrics cm;
    std::exception_ptr critic_error;
    std::thread t([&] {
      try {
        critic_update(cm);
      } catch (...) {
        critic_error = std::current_exception();
      }
    });
    try {
      actor_update();
    } catch (...) {
      t.join();
      throw;
    }
    t.join();
    if (critic_error) std::rethrow_exception(critic_error);
    for (const auto& [k, v] : cm) m.set(k, v);
    return;
  }
  if (critic_) {
    comm_->set_stage("update_critic");
    critic_update(m);
  }
  if (actor) actor_update();
}

void PpoTrainer::update_critic(Experience& exp, metrics::Metrics& m) {
  const int64_t L = exp.L;
  const int64_t mini = cfg_.get<int64_t>("critic.ppo_mini_batch_size") * n_ / comm_->world_size();
  const int64_t epochs = cfg_.get<int64_t>("critic.ppo_epochs");
  const bool dynamic = cfg_.get<bool>("critic.use_dynamic_bsz");
  const int64_t max_tokens = cfg_.get<int64_t>("critic.ppo_max_token_len_per_gpu");
  const int64_t micro_seqs = update_micro_seqs(cfg_, "critic.", comm_->world_size(), mini);
  const double clip = cfg_.get<double>("critic.cliprange_value");
  const LossAggMode mode = parse_loss_agg_mode(cfg_.get<std::string>("critic.loss_agg_mode"));
  const float lr = static_cast<float>(critic_->base_lr * critic_->schedule.multiplier(global_step_));
  const int64_t num_mini = (exp.B + mini - 1) / mini;
  std::vector<float> values_tok;
  double vf_loss = 0, vf_clipfrac = 0, gnorm_sum = 0;
  int64_t updates = 0, applied = 0, skipped = 0;
  for (int64_t ep = 0; ep < epochs; ++ep) {
    for (int64_t mb = 0; mb < num_mini; ++mb) {
      std::vector<int64_t> idx;
      for (int64_t b = mb * mini; b < std::min(exp.B, (mb + 1) * mini); ++b) idx.push_back(b);
      std::vector<float> mini_mask = rows(exp.mask, idx, L);
      AggNorm norm;
      norm.dp_size = comm_->world_size();
      norm.batch_num_tokens = comm_->sum(std::accumulate(mini_mask.begin(), mini_mask.end(), 0.0));
      norm.global_batch_size = comm_->sum(static_cast<double>(idx.size()));
      norm.loss_scale_factor = static_cast<double>(cfg_.get<int64_t>("data.max_response_length"));
      critic_->model->zero_grad();
      std::vector<std::vector<int64_t>> micros = micro_batches(exp, idx, dynamic, max_tokens, micro_seqs);
      for (size_t mi = 0; mi < micros.size(); ++mi) {
        const PackedResponses mb(exp, std::move(micros[mi]));
        const std::vector<int64_t>& micro = mb.rows();
        check_plan(*critic_->model, mb.batch());
        critic_->model->forward_values(mb.batch(), values_tok);
        const int64_t bm = static_cast<int64_t>(micro.size());
        std::vector<float> vpreds = mb.gather(values_tok);
        std::vector<float> mask = rows(exp.mask, micro, L);
        ValueLossOutput out = compute_value_loss({bm, L}, vpreds, rows(exp.returns, micro, L), rows(exp.values, micro, L),
                                                 mask, clip, mode, norm);
        const std::vector<float> d_v = mb.scatter(out.d_vpreds);
        critic_->model->state().prepare_backward(mi + 1 == micros.size());
        critic_->model->backward_values(d_v.data());
        vf_loss += out.vf_loss;
        vf_clipfrac += out.vf_clipfrac * std::accumulate(mask.begin(), mask.end(), 0.0) /
                       std::max(1.0, *norm.batch_num_tokens);
      }
      const double gnorm = critic_->model->optimizer_step(lr, *comm_);
      ++updates;
      if (!critic_->model->state().step_deferred()) {
        gnorm_sum += gnorm;
        ++applied;
        if (!std::isfinite(gnorm)) ++skipped;
      }
    }
  }
  warn_skipped_updates("critic", skipped, applied);
  const double u = static_cast<double>(std::max<int64_t>(1, updates));
  vf_loss = comm_->mean(vf_loss);  // as the actor's losses: dp_size x the global normaliser
  vf_clipfrac = comm_->sum(vf_clipfrac);
  m.set("critic/vf_loss", vf_loss / u);
  m.set("critic/vf_clipfrac", vf_clipfrac / u);
  if (applied > 0) m.set("critic/grad_norm", gnorm_sum / static_cast<double>(applied));
  m.set("critic/lr", lr);
}

// ---- metrics --------------------------------------------------------------------------------------

// verl's compute_data_metrics over every rank's samples: the statistics of the concatenation of
// the ranks' values (one rank: exactly Metrics::add_stats / add_length_stats).
void PpoTrainer::add_global_stats(metrics::Metrics& m, std::string_view prefix, const std::vector<double>& x) const {
  if (comm_->world_size() == 1) {
    m.add_stats(prefix, x);
    return;
  }
  double sums[2] = {0, static_cast<double>(x.size())};
  double hi[1] = {-std::numeric_limits<double>::infinity()}, lo[1] = {std::numeric_limits<double>::infinity()};
  for (double v : x) {
    sums[0] += v;
    hi[0] = std::max(hi[0], v);
    lo[0] = std::min(lo[0], v);
  }
  comm_->all_reduce(std::span<double>(sums), dist::ReduceOp::Sum);
  comm_->all_reduce(std::span<double>(hi), dist::ReduceOp::Max);
  comm_->all_reduce(std::span<double>(lo), dist::ReduceOp::Min);
  if (sums[1] == 0) return;  // nothing to reduce anywhere: no statistic, as add_stats
  m.set(std::string(prefix) + "/mean", sums[0] / sums[1]);
  m.set(std::string(prefix) + "/max", hi[0]);
  m.set(std::string(prefix) + "/min", lo[0]);
}

void PpoTrainer::add_global_length_stats(metrics::Metrics& m, std::string_view prefix, const std::vector<int64_t>& len,
                                         int64_t max_length) const {
  if (comm_->world_size() == 1) {
    m.add_length_stats(prefix, len, max_length);
    return;
  }
  std::vector<double> x(len.begin(), len.end());
  add_global_stats(m, prefix, x);
  double clipped[2] = {0, static_cast<double>(len.size())};
  for (int64_t l : len) clipped[0] += l >= max_length ? 1.0 : 0.0;
  comm_->all_reduce(std::span<double>(clipped), dist::ReduceOp::Sum);
  if (clipped[1] > 0) m.set(std::string(prefix) + "/clip_ratio", clipped[0] / clipped[1]);
}

void PpoTrainer::add_data_metrics(const Experience& exp, metrics::Metrics& m) const {
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
  add_global_stats(m, "critic/score", seq_score);
  add_global_stats(m, "critic/rewards", seq_reward);
  add_global_stats(m, "critic/advantages", adv);
  add_global_stats(m, "critic/returns", ret);
  if (!val.empty()) {
    add_global_stats(m, "critic/values", val);
    // vf_explained_var = 1 - var(returns - values) / var(returns), over valid tokens (of every rank).
    std::vector<double> diff(ret.size());
    for (size_t i = 0; i < ret.size(); ++i) diff[i] = ret[i] - val[i];
    if (comm_->world_size() == 1) {
      auto var = [](const std::vector<double>& x) {
        double mean = std::accumulate(x.begin(), x.end(), 0.0) / x.size(), v = 0;
        for (double e : x) v += (e - mean) * (e - mean);
        return v / x.size();
      };
      m.set("critic/vf_explained_var", 1.0 - var(diff) / (var(ret) + 1e-5));
    } else {
      double s[5] = {static_cast<double>(ret.size()), 0, 0, 0, 0};  // n, sum and sum of squares of ret, diff
      for (size_t i = 0; i < ret.size(); ++i) {
        s[1] += ret[i];
        s[2] += ret[i] * ret[i];
        s[3] += diff[i];
        s[4] += diff[i] * diff[i];
      }
      comm_->all_reduce(std::span<double>(s), dist::ReduceOp::Sum);
      const double var_ret = s[2] / s[0] - (s[1] / s[0]) * (s[1] / s[0]);
      const double var_diff = s[4] / s[0] - (s[3] / s[0]) * (s[3] / s[0]);
      m.set("critic/vf_explained_var", 1.0 - var_diff / (var_ret + 1e-5));
    }
  }
  add_global_length_stats(m, "response_length", resp_len,
                          cfg_.get<int64_t>("actor_rollout_ref.rollout.response_length"));
  add_global_length_stats(m, "prompt_length", prompt_len, cfg_.get<int64_t>("data.max_prompt_length"));
}

void PpoTrainer::drop_by_length(Experience& exp, metrics::Metrics& m) const {
  int64_t dropped = 0;
  for (int64_t b = 0; b < exp.B; ++b) {
    if (dyn_batch_->keeps(exp.tokens(b))) continue;
    std::fill_n(exp.mask.begin() + b * exp.L, exp.L, 0.0f);
    ++dropped;
  }
  m.set("dynamic_batch/dropped_samples", static_cast<double>(comm_->sum(dropped)));
}

std::pair<std::vector<data::Sample>, int64_t> PpoTrainer::rank_share(const std::vector<data::Sample>& all) const {
  const int64_t world = comm_->world_size(), n = static_cast<int64_t>(all.size());
  if (world == 1) return {all, 0};
  VERL_CHECK(n % world == 0, "a batch of {} prompts does not split evenly over {} data-parallel ranks", n, world);
  const int64_t per = n / world, first = comm_->rank() * per;
  return {std::vector<data::Sample>(all.begin() + first, all.begin() + first + per), first};
}

// ---- the step ---------------------------------------------------------------------------------------

metrics::Metrics PpoTrainer::train_step(const data::Batch& batch) {
  metrics::StageTimer timer;
  metrics::Metrics m;
  Experience exp;
  auto step_scope = timer.scope("step");
  // This rank's share of the prompts (a prompt's n samples stay on one rank); sampling seeds come
  // from the global prompt index, so the step's samples do not depend on the world size.
  const auto [local, first] = rank_share(batch.samples);
  comm_->set_stage("gen");
  (void)take_tracked_device_peak();  // each phase's device peak counts from its start
  TokenPipeline pipe = pipeline_plan(static_cast<int64_t>(local.size()) * n_);
  // trainer.one_step_off_policy: the rollout the last step started from its weights (kept alive:
  // the experience's samples point into it), else this step's own.
  double gen_wait = 0;
  std::unique_ptr<Prefetch> ready = one_step_off_ ? take_prefetch(batch, gen_wait) : nullptr;
  const int64_t staleness = ready ? global_step_ - ready->weights_step : 0;
  if (ready) {
    exp = std::move(ready->exp);
    pipe = TokenPipeline{};  // the passes need this step's weights: they run below
  } else {
    generate(local, first, exp, timer, {.pipe = &pipe});
  }
  record_device_memory(m, "gen");
  if (one_step_off_) {
    m.set("rollout/staleness", static_cast<double>(staleness));
    m.set("rollout/weights_step", static_cast<double>(global_step_ - staleness));
    if (global_step_ + 1 < total_steps_) start_prefetch();  // the next step's rollout, beside this step
  }
  // The token pipeline's per-row results as [B, L] matrices (zero past each response).
  const auto pipelined = [&](const std::vector<std::vector<float>>& rows) {
    std::vector<float> out(static_cast<size_t>(exp.B * exp.L), 0.0f);
    for (int64_t b = 0; b < exp.B; ++b) std::copy(rows[b].begin(), rows[b].end(), out.begin() + b * exp.L);
    return out;
  };
  const bool filtering = cfg_.get<bool>("algorithm.filter_groups.enable");
  if (filtering && !filter_groups(batch, exp, timer, m)) return m;  // out of data: fit() stops
  const std::vector<data::Sample>& step_samples = filtering ? kept_samples_ : batch.samples;
  if (auto dir = cfg_.get<std::optional<std::string>>("trainer.rollout_data_dir"))
    dump_generations(*dir, "trainer.rollout_data_dir", global_step_ + 1, generation_rows(*tok_, exp), *comm_);
  // Sampled ids past the tokenizer (a padded embedding's extra rows) have no text; counted here.
  int64_t out_of_vocab = 0;
  for (const auto& r : exp.response)
    for (int32_t id : r) out_of_vocab += id >= tok_->vocab_size() ? 1 : 0;
  m.set("rollout/out_of_vocab_tokens", static_cast<double>(comm_->sum(out_of_vocab)));
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
  // verl's _balance_batch: the ranks swap rows so each holds a similar workload for the passes
  // and updates that follow (one rank has nothing to balance).
  double exchange_bytes = 0;
  if (comm_->world_size() > 1 && cfg_.get<bool>("trainer.balance_batch")) {
    auto s = timer.scope("balance");
    comm_->set_stage("balance_batch");
    BalanceResult br = balance_across_ranks(exp, step_samples, *comm_);
    for (const auto& [k, v] : br.metrics) m.set(k, v);
    exchange_bytes += static_cast<double>(br.bytes_sent);
  }
  // data.dynamic_batch's length bounds, before every pass: no loss, KL term or rollout correction
  // sees a dropped sample's tokens, while its score stays in its group's baseline.
  if (dyn_batch_) drop_by_length(exp, m);

  const bool use_kl_in_reward = kl_ctrl_.has_value();
  if (rollout_corr_.bypass_mode) {
    // verl's apply_bypass_mode: the rollout's log-probs are the old policy's (no recomputation).
    exp.old_log_prob = exp.rollout_log_prob;
  } else if (needs_old_log_prob(exp.B, staleness)) {
    auto s = timer.scope("old_log_prob");
    comm_->set_stage("old_log_prob");
    (void)take_tracked_device_peak();
    if (pipe.old_log_prob) {
      exp.old_log_prob = pipelined(pipe.old_rows);
    } else {
      compute_log_probs(*actor_.model, exp, exp.old_log_prob, nullptr);
    }
    record_device_memory(m, "old_log_prob");
    ProbsDiff diff;
    diff.add(exp.rollout_log_prob, exp.old_log_prob, exp.mask);
    diff.reduce(*comm_);
    diff.report(m);
    apply_rollout_correction(exp, m);
  }
  if (ref_) {
    auto s = timer.scope("ref");
    comm_->set_stage("ref");
    (void)take_tracked_device_peak();
    if (pipe.ref) {
      exp.ref_log_prob = pipelined(pipe.ref_rows);
    } else {
      ref_->wake();
      compute_log_probs(*ref_, exp, exp.ref_log_prob, nullptr);
      record_device_memory(m, "ref");
      ref_->sleep();
    }
  }
  if (critic_) {
    auto s = timer.scope("values");
    comm_->set_stage("values");
    (void)take_tracked_device_peak();
    if (pipe.values) {
      exp.values = pipelined(pipe.value_rows);
    } else {
      compute_values(exp, exp.values);
      record_device_memory(m, "values");
    }
  }
  {
    auto s = timer.scope("adv");
    comm_->set_stage("adv");
    // The advantages are computed over the global batch, as verl's driver does: GAE's and
    // REINFORCE++'s whitening and the adaptive KL controller take batch-wide statistics. With
    // several ranks each gathers the per-token [B, L] rows it needs (rewards, log-probs, values,
    // masks: no hidden-size or vocabulary-size tensor) and keeps its own rows of the result.
    GlobalRows g(*comm_, exp);
    const std::vector<float> scores = g.gather(exp.token_level_scores), mask = g.gather(exp.mask);
    std::vector<float> rewards = scores;
    if (use_kl_in_reward) {
      KlInRewardOutput k = apply_kl_penalty(g.shape(), scores, g.gather(exp.old_log_prob), g.gather(exp.ref_log_prob),
                                            mask, *kl_ctrl_,
                                            parse_kl_type(cfg_.get<std::string>("algorithm.kl_penalty")));
      rewards = std::move(k.token_level_rewards);
      m.set("actor/reward_kl_penalty", k.current_kl);
      m.set("actor/reward_kl_penalty_coeff", k.beta);
    }
    const std::vector<float> values = g.gather(exp.values);
    const std::vector<int64_t> index = g.gather_index(exp.group);
    AdvantageInputs in;
    in.shape = g.shape();
    in.token_level_rewards = rewards;
    in.response_mask = mask;
    in.values = values;
    in.index = index;
    in.gamma = cfg_.get<double>("algorithm.gamma");
    in.lam = cfg_.get<double>("algorithm.lam");
    in.norm_adv_by_std_in_grpo = cfg_.get<bool>("algorithm.norm_adv_by_std_in_grpo");
    std::vector<float> baselines;
    if (estimator_ == AdvantageEstimator::ReMax) {
      // ReMax's baseline: the reward of each prompt's greedy response (verl generates it with
      // do_sample=False in the gen stage). Each rank generates its own prompts' (one sample a
      // prompt, in prompt order); a row may sit on another rank after balance_batch, so the
      // per-prompt scores are gathered first.
      Experience greedy;
      generate(local, first, greedy, timer, {.greedy = true});
      const std::vector<float> greedy_scores = g.gather_per_row(greedy.scores);
      for (int64_t b = 0; b < exp.B; ++b) baselines.push_back(greedy_scores[exp.group[b]]);
      baselines = g.gather_per_row(baselines);
      in.reward_baselines = baselines;
    }
    AdvantageOutput a = compute_advantage(estimator_, in);
    exp.token_level_rewards = g.mine(rewards);
    exp.advantages = g.mine(a.advantages);
    exp.returns = g.mine(a.returns);
    exchange_bytes += static_cast<double>(g.bytes_sent());
    m.set("perf/exchange_bytes", exchange_bytes);
  }
  run_updates(exp, m, timer);
  step_scope.stop();
  ++global_step_;
  if (comm_->distributed()) {
    // This rank's gradient sync in the step's updates (optim/grad_sync.h): bytes it sent and the
    // seconds backward did not hide.
    optim::SyncStats sync = actor_.model->state().take_sync_stats();
    if (critic_) {
      sync.add(critic_->model->state().take_sync_stats());
    }
    m.set("perf/grad_sync_bytes", sync.bytes);
    // ZeRO-3: the weight gathers of the step's passes (bytes this rank sent, seconds it waited).
    optim::GatherStats gather = actor_.model->state().take_gather_stats();
    if (critic_) {
      const optim::GatherStats c = critic_->model->state().take_gather_stats();
      gather.bytes += c.bytes;
      gather.seconds += c.seconds;
      gather.gathers += c.gathers;
    }
    if (gather.gathers > 0) {
      m.set("perf/zero3_gather_bytes", gather.bytes);
      m.set("timing_s/zero3_gather", gather.seconds);
    }
    m.set("perf/grad_sync_bytes_dense", sync.dense_bytes);
    m.set("timing_s/grad_sync", sync.seconds);
  }

  add_data_metrics(exp, m);
  add_reward_extra_metrics(exp, m);
  for (const char* stage : {"gen", "gen_setup", "reshard", "reward", "balance", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "step"}) {
    const double s = timer.seconds(stage);
    if (s > 0 || std::string(stage) == "gen" || std::string(stage) == "step") m.set(std::string("timing_s/") + stage, s);
  }
  m.set("timing_s/reward_overlap_gen", timer.overlap("gen", "reward"));
  if (ready) {  // the rollout ran during the last step: its own times, and how long this one waited
    m.set("timing_s/gen", ready->timer.seconds("gen"));
    m.set("timing_s/gen_setup", ready->timer.seconds("gen_setup"));
    m.set("timing_s/reward", ready->timer.seconds("reward"));
    m.set("timing_s/reward_overlap_gen", ready->timer.overlap("gen", "reward"));
    m.set("timing_s/gen_wait", gen_wait);
  }
  for (const char* stage : {"old_log_prob", "ref", "values"})  // the token pipeline's share of each pass
    if (token_pipeline_) m.set(std::string("timing_s/") + stage + "_overlap_gen", timer.overlap("gen", stage));
  if (critic_actor_overlap_ && critic_) m.set("timing_s/update_critic_overlap_actor", timer.overlap("update_actor", "update_critic"));
  int64_t total_tokens = 0;
  for (int64_t b = 0; b < exp.B; ++b) total_tokens += exp.tokens(b);
  // verl's perf/throughput: tokens of the global batch / (step time x world size).
  metrics::add_throughput(m, comm_->sum(total_tokens), timer.seconds("step"), comm_->world_size());
  m.set("training/global_step", static_cast<double>(global_step_));
  m.set("training/epoch", static_cast<double>(batch.epoch));
  // Memory (the seed's per-phase figures start here) and, where NVML sees a GPU, its utilisation.
  metrics::add_cpu_memory_metrics(m);
  if (gpu_monitor_ && gpu_monitor_->available()) metrics::add_gpu_metrics(m, gpu_monitor_->snapshot());
  return m;
}

std::optional<data::Batch> PpoTrainer::next_batch() {
  if (prefetch_ && !prefetch_->handed_out) {
    prefetch_->handed_out = true;
    return prefetch_->batch;
  }
  return train_loader_->next();
}

// ---- one-step-off policy ----------------------------------------------------------------------------


void PpoTrainer::start_prefetch() {
  auto p = std::make_unique<Prefetch>();
  p->loader_state = train_loader_->state();
  std::optional<data::Batch> next = train_loader_->next();
  if (!next) return;
  p->batch = std::move(*next);
  auto [local, first] = rank_share(p->batch.samples);
  p->local = std::move(local);
  p->first = first;
  // A copy: this step's update changes the actor's weights in place while the rollout reads these
  // (on the GPU a device copy with a stream of its own, so generation and the update share the
  // device; on the CPU a host copy).
  p->snapshot = actor_.model->rollout_snapshot();
  if (!p->snapshot) p->weights = actor_.model->weights();
  p->weights_step = global_step_;
  const int64_t step = global_step_ + 2;  // the step these samples are for
  Prefetch* raw = p.get();
  raw->timer.reset();
  raw->thread = std::thread([this, raw, step] {
    try {
      generate(raw->local, raw->first, raw->exp, raw->timer,
               {.weights = raw->snapshot ? nullptr : &raw->weights, .snapshot = raw->snapshot.get(), .step = step});
    } catch (...) {
      raw->error = std::current_exception();
    }
  });
  prefetch_ = std::move(p);
}

std::unique_ptr<PpoTrainer::Prefetch> PpoTrainer::take_prefetch(const data::Batch& batch, double& waited_s) {
  std::unique_ptr<Prefetch> p = std::move(prefetch_);
  if (!p) return nullptr;
  Timer t;
  if (p->thread.joinable()) p->thread.join();
  waited_s = t.seconds();
  if (p->error) std::rethrow_exception(p->error);
  // A caller that fed another batch (not the one next_batch() handed out) gets a fresh rollout.
  const bool same = p->handed_out && p->batch.samples.size() == batch.samples.size() &&
                    std::equal(p->batch.samples.begin(), p->batch.samples.end(), batch.samples.begin(),
                               [](const data::Sample& a, const data::Sample& b) { return a.prompt_ids == b.prompt_ids; });
  return same ? std::move(p) : nullptr;
}

metrics::Metrics PpoTrainer::validate() {
  metrics::Metrics m;
  if (!val_set_) return m;
  Timer t;
  data::DataLoader loader(*val_set_, data::LoaderOptions::val_from_config(cfg_, val_set_->size()));
  std::map<std::string, std::pair<double, int64_t>> per_source;
  const int64_t n = cfg_.get<int64_t>("actor_rollout_ref.rollout.val_kwargs.n");
  const auto dump_dir = cfg_.get<std::optional<std::string>>("trainer.validation_data_dir");
  const int64_t to_log = cfg_.get<int64_t>("trainer.log_val_generations");
  std::vector<GenerationRow> generations;  // this rank's, for the dump and the log
  comm_->set_stage("testing");
  while (auto batch = loader.next()) {
    metrics::StageTimer timer;
    Experience exp;
    // Every rank sees the whole batch and generates its share; the sums per data source are then
    // reduced over the sources of the whole batch, which every rank knows.
    for (const data::Sample& s : batch->samples) per_source.try_emplace(s.data_source, 0.0, 0);
    const int64_t world = comm_->world_size(), n = static_cast<int64_t>(batch->samples.size());
    const int64_t begin = n * comm_->rank() / world, end = n * (comm_->rank() + 1) / world;
    const std::vector<data::Sample> local(batch->samples.begin() + begin, batch->samples.begin() + end);
    generate(local, begin, exp, timer, {.validation = true});
    if (dump_dir || to_log > 0) {
      std::vector<GenerationRow> g = generation_rows(*tok_, exp);
      generations.insert(generations.end(), std::make_move_iterator(g.begin()), std::make_move_iterator(g.end()));
    }
    for (int64_t b = 0; b < exp.B; ++b) {
      auto& acc = per_source[exp.sample[b]->data_source];
      acc.first += exp.scores[b];
      acc.second += 1;
    }
  }
  if (comm_->world_size() > 1) {
    std::vector<double> sums;
    for (const auto& [src, acc] : per_source) {
      sums.push_back(acc.first);
      sums.push_back(static_cast<double>(acc.second));
    }
    comm_->all_reduce(std::span<double>(sums), dist::ReduceOp::Sum);
    size_t i = 0;
    for (auto& [src, acc] : per_source) {
      acc.first = sums[i++];
      acc.second = static_cast<int64_t>(sums[i++]);
    }
  }
  for (const auto& [src, acc] : per_source) {
    m.set(fmt::format("val-core/{}/reward/mean@{}", src, n), acc.first / std::max<int64_t>(1, acc.second));
  }
  if (dump_dir) dump_generations(*dump_dir, "trainer.validation_data_dir", global_step_, generations, *comm_);
  if (comm_->rank() == 0) log_val_generations(std::move(generations), to_log, global_step_);
  m.set("timing_s/testing", t.seconds());
  return m;
}

void PpoTrainer::resume() {
  const std::string dir = resume_checkpoint_dir(cfg_.get<std::string>("trainer.resume_mode"),
                                                cfg_.get<std::string>("trainer.default_local_dir"),
                                                cfg_.get<std::optional<std::string>>("trainer.resume_from_path"),
                                                /*warn=*/comm_->rank() == 0);
  if (dir.empty()) return;
  // The checkpoint's files do not depend on the device: load on the host, then hand the actor's
  // weights and AdamW state to its model (on cuda: uploaded).
  const model::Weights& current = actor_.model->weights();
  model::Weights actor_weights{current.config, current.layout, {}};
  AdamWState actor_opt;
  std::optional<model::Weights> critic_weights;
  AdamWState critic_opt;
  if (critic_) {
    const model::Weights& cw = critic_->model->weights();
    critic_weights = model::Weights{cw.config, cw.layout, {}};
  }
  // A sharded state loads only its slice of the moments, from whichever files the checkpoint has
  // (whole, or shards of any world size).
  auto slice = [](PolicyModel& p) -> std::optional<optim::ShardSpec> {
    if (p.state().whole()) return std::nullopt;
    return p.state().shard();
  };
  const std::optional<optim::ShardSpec> actor_shard = slice(*actor_.model);
  const std::optional<optim::ShardSpec> critic_shard = critic_ ? slice(*critic_->model) : std::nullopt;
  // checkpoint.load_contents: without optimizer, the moments start fresh.
  const CheckpointContents critic_load = critic_ ? critic_load_ : CheckpointContents{};
  nlohmann::json st = load_checkpoint(dir, actor_weights, actor_opt, critic_ ? &*critic_weights : nullptr,
                                      critic_ ? &critic_opt : nullptr, actor_shard ? &*actor_shard : nullptr,
                                      critic_shard ? &*critic_shard : nullptr, actor_load_, critic_load);
  if (comm_->rank() == 0)
    for (const auto& [load, section] : {std::pair{actor_load_, "actor_rollout_ref.actor"}, std::pair{critic_load, "critic"}})
      if (!load.optimizer)
        log::warn("{}: {}.checkpoint.load_contents leaves out the optimizer: AdamW's moments start fresh", dir, section);
  actor_.model->restore(std::move(actor_weights.data), std::move(actor_opt));
  if (critic_) critic_->model->restore(std::move(critic_weights->data), std::move(critic_opt));
  // LightweightSync: each rank's carry (the gradient it still owes) and the interval's phase.
  auto restore_carry = [&](PolicyModel& p, const char* part) {
    optim::TrainState& st = p.state();
    if (!st.lightweight() || !st.lightweight()->needs_carry()) return;
    const std::string from = (std::filesystem::path(dir) / part).string();
    std::optional<SyncCarry> c = load_sync_carry(from, st.numel(), comm_->world_size(), comm_->rank());
    if (!c) {
      if (comm_->rank() == 0)
        log::warn("{}: no LightweightSync carry (saved without gradient_sync_method=lightweight): starting from an "
                  "empty one", from);
      st.upload_carry({}, 0);
      return;
    }
    st.upload_carry(c->carry, c->sync_calls);
  };
  restore_carry(*actor_.model, "actor");
  if (critic_) restore_carry(*critic_->model, "critic");
  global_step_ = st.at("global_step").get<int64_t>();
  train_loader_->load_state(st.at("dataloader"));
  if (kl_ctrl_ && st.contains("kl_coef")) {
    kl_ctrl_ = kl_ctrl_->is_adaptive()
                   ? KlController::adaptive(st["kl_coef"].get<double>(), cfg_.get<double>("algorithm.kl_ctrl.target_kl"),
                                            cfg_.get<double>("algorithm.kl_ctrl.horizon"))
                   : KlController::fixed(st["kl_coef"].get<double>());
  }
  log::info("resumed from {} at step {}", dir, global_step_);
}

std::string PpoTrainer::save() {
  // Every rank calls this. A ZeRO-sharded optimizer state is written by every rank, its own slice,
  // in parallel; otherwise rank 0 holds everything and writes alone (checkpoint.h).
  comm_->set_stage("save");
  const bool lead = comm_->rank() == 0;
  struct Part {
    AdamWState opt;
    std::vector<float> carry;
    ModelState ms;
  };
  // ZeRO-3: rank 0 writes the whole weights, gathered from the shards for the save.
  std::optional<FullWeights> actor_full, critic_full;
  actor_full.emplace(*actor_.model, reshard_bucket_);
  if (critic_) critic_full.emplace(*critic_->model, reshard_bucket_);
  // checkpoint.save_contents: the optimizer state is written unless the list leaves it out.
  auto part = [&](PolicyModel& p, const CheckpointContents& contents) {
    Part out;
    optim::TrainState& st = p.state();
    out.carry = st.download_carry();  // LightweightSync: every rank's own (checkpoint.h)
    out.ms.sync_calls = st.sync_calls();
    out.ms.optimizer = contents.optimizer;
    if (!st.whole()) {
      if (out.ms.optimizer) out.opt = st.download_optimizer_shard();
      out.ms.shard = st.shard();
      out.ms.shard_numel = st.numel();
    } else if (lead && out.ms.optimizer) {
      out.opt = p.optimizer_state();  // host copies: on cuda downloaded here
    }
    if (lead) out.ms.weights = &p.weights();  // on cuda downloaded if stale
    return out;
  };
  Part actor = part(*actor_.model, actor_save_);
  actor.ms.opt = &actor.opt;
  if (!actor.carry.empty()) actor.ms.carry = &actor.carry;
  std::optional<Part> critic_part;
  std::optional<ModelState> critic;
  if (critic_) {
    critic_part = part(*critic_->model, critic_save_);
    critic_part->ms.opt = &critic_part->opt;
    if (!critic_part->carry.empty()) critic_part->ms.carry = &critic_part->carry;
    critic = critic_part->ms;
  }
  // A rollout started for the next step is not saved: the resumed run generates that batch anew.
  nlohmann::json st = {{"dataloader", prefetch_ && !prefetch_->handed_out ? prefetch_->loader_state
                                                                         : train_loader_->state()}};
  if (kl_ctrl_) st["kl_coef"] = kl_ctrl_->value();
  const int64_t keep = cfg_.get<std::optional<int64_t>>("trainer.max_actor_ckpt_to_keep").value_or(0);
  const int64_t keep_critic = cfg_.get<std::optional<int64_t>>("trainer.max_critic_ckpt_to_keep").value_or(0);
  return save_checkpoint(cfg_.get<std::string>("trainer.default_local_dir"), global_step_, actor.ms, critic, st,
                         tokenizer_dir_, keep, comm_.get(), critic ? keep_critic : 0);
}

void PpoTrainer::fit() {
  // One run per directory; rank 0 (the one that logs and saves) holds the lock.
  std::optional<RunLock> run_lock;
  if (comm_->rank() == 0) run_lock.emplace(cfg_.get<std::string>("trainer.default_local_dir"));
  resume();
  metrics::LoggerOptions lo;
  lo.experiment_dir = cfg_.get<std::string>("trainer.default_local_dir");
  std::filesystem::create_directories(lo.experiment_dir);
  lo.total_steps = total_steps_;
  lo.logging_steps = cfg_.get<int64_t>("trainer.logging_steps");
  lo.resume_step = global_step_;
  // Rank 0 logs and saves (every rank holds the same weights: their gradients are all-reduced).
  const bool lead = comm_->rank() == 0;
  if (lead) {
    logger_ = std::make_unique<metrics::MultiLogger>(cfg_.get<std::vector<std::string>>("trainer.logger"), lo);
    if (!gpu_monitor_) gpu_monitor_ = std::make_unique<metrics::GpuMonitor>();
  }
  auto log_metrics = [&](const metrics::Metrics& m) {
    if (logger_) logger_->log(global_step_, m);
  };
  const int64_t test_freq = cfg_.get<int64_t>("trainer.test_freq");
  const int64_t save_freq = cfg_.get<int64_t>("trainer.save_freq");
  if (val_set_ && cfg_.get<bool>("trainer.val_before_train") && global_step_ == 0) {
    metrics::Metrics v = validate();
    log_metrics(v);
    if (cfg_.get<bool>("trainer.val_only")) return;
  }
  note_step(global_step_, /*in_progress=*/false);  // 0, or the step resumed from
  while (global_step_ < total_steps_) {
    std::optional<data::Batch> batch = next_batch();
    if (!batch) break;
    note_step(global_step_ + 1, /*in_progress=*/true);  // for the line a signal prints
    metrics::Metrics m = train_step(*batch);
    if (out_of_data_) break;  // filter_groups could not fill a step (verl's loop ends there too)
    m.set("timing_s/data", train_loader_->last_wait_seconds());
    const bool last = global_step_ == total_steps_;
    if (val_set_ && test_freq > 0 && (global_step_ % test_freq == 0 || last)) m.merge(validate());
    if (save_freq > 0 && (global_step_ % save_freq == 0 || last)) {
      Timer t;
      std::string dir;
      try {
        dir = save();  // every rank (each writes its shard of a sharded state)
      } catch (const std::exception&) {
        // The step trained: its metrics go to the logs before the save's error ends the run.
        try {
          log_metrics(m);
          if (logger_) logger_->flush();
        } catch (const std::exception&) {  // the save's error is the one to report (a full disk fails both)
        }
        throw;
      }
      if (lead) last_checkpoint_ = dir;
      m.set("timing_s/save", t.seconds());
    }
    log_metrics(m);
    note_step(global_step_, /*in_progress=*/false);
  }
  if (logger_) logger_->flush();
}

// ---- DAPO: the reward manager, dynamic sampling, rollout correction -------------------------------

float PpoTrainer::manager_reward(Experience& exp, int64_t b, double score, double acc) const {
  exp.raw_score[b] = static_cast<float>(score);
  exp.acc[b] = static_cast<float>(acc);
  if (!dapo_manager_ || !overlong_.enable) return static_cast<float>(score);
  // verl's DAPORewardManager: the penalty grows linearly over the last `len` tokens before
  // max_resp_len, reaching -penalty_factor there; shorter responses get 0.
  const double expected = static_cast<double>(cfg_.get<int64_t>("data.max_response_length") - overlong_.len);
  const double exceed = static_cast<double>(exp.response[b].size()) - expected;
  const double penalty = std::min(-exceed / static_cast<double>(overlong_.len) * overlong_.penalty_factor, 0.0);
  exp.overlong_reward[b] = static_cast<float>(penalty);
  return static_cast<float>(score + penalty);
}

void PpoTrainer::add_reward_extra_metrics(const Experience& exp, metrics::Metrics& m) const {
  if (!dapo_manager_) return;
  std::vector<double> acc(exp.acc.begin(), exp.acc.end());
  m.add_stats("reward_extra/acc", acc);
  if (overlong_.enable && overlong_.log) {
    std::vector<double> pen(exp.overlong_reward.begin(), exp.overlong_reward.end()), over;
    for (double p : pen) over.push_back(p < 0 ? 1.0 : 0.0);
    m.add_stats("reward_extra/overlong_reward", pen);
    m.add_stats("reward_extra/overlong", over);
  }
}

bool PpoTrainer::filter_groups(const data::Batch& batch, Experience& exp, metrics::StageTimer& timer,
                               metrics::Metrics& m) {
  const std::string metric = *cfg_.get<std::optional<std::string>>("algorithm.filter_groups.metric");
  const int64_t max_gen = cfg_.get<int64_t>("algorithm.filter_groups.max_num_gen_batches");
  const int64_t want = cfg_.get<int64_t>("data.train_batch_size");
  // The generation batches of this step and, per batch, the first row of each kept group
  // (a group is a prompt's n consecutive rows). Samples of later batches live in `extra`.
  std::deque<Experience> gens;
  std::deque<std::vector<data::Sample>> extra;
  std::vector<std::pair<const Experience*, int64_t>> kept;
  int64_t num_gen = 0, first_index = 0;
  gens.push_back(std::move(exp));
  for (;;) {
    const Experience& g = gens.back();
    ++num_gen;
    // recipe/dapo/dapo_ray_trainer.py: a group stays when its metric's std is > 0 or it has one
    // sample. Equal values (max == min) stand for std == 0.
    for (int64_t b0 = 0; b0 < g.B; b0 += n_) {
      double lo = std::numeric_limits<double>::infinity(), hi = -lo;
      for (int64_t b = b0; b < b0 + n_; ++b) {
        const double v = metric == "acc" ? g.acc[b] : metric == "score" ? g.raw_score[b] : g.scores[b];
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      if (hi > lo || n_ == 1) kept.emplace_back(&g, b0);
    }
    if (static_cast<int64_t>(kept.size()) >= want) break;
    VERL_CHECK(max_gen <= 0 || num_gen < max_gen,
               "algorithm.filter_groups: {} generation batches kept {} of the {} prompts of data.train_batch_size "
               "(algorithm.filter_groups.max_num_gen_batches={}); the data may be too hard or too easy for "
               "metric={}; raise max_num_gen_batches (0: no limit)",
               num_gen, kept.size(), want, max_gen, metric);
    std::optional<data::Batch> next = next_batch();
    if (!next) {
      log::warn("algorithm.filter_groups: the training data ran out with {} of {} prompts kept; training stops",
                kept.size(), want);
      out_of_data_ = true;
      return false;
    }
    extra.push_back(std::move(next->samples));
    // Distinct sampling seeds (and prompt indices) for each generation batch of the step.
    first_index += static_cast<int64_t>(batch.samples.size());
    Experience more;
    generate(extra.back(), first_index, more, timer, {});
    gens.push_back(std::move(more));
  }
  kept.resize(static_cast<size_t>(want));  // verl aligns the batch to train_batch_size x n rows
  m.set("train/num_gen_batches", static_cast<double>(num_gen));

  // The step's experience: the kept groups in order, prompt indices 0 .. want - 1.
  kept_samples_.clear();
  kept_samples_.reserve(kept.size());
  for (const auto& [g, b0] : kept) kept_samples_.push_back(*g->sample[b0]);
  Experience out;
  out.B = want * n_;
  out.L = 1;
  for (const auto& [g, b0] : kept)
    for (int64_t b = b0; b < b0 + n_; ++b) out.L = std::max<int64_t>(out.L, static_cast<int64_t>(g->response[b].size()));
  const int64_t L = out.L;
  out.mask.assign(out.B * L, 0.0f);
  out.rollout_log_prob.assign(out.B * L, 0.0f);
  out.token_level_scores.assign(out.B * L, 0.0f);
  for (size_t k = 0; k < kept.size(); ++k) {
    const auto& [g, b0] = kept[k];
    for (int64_t b = b0; b < b0 + n_; ++b) {
      const int64_t row = static_cast<int64_t>(out.group.size());
      out.group.push_back(static_cast<int64_t>(k));
      out.sample.push_back(&kept_samples_[k]);
      out.response.push_back(g->response[b]);
      out.finish_reason.push_back(g->finish_reason[b]);
      out.scores.push_back(g->scores[b]);
      out.acc.push_back(g->acc[b]);
      out.raw_score.push_back(g->raw_score[b]);
      out.overlong_reward.push_back(g->overlong_reward[b]);
      const int64_t len = static_cast<int64_t>(g->response[b].size());
      std::copy_n(g->mask.begin() + b * g->L, len, out.mask.begin() + row * L);
      std::copy_n(g->rollout_log_prob.begin() + b * g->L, len, out.rollout_log_prob.begin() + row * L);
      std::copy_n(g->token_level_scores.begin() + b * g->L, len, out.token_level_scores.begin() + row * L);
    }
  }
  out.token_level_rewards = out.token_level_scores;
  exp = std::move(out);
  return true;
}

void PpoTrainer::apply_rollout_correction(Experience& exp, metrics::Metrics& m) {
  // verl computes it on the driver over the whole batch: gather the three [B, L] matrices.
  GlobalRows g(*comm_, exp);
  const std::vector<float> old = g.gather(exp.old_log_prob), rollout = g.gather(exp.rollout_log_prob),
                           mask = g.gather(exp.mask);
  if (std::all_of(mask.begin(), mask.end(), [](float v) { return v == 0.0f; })) return;  // no token
  RolloutCorrectionOutput out = compute_rollout_correction(g.shape(), old, rollout, mask, rollout_corr_);
  for (const auto& [k, v] : out.metrics) m.set(k, v);
  if (!rollout_corr_.rollout_rs.empty()) exp.mask = g.mine(out.response_mask);
  if (rollout_corr_.rollout_is) exp.rollout_is_weights = g.mine(out.rollout_is_weights);
}

}  // namespace verl::trainer
