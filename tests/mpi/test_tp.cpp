// Tensor-parallel generation on CPU ranks (model/tp.h) in groups of two ranks under mpirun: the
// slice + all-reduce step equals the whole model's step (prefill and decode logits) for the
// golden qwen2 (q/k/v biases, tied head), llama3 and qwen3 (q/k norm) models and for a model with
// every bias and an odd vocabulary; greedy tokens and their log-probs with TP 2 equal TP 1; the
// error for heads that do not divide; the layout PpoConfig makes of the key and the rank count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "core/rng.h"
#include "dist/mpi_communicator.h"
#include "model/cpu/decoder.h"
#include "model/tp.h"
#include "rollout/engine.h"
#include "trainer/ppo_config.h"
#include "trainer/rollout_worker.h"

namespace verl::model {
namespace {

const std::string kGolden = std::string(VERL_SOURCE_DIR) + "/tests/fixtures/golden/";

dist::MpiCommunicator& world() {
  static dist::MpiCommunicator c(/*timeout_s=*/60);
  return c;
}

// Groups of two consecutive ranks (TP 2), as the trainer forms them.
dist::Communicator& pair() {
  static std::unique_ptr<dist::Communicator> g = world().split(world().rank() / 2, world().rank());
  return *g;
}

// The logits of a prefill of `seqs` (every token's row) and then one decode step of token
// `next[b]` each, over a paged cache of this weights' kv heads: [(sum len + B), V].
std::vector<float> step_logits(const Weights& w, const TpContext* tp,
                               const std::vector<std::vector<int32_t>>& seqs,
                               const std::vector<int32_t>& next) {
  const ModelConfig& c = w.config;
  const int64_t bs = 4, W = 8, B = static_cast<int64_t>(seqs.size());
  const int64_t stride = B * W * bs * c.num_key_value_heads * c.head_dim;
  std::vector<float> k(static_cast<size_t>(stride * c.num_hidden_layers)), v(k.size());
  std::vector<int32_t> tables(static_cast<size_t>(B * W));
  for (int64_t i = 0; i < B * W; ++i) tables[i] = static_cast<int32_t>(i);
  const int64_t V = tp ? tp->vocab_size : c.vocab_size;
  cpu::Decoder dec(w);
  cpu::StepWorkspace ws;
  std::vector<float> out;
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<int32_t> ids, pos, cu{0}, slots, rows;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t len = static_cast<int64_t>(seqs[b].size());
      for (int64_t i = pass == 0 ? 0 : len; i < (pass == 0 ? len : len + 1); ++i) {
        ids.push_back(pass == 0 ? seqs[b][i] : next[b]);
        pos.push_back(static_cast<int32_t>(i));
        slots.push_back(static_cast<int32_t>(b * W * bs + i));
        rows.push_back(static_cast<int32_t>(rows.size()));
      }
      cu.push_back(static_cast<int32_t>(ids.size()));
    }
    const cpu::Tokens t{static_cast<int64_t>(ids.size()), B, ids.data(), pos.data(), cu.data()};
    const cpu::PagedKv kv{k.data(), v.data(), stride, bs, slots.data(), tables.data(), W};
    std::vector<float> logits(rows.size() * static_cast<size_t>(V));
    dec.forward_step(t, kv, rows, logits.data(), ws, tp);
    out.insert(out.end(), logits.begin(), logits.end());
  }
  return out;
}

std::vector<int32_t> random_tokens(Rng& rng, int64_t n, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng.below(vocab));
  return t;
}

