// The engine's multi-turn mode (the agent loop's token-in/token-out) on the real CPU model: a
// paused sample keeps its KV cache and each continuation is prefilled alone (the appended tokens
// plus the turn's last token), the mask marks appended tokens, the log-probs of every sampled
// token equal the trainer's forward over the whole trajectory, and a sample's trajectory does not
// depend on what else runs beside it.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/rng.h"
#include "model/transformer.h"
#include "rollout/engine.h"

namespace verl::rollout {
namespace {

const std::string kGolden = std::string(VERL_SOURCE_DIR) + "/tests/fixtures/golden/";

// Appends `turn_len[t]` tokens (a fixed pattern) after turn t, ends the trajectory after
// turn_len.size() turns. Continuations are answered at the next poll (as an instant tool).
class ScriptedTurns final : public TurnHandler {
 public:
  explicit ScriptedTurns(std::vector<int32_t> turn_len) : turn_len_(std::move(turn_len)) {}
  void turn_ended(int64_t request, int32_t sample, std::span<const int32_t>) override {
    int32_t& t = turns_[{request, sample}];
    Continuation k{request, sample, {}, false};
    if (t >= static_cast<int32_t>(turn_len_.size())) {
      k.end = true;
    } else {
      for (int32_t i = 0; i < turn_len_[t]; ++i) k.append.push_back((3 * i + t + 11) % 50);
    }
    ++t;
    ready_.push_back(std::move(k));
  }
  void poll(std::vector<Continuation>& out, bool wait) override {
    EXPECT_TRUE(!wait || !ready_.empty()) << "the engine waits on a handler with nothing pending";
    for (auto& k : ready_) out.push_back(std::move(k));
    ready_.clear();
  }
  std::map<std::pair<int64_t, int32_t>, int32_t> turns_;

 private:
  std::vector<int32_t> turn_len_;
  std::vector<Continuation> ready_;
};

// Forwards to the CPU runner, recording every item's (sequence, start, new tokens).
class RecordingRunner final : public StepRunner {
 public:
  RecordingRunner(const model::Weights& w, int32_t blocks, int32_t block_size)
      : inner_(w, blocks, block_size) {}
  int32_t num_blocks() const override { return inner_.num_blocks(); }
  int32_t block_size() const override { return inner_.block_size(); }
  int64_t vocab_size() const override { return inner_.vocab_size(); }
  StepRunnerStats stats() const override { return inner_.stats(); }
  void step(const ScheduledBatch& batch, std::span<int32_t> tokens,
            std::span<float> logprobs) override {
    for (const ScheduledItem& it : batch.items)
      chunks[it.seq->id()].push_back({it.start_pos, it.num_new_tokens});
    inner_.step(batch, tokens, logprobs);
  }
  std::map<int64_t, std::vector<std::pair<int32_t, int32_t>>> chunks;

