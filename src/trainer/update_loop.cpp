// The update loop the actor and the critic share, the cut into micro-batches and the forward-only
// log-prob pass (verl's dp_actor / dp_critic: update_policy, update_critic, compute_log_prob).
#include "trainer/update_loop.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string_view>

#include "core/error.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/rng.h"
#include "data/dynamic_batch.h"
#include "data/seqlen_balancing.h"

namespace verl::trainer {

std::vector<float> rows(const std::vector<float>& m, const std::vector<int64_t>& idx, int64_t L) {
  std::vector<float> out;
  if (m.empty()) return out;
  out.reserve(idx.size() * L);
  for (int64_t b : idx) out.insert(out.end(), m.begin() + b * L, m.begin() + (b + 1) * L);
  return out;
}

void check_plan(const PolicyModel& policy, const model::PackedBatch& pb) {
  if (policy.max_tokens() == 0) return;  // the CPU model grows its buffers
  VERL_CHECK(pb.num_tokens() <= policy.max_tokens() && pb.num_seqs() <= policy.max_seqs(),
             "a micro-batch of {} tokens in {} sequences exceeds the {} tokens / {} sequences the "
             "{} model was "
             "planned for from actor_rollout_ref.actor.ppo_max_token_len_per_gpu, "
             "ppo_micro_batch_size_per_gpu "
             "(without use_dynamic_bsz), data.gen_batch_size x actor_rollout_ref.rollout.n and "
             "data.max_prompt_length + data.max_response_length; check those keys",
             pb.num_tokens(), pb.num_seqs(), policy.max_tokens(), policy.max_seqs(),
             to_string(policy.device()));
}

std::vector<std::vector<int64_t>> micro_batches(const Experience& exp,
                                                const std::vector<int64_t>& idx, bool dynamic,
                                                int64_t max_tokens, int64_t max_seqs,
                                                const PassContext& ctx) {
  dist::Communicator& comm = *ctx.comm;
  std::vector<std::vector<int64_t>> out;
  if (ctx.dyn_batch) {
    // data.dynamic_batch: the sampler's budget (at most this pass's token key), samples outside the
    // length bounds left out (their masks are zero: drop_by_length).
    std::vector<int64_t> lens;
    for (int64_t b : idx) lens.push_back(exp.tokens(b));
    data::DpMax dp_max;
    if (comm.world_size() > 1) dp_max = [&comm](int64_t n) { return comm.max(n); };
    for (const auto& part : ctx.dyn_batch->pack(lens, max_tokens, dp_max).micro_batches) {
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
                 "a sequence of {} tokens exceeds the micro-batch token budget {} "
                 "(ppo_max_token_len_per_gpu, "
                 "or for a forward-only pass log_prob_max_token_len_per_gpu / "
                 "forward_max_token_len_per_gpu)",
                 lens.back(), max_tokens);
    }
    data::MicroBatchOptions mo;
    mo.max_token_len = max_tokens;
    if (comm.world_size() > 1) mo.dp_max = [&comm](int64_t n) { return comm.max(n); };
    for (const auto& part : data::rearrange_micro_batches(lens, mo).micro_batches) {
      out.emplace_back();
      for (int64_t i : part) out.back().push_back(idx[i]);
    }
    return out;
  }
  for (size_t i = 0; i < idx.size(); i += static_cast<size_t>(max_seqs)) {
    out.emplace_back(idx.begin() + i,
                     idx.begin() + std::min(idx.size(), i + static_cast<size_t>(max_seqs)));
  }
  return out;
}

void compute_log_probs(PolicyModel& policy, const Experience& exp, const ForwardBatching& fb,
                       float temperature, const PassContext& ctx, std::vector<float>& logp,
                       std::vector<float>* entropy) {
  const int64_t L = exp.L;
  logp.assign(exp.B * L, 0.0f);
  if (entropy) entropy->assign(exp.B * L, 0.0f);
  std::vector<int64_t> all(exp.B);
  std::iota(all.begin(), all.end(), 0);
  std::vector<float> lp, ent;  // [T] of one micro-batch
  for (auto& idx : micro_batches(exp, all, fb.dynamic, fb.max_tokens, fb.max_seqs, ctx)) {
    const PackedResponses mb(exp, std::move(idx));
    check_plan(policy, mb.batch());
    policy.forward(mb.batch(), temperature, lp, entropy ? &ent : nullptr, /*for_backward=*/false);
    mb.gather_into(lp, logp);
    if (entropy) mb.gather_into(ent, *entropy);
  }
  policy.release_activations();
}

FullWeights::FullWeights(PolicyModel& p, int64_t bucket)
    : strategy_(p.strategy()), held_(!p.state().has_full_weights()) {
  if (held_) strategy_.gather_full_weights(bucket);
}

FullWeights::~FullWeights() {
  if (held_) strategy_.drop_full_weights();
}

