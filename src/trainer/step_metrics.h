// A step's metrics in one place: verl's compute_data_metrics over every rank's samples, the stage
// timings, the rollout-vs-trainer log-prob gap, data.dynamic_batch's packing figures, the gradient
// sync's, and per-phase memory (the device's on cuda, the training states' on the cpu); plus the
// generation dumps (trainer.rollout_data_dir, validation_data_dir, log_val_generations).
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/device.h"
#include "data/dynamic_batch.h"
#include "dist/communicator.h"
#include "metrics/metrics.h"
#include "trainer/experience.h"
#include "trainer/policy_model.h"

namespace verl::tokenizer {
class Tokenizer;
}

namespace verl::trainer {

// Memory at the end of a phase: on cuda the device's in use (perf/device_memory_gib/<phase>) and
// the phase's peak (perf/device_memory_peak_gib/<phase>: the tracked allocations' peak since the
// phase began, or `tracked_peak` if more, plus the untracked rest); on the cpu what the models'
// training states hold with ZeRO-3's gather buffers at their peak in the phase
// (perf/host_state_gib/<phase>; the buffers alone: perf/host_gather_gib/<phase>).
class MemoryRecorder {
 public:
  explicit MemoryRecorder(Device device) : device_(device) {}
  // The models whose states count (null entries are skipped).
  void set_models(std::vector<PolicyModel*> models) { models_ = std::move(models); }
  // The states' bytes and the gather buffers' peak since the last call.
  std::pair<size_t, size_t> host_state_bytes() const;
  // The gen phase's figures, taken while the rollout's KV cache is still held.
  void end_of_gen();
  void record(metrics::Metrics& m, const char* phase, size_t tracked_peak = 0) const;

 private:
  Device device_;
  std::vector<PolicyModel*> models_;
  size_t gen_device_bytes_ = 0;  // device memory in use at the end of the last generation
  std::pair<size_t, size_t>
      gen_state_bytes_;  // host_state_bytes() then, before ZeRO-3's whole weights go
};

// verl's training/rollout_probs_diff_{max,mean,std}: |exp(rollout log-prob) - exp(old log-prob)|
// over response tokens. 0 with actor_rollout_ref.rollout.batch_invariant on cuda; on cpu both are
// fp32 models that sum in other orders (about 1e-6 on the demo).
struct ProbsDiff {
  double worst = 0, sum = 0, sq = 0, n = 0;
  void add(const std::vector<float>& rollout, const std::vector<float>& old,
           const std::vector<float>& mask);
  void reduce(dist::Communicator& comm);  // over every rank's tokens
  void report(metrics::Metrics& m) const;
};

// data.dynamic_batch's metrics of a step: `update` holds the actor update's packings, `other` the
// step's earlier ones (their budget steps count too). Token sums over every rank.
void add_dynamic_batch_metrics(const data::DynamicBatchStats& other,
                               const data::DynamicBatchStats& update, dist::Communicator& comm,
                               int64_t budget, metrics::Metrics& m);

// verl's compute_data_metrics over every rank's samples (critic/score, rewards, advantages,
// returns, values, vf_explained_var, response_length, prompt_length): the statistics of the
// concatenation of the ranks' values (one rank: exactly Metrics::add_stats / add_length_stats).
void add_data_metrics(const Experience& exp, dist::Communicator& comm, int64_t response_length,
                      int64_t max_prompt_length, metrics::Metrics& m);

// The rollout engine's figures of the step (rollout/engine_steps, decode steps, CUDA graphs) and
// the sampled ids past the tokenizer's vocabulary (rollout/out_of_vocab_tokens).
void add_rollout_metrics(const Experience& exp, int64_t vocab_size, dist::Communicator& comm,
                         metrics::Metrics& m);

// With a communicator: the gradient sync's bytes and seconds of the step's updates and ZeRO-3's
// weight gathers, over the trained models' states.
void add_sync_metrics(const std::vector<PolicyModel*>& trained, metrics::Metrics& m);

// timing_s/<stage> of the step's stages and their overlaps (reward with gen; the token pipeline's
// passes with gen; the critic's update with the actor's).
void add_timing_metrics(const metrics::StageTimer& timer, bool token_pipeline, bool critic_overlap,
                        metrics::Metrics& m);

// One generated sample as verl's _dump_generations writes it: the prompt and the response as text
// (special tokens skipped), the row's ground truth and the sample's score.
struct GenerationRow {
  std::string input, output;
  nlohmann::json gts;
  double score = 0;
};
std::vector<GenerationRow> generation_rows(const tokenizer::Tokenizer& tok, const Experience& exp);

// verl's _dump_generations (trainer.rollout_data_dir, trainer.validation_data_dir):
// DIR/<step>.jsonl with one {"input", "output", "gts", "score", "step"} line per sample. With
// several ranks each writes its own samples, to DIR/<step>_rank<r>.jsonl.
void dump_generations(const std::string& dir, const std::string& key, int64_t step,
                      const std::vector<GenerationRow>& rows, const dist::Communicator& comm);

// verl's _maybe_log_val_generations (trainer.log_val_generations): `n` validation samples, sorted
// by input and shuffled with a fixed seed so that every validation shows the same prompts.
void log_val_generations(std::vector<GenerationRow> rows, int64_t n, int64_t step);

}  // namespace verl::trainer
