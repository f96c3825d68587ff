// The rollout engine on the real CPU model: greedy generation equals the argmax chain of full
// forwards, decode logits equal a full forward's, a sequence's tokens and log-probs are
// bit-identical alone, in a batch of 64, forked from a shared prefix, or preempted and recomputed,
// and the reported log-probs equal the trainer's (verl logprobs) on the same tokens.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "../common/test_util.h"
#include "core/dump.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/transformer.h"
#include "rollout/engine.h"

namespace verl::rollout {
namespace {

const std::string kGolden = std::string(VERL_SOURCE_DIR) + "/tests/fixtures/golden/";

std::vector<int32_t> random_tokens(Rng& rng, int64_t n, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng.below(vocab));
  return t;
}

// Full next-token logits of every position of `seq`, by the training forward (independent of the
// rollout code path): h_final @ W_lm^T.
std::vector<float> full_logits(const model::Transformer& tf, const std::vector<int32_t>& seq) {
  const model::ModelConfig& c = tf.weights().config;
  model::PackedBatch b = model::PackedBatch::from_sequences({seq});
  model::Activations acts;
  tf.forward(b, acts);
  const int64_t T = b.num_tokens(), C = c.hidden_size, V = c.vocab_size;
  const float* w = tf.weights().lm_head();
  std::vector<float> out(static_cast<size_t>(T * V));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = 0; v < V; ++v) {
      double s = 0;
      for (int64_t k = 0; k < C; ++k) s += double(acts.h_final[t * C + k]) * w[v * C + k];
      out[t * V + v] = static_cast<float>(s);
    }
  return out;
}

EngineConfig small_engine(int32_t num_blocks = 256, int32_t block_size = 4) {
  EngineConfig cfg;
  cfg.scheduler.num_blocks = num_blocks;
  cfg.scheduler.block_size = block_size;
  cfg.scheduler.max_model_len = 128;
  cfg.scheduler.max_num_seqs = 64;
  cfg.scheduler.max_num_batched_tokens = 64;  // forces chunked prefill of longer prompts
  return cfg;
}

class GreedyGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(GreedyGolden, GreedyEqualsArgmaxChainOfFullForwards) {
  model::Weights w = model::Weights::load(kGolden + GetParam());
  model::Transformer tf(w);
  Engine engine(w, small_engine());
  Rng rng(11);
  std::vector<Request> reqs;
  for (int64_t len : {3, 9, 70}) {  // 70 > the 64-token step budget: chunked prefill
    Request r;
    r.prompt = random_tokens(rng, len, w.config.vocab_size);
    r.params.temperature = 0.0f;
    r.params.max_tokens = 10;
    r.params.ignore_eos = true;
    reqs.push_back(r);
  }
  std::vector<Completion> out = engine.generate(reqs);
  ASSERT_EQ(out.size(), reqs.size());
  const int64_t V = w.config.vocab_size;
  for (size_t r = 0; r < reqs.size(); ++r) {
    ASSERT_EQ(out[r].tokens.size(), 10u);
    EXPECT_EQ(out[r].finish_reason, FinishReason::Length);
    std::vector<int32_t> seq = reqs[r].prompt;
    seq.insert(seq.end(), out[r].tokens.begin(), out[r].tokens.end() - 1);
    std::vector<float> logits = full_logits(tf, seq);
    for (size_t i = 0; i < out[r].tokens.size(); ++i) {
      const float* row = logits.data() + (reqs[r].prompt.size() - 1 + i) * V;
      int64_t best = std::max_element(row, row + V) - row;
      EXPECT_EQ(out[r].tokens[i], best) << "request " << r << " token " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, GreedyGolden, ::testing::Values("qwen2", "llama3", "qwen3"));

// Drives the scheduler and runner by hand to see each step's logits.
TEST(ModelRunner, DecodeLogitsEqualFullForward) {
  model::Weights w = model::Weights::load(kGolden + "qwen3");
  model::Transformer tf(w);
  EngineConfig cfg = small_engine();
  KVCache cache(w.config, cfg.scheduler.num_blocks, cfg.scheduler.block_size);
  CpuModelRunner runner(w, cache);
  Scheduler sched(cfg.scheduler);
  Rng rng(5);
  SamplingParams sp;
  sp.temperature = 0.0f;
  sp.max_tokens = 6;
  sp.ignore_eos = true;
  Sequence seq(0, random_tokens(rng, 13, w.config.vocab_size), sp);
  sched.add(&seq);
  const int64_t V = w.config.vocab_size;
  std::vector<std::vector<float>> step_logits;
  std::vector<float> logits;
  while (sched.has_unfinished()) {
    const ScheduledBatch& b = sched.schedule();
    runner.run(b, logits);
    ASSERT_EQ(b.num_samples(), 1);
    step_logits.emplace_back(logits.begin(), logits.begin() + V);
    const float* row = logits.data();
    int32_t tok = static_cast<int32_t>(std::max_element(row, row + V) - row);
    float lp = 0;
    sched.postprocess(b, std::span<const int32_t>(&tok, 1), std::span<const float>(&lp, 1));
  }
  std::vector<int32_t> all(seq.token_ids().begin(), seq.token_ids().end() - 1);
  std::vector<float> ref = full_logits(tf, all);
  ASSERT_EQ(step_logits.size(), 6u);
  double worst = 0;
  for (size_t i = 0; i < step_logits.size(); ++i) {
    const float* r = ref.data() + (seq.num_prompt_tokens() - 1 + i) * V;
    for (int64_t v = 0; v < V; ++v)
      worst = std::max(worst, std::fabs(double(step_logits[i][v]) - r[v]));
  }
  EXPECT_LE(worst, 1e-5);
}

struct Probe {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

Probe run_probe(const model::Weights& w, EngineConfig cfg, const Request& probe, int others, int n,
                int64_t* preemptions = nullptr) {
  Rng rng(99);
  std::vector<Request> reqs;
  for (int i = 0; i < others / 2; ++i) {
    Request r;
    r.prompt = random_tokens(rng, 2 + rng.below(20), w.config.vocab_size);
    r.params = probe.params;
    r.params.seed = 1000 + i;
    reqs.push_back(r);
  }
  Request p = probe;
  p.n = n;
  reqs.push_back(p);
  for (int i = others / 2; i < others; ++i) {
    Request r;
    r.prompt = random_tokens(rng, 2 + rng.below(20), w.config.vocab_size);
    r.params = probe.params;
    r.params.seed = 1000 + i;
    reqs.push_back(r);
  }
  Engine engine(w, cfg);
  std::vector<Completion> out = engine.generate(reqs);
  if (preemptions) *preemptions = engine.stats().preemptions;
  // The probe's sample 0 (request index others/2).
  for (const Completion& c : out) {
    if (c.request == others / 2 && c.sample == 0) return {c.tokens, c.logprobs};
  }
  ADD_FAILURE() << "probe not found";
  return {};
}

TEST(Engine, BatchInvariantAloneInBatchSharedAndPreempted) {
  model::Weights w = model::Weights::load(kGolden + "llama3");
  Request probe;
  Rng rng(3);
  probe.prompt = random_tokens(rng, 11, w.config.vocab_size);
  probe.params.temperature = 1.0f;
  probe.params.top_p = 0.9f;
  probe.params.max_tokens = 24;
  probe.params.ignore_eos = true;
  probe.params.seed = 42;

  Probe alone = run_probe(w, small_engine(), probe, 0, 1);
  ASSERT_EQ(alone.tokens.size(), 24u);
  Probe in_batch = run_probe(w, small_engine(), probe, 63, 1);
  EXPECT_EQ(in_batch.tokens, alone.tokens);
  EXPECT_EQ(in_batch.logprobs, alone.logprobs);  // bitwise

  // Sample 0 of a group of 4 with the prompt prefilled once and shared, and without sharing.
  Probe shared = run_probe(w, small_engine(), probe, 7, 4);
  EXPECT_EQ(shared.tokens, alone.tokens);
  EXPECT_EQ(shared.logprobs, alone.logprobs);
  EngineConfig no_share = small_engine();
  no_share.scheduler.enable_prefix_sharing = false;
  Probe unshared = run_probe(w, no_share, probe, 7, 4);
  EXPECT_EQ(unshared.tokens, alone.tokens);
  EXPECT_EQ(unshared.logprobs, alone.logprobs);

  // A pool too small for everyone at once: sequences are preempted and recomputed.
  int64_t preemptions = 0;
  Probe tight =
      run_probe(w, small_engine(/*num_blocks=*/40, /*block_size=*/4), probe, 31, 1, &preemptions);
  EXPECT_GT(preemptions, 0);
  EXPECT_EQ(tight.tokens, alone.tokens);
  EXPECT_EQ(tight.logprobs, alone.logprobs);
}

TEST(Engine, ReportedLogprobsEqualTrainerLogprobs) {
  model::Weights w = model::Weights::load(kGolden + "qwen2");
  model::Transformer tf(w);
  Engine engine(w, small_engine());
  Rng rng(8);
  std::vector<Request> reqs;
  for (int i = 0; i < 4; ++i) {
    Request r;
    r.prompt = random_tokens(rng, 5 + 3 * i, w.config.vocab_size);
    r.params.temperature = 0.7f;
    r.params.top_k = 20;
    r.params.max_tokens = 16;
    r.params.ignore_eos = true;
    r.params.seed = 7;
    r.n = 2;
    reqs.push_back(r);
  }
  std::vector<Completion> out = engine.generate(reqs);
  ASSERT_EQ(out.size(), 8u);
  std::vector<std::vector<int32_t>> seqs;
  for (const Completion& c : out) {
    std::vector<int32_t> s = reqs[c.request].prompt;
    s.insert(s.end(), c.tokens.begin(), c.tokens.end());
    seqs.push_back(s);
  }
  model::PackedBatch b = model::PackedBatch::from_sequences(seqs);
  model::Activations acts;
  model::ForwardOptions opt;
  opt.temperature = 0.7f;
  tf.forward(b, acts, opt);
  double worst = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t P = static_cast<int64_t>(reqs[out[i].request].prompt.size());
    for (size_t j = 0; j < out[i].tokens.size(); ++j) {
      const float trainer = acts.logprob[b.cu_seqlens[i] + P - 1 + j];
      worst = std::max(worst, std::fabs(double(trainer) - out[i].logprobs[j]));
    }
  }
  EXPECT_LE(worst, 1e-5);
  // The two samples of a group differ (distinct Philox streams).
  EXPECT_NE(out[0].tokens, out[1].tokens);
}

TEST(Engine, PrefixSharingComputesThePromptOncePerGroup) {
  model::Weights w = model::Weights::load(kGolden + "qwen2");
  Rng rng(4);
  std::vector<Request> reqs;
  for (int i = 0; i < 4; ++i) {
    Request r;
    r.prompt = random_tokens(rng, 32, w.config.vocab_size);
    r.params.max_tokens = 4;
    r.params.ignore_eos = true;
    r.n = 8;
    reqs.push_back(r);
  }
  Engine engine(w, small_engine());
  engine.generate(reqs);
  EXPECT_EQ(engine.stats().prompt_tokens_without_sharing, 4 * 8 * 32);
  EXPECT_EQ(engine.stats().prompt_tokens_computed, 4 * 32);
}

// rollout.length_dist's forced lengths: sample i of a request ends as at its EOS after eos_at[i]
// tokens (finish reason "stop"), capped by max_tokens (then "length"); 0 leaves a sample alone; a
// list of the wrong size is refused naming the request.
TEST(Engine, ForcedLengthsEndSamplesAsTheirEos) {
  model::Weights w = model::Weights::load(kGolden + "qwen2");
  Rng rng(5);
  Request r;
  r.prompt = random_tokens(rng, 9, w.config.vocab_size);
  r.params.max_tokens = 10;
  r.params.ignore_eos = true;
  r.n = 4;
  r.eos_at = {3, 1, 0, 25};
  Engine engine(w, small_engine());
  const std::vector<Completion> out = engine.generate({r});
  ASSERT_EQ(out.size(), 4u);
  const size_t want_len[] = {3, 1, 10, 10};
  const FinishReason want_reason[] = {FinishReason::Stop, FinishReason::Stop, FinishReason::Length,
                                      FinishReason::Stop};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(out[i].tokens.size(), want_len[i]) << "sample " << i;
    EXPECT_EQ(out[i].finish_reason, want_reason[i]) << "sample " << i;
  }
  // The forced stop keeps the model's own samples: sample 0's tokens are the unforced sample's
  // first three.
  Request plain = r;
  plain.eos_at.clear();
  const std::vector<Completion> free_run = engine.generate({plain});
  EXPECT_TRUE(std::equal(out[0].tokens.begin(), out[0].tokens.end(), free_run[0].tokens.begin()));
  r.eos_at = {3, 1};
  try {
    engine.generate({r});
    FAIL() << "two lengths for four samples were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("request 0: 2 forced lengths"), std::string::npos)
        << e.what();
  }
}

TEST(Engine, SequenceThatCanNeverFitIsAClearError) {
  model::Weights w = model::Weights::load(kGolden + "qwen2");
  Engine engine(w, small_engine(/*num_blocks=*/4, /*block_size=*/4));
  Request r;
  r.prompt = std::vector<int32_t>(10, 1);
  r.params.max_tokens = 20;
  try {
    engine.generate({r});
    FAIL() << "expected an error";
  } catch (const verl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("can never fit"), std::string::npos) << e.what();
  }
}