void setup_data_parallel(const UpdateKeys& u, const std::optional<optim::LightweightConfig>& lw,
                         PolicyModel& model, dist::Communicator& comm) {
  const char* key = u.zero_stage_key.c_str();
  const int64_t stage = u.zero_stage;
  // The strategy for (device, stage, LightweightSync); unsupported combinations are refused there.
  optim::StrategyConfig sc;
  sc.zero_stage = static_cast<int>(stage);
  sc.lightweight = lw;
  sc.zero_stage_key = key;
  if (comm.world_size() == 1) {
    if (stage > 0)
      log::warn("{}={}: one rank has nothing to shard; the whole optimizer state stays here", key,
                stage);
    // A one-rank NCCL communicator still reduces (through NCCL): its buckets go as with more, and
    // LightweightSync compresses them (what one GPU can show of it).
    if (comm.distributed()) {
      model.set_strategy(optim::make_strategy(model.state(), comm, sc));
    } else if (lw) {
      log::warn(
          "trainer.gradient_sync_method=lightweight: one rank sends no gradients; the update uses "
          "the whole "
          "gradient, as with allreduce");
    }
    return;
  }
  model.set_strategy(optim::make_strategy(model.state(), comm, sc));
  const optim::TrainState& st = model.state();
  if (lw) {
    const std::string_view model_key(key);
    log::info(
        "LightweightSync for {}: top_k {}, {} values, a sync every {} optimizer step(s), error "
        "feedback {}",
        model_key.substr(0, model_key.rfind('.')), lw->top_k, optim::to_string(lw->values),
        lw->interval, lw->error_feedback ? "on" : "off");
  }
  if (stage == 0) return;
  log::info("ZeRO-{} ({}): rank {} of {} keeps the {}AdamW moments{} of elements [{}, {}) of {}",
            stage, key, comm.rank(), comm.world_size(), stage == 3 ? "weights, " : "",
            stage >= 2 ? " and gradients" : "", st.shard().begin, st.shard().end, st.numel());
}

void UpdateLoopResult::report(metrics::Metrics& m, const char* role, float lr) const {
  const std::string r(role);
  if (applied > 0) m.set(r + "/grad_norm", grad_norm_sum / static_cast<double>(applied));
  m.set(r + "/lr", lr);
}

UpdateLoopResult run_update_loop(const Experience& exp, PolicyModel& model, float lr,
                                 const PassContext& ctx, const UpdateLoopSettings& s,
                                 const MicroStep& micro_step) {
  dist::Communicator& comm = *ctx.comm;
  const int64_t L = exp.L, mini = s.mini;
  const int64_t num_mini = (exp.B + mini - 1) / mini;
  UpdateLoopResult r;
  std::vector<int64_t> order(exp.B);
  std::iota(order.begin(), order.end(), 0);
  for (int64_t ep = 0; ep < s.epochs; ++ep) {
    if (s.shuffle) {
      Rng rng(s.seed ^ 0xac7, static_cast<uint64_t>(s.step * 1000 + ep));
      for (int64_t i = exp.B - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
    }
    for (int64_t mb = 0; mb < num_mini; ++mb) {
      std::vector<int64_t> idx(order.begin() + mb * mini,
                               order.begin() + std::min(exp.B, (mb + 1) * mini));
      // Global normalisers over the mini-batch: micro-batching then changes nothing but
      // float reassociation (the sum of the micro losses is the mini-batch loss).
      std::vector<float> mini_mask = rows(exp.mask, idx, L);
      AggNorm norm;
      norm.dp_size = comm.world_size();
      norm.batch_num_tokens = comm.sum(std::accumulate(mini_mask.begin(), mini_mask.end(), 0.0));
      norm.global_batch_size = comm.sum(static_cast<double>(idx.size()));
      norm.loss_scale_factor = s.loss_scale_factor;
      // Gradients accumulate over the micro-batches (on the policy's device) until the step.
      model.zero_grad();
      // Every rank has as many micro-batches (equal shares; dynamic sizes agree on the count), so
      // the gradient buckets that the last one's backward reduces start in step on every rank.
      std::vector<std::vector<int64_t>> micros =
          micro_batches(exp, idx, s.dynamic, s.max_tokens, s.micro_seqs, ctx);
      for (size_t mi = 0; mi < micros.size(); ++mi) {
        const PackedResponses packed(exp, std::move(micros[mi]));
        check_plan(model, packed.batch());
        micro_step(packed, norm, mi + 1 == micros.size());
      }
      if (s.fault_point) fault_point("train", s.step + 1);
      if (s.track_peaks) r.pass_peak = std::max(r.pass_peak, take_tracked_device_peak());
      const double gnorm =
          model.optimizer_step(lr, comm);  // all-reduces the gradients over comm first
      if (s.track_peaks) r.optimizer_peak = std::max(r.optimizer_peak, take_tracked_device_peak());
      // LightweightSync's interval: a step that only kept its gradients for the next sync has no
      // norm.
      ++r.updates;
      if (!model.strategy().step_deferred()) {
        r.grad_norm_sum += gnorm;
        ++r.applied;
        if (!std::isfinite(gnorm)) ++r.skipped;
      }
    }
  }
  // Every rank saw the same norm; one line is enough.
  if (r.skipped > 0 && comm.rank() == 0)
    log::warn(
        "step {}: the {}'s gradient norm was not finite in {} of its {} optimizer steps; those "
        "updates "
        "were skipped, as verl does (the weights did not change). Check the rewards "
        "(critic/score/*) and "
        "the learning rate",
        s.step + 1, s.role, r.skipped, r.applied);
  return r;
}

}  // namespace verl::trainer