 private:
  CpuStepRunner inner_;
};

EngineConfig config() {
  EngineConfig cfg;
  cfg.scheduler.num_blocks = 512;
  cfg.scheduler.block_size = 4;
  cfg.scheduler.max_model_len = 256;
  cfg.scheduler.max_num_seqs = 16;
  cfg.scheduler.max_num_batched_tokens = 128;
  return cfg;
}

std::vector<Request> requests(int64_t vocab) {
  Rng rng(21);
  std::vector<Request> reqs;
  for (int i = 0; i < 3; ++i) {
    Request r;
    for (int j = 0; j < 6 + 5 * i; ++j) r.prompt.push_back(static_cast<int32_t>(rng.below(vocab)));
    r.params.temperature = 1.0f;
    r.params.max_tokens = 120;
    r.params.seed = 5 + i;
    // A quarter of the vocabulary ends a turn, so turns are a few tokens long.
    for (int32_t t = 0; t < vocab; t += 4) r.params.stop_token_ids.push_back(t);
    r.n = 2;
    reqs.push_back(r);
  }
  return reqs;
}

TEST(MultiTurn, ContinuationsPrefillOnlyAppendedTokensAndMaskThem) {
  model::Weights w = model::Weights::load(kGolden + "qwen2");
  const std::vector<int32_t> turn_len = {5, 9, 3};
  RecordingRunner runner(w, 512, 4);
  Engine engine(runner, config());
  ScriptedTurns turns(turn_len);
  GenerateHooks hooks;
  hooks.turns = &turns;
  const std::vector<Request> reqs = requests(w.config.vocab_size);
  const std::vector<Completion> out = engine.generate(reqs, hooks);
  ASSERT_EQ(out.size(), 6u);

  int64_t appended = 0, reused = 0;
  int64_t seq_id = 0;
  for (const Completion& c : out) {
    ASSERT_EQ(c.generated.size(), c.tokens.size());
    const int64_t P = static_cast<int64_t>(reqs[c.request].prompt.size());
    // Walk the trajectory: sampled runs end at a stop token, then an appended run of turn_len[t].
    size_t j = 0;
    int32_t turn = 0;
    std::vector<std::pair<int32_t, int32_t>> expect_prefills;  // (start, tokens) per continuation
    while (j < c.tokens.size()) {
      while (j < c.tokens.size() && c.generated[j]) ++j;
      if (j == c.tokens.size()) break;
      ASSERT_LT(turn, static_cast<int32_t>(turn_len.size()));
      // The appended run is exactly the scripted tokens, after the turn's stop token.
      EXPECT_TRUE(reqs[c.request].params.is_stop_token(c.tokens[j - 1]));
      for (int32_t i = 0; i < turn_len[turn]; ++i, ++j) {
        ASSERT_LT(j, c.tokens.size());
        EXPECT_EQ(c.generated[j], 0);
        EXPECT_EQ(c.tokens[j], (3 * i + turn + 11) % 50);
        EXPECT_EQ(c.logprobs[j], 0.0f);
      }
      // Its prefill: the stop token (whose KV no decode wrote) and the appended tokens, starting
      // where the cached context ends.
      const int32_t start = static_cast<int32_t>(P + j - turn_len[turn] - 1);
      expect_prefills.push_back({start, turn_len[turn] + 1});
      appended += turn_len[turn];
      reused += start;
      ++turn;
    }
    // Chunks of this sequence with more than one token after its first: exactly the prefills.
    const auto& chunks = runner.chunks.at(seq_id++);
    std::vector<std::pair<int32_t, int32_t>> prefills;
    for (const auto& chunk : chunks)
      if (chunk.first >= P && chunk.second > 1) prefills.push_back(chunk);
    EXPECT_EQ(prefills, expect_prefills) << "request " << c.request << " sample " << c.sample;
  }
  EXPECT_EQ(engine.stats().appended_tokens, appended);
  EXPECT_EQ(engine.stats().kv_reused_tokens, reused);
  EXPECT_GT(appended, 0);
  EXPECT_EQ(engine.stats().preemptions, 0);
}

TEST(MultiTurn, SampledLogprobsEqualTrainerOverTheWholeTrajectory) {
  model::Weights w = model::Weights::load(kGolden + "qwen2");
  model::Transformer tf(w);
  Engine engine(w, config());
  ScriptedTurns turns({4, 6});
  GenerateHooks hooks;
  hooks.turns = &turns;
  const std::vector<Request> reqs = requests(w.config.vocab_size);
  const std::vector<Completion> out = engine.generate(reqs, hooks);
  std::vector<std::vector<int32_t>> seqs;
  for (const Completion& c : out) {
    std::vector<int32_t> s = reqs[c.request].prompt;
    s.insert(s.end(), c.tokens.begin(), c.tokens.end());
    seqs.push_back(s);
  }
  model::PackedBatch b = model::PackedBatch::from_sequences(seqs);
  model::Activations acts;
  model::ForwardOptions opt;
  opt.temperature = 1.0f;
  tf.forward(b, acts, opt);
  double worst = 0;
  int64_t sampled = 0, tool = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t P = static_cast<int64_t>(reqs[out[i].request].prompt.size());
    for (size_t j = 0; j < out[i].tokens.size(); ++j) {
      if (!out[i].generated[j]) {
        ++tool;
        continue;
      }
      ++sampled;
      const float trainer = acts.logprob[b.cu_seqlens[i] + P - 1 + j];
      worst = std::max(worst, std::fabs(double(trainer) - out[i].logprobs[j]));
    }
  }
  EXPECT_GT(tool, 0);
  EXPECT_GT(sampled, tool / 4);
  EXPECT_LE(worst, 1e-5);
}

TEST(MultiTurn, TrajectoryDoesNotDependOnItsBatch) {
  model::Weights w = model::Weights::load(kGolden + "qwen2");
  const std::vector<Request> reqs = requests(w.config.vocab_size);
  auto run = [&](const std::vector<Request>& rs) {
    Engine engine(w, config());
    ScriptedTurns turns({3, 3});
    GenerateHooks hooks;
    hooks.turns = &turns;
    return engine.generate(rs, hooks);
  };
  const std::vector<Completion> all = run(reqs);
  const std::vector<Completion> alone = run({reqs[1]});
  ASSERT_EQ(alone.size(), 2u);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(alone[s].tokens, all[2 + s].tokens);
    EXPECT_EQ(alone[s].logprobs, all[2 + s].logprobs);
    EXPECT_EQ(alone[s].generated, all[2 + s].generated);
  }
}

// Continuations one a poll (tools finishing at different times), so samples stay paused while
// others run.
class OneAtATime final : public TurnHandler {
 public:
  void turn_ended(int64_t request, int32_t sample, std::span<const int32_t>) override {
    int32_t& t = turns_[{request, sample}];
    Continuation k{request, sample, {}, t >= 2};
    if (!k.end)
      for (int32_t i = 0; i < 6; ++i) k.append.push_back((5 * i + t + 3) % 50);
    ++t;
    ready_.push_back(std::move(k));
  }
  void poll(std::vector<Continuation>& out, bool wait) override {
    EXPECT_TRUE(!wait || !ready_.empty());
    if (ready_.empty()) return;
    out.push_back(std::move(ready_.front()));
    ready_.erase(ready_.begin());
  }

 private:
  std::map<std::pair<int64_t, int32_t>, int32_t> turns_;
  std::vector<Continuation> ready_;
};

TEST(MultiTurn, PausedSamplesUnderMemoryPressureReplayExactly) {
  model::Weights w = model::Weights::load(kGolden + "qwen2");
  std::vector<Request> reqs = requests(w.config.vocab_size);
  for (Request& r : reqs) r.params.max_tokens = 60;
  auto run = [&](int32_t blocks, int64_t* preemptions) {
    EngineConfig cfg = config();
    cfg.scheduler.num_blocks = blocks;
    Engine engine(w, cfg);
    OneAtATime turns;
    GenerateHooks hooks;
    hooks.turns = &turns;
    std::vector<Completion> out = engine.generate(reqs, hooks);
    *preemptions = engine.stats().preemptions;
    return out;
  };
  int64_t roomy = 0, tight = 0;
  const std::vector<Completion> a = run(512, &roomy);
  const std::vector<Completion> b = run(24, &tight);  // 96 tokens: one trajectory at a time
  EXPECT_EQ(roomy, 0);
  EXPECT_GT(tight, 0);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << i;
    EXPECT_EQ(a[i].logprobs, b[i].logprobs) << i;
    EXPECT_EQ(a[i].generated, b[i].generated) << i;
  }
}

}  // namespace
}  // namespace verl::rollout
