// The actor's side of verl's ActorRolloutRefWorker: the actor (its log-prob pass and its PPO
// update over the shared update loop) and the frozen reference policy beside it, both on
// trainer.device. The rollout reads the actor's weights (rollout_worker.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "metrics/metrics.h"
#include "model/weights.h"
#include "trainer/ppo_config.h"
#include "trainer/run_plan.h"
#include "trainer/step_metrics.h"
#include "trainer/update_loop.h"

namespace verl::trainer {

// make_policy, with what to do when a model's state does not fit on the GPU: the allocator's
// out-of-memory error gains the device's figures and the keys that move state to the host.
std::unique_ptr<PolicyModel> build_policy(Device device, model::Weights w,
                                          const PolicyOptions& opts, const char* what,
                                          const char* keys);

// <prefix>quantization_* (the reward model's, the reference policy's): quantises w's linear layers
// once at load (model/quantize.h) and logs what it did. Returns the quantised matrices when `keep`
// (a GPU model computes with them instead of bf16 copies), else none.
std::vector<model::QuantizedLayer> quantize_as_configured(const QuantizationKeys& q,
                                                          const std::string& prefix,
                                                          model::Weights& w, const char* what,
                                                          bool keep);

class ActorWorker {
 public:
  // The actor from `weights` and, when the run uses one, the reference policy (the actor's
  // starting weights), with their micro-batch plans and data parallelism over `comm`.
  ActorWorker(const PpoConfig& cfg, const RunPlan& plan, Device device, model::Weights weights,
              dist::Communicator& comm, int64_t total_steps);

  PolicyModel& model() { return *actor_.model; }
  const PolicyModel& model() const { return *actor_.model; }
  // The reference policy: a model of its own, or with LoRA the actor with its adapters off
  // (ref_in_actor()); null when the run uses none.
  PolicyModel* ref() { return ref_.get(); }
  bool ref_in_actor() const { return ref_in_actor_; }
  float temperature() const { return temperature_; }

  // old_log_prob: the actor's log-probs of every response token, cut by rollout.log_prob_*.
  void compute_old_log_prob(const Experience& exp, const PassContext& ctx, std::vector<float>& out);
  // ref: the reference policy's, cut by ref.log_prob_*.
  void compute_ref_log_prob(const Experience& exp, const PassContext& ctx, std::vector<float>& out);
  // update_actor: ppo_epochs x mini-batches x micro-batches of the actor loss (with bypass-mode
  // rollout correction), then the actor/* metrics and the phase's memory (update_actor, optimizer).
  // `step`: training steps done before this one.
  void update(const Experience& exp, metrics::Metrics& m, int64_t step, const PassContext& ctx,
              MemoryRecorder& memory);

 private:
  const PpoConfig& cfg_;
  Device device_;
  TrainedModel actor_;
  std::unique_ptr<PolicyModel> ref_;  // the frozen reference policy, forward only
  bool ref_in_actor_ = false;
  float temperature_ = 1.0f;
};

}  // namespace verl::trainer
