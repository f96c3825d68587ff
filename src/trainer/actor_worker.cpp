// The actor and the reference policy: their construction from the typed config, the log-prob
// passes and the actor's update (verl's dp_actor.update_policy over the shared update loop).
#include "trainer/actor_worker.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <string_view>

#include "core/error.h"
#include "core/log.h"
#include "model/quantize.h"

namespace verl::trainer {
namespace {

// algorithm.rollout_correction in bypass mode for one micro-batch (verl's
// compute_policy_loss_bypass_mode): the rejection mask and weights come from the current policy's
// log-probs against the rollout's (= old); ppo_clip then takes PPO's ratio as the correction and
// no weights, reinforce takes -A log pi times the truncated weights (our gpg loss with weights).
// The micro-batch's rollout_corr/* metrics are summed into `metrics` (value, count).
void bypass_correction(const RolloutCorrectionConfig& rc, Shape s, const std::vector<float>& logp,
                       const std::vector<float>& rollout, std::vector<float>& mask,
                       std::vector<float>& is_weights, ActorLossConfig& lc,
                       std::map<std::string, std::pair<double, int64_t>>& metrics) {
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

// verl's ref_in_actor: the reference policy of a LoRA actor is the actor with its adapters
// switched off for the pass, not a second copy of the weights. Forward passes only.
class AdaptersOff final : public PolicyModel {
 public:
  explicit AdaptersOff(PolicyModel& actor) : PolicyModel(AdamWConfig{}), actor_(actor) {}
  Device device() const override { return actor_.device(); }
  const model::ModelConfig& config() const override { return actor_.config(); }
  void forward(const model::PackedBatch& batch, float temperature, std::vector<float>& logprob,
               std::vector<float>* entropy, bool for_backward = true) override {
    (void)for_backward;
    actor_.set_adapters_enabled(false);
    try {
      actor_.forward(batch, temperature, logprob, entropy, false);
    } catch (...) {
      actor_.set_adapters_enabled(true);
      throw;
    }
    actor_.set_adapters_enabled(true);
  }
  void backward(const float*, const float*) override { refuse("backward"); }
  void forward_values(const model::PackedBatch&, std::vector<float>&) override {
    refuse("forward_values");
  }
  void backward_values(const float*) override { refuse("backward_values"); }
  optim::TrainState& state() override { return actor_.state(); }
  optim::Strategy& strategy() override { return actor_.strategy(); }
  void set_strategy(std::unique_ptr<optim::Strategy>) override { refuse("set_strategy"); }
  void release_activations() override { actor_.release_activations(); }
  const model::Weights& weights() override { return actor_.weights(); }
  int64_t max_tokens() const override { return actor_.max_tokens(); }
  int64_t max_seqs() const override { return actor_.max_seqs(); }

 private:
  [[noreturn]] static void refuse(const char* what) {
    VERL_FAIL("internal: the reference policy inside the LoRA actor is forward only ({})", what);
  }
  PolicyModel& actor_;
};

}  // namespace

std::unique_ptr<PolicyModel> build_policy(Device device, model::Weights w,
                                          const PolicyOptions& opts, const char* what,
                                          const char* keys) {
  const double params = static_cast<double>(w.layout.total);
  try {
    return make_policy(device, std::move(w), opts);
  } catch (const Error& e) {
    if (device != Device::Cuda ||
        std::string_view(e.what()).find("out of memory") == std::string_view::npos)
      throw;
    constexpr double kGiB = 1 << 30;
    VERL_FAIL(
        "the {} ({:.2f}B parameters: {:.1f} GiB for a trained state at 18 bytes a parameter, "
        "{:.1f} GiB for "
        "bf16 weights alone) does not fit on the GPU beside the {:.1f} GiB already in use of "
        "{:.1f} GiB; "
        "consider {} (docs/memory.md). The allocator said: {}",
        what, params / 1e9, 18 * params / kGiB, 2 * params / kGiB,
        static_cast<double>(device_memory_in_use()) / kGiB,
        static_cast<double>(device_memory_total()) / kGiB, keys, e.what());
  }
}

std::vector<model::QuantizedLayer> quantize_as_configured(const QuantizationKeys& q,
                                                          const std::string& prefix,
                                                          model::Weights& w, const char* what,
                                                          bool keep) {
  VERL_CHECK(q.bits != 4 || q.group_size % 2 == 0, "{}quantization_group_size={}: must be even",
             prefix, q.group_size);
  VERL_CHECK(q.calibration_samples >= 0 && q.calibration_samples <= model::kMaxCalibrationSamples,
             "{}quantization_calibration_samples={}: want 0 (round to nearest) to {}", prefix,
             q.calibration_samples, model::kMaxCalibrationSamples);
  model::QuantizeOptions opt;
  opt.bits = q.bits;
  opt.group = q.group_size;
  opt.calibration_samples = q.calibration_samples;
  std::vector<model::QuantizedLayer> kept;
  const model::QuantizeReport r = model::quantize_linear_weights(w, opt, keep ? &kept : nullptr);
  if (r.matrices > 0)
    log::info("{}: {}{}", what, model::describe(r, q.bits, q.group_size),
              keep ? "; on the GPU the linear layers compute from the quantised codes" : "");
  return kept;
}

ActorWorker::ActorWorker(const PpoConfig& cfg, const RunPlan& plan, Device device,
                         model::Weights weights, dist::Communicator& comm, int64_t total_steps)
    : cfg_(cfg), device_(device), temperature_(static_cast<float>(cfg.rollout.train.temperature)) {
  // The actor and the frozen reference policy (the actor's starting weights) on trainer.device.
  // The reference model's log-probs meet nobody's: it takes the fast kernels.
  PolicyOptions po;
  po.recompute = cfg.actor.gradient_checkpointing;
  if (cfg.lora)
    po.lora = make_lora_adapters(*cfg.lora, weights.config, static_cast<uint64_t>(cfg.data.seed));
  if (plan.ref && cfg.lora) {
    ref_in_actor_ = true;
    log::info(
        "LoRA: the reference policy is the actor with its adapters off (no second copy of the "
        "weights)");
  } else if (plan.ref) {
    PolicyOptions ro = po;
    ro.trainable = false;
    ro.max_tokens = plan.ref_plan.max_tokens;
    ro.max_seqs = plan.ref_plan.max_seqs;
    // ref.fsdp_config.param_offload: the bf16 weights on the host, on the device for the ref pass
    // only.
    ro.offload = cfg.ref_offload.resolve(device);
    model::Weights ref_weights = weights;
    std::vector<model::QuantizedLayer> ref_q =
        quantize_as_configured(cfg.ref_quantization, "actor_rollout_ref.ref.", ref_weights,
                               "reference policy", device == Device::Cuda);
    if (!ref_q.empty())
      ro.quantized = std::make_shared<const std::vector<model::QuantizedLayer>>(std::move(ref_q));
    ref_ = build_policy(device, std::move(ref_weights), ro, "reference policy",
                        "actor_rollout_ref.ref.fsdp_config.param_offload=true (its weights on the "
                        "host between ref passes)");
  }
  po.numerics = cfg.rollout.numerics;
  po.optim = cfg.actor.optim.adamw;
  po.max_tokens = plan.actor_plan.max_tokens;
  po.max_seqs = plan.actor_plan.max_seqs;
  po.offload = cfg.actor.offload.resolve(device);
  actor_.base_lr = po.optim.lr;
  actor_.schedule = cfg.actor.optim.schedule(total_steps);
  actor_.model = build_policy(
      device, std::move(weights), po, "actor",
      "actor_rollout_ref.actor_offload_ratio (0.3 keeps 30% of the fp32 master weights and AdamW "
      "moments in pinned host memory, 1.0 all of them) and "
      "actor_rollout_ref.ref.fsdp_config.param_offload=true");
  setup_data_parallel(cfg.actor, cfg.trainer.lightweight_sync, *actor_.model, comm);
  if (ref_in_actor_) ref_ = std::make_unique<AdaptersOff>(*actor_.model);
}

void ActorWorker::compute_old_log_prob(const Experience& exp, const PassContext& ctx,
                                       std::vector<float>& out) {
  compute_log_probs(*actor_.model, exp, cfg_.old_log_prob_batching, temperature_, ctx, out,
                    nullptr);
}

void ActorWorker::compute_ref_log_prob(const Experience& exp, const PassContext& ctx,
                                       std::vector<float>& out) {
  compute_log_probs(*ref_, exp, cfg_.ref_batching, temperature_, ctx, out, nullptr);
}

void ActorWorker::update(const Experience& exp, metrics::Metrics& m, int64_t step,
                         const PassContext& ctx, MemoryRecorder& memory) {
  dist::Communicator& comm = *ctx.comm;
  const UpdateKeys& u = cfg_.actor;
  const int64_t L = exp.L;
  const int64_t num_mini = (exp.B + u.mini - 1) / u.mini;
  // Fully on-policy (one epoch over one mini-batch): the old policy is the current one, so the
  // update's own forward gives old_log_prob exactly.
  const bool on_policy = exp.old_log_prob.empty();
  VERL_CHECK(!on_policy || (u.ppo_epochs == 1 && num_mini == 1),
             "internal: old_log_prob was skipped off-policy");
  const float lr = actor_.lr(step);
  PolicyModel& actor = *actor_.model;
  const RolloutCorrectionConfig& rc = cfg_.algorithm.rollout_correction;
  std::vector<float> lp_tok, ent_tok;  // [T] of one micro-batch
  double pg_loss = 0, pg_clipfrac = 0, ppo_kl = 0, clip_lower = 0, ent = 0, kl_loss = 0;
  // On policy, the update's own forward is old_log_prob: compare the rollout's with it there.
  ProbsDiff probs_diff;
  std::map<std::string, std::pair<double, int64_t>>
      bypass_metrics;  // rollout_corr/* per micro-batch
  UpdateLoopSettings s;
  s.role = "actor";
  s.mini = u.mini;
  s.epochs = u.ppo_epochs;
  s.dynamic = u.use_dynamic_bsz;
  s.max_tokens = u.ppo_max_token_len_per_gpu;
  s.micro_seqs = u.micro(u.mini);
  s.shuffle = u.shuffle;
  s.seed = cfg_.data.seed;
  s.step = step;
  s.loss_scale_factor = static_cast<double>(cfg_.data.max_response_length);
  s.fault_point = true;
  s.track_peaks = true;
  const UpdateLoopResult r = run_update_loop(
      exp, actor, lr, ctx, s, [&](const PackedResponses& mb, const AggNorm& norm, bool last) {
        const double mini_tokens = *norm.batch_num_tokens;
        ActorLossConfig lc = cfg_.actor_loss;
        lc.policy.norm = norm;
        const std::vector<int64_t>& micro = mb.rows();
        actor.forward(mb.batch(), temperature_, lp_tok, &ent_tok);
        const int64_t bm = static_cast<int64_t>(micro.size());
        std::vector<float> logp = mb.gather(lp_tok), entropy = mb.gather(ent_tok);
        std::vector<float> old = on_policy ? logp : rows(exp.old_log_prob, micro, L);
        if (on_policy)
          probs_diff.add(rows(exp.rollout_log_prob, micro, L), logp, rows(exp.mask, micro, L));
        std::vector<float> adv = rows(exp.advantages, micro, L), mask = rows(exp.mask, micro, L);
        std::vector<float> ref = rows(exp.ref_log_prob, micro, L);
        std::vector<float> is_weights = rows(exp.rollout_is_weights, micro, L);
        ActorLossConfig mlc = lc;
        if (rc.bypass_mode)
          bypass_correction(rc, {bm, L}, logp, old, mask, is_weights, mlc, bypass_metrics);
        ActorLossOutput out =
            compute_actor_loss({bm, L}, old, logp, adv, mask, entropy, ref, mlc, is_weights);
        const std::vector<float> d_lp = mb.scatter(out.d_log_prob),
                                 d_ent = mb.scatter(out.d_entropy);
        // Without an entropy bonus d_entropy is all zeros: pass null, which both models skip.
        actor.strategy().prepare_backward(last);
        actor.backward(d_lp.data(),
                       lc.entropy_coeff == 0 || d_ent.empty() ? nullptr : d_ent.data());
        const double share =
            std::accumulate(mask.begin(), mask.end(), 0.0) / std::max(1.0, mini_tokens);
        pg_loss += out.pg_loss;
        // actor/entropy is the token-mean policy entropy, reported whatever entropy_coeff is.
        for (int64_t i = 0; i < bm * L; ++i)
          ent += entropy[i] * mask[i] / std::max(1.0, mini_tokens);
        kl_loss += out.kl_loss;
        pg_clipfrac += out.pg_clipfrac * share;
        ppo_kl += out.ppo_kl * share;
        clip_lower += out.pg_clipfrac_lower * share;
      });
  actor.release_activations();
  // The phase's memory: the micro-batches' peak (forward and backward) and the optimizer steps'
  // (an offloaded state's staging slots), apart.
  memory.record(m, "update_actor", r.pass_peak);
  memory.record(m, "optimizer", r.optimizer_peak);
  if (device_ == Device::Cuda)
    m.set("perf/host_pinned_gib", static_cast<double>(pinned_host_memory()) / (1 << 30));
  const double n = static_cast<double>(std::max<int64_t>(1, r.updates));
  // The losses carry verl's global normalisers times dp_size (so the ranks' mean gradient is the
  // global one): their mean over ranks is the global loss. The entropy and the fractions are
  // weighted by global token counts already: their sum over ranks is the global value.
  pg_loss = comm.mean(pg_loss);
  kl_loss = comm.mean(kl_loss);
  ent = comm.sum(ent);
  pg_clipfrac = comm.sum(pg_clipfrac);
  ppo_kl = comm.sum(ppo_kl);
  clip_lower = comm.sum(clip_lower);
  probs_diff.reduce(comm);
  probs_diff.report(m);
  // Bypass mode's rollout_corr/* metrics: the mean over micro-batches (verl's reduce_metrics), then
  // over ranks (every rank has the same keys).
  for (const auto& [k, v] : bypass_metrics)
    m.set(k, comm.mean(v.first / static_cast<double>(v.second)));
  m.set("actor/pg_loss", pg_loss / n);
  m.set("actor/pg_clipfrac", pg_clipfrac / n);
  m.set("actor/ppo_kl", ppo_kl / n);
  m.set("actor/pg_clipfrac_lower", clip_lower / n);
  m.set("actor/entropy", ent / n);
  if (cfg_.actor_loss.use_kl_loss) {
    m.set("actor/kl_loss", kl_loss / n);
    m.set("actor/kl_coef", cfg_.actor_loss.kl_loss_coef);
  }
  r.report(m, "actor", lr);
}

}  // namespace verl::trainer
