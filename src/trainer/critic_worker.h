// The critic (verl's CriticWorker): its values of every response token and its update, the value
// loss over the update loop the actor uses too, on trainer.device.
#pragma once

#include <cstdint>
#include <vector>

#include "metrics/metrics.h"
#include "trainer/ppo_config.h"
#include "trainer/run_plan.h"
#include "trainer/update_loop.h"

namespace verl::trainer {

class CriticWorker {
 public:
  // The critic from critic.model.path (a value head over the model), planned from `plan`.
  CriticWorker(const PpoConfig& cfg, const RunPlan& plan, Device device, dist::Communicator& comm,
               int64_t total_steps);

  PolicyModel& model() { return *critic_.model; }

  // values: the critic's value of the state before each response token, cut by critic.forward_*.
  void compute_values(const Experience& exp, const PassContext& ctx, std::vector<float>& values);
  // update_critic: ppo_epochs x mini-batches x micro-batches of the clipped value loss, then the
  // critic/* metrics. `step`: training steps done before this one.
  void update(const Experience& exp, metrics::Metrics& m, int64_t step, const PassContext& ctx);

 private:
  const PpoConfig& cfg_;
  TrainedModel critic_;
};

}  // namespace verl::trainer