// The rollout runs the trainer's decoder layers, but its steps write no named intermediates: a
// generation under VERL_DUMP must not overwrite the trainer's dump, and dumping changes nothing.
TEST(Engine, RolloutStepsWriteNoDumpAndDumpingChangesNothing) {
  model::Weights w = model::Weights::load(kGolden + "qwen3");
  Request r;
  Rng rng(21);
  r.prompt = random_tokens(rng, 9, w.config.vocab_size);
  r.params.temperature = 1.0f;
  r.params.seed = 5;
  r.params.max_tokens = 6;
  r.params.ignore_eos = true;
  const std::vector<Completion> plain = Engine(w, small_engine()).generate({r});

  namespace fs = std::filesystem;
  const test::TempDir scratch("rollout_dump");
  const fs::path& dir = scratch.path();
  dump::set_dir(dir.string());
  const std::vector<Completion> dumped = Engine(w, small_engine()).generate({r});
  dump::set_dir("");
  EXPECT_FALSE(fs::exists(dir / "cpu")) << "the rollout wrote a dump under " << dir;
  ASSERT_EQ(plain.size(), 1u);
  ASSERT_EQ(dumped.size(), 1u);
  EXPECT_EQ(plain[0].tokens, dumped[0].tokens);
  EXPECT_EQ(plain[0].logprobs, dumped[0].logprobs);
}

}  // namespace
}  // namespace verl::rollout
