// The critic's passes: values (forward only) and the value-loss update over the shared loop.
#include "trainer/critic_worker.h"

#include <algorithm>
#include <numeric>

#include "trainer/actor_worker.h"

namespace verl::trainer {

CriticWorker::CriticWorker(const PpoConfig& cfg, const RunPlan& plan, Device device,
                           dist::Communicator& comm, int64_t total_steps)
    : cfg_(cfg) {
  // The critic on trainer.device too; its micro-batches are planned from the critic.* keys.
  PolicyOptions co;
  co.optim = cfg.critic.optim.adamw;
  co.recompute = cfg.critic.gradient_checkpointing;
  co.max_tokens = plan.critic_plan.max_tokens;
  co.max_seqs = plan.critic_plan.max_seqs;
  co.offload = cfg.critic.offload.resolve(device);
  critic_.base_lr = co.optim.lr;
  critic_.schedule = cfg.critic.optim.schedule(total_steps);
  model::Weights critic_weights =
      model::Weights::load_as_critic(cfg.critic_model_path, cfg.data.seed);
  critic_weights.config =
      apply_model_overrides(cfg.critic_model_path, critic_weights.config,
                            cfg.critic_override_config, "critic.model.override_config");
  critic_.model =
      build_policy(device, std::move(critic_weights), co, "critic",
                   "critic.model.fsdp_config.optimizer_offload=true / param_offload=true");
  setup_data_parallel(cfg.critic, cfg.trainer.lightweight_sync, *critic_.model, comm);
}

void CriticWorker::compute_values(const Experience& exp, const PassContext& ctx,
                                  std::vector<float>& values) {
  const int64_t L = exp.L;
  values.assign(exp.B * L, 0.0f);
  std::vector<int64_t> all(exp.B);
  std::iota(all.begin(), all.end(), 0);
  std::vector<float> v;
  const ForwardBatching& fb = cfg_.values_batching;
  for (auto& idx : micro_batches(exp, all, fb.dynamic, fb.max_tokens, fb.max_seqs, ctx)) {
    const PackedResponses mb(exp, std::move(idx));
    check_plan(*critic_.model, mb.batch());
    critic_.model->forward_values(mb.batch(), v);
    mb.gather_into(v, values);
  }
}

void CriticWorker::update(const Experience& exp, metrics::Metrics& m, int64_t step,
                          const PassContext& ctx) {
  dist::Communicator& comm = *ctx.comm;
  const UpdateKeys& u = cfg_.critic;
  const int64_t L = exp.L;
  const float lr = critic_.lr(step);
  PolicyModel& critic = *critic_.model;
  std::vector<float> values_tok;
  double vf_loss = 0, vf_clipfrac = 0;
  UpdateLoopSettings s;
  s.role = "critic";
  s.mini = u.mini;
  s.epochs = u.ppo_epochs;
  s.dynamic = u.use_dynamic_bsz;
  s.max_tokens = u.ppo_max_token_len_per_gpu;
  s.micro_seqs = u.micro(u.mini);
  s.step = step;
  s.loss_scale_factor = static_cast<double>(cfg_.data.max_response_length);
  const UpdateLoopResult r = run_update_loop(
      exp, critic, lr, ctx, s, [&](const PackedResponses& mb, const AggNorm& norm, bool last) {
        const std::vector<int64_t>& micro = mb.rows();
        critic.forward_values(mb.batch(), values_tok);
        const int64_t bm = static_cast<int64_t>(micro.size());
        std::vector<float> vpreds = mb.gather(values_tok);
        std::vector<float> mask = rows(exp.mask, micro, L);
        ValueLossOutput out = compute_value_loss(
            {bm, L}, vpreds, rows(exp.returns, micro, L), rows(exp.values, micro, L), mask,
            cfg_.critic_cliprange_value, cfg_.critic_loss_agg_mode, norm);
        const std::vector<float> d_v = mb.scatter(out.d_vpreds);
        critic.strategy().prepare_backward(last);
        critic.backward_values(d_v.data());
        vf_loss += out.vf_loss;
        vf_clipfrac += out.vf_clipfrac * std::accumulate(mask.begin(), mask.end(), 0.0) /
                       std::max(1.0, *norm.batch_num_tokens);
      });
  const double n = static_cast<double>(std::max<int64_t>(1, r.updates));
  vf_loss = comm.mean(vf_loss);  // as the actor's losses: dp_size x the global normaliser
  vf_clipfrac = comm.sum(vf_clipfrac);
  m.set("critic/vf_loss", vf_loss / n);
  m.set("critic/vf_clipfrac", vf_clipfrac / n);
  r.report(m, "critic", lr);
}

}  // namespace verl::trainer