// The slice's step against the whole model's on the same tokens: every logit within 1e-5.
void expect_slice_equals_whole(const Weights& w) {
  if (world().world_size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  trainer::CommTpGroup group(pair());
  const TpSlice s = tp_slice(w, group.rank(), group.size());
  const TpContext ctx = tp_context(s, group);
  Rng rng(5);
  const int64_t V = w.config.vocab_size;
  const std::vector<std::vector<int32_t>> seqs = {random_tokens(rng, 5, V),
                                                  random_tokens(rng, 11, V)};
  const std::vector<int32_t> next = random_tokens(rng, 2, V);
  const std::vector<float> whole = step_logits(w, nullptr, seqs, next);
  const std::vector<float> tp = step_logits(s.weights, &ctx, seqs, next);
  ASSERT_EQ(tp.size(), whole.size());
  ASSERT_EQ(whole.size(), static_cast<size_t>((5 + 11 + 2) * V));
  double worst = 0, largest = 0;
  for (size_t i = 0; i < whole.size(); ++i) {
    worst = std::max(worst, std::fabs(double(tp[i]) - whole[i]));
    largest = std::max(largest, std::fabs(double(whole[i])));
  }
  EXPECT_LE(worst, 1e-5) << w.config.architecture << " (largest logit " << largest << ")";
  EXPECT_GT(largest, 1e-3);  // the logits are not all zero
  // Every rank of the group holds the same logits (they are gathered).
  std::vector<float> first = tp;
  pair().broadcast(std::span<float>(first), 0);
  EXPECT_EQ(first, tp);
}

class TpGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(TpGolden, SliceStepEqualsWholeModelStep) {
  expect_slice_equals_whole(Weights::load(kGolden + GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Families, TpGolden, ::testing::Values("qwen2", "llama3", "qwen3"));

// A Llama with q/k/v, o and MLP biases (row-parallel biases are added once, after the sum), a tied
// head and an odd vocabulary (the last rank's rows are padded).
Weights biased_odd_vocab_model() {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.model_type = "llama";
  c.family = Family::Llama;
  c.vocab_size = 257;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = true;
  c.attention_bias = c.o_proj_bias = c.mlp_bias = true;
  Weights w = Weights::from_config(c);
  w.init_random(17, 0.2f);
  Rng rng(23);
  for (const LayerParams& p : w.layout.layers)
    for (int b : {p.bqkv, p.bo, p.bgu, p.bdown})
      for (int64_t i = 0; i < w.layout.params[b].numel; ++i)
        w.param(b)[i] = 0.1f * static_cast<float>(rng.normal());
  return w;
}

TEST(Tp, BiasesAndAnOddVocabularyStepEqualsWholeModel) {
  const Weights w = biased_odd_vocab_model();
  expect_slice_equals_whole(w);
  // 257 rows split two ways: 129 each, the second rank's last row zero padding.
  const TpSlice s = tp_slice(w, 1, 2);
  EXPECT_EQ(s.weights.config.vocab_size, 129);
  EXPECT_EQ(s.vocab_begin, 129);
  const float* pad = s.weights.param(s.weights.layout.embed) + 128 * 32;
  EXPECT_TRUE(std::all_of(pad, pad + 32, [](float x) { return x == 0.0f; }));
  EXPECT_EQ(s.weights.param(s.weights.layout.embed)[0], w.param(w.layout.embed)[129 * 32]);
}

TEST(Tp, SliceSplitsHeadsAndRows) {
  const Weights w = Weights::load(kGolden + "qwen3");
  const TpSlice s = tp_slice(w, 1, 2);
  const ModelConfig& c = s.weights.config;
  EXPECT_EQ(c.num_attention_heads, 2);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.head_dim, 24);
  EXPECT_EQ(c.intermediate_size, 48);
  EXPECT_EQ(c.vocab_size, 128);
  // Rank 1's first k row is the whole model's k head 1 (row qd + D of wqkv).
  const int64_t C = 64, D = 24;
  const float* mine = s.weights.param(s.weights.layout.layers[0].wqkv) + (2 * D) * C;
  const float* whole = w.param(w.layout.layers[0].wqkv) + (4 * D + D) * C;
  EXPECT_TRUE(std::equal(mine, mine + C, whole));
  // Its wo holds the whole wo's columns [2D, 4D).
  EXPECT_EQ(s.weights.param(s.weights.layout.layers[0].wo)[1 * 2 * D],
            w.param(w.layout.layers[0].wo)[1 * 4 * D + 2 * D]);
}

TEST(Tp, HeadsThatDoNotDivideAreRefusedByName) {
  const Weights w = Weights::load(kGolden + "llama3");  // 4 query heads, 2 kv heads
  const std::string e = test::expected_error_of([&] { tp_slice(w, 0, 4); });
  EXPECT_NE(e.find("tensor_model_parallel_size=4"), std::string::npos) << e;
  EXPECT_NE(e.find("num_attention_heads (4)"), std::string::npos) << e;
  EXPECT_NE(e.find("num_key_value_heads (2)"), std::string::npos) << e;
  const std::string f = test::expected_error_of([&] { tp_slice(w, 0, 3); });
  EXPECT_NE(f.find("tensor_model_parallel_size=3"), std::string::npos) << f;
  // The trainer checks before its first step with the same words.
  EXPECT_EQ(test::expected_error_of([&] { check_tp_split(w.config, 4); }), e);
  EXPECT_EQ(test::error_of([&] { check_tp_split(w.config, 2); }), "");
}

// The top-2 margin of the next-token logits after `prefix` on the whole model.
double top2_margin(const Weights& w, const std::vector<int32_t>& prefix) {
  std::vector<int32_t> head(prefix.begin(), prefix.end() - 1);
  const std::vector<float> l = step_logits(w, nullptr, {head}, {prefix.back()});
  const int64_t V = w.config.vocab_size;
  std::vector<float> last(l.end() - V, l.end());
  std::partial_sort(last.begin(), last.begin() + 2, last.end(), std::greater<>());
  return double(last[0]) - last[1];
}

TEST_P(TpGolden, GreedyTokensAndLogProbsEqualOneRank) {
  if (world().world_size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  const Weights w = Weights::load(kGolden + GetParam());
  trainer::CommTpGroup group(pair());
  const TpSlice s = tp_slice(w, group.rank(), group.size());
  const TpContext ctx = tp_context(s, group);
  rollout::EngineConfig ec;
  ec.scheduler.num_blocks = 256;
  ec.scheduler.block_size = 4;
  ec.scheduler.max_model_len = 128;
  ec.scheduler.max_num_seqs = 64;
  ec.scheduler.max_num_batched_tokens = 64;  // chunked prefill of the 70-token prompt
  Rng rng(11);
  std::vector<rollout::Request> reqs;
  for (int64_t len : {3, 9, 70}) {
    rollout::Request r;
    r.prompt = random_tokens(rng, len, w.config.vocab_size);
    r.params.temperature = 0.0f;
    r.params.max_tokens = 12;
    r.params.ignore_eos = true;
    reqs.push_back(r);
  }
  rollout::Engine one(w, ec);
  const std::vector<rollout::Completion> ref = one.generate(reqs);
  rollout::CpuStepRunner runner(s.weights, ec.scheduler.num_blocks, ec.scheduler.block_size, &ctx);
  rollout::Engine two(runner, ec);
  const std::vector<rollout::Completion> got = two.generate(reqs);
  ASSERT_EQ(got.size(), ref.size());
  int64_t compared = 0;
  for (size_t r = 0; r < ref.size(); ++r) {
    ASSERT_EQ(got[r].tokens.size(), 12u);
    std::vector<int32_t> prefix = reqs[r].prompt;
    for (size_t j = 0; j < ref[r].tokens.size(); ++j) {
      if (got[r].tokens[j] != ref[r].tokens[j]) {
        // A tie within rounding may go either way; anything else is a bug.
        EXPECT_LT(top2_margin(w, prefix), 1e-4) << "request " << r << " token " << j;
        break;
      }
      EXPECT_NEAR(got[r].logprobs[j], ref[r].logprobs[j], 1e-5)
          << "request " << r << " token " << j;
      prefix.push_back(ref[r].tokens[j]);
      ++compared;
    }
    // Both ranks of the group produced the same tokens.
    std::vector<int32_t> mine = got[r].tokens;
    pair().broadcast(std::span<int32_t>(mine), 0);
    EXPECT_EQ(mine, got[r].tokens);
  }
  EXPECT_GE(compared, 30);  // divergence is the rare exception
}

// The layout PpoConfig makes of the key and the ranks (no collectives: any rank count).
TEST(TpConfig, ResolvedFromTheKeyAndTheRanks) {
  const std::string k = "actor_rollout_ref.rollout.tensor_model_parallel_size";
  auto read = [&](int world, std::vector<std::string> o) {
    return trainer::PpoConfig::read(test::demo_config(o), world, world > 1).rollout;
  };
  // verl's default (2) left unset splits nothing, and says so.
  trainer::RolloutKeys r = read(4, {});
  EXPECT_EQ(r.tensor_parallel, 1);
  EXPECT_NE(r.tensor_parallel_note.find("left at verl's default 2"), std::string::npos);
  r = read(4, {k + "=2"});
  EXPECT_EQ(r.tensor_parallel, 2);
  EXPECT_EQ(r.tensor_parallel_note, "");
  r = read(4, {k + "=4"});
  EXPECT_EQ(r.tensor_parallel, 4);
  // Fewer ranks than asked for: all of them when they divide it, else one.
  r = read(2, {k + "=4"});
  EXPECT_EQ(r.tensor_parallel, 2);
  EXPECT_NE(r.tensor_parallel_note.find(k + "=4 with 2 rank(s): tensor parallel size 2 instead"),
            std::string::npos)
      << r.tensor_parallel_note;
  EXPECT_EQ(read(2, {k + "=3"}).tensor_parallel, 1);
  EXPECT_EQ(read(1, {k + "=2"}).tensor_parallel, 1);
  std::string e = test::expected_error_of([&] { read(4, {k + "=3"}); });
  EXPECT_NE(e.find(k + "=3 must divide the 4 ranks"), std::string::npos) << e;
  e = test::expected_error_of([&] { read(4, {k + "=2", "trainer.one_step_off_policy=true"}); });
  EXPECT_NE(e.find("trainer.one_step_off_policy=true with " + k + "=2"), std::string::npos) << e;
}

}  // namespace
}  // namespace verl::model
