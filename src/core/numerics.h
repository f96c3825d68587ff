// The one numerics choice of the GPU kernels, taken once from the config and passed down to the
// ops (CudaContext), the GPU model, the GPU rollout runner and the policies. It trades speed for
// agreement between the log-probs the rollout reports and the ones the trainer recomputes
// (docs/cuda.md, docs/rollout.md). The CPU model has one fp32 path and ignores it.
#pragma once

namespace verl {

enum class Numerics {
  // Split-K GEMMs where cuBLASLt picks them and split-K decode attention: fastest; rollout
  // log-probs within about 0.06 nats of the trainer's.
  Fast,
  // Forward GEMMs that never split k and decode attention on the training kernel's arithmetic
  // (actor_rollout_ref.rollout.match_trainer_numerics): within float-rounding noise (~1e-6).
  MatchTrainer,
  // Batch-invariant GEMMs, the training attention kernel over the paged cache and the trainer's
  // LM-head op in the rollout (actor_rollout_ref.rollout.batch_invariant): bit for bit.
  BatchInvariant,
};

inline const char* to_string(Numerics n) {
  switch (n) {
    case Numerics::MatchTrainer:
      return "match_trainer";
    case Numerics::BatchInvariant:
      return "batch_invariant";
    default:
      return "fast";
  }
}

// verl's two rollout keys as one mode; batch_invariant wins when both are set (it never splits k
// either, so it implies the match).
inline Numerics numerics_from_flags(bool batch_invariant, bool match_trainer_numerics) {
  if (batch_invariant) return Numerics::BatchInvariant;
  return match_trainer_numerics ? Numerics::MatchTrainer : Numerics::Fast;
}

// Forward GEMMs may not split k (every mode but Fast).
inline bool unsplit_k(Numerics n) {
  return n != Numerics::Fast;
}

}  // namespace verl
