// AdamW over a flat parameter buffer with global gradient-norm clipping, as torch.optim.AdamW with
// torch.nn.utils.clip_grad_norm_ (the optimizer verl's FSDP workers use). The moments live in flat
// buffers of the same layout as the parameters, so sharding and checkpointing are plain slices.
#pragma once

#include <cstdint>
#include <vector>

namespace verl::trainer {

struct AdamWConfig {
  float lr = 1e-6f;  // verl's actor default
  float beta1 = 0.9f, beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  float grad_clip = 1.0f;  // max global L2 norm; <= 0 disables clipping
};

// AdamW's state in the parameters' flat layout: what a checkpoint saves and restores, whichever
// device ran the optimizer.
struct AdamWState {
  std::vector<float> exp_avg, exp_avg_sq;  // first and second moments
  int64_t step = 0;                        // updates applied (skipped non-finite steps excluded)
};

class AdamW {
 public:
  AdamW(int64_t n, AdamWConfig cfg);

  // Clips `grads` to the global norm (scale folded into the update, grads left as they are) and
  // applies one AdamW step with learning rate `lr`. Returns the global gradient norm before
  // clipping. A non-finite norm skips the update (as verl does) and is returned as is.
  double step(float* params, const float* grads, float lr);

  int64_t num_steps() const { return s_.step; }
  std::vector<float>& exp_avg() { return s_.exp_avg; }
  std::vector<float>& exp_avg_sq() { return s_.exp_avg_sq; }
  void set_num_steps(int64_t s) { s_.step = s; }
  const AdamWState& state() const { return s_; }
  AdamWState& state() { return s_; }
  const AdamWConfig& config() const { return cfg_; }

 private:
  AdamWConfig cfg_;
  AdamWState s_;
};

}  // namespace verl::trainer
