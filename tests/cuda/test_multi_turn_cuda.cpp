// Multi-turn rollouts on the GPU runner (the engine's multi-turn mode is device-neutral): samples
// pause at their stop tokens, scripted tool turns are appended and prefilled onto the cached
// prefix, and the log-probs the runner reports for the tokens it sampled agree with the trainer's
// CUDA forward over the whole trajectory (tool tokens included as context): within the model's
// log-prob tolerance by default, bit for bit with batch_invariant on both sides. Each
// continuation's prefill is its appended tokens plus the turn's stop token, as on the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/rng.h"
#include "model/batch.h"
#include "model/cuda/transformer.h"
#include "model/weights.h"
#include "optim/cuda/train_state.h"
#include "rollout/cuda/model_runner.h"
#include "rollout/engine.h"
#include "test_util.h"
#include "tolerances.h"

namespace verl::ops::cuda::test {
namespace {

const std::string kGolden = std::string(VERL_SOURCE_DIR) + "/tests/fixtures/golden/";

// Appends 5, then 9 fixed tokens after the first two turns and ends the trajectory at the third.
class ScriptedTurns final : public rollout::TurnHandler {
 public:
  void turn_ended(int64_t request, int32_t sample, std::span<const int32_t>) override {
    int32_t& t = turns_[{request, sample}];
    rollout::Continuation k{request, sample, {}, t >= 2};
    if (!k.end)
      for (int32_t i = 0; i < (t == 0 ? 5 : 9); ++i) k.append.push_back((3 * i + t + 11) % 50);
    ++t;
    ready_.push_back(std::move(k));
  }
  void poll(std::vector<rollout::Continuation>& out, bool) override {
    for (auto& k : ready_) out.push_back(std::move(k));
    ready_.clear();
  }

 private:
  std::map<std::pair<int64_t, int32_t>, int32_t> turns_;
  std::vector<rollout::Continuation> ready_;
};

class MultiTurnCuda : public CudaTest, public ::testing::WithParamInterface<bool> {};

TEST_P(MultiTurnCuda, SampledLogprobsMatchTheTrainerOverWholeTrajectories) {
  const bool invariant = GetParam();
  model::Weights w = model::Weights::load(kGolden + "qwen2");
  const int64_t V = w.config.vocab_size;
  Rng rng(21);
  std::vector<rollout::Request> reqs;
  for (int64_t len : {6, 11, 30}) {
    rollout::Request r;
    r.prompt.resize(static_cast<size_t>(len));
    for (auto& t : r.prompt) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
    r.params.temperature = 1.0f;
    r.params.max_tokens = 200;
    r.params.seed = 5 + static_cast<uint64_t>(len);
    for (int32_t t = 0; t < V; t += 4) r.params.stop_token_ids.push_back(t);  // short turns
    r.n = 2;
    reqs.push_back(r);
  }
  rollout::EngineConfig cfg;
  cfg.scheduler.num_blocks = 128;
  cfg.scheduler.block_size = 16;
  cfg.scheduler.max_model_len = 256;
  cfg.scheduler.max_num_seqs = 8;
  cfg.scheduler.max_num_batched_tokens = 256;

  model::cuda::CudaTransformerOptions to;
  to.max_tokens = 6 * 256;
  to.max_seqs = 6;
  to.trainable = false;
  to.numerics = numerics_from_flags(invariant, false);
  optim::cuda::CudaTrainState state(ctx(), w, /*trainable=*/false);
  model::cuda::CudaTransformer tf(ctx(), w.config, w.layout, state.weights_bf16(), nullptr, to);
  rollout::cuda::CudaRunnerOptions ro;
  ro.numerics = to.numerics;
  ro.kv_blocks = cfg.scheduler.num_blocks;
  ro.kv_cache_bytes = int64_t{1} << 40;
  rollout::cuda::CudaModelRunner runner(ctx(), tf.config(), tf.layout(), state.weights_bf16(),
                                        cfg.scheduler, ro);
  rollout::Engine engine(runner, cfg);
  ScriptedTurns turns;
  rollout::GenerateHooks hooks;
  hooks.turns = &turns;
  const std::vector<rollout::Completion> done = engine.generate(reqs, hooks);
  ASSERT_EQ(done.size(), 6u);

  std::vector<std::vector<int32_t>> seqs;
  int64_t appended = 0;
  for (const rollout::Completion& c : done) {
    ASSERT_EQ(c.generated.size(), c.tokens.size());
    for (uint8_t g : c.generated) appended += g == 0;
    std::vector<int32_t> s = reqs[static_cast<size_t>(c.request)].prompt;
    s.insert(s.end(), c.tokens.begin(), c.tokens.end());
    seqs.push_back(std::move(s));
  }
  EXPECT_EQ(appended, engine.stats().appended_tokens);
  EXPECT_GT(appended, 0);
  EXPECT_GT(engine.stats().kv_reused_tokens, 0);
  model::PackedBatch b = model::PackedBatch::from_sequences(seqs);
  tf.forward(b, 1.0f, /*for_backward=*/false);
  const std::vector<float> lp = tf.download_logprob();
  double worst = 0;
  int64_t n = 0;
  for (size_t i = 0; i < done.size(); ++i) {
    const int64_t base =
        b.cu_seqlens[i] +
        static_cast<int64_t>(reqs[static_cast<size_t>(done[i].request)].prompt.size()) - 1;
    for (size_t j = 0; j < done[i].tokens.size(); ++j) {
      if (!done[i].generated[j]) continue;  // tool tokens: context, not sampled
      worst = std::max(worst,
                       std::fabs(double(done[i].logprobs[j]) - lp[base + static_cast<int64_t>(j)]));
      ++n;
    }
  }
  std::printf(
      "multi-turn%s: rollout vs trainer CUDA log-probs over %lld sampled tokens (%lld "
      "appended): max |diff| %.3g\n",
      invariant ? " (batch_invariant)" : "", static_cast<long long>(n),
      static_cast<long long>(appended), worst);
  if (invariant) {
    EXPECT_EQ(worst, 0.0);
  } else {
    EXPECT_LE(worst, kModelLogprob.atol);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, MultiTurnCuda, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "BatchInvariant" : "Default";
                         });

}  // namespace
}  // namespace verl::ops::cuda::test
