// The hybrid engine's two views of one policy on the GPU: the rollout runner (paged KV cache,
// decode kernels, src/rollout/cuda/model_runner.h) reads the trainer model's own bf16 weights
// (the training state's weights_bf16(), no copy), and the log-probs it reports for the tokens it
// sampled must agree with what the trainer's CUDA forward computes for the same tokens (the
// old_log_prob / rollout_log_prob that PPO's ratio compares). By default the two paths use
// different kernels (paged decode vs packed flash attention, GEMMs at other batch sizes) with the
// same rounding points, so they agree to accumulation-order noise, not bit for bit; the test prints
// the largest difference. With batch_invariant on both sides (batch-invariant GEMMs, the training
// attention kernel over the paged cache, the trainer's LM-head op for the sampled tokens) they are
// equal. A third mode, match_trainer_numerics (decode attention on the training kernel's
// arithmetic, one GEMM split-K choice per shape on both sides), must agree within 1e-3; it measures
// about 1e-6.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
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

enum class Mode { kDefault, kMatchTrainer, kBatchInvariant };

class RolloutVsTrainerModes : public CudaTest, public ::testing::WithParamInterface<Mode> {};

TEST_P(RolloutVsTrainerModes, SampledLogprobsMatchTheTrainersCudaForward) {
  const bool invariant = GetParam() == Mode::kBatchInvariant;
  const bool match = GetParam() == Mode::kMatchTrainer;
  for (const char* family : {"qwen2", "llama3", "qwen3"}) {
    SCOPED_TRACE(std::string(family) + (invariant ? " batch_invariant" : ""));
    model::Weights w = model::Weights::load(kGolden + family);
    const int64_t V = w.config.vocab_size;
    // Prompts of several lengths, n = 4 samples each at temperature 0.8 (the trainer's forward
    // divides the logits by the same temperature).
    Rng rng(7);
    std::vector<rollout::Request> reqs;
    for (int64_t len : {5, 23, 40}) {
      rollout::Request r;
      r.prompt.resize(static_cast<size_t>(len));
      for (auto& t : r.prompt) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(V)));
      r.params.temperature = 0.8f;
      r.params.max_tokens = 48;
      r.params.ignore_eos = true;
      r.params.seed = 77 + static_cast<uint64_t>(len);
      r.n = 4;
      reqs.push_back(r);
    }
    rollout::EngineConfig cfg;
    cfg.scheduler.num_blocks = 64;
    cfg.scheduler.block_size = 16;
    cfg.scheduler.max_model_len = 128;
    cfg.scheduler.max_num_seqs = 16;
    cfg.scheduler.max_num_batched_tokens = 256;

    // The trainer's model; the runner reads its bf16 weights.
    const int64_t max_tokens = 12 * 128;
    model::cuda::CudaTransformerOptions to;
    to.max_tokens = max_tokens;
    to.max_seqs = 12;
    to.trainable = false;
    to.numerics = numerics_from_flags(invariant, match);
    optim::cuda::CudaTrainState state(ctx(), w, /*trainable=*/false);
    model::cuda::CudaTransformer tf(ctx(), w.config, w.layout, state.weights_bf16(), nullptr, to);
    rollout::cuda::CudaRunnerOptions ro;
    ro.numerics = to.numerics;
    ro.kv_blocks = cfg.scheduler.num_blocks;
    ro.kv_cache_bytes = int64_t{1} << 40;  // the block count decides
    rollout::cuda::CudaModelRunner runner(ctx(), tf.config(), tf.layout(), state.weights_bf16(),
                                          cfg.scheduler, ro);
    rollout::Engine engine(runner, cfg);
    const std::vector<rollout::Completion> done = engine.generate(reqs);
    ASSERT_EQ(done.size(), 12u);

    // Pack prompt + response of every sample; response token j is scored at position
    // prompt_len - 1 + j of its sequence.
    std::vector<std::vector<int32_t>> seqs;
    for (const rollout::Completion& c : done) {
      std::vector<int32_t> s = reqs[static_cast<size_t>(c.request)].prompt;
      s.insert(s.end(), c.tokens.begin(), c.tokens.end());
      seqs.push_back(std::move(s));
    }
    model::PackedBatch b = model::PackedBatch::from_sequences(seqs);
    tf.forward(b, 0.8f, /*for_backward=*/false);
    const std::vector<float> lp = tf.download_logprob();
    double worst = 0, sum = 0;
    int64_t n = 0;
    for (size_t i = 0; i < done.size(); ++i) {
      const int64_t base =
          b.cu_seqlens[i] +
          static_cast<int64_t>(reqs[static_cast<size_t>(done[i].request)].prompt.size()) - 1;
      for (size_t j = 0; j < done[i].tokens.size(); ++j) {
        const double d =
            std::fabs(double(done[i].logprobs[j]) - lp[base + static_cast<int64_t>(j)]);
        worst = std::max(worst, d);
        sum += d;
        ++n;
      }
    }
    std::printf(
        "%s%s: rollout vs trainer CUDA log-probs over %lld sampled tokens: max |diff| %.3g, "
        "mean %.3g\n",
        family,
        invariant ? " (batch_invariant)"
        : match   ? " (match_trainer_numerics)"
                  : "",
        static_cast<long long>(n), worst, sum / static_cast<double>(n));
    if (invariant) {
      EXPECT_EQ(worst, 0.0);
    } else if (match) {
      EXPECT_LE(worst, 1e-3);
    } else {
      EXPECT_LE(worst, kModelLogprob.atol);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, RolloutVsTrainerModes,
                         ::testing::Values(Mode::kDefault, Mode::kMatchTrainer,
                                           Mode::kBatchInvariant),
                         [](const ::testing::TestParamInfo<Mode>& i) {
                           return i.param == Mode::kBatchInvariant ? "BatchInvariant"
                                  : i.param == Mode::kMatchTrainer ? "MatchTrainer"
                                                                   : "Default";
                         });

}  // namespace
}  // namespace verl::ops::cuda::test
