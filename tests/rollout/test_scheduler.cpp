// Scheduler: budgets per step, chunked prefill, preemption by recompute, group prefix sharing
// and rejection of impossible sequences. Generations are driven through a fake paged runner
// (fake_model.h) and compared token by token with a scheduler-free reference.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "core/error.h"
#include "core/rng.h"
#include "fake_model.h"
#include "rollout/scheduler.h"

namespace verl::rollout {
namespace {

using testing::FakeRunner;
using testing::reference_generate;

constexpr int32_t kVocab = 50;

struct Workload {
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<std::vector<Sequence*>> groups;
};

// Random groups of n samples: prompt lengths 1..60, max_tokens 1..40, EOS = token 0 for most.
Workload make_workload(int num_groups, int n, uint64_t seed) {
  Workload w;
  Rng rng(seed, 0);
  int64_t id = 0;
  for (int g = 0; g < num_groups; ++g) {
    std::vector<int32_t> prompt(1 + rng.below(60));
    for (auto& t : prompt) t = static_cast<int32_t>(1 + rng.below(kVocab - 1));
    SamplingParams p;
    p.max_tokens = 1 + static_cast<int32_t>(rng.below(40));
    p.ignore_eos = rng.below(4) == 0;
    p.stop_token_ids = {0};
    std::vector<Sequence*> group;
    for (int i = 0; i < n; ++i) {
      w.seqs.push_back(std::make_unique<Sequence>(id++, prompt, p, g, i));
      group.push_back(w.seqs.back().get());
    }
    w.groups.push_back(group);
  }
  return w;
}

struct RunResult {
  int64_t steps = 0, finished = 0;
  int32_t max_tokens_in_step = 0, max_running = 0;
};

// Drives the scheduler to completion; half of the groups arrive after a few steps, as requests
// stream in. Checks the per-step budgets on the way.
RunResult drive(Scheduler& sched, Workload& w, FakeRunner& runner) {
  RunResult r;
  const size_t first = w.groups.size() / 2;
  for (size_t g = 0; g < first; ++g) sched.add_group(w.groups[g]);
  std::vector<int32_t> tokens;
  while (sched.has_unfinished() || r.steps < 5) {
    if (r.steps == 5) {
      for (size_t g = first; g < w.groups.size(); ++g) sched.add_group(w.groups[g]);
    }
    const ScheduledBatch& b = sched.schedule();
    EXPECT_FALSE(b.empty() && sched.has_unfinished()) << "no progress at step " << r.steps;
    if (b.empty() && sched.has_unfinished()) break;
    EXPECT_LE(b.num_tokens(), sched.config().max_num_batched_tokens);
    EXPECT_LE(static_cast<int32_t>(sched.num_running()), sched.config().max_num_seqs);
    EXPECT_LE(b.num_seqs(), sched.config().max_num_seqs);
    r.max_tokens_in_step = std::max(r.max_tokens_in_step, b.num_tokens());
    r.max_running = std::max(r.max_running, static_cast<int32_t>(sched.num_running()));
    if (!runner.step(b, tokens)) break;
    r.finished += static_cast<int64_t>(sched.postprocess(b, tokens, {}).size());
    ++r.steps;
    if (r.steps > 100000) {
      ADD_FAILURE() << "did not finish";
      break;
    }
  }
  return r;
}

void expect_matches_reference(const Workload& w, int32_t max_model_len) {
  for (const auto& s : w.seqs) {
    const auto ref = reference_generate(*s, kVocab, max_model_len);
    ASSERT_EQ(s->status, SequenceStatus::Finished) << "seq " << s->id();
    ASSERT_EQ(std::vector<int32_t>(s->output_tokens().begin(), s->output_tokens().end()),
              ref.output)
        << "seq " << s->id() << " (preempted " << s->num_preemptions << " times)";
    ASSERT_EQ(s->finish_reason, ref.reason) << "seq " << s->id();
  }
}

// Tight memory: many preemptions, forks and copies; every sequence still generates exactly
// what it generates alone, budgets hold at every step, and the pool is whole at the end.
TEST(Scheduler, TightMemoryMatchesReferenceAndNeverLeaks) {
  SchedulerConfig cfg;
  cfg.max_num_seqs = 16;
  cfg.max_num_batched_tokens = 48;
  cfg.num_blocks = 40;
  cfg.block_size = 4;
  cfg.max_model_len = 128;
  Workload w = make_workload(30, 4, 7);
  Scheduler sched(cfg);
  FakeRunner runner(cfg.num_blocks, cfg.block_size, kVocab);
  const RunResult r = drive(sched, w, runner);
  EXPECT_EQ(r.finished, static_cast<int64_t>(w.seqs.size()));
  expect_matches_reference(w, cfg.max_model_len);
  EXPECT_EQ(sched.block_manager().num_free_blocks(), cfg.num_blocks);
  const SchedulerStats& st = sched.stats();
  RecordProperty("preemptions", static_cast<int>(st.num_preemptions));
  RecordProperty("forks", static_cast<int>(st.num_forks));
  RecordProperty("block_copies", static_cast<int>(st.num_block_copies));
  RecordProperty("steps", static_cast<int>(st.num_steps));
  // The test only means something if these paths ran.
  EXPECT_GT(st.num_preemptions, 50);
  EXPECT_EQ(st.num_forks, 30 * 3);  // every non-first sample forks, preempted heads included
  EXPECT_GT(st.num_block_copies, 10);
  EXPECT_EQ(r.max_tokens_in_step, cfg.max_num_batched_tokens);  // the budget binds, and holds
  int stops = 0, lengths = 0;
  for (const auto& s : w.seqs) (s->finish_reason == FinishReason::Stop ? stops : lengths)++;
  EXPECT_GT(stops, 0);
  EXPECT_GT(lengths, 0);
}

// The same workload with ample memory: no preemption at all, same tokens (the reference), and
// a run without sharing gives the same tokens too.
TEST(Scheduler, AmpleMemoryAndNoSharingGiveTheSameTokens) {
  for (bool sharing : {true, false}) {
    SchedulerConfig cfg;
    cfg.max_num_seqs = 64;
    cfg.max_num_batched_tokens = 256;
    cfg.num_blocks = 4096;
    cfg.block_size = 16;
    cfg.max_model_len = 128;
    cfg.enable_prefix_sharing = sharing;
    Workload w = make_workload(30, 4, 7);
    Scheduler sched(cfg);
    FakeRunner runner(cfg.num_blocks, cfg.block_size, kVocab);
    const RunResult r = drive(sched, w, runner);
    EXPECT_EQ(sched.stats().num_preemptions, 0);
    EXPECT_LE(r.max_running, cfg.max_num_seqs);
    expect_matches_reference(w, cfg.max_model_len);
    EXPECT_EQ(sched.block_manager().num_free_blocks(), cfg.num_blocks);
    EXPECT_EQ(sched.stats().num_forks, sharing ? 30 * 3 : 0);
  }
}

TEST(Scheduler, ChunkedPrefillSplitsLongPromptAndOnlyLastChunkSamples) {
  SchedulerConfig cfg;
  cfg.max_num_batched_tokens = 32;
  cfg.num_blocks = 64;
  cfg.block_size = 8;
  cfg.max_model_len = 256;
  SamplingParams p;
  p.max_tokens = 3;
  Sequence s(0, std::vector<int32_t>(100, 5), p);
  Scheduler sched(cfg);
  FakeRunner runner(cfg.num_blocks, cfg.block_size, kVocab);
  sched.add(&s);
  std::vector<int32_t> tokens;
  const int32_t expect_n[] = {32, 32, 32, 4, 1, 1};
  const bool expect_sample[] = {false, false, false, true, true, true};
  int32_t start = 0;
  for (int step = 0; step < 6; ++step) {
    const ScheduledBatch& b = sched.schedule();
    ASSERT_EQ(b.num_seqs(), 1) << "step " << step;
    EXPECT_EQ(b.items[0].num_new_tokens, expect_n[step]) << "step " << step;
    EXPECT_EQ(b.items[0].start_pos, start) << "step " << step;
    EXPECT_EQ(b.items[0].samples, expect_sample[step]) << "step " << step;
    EXPECT_EQ(b.num_samples(), expect_sample[step] ? 1 : 0);
    EXPECT_EQ(b.positions.front(), start);
    EXPECT_EQ(b.context_lens[0], start + expect_n[step]);
    EXPECT_EQ(b.block_tables.size(), static_cast<size_t>(256 / 8));
    ASSERT_TRUE(runner.step(b, tokens));
    sched.postprocess(b, tokens, {});
    if (step < 5) {  // step 5 finishes it, which frees its KV
      EXPECT_EQ(s.num_computed_tokens, start + expect_n[step]);
    }
    start += expect_n[step];
  }
  EXPECT_EQ(s.status, SequenceStatus::Finished);
  EXPECT_EQ(s.num_output_tokens(), 3);
  EXPECT_EQ(std::vector<int32_t>(s.output_tokens().begin(), s.output_tokens().end()),
            reference_generate(s, kVocab, cfg.max_model_len).output);
}

// A running decode and a long prompt share one step's budget: the decode comes first.
TEST(Scheduler, DecodeFirstThenPrefillChunkFillsTheBudget) {
  SchedulerConfig cfg;
  cfg.max_num_batched_tokens = 16;
  cfg.num_blocks = 64;
  cfg.block_size = 4;
  cfg.max_model_len = 128;
  SamplingParams p;
  p.max_tokens = 20;
  p.ignore_eos = true;
  Sequence a(0, {1, 2, 3}, p), b(1, std::vector<int32_t>(40, 7), p);
  Scheduler sched(cfg);
  FakeRunner runner(cfg.num_blocks, cfg.block_size, kVocab);
  std::vector<int32_t> tokens;
  sched.add(&a);
  const ScheduledBatch& s0 = sched.schedule();
  ASSERT_TRUE(runner.step(s0, tokens));
  sched.postprocess(s0, tokens, {});
  sched.add(&b);
  const ScheduledBatch& s1 = sched.schedule();
  ASSERT_EQ(s1.num_seqs(), 2);
  EXPECT_EQ(s1.items[0].seq, &a);
  EXPECT_EQ(s1.items[0].num_new_tokens, 1);
  EXPECT_EQ(s1.items[1].seq, &b);
  EXPECT_EQ(s1.items[1].num_new_tokens, 15);
  EXPECT_FALSE(s1.items[1].samples);
  ASSERT_EQ(s1.num_samples(), 1);
  EXPECT_EQ(s1.sample_token_indices[0], 0);
  EXPECT_EQ(s1.cu_seqlens, (std::vector<int32_t>{0, 1, 16}));
}

// Two sequences, a pool too small for both to finish: the later one is preempted (blocks
// freed, back to waiting with nothing computed), re-prefilled with prompt + output later, and
// both end with the reference tokens.
TEST(Scheduler, PreemptedSequenceRecomputesAndResumes) {
  SchedulerConfig cfg;
  cfg.max_num_batched_tokens = 64;
  cfg.num_blocks = 6;
  cfg.block_size = 4;
  cfg.max_model_len = 64;
  cfg.admission_watermark = 0.0f;
  SamplingParams p;
  p.max_tokens = 12;
  p.ignore_eos = true;
  Sequence a(0, {1, 2, 3, 4, 5, 6}, p), b(1, {9, 8, 7, 6, 5, 4}, p);
  Scheduler sched(cfg);
  FakeRunner runner(cfg.num_blocks, cfg.block_size, kVocab);
  sched.add(&a);
  sched.add(&b);
  std::vector<int32_t> tokens;
  bool saw_preempt = false, saw_reprefill = false;
  while (sched.has_unfinished()) {
    const ScheduledBatch& batch = sched.schedule();
    if (!saw_preempt && b.status == SequenceStatus::Waiting && b.num_output_tokens() > 0) {
      saw_preempt = true;
      EXPECT_TRUE(b.block_table.empty());
      EXPECT_EQ(b.num_computed_tokens, 0);
      EXPECT_EQ(a.status, SequenceStatus::Running);
    }
    for (const ScheduledItem& it : batch.items) {
      if (saw_preempt && it.seq == &b && it.start_pos == 0) {
        saw_reprefill = true;
        EXPECT_EQ(it.num_new_tokens, b.num_tokens());  // prompt + everything generated so far
        EXPECT_TRUE(it.samples);
      }
    }
    ASSERT_TRUE(runner.step(batch, tokens));
    sched.postprocess(batch, tokens, {});
  }
  EXPECT_TRUE(saw_preempt);
  EXPECT_TRUE(saw_reprefill);
  EXPECT_EQ(sched.stats().num_preemptions, 1);
  EXPECT_EQ(b.num_preemptions, 1);
  for (Sequence* s : {&a, &b}) {
    EXPECT_EQ(std::vector<int32_t>(s->output_tokens().begin(), s->output_tokens().end()),
              reference_generate(*s, kVocab, cfg.max_model_len).output);
  }
  EXPECT_EQ(sched.block_manager().num_free_blocks(), cfg.num_blocks);
}

// GRPO groups: 8 prompts x 8 samples. With sharing, each prompt's KV is computed once and the
// 7 other samples fork (prefill tokens drop 8x); the first step samples all 8 of a group from
// the same logits row; each group's shared partial block is copied 7 times.
TEST(Scheduler, GroupSharingComputesEachPromptOnce) {
  constexpr int kGroups = 8, kN = 8, kPrompt = 37;
  for (bool sharing : {true, false}) {
    SchedulerConfig cfg;
    cfg.max_num_seqs = 128;
    cfg.max_num_batched_tokens = 4096;  // every prompt fits in the first step, shared or not
    cfg.num_blocks = 1024;
    cfg.block_size = 16;
    cfg.max_model_len = 256;
    cfg.enable_prefix_sharing = sharing;
    std::vector<std::unique_ptr<Sequence>> seqs;
    Scheduler sched(cfg);
    SamplingParams p;
    p.max_tokens = 5;
    p.ignore_eos = true;
    for (int g = 0; g < kGroups; ++g) {
      std::vector<Sequence*> group;
      for (int i = 0; i < kN; ++i) {
        seqs.push_back(
            std::make_unique<Sequence>(g * kN + i, std::vector<int32_t>(kPrompt, 3 + g), p, g, i));
        group.push_back(seqs.back().get());
      }
      sched.add_group(group);
    }
    FakeRunner runner(cfg.num_blocks, cfg.block_size, kVocab);
    std::vector<int32_t> tokens;
    const ScheduledBatch& first = sched.schedule();
    EXPECT_EQ(first.num_samples(), kGroups * kN);
    EXPECT_EQ(first.num_seqs(), sharing ? kGroups : kGroups * kN);
    EXPECT_EQ(first.num_tokens(), (sharing ? kGroups : kGroups * kN) * kPrompt);
    if (sharing) {  // samples 0..7 of group 0 all read the logits of the head's last prompt token
      for (int i = 0; i < kN; ++i) {
        EXPECT_EQ(first.sample_seqs[static_cast<size_t>(i)]->group_id(), 0);
        EXPECT_EQ(first.sample_token_indices[static_cast<size_t>(i)], kPrompt - 1);
      }
    }
    ASSERT_TRUE(runner.step(first, tokens));
    sched.postprocess(first, tokens, {});
    while (sched.has_unfinished()) {
      const ScheduledBatch& b = sched.schedule();
      ASSERT_TRUE(runner.step(b, tokens));
      sched.postprocess(b, tokens, {});
    }
    const SchedulerStats& st = sched.stats();
    EXPECT_EQ(st.prompt_tokens_computed, (sharing ? kGroups : kGroups * kN) * kPrompt);
    EXPECT_EQ(st.prompt_tokens_without_sharing(), kGroups * kN * kPrompt);
    EXPECT_EQ(st.num_block_copies, sharing ? kGroups * (kN - 1) : 0);
    EXPECT_EQ(st.output_tokens_computed, kGroups * kN * (p.max_tokens - 1));
    for (const auto& s : seqs) {
      EXPECT_EQ(std::vector<int32_t>(s->output_tokens().begin(), s->output_tokens().end()),
                reference_generate(*s, kVocab, cfg.max_model_len).output);
    }
    EXPECT_EQ(sched.block_manager().num_free_blocks(), cfg.num_blocks);
  }
}

// A group larger than max_num_seqs is admitted in sub-groups, each sharing its own prompt KV.
TEST(Scheduler, GroupLargerThanMaxNumSeqsIsSplit) {
  SchedulerConfig cfg;
  cfg.max_num_seqs = 4;
  cfg.num_blocks = 256;
  cfg.block_size = 8;
  cfg.max_model_len = 128;
  SamplingParams p;
  p.max_tokens = 6;
  p.ignore_eos = true;
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<Sequence*> group;
  for (int i = 0; i < 10; ++i) {
    seqs.push_back(std::make_unique<Sequence>(i, std::vector<int32_t>(20, 4), p, 0, i));
    group.push_back(seqs.back().get());
  }
  Scheduler sched(cfg);
  sched.add_group(group);
  EXPECT_EQ(sched.num_waiting(), 10u);
  FakeRunner runner(cfg.num_blocks, cfg.block_size, kVocab);
  std::vector<int32_t> tokens;
  while (sched.has_unfinished()) {
    const ScheduledBatch& b = sched.schedule();
    EXPECT_LE(static_cast<int32_t>(sched.num_running()), 4);
    ASSERT_TRUE(runner.step(b, tokens));
    sched.postprocess(b, tokens, {});
  }
  EXPECT_EQ(sched.stats().prompt_tokens_computed, 3 * 20);  // sub-groups of 4, 4, 2
  EXPECT_EQ(sched.stats().num_forks, 3 + 3 + 1);
  for (const auto& s : seqs) {
    EXPECT_EQ(std::vector<int32_t>(s->output_tokens().begin(), s->output_tokens().end()),
              reference_generate(*s, kVocab, cfg.max_model_len).output);
  }
}

TEST(Scheduler, StopTokenAndLengthAndMaxModelLen) {
  SchedulerConfig cfg;
  cfg.num_blocks = 64;
  cfg.block_size = 4;
  cfg.max_model_len = 10;
  SamplingParams p;
  p.max_tokens = 100;  // capped by max_model_len: 10 - 4 prompt tokens = 6 outputs
  p.ignore_eos = true;
  Sequence s(0, {1, 2, 3, 4}, p);
  Scheduler sched(cfg);
  FakeRunner runner(cfg.num_blocks, cfg.block_size, kVocab);
  sched.add(&s);
  std::vector<int32_t> tokens;
  while (sched.has_unfinished()) {
    const ScheduledBatch& b = sched.schedule();
    ASSERT_TRUE(runner.step(b, tokens));
    sched.postprocess(b, tokens, {});
  }
  EXPECT_EQ(s.num_output_tokens(), 6);
  EXPECT_EQ(s.finish_reason, FinishReason::Length);
  EXPECT_EQ(to_string(s.finish_reason), "length");

  // The first token the fake model draws for this prompt, made a stop token: stops after 1.
  const int32_t first_tok = s.output_tokens()[0];
  SamplingParams q;
  q.max_tokens = 5;
  q.stop_token_ids = {first_tok};
  Sequence t(0, {1, 2, 3, 4}, q);
  Scheduler sched2(cfg);
  FakeRunner runner2(cfg.num_blocks, cfg.block_size, kVocab);
  sched2.add(&t);
  const ScheduledBatch& b = sched2.schedule();
  ASSERT_TRUE(runner2.step(b, tokens));
  const auto& done = sched2.postprocess(b, tokens, {});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0], &t);
  EXPECT_EQ(t.finish_reason, FinishReason::Stop);
  EXPECT_EQ(t.num_output_tokens(), 1);
  EXPECT_FALSE(sched2.has_unfinished());
  EXPECT_EQ(sched2.block_manager().num_free_blocks(), cfg.num_blocks);
}

// finish() (stop strings, aborts) works on a waiting head, a pending fork and a running sample;
// the rest of the group still shares its prompt and generates the reference tokens.
TEST(Scheduler, FinishRemovesASequenceFromAnyQueue) {
  SchedulerConfig cfg;
  cfg.num_blocks = 64;
  cfg.block_size = 4;
  cfg.max_model_len = 64;
  SamplingParams p;
  p.max_tokens = 8;
  p.ignore_eos = true;
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<Sequence*> group;
  for (int i = 0; i < 4; ++i) {
    seqs.push_back(std::make_unique<Sequence>(i, std::vector<int32_t>{5, 6, 7, 8, 9}, p, 0, i));
    group.push_back(seqs.back().get());
  }
  Sequence solo(4, {1, 2, 3}, p, 1, 0);
  Scheduler sched(cfg);
  sched.add_group(group);
  sched.add(&solo);
  sched.finish(seqs[0].get(), FinishReason::Abort);  // the waiting head: 1 becomes the head
  sched.finish(seqs[2].get(), FinishReason::Abort);  // a sample waiting to fork
  EXPECT_EQ(sched.num_waiting(), 3u);
  FakeRunner runner(cfg.num_blocks, cfg.block_size, kVocab);
  std::vector<int32_t> tokens;
  const ScheduledBatch& b = sched.schedule();
  ASSERT_EQ(b.num_seqs(), 2);
  EXPECT_EQ(b.items[0].seq, seqs[1].get());
  EXPECT_EQ(b.items[1].seq, &solo);
  EXPECT_EQ(b.num_samples(), 3);  // 1, its fork 3, and solo
  EXPECT_EQ(sched.stats().num_forks, 1);
  ASSERT_TRUE(runner.step(b, tokens));
  sched.postprocess(b, tokens, {});
  sched.finish(seqs[3].get(), FinishReason::StopString);  // a running sample sharing blocks
  EXPECT_EQ(seqs[3]->num_output_tokens(), 1);
  EXPECT_TRUE(seqs[3]->block_table.empty());
  EXPECT_EQ(sched.num_running(), 2u);
  EXPECT_THROW(sched.finish(seqs[3].get(), FinishReason::Abort), Error);
  while (sched.has_unfinished()) {
    const ScheduledBatch& next = sched.schedule();
    ASSERT_TRUE(runner.step(next, tokens));
    sched.postprocess(next, tokens, {});
  }
  for (Sequence* s : {seqs[1].get(), &solo}) {
    EXPECT_EQ(std::vector<int32_t>(s->output_tokens().begin(), s->output_tokens().end()),
              reference_generate(*s, kVocab, cfg.max_model_len).output);
  }
  EXPECT_EQ(seqs[0]->finish_reason, FinishReason::Abort);
  EXPECT_EQ(seqs[0]->num_output_tokens(), 0);
  EXPECT_EQ(seqs[3]->finish_reason, FinishReason::StopString);
  EXPECT_EQ(sched.block_manager().num_free_blocks(), cfg.num_blocks);
}

TEST(Scheduler, ImpossibleSequenceIsRejectedWithNumbers) {
  SchedulerConfig cfg;
  cfg.num_blocks = 10;
  cfg.block_size = 16;
  cfg.max_model_len = 1024;
  SamplingParams p;
  p.max_tokens = 100;
  Sequence s(7, std::vector<int32_t>(100, 1), p);
  Scheduler sched(cfg);
  try {
    sched.add(&s);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("sequence 7"), std::string::npos) << msg;
    EXPECT_NE(msg.find("200 tokens need 13 KV blocks"), std::string::npos) << msg;
    EXPECT_NE(msg.find("has 10 blocks"), std::string::npos) << msg;
  }
  EXPECT_FALSE(sched.has_unfinished());
  // A prompt that fills max_model_len leaves no room to generate.
  cfg.max_model_len = 100;
  Scheduler sched2(cfg);
  EXPECT_THROW(sched2.add(&s), Error);
}

TEST(Scheduler, PostprocessChecksTheSampleCount) {
  SchedulerConfig cfg;
  cfg.num_blocks = 16;
  cfg.block_size = 4;
  Sequence s(0, {1, 2}, SamplingParams{});
  Scheduler sched(cfg);
  sched.add(&s);
  const ScheduledBatch& b = sched.schedule();
  ASSERT_EQ(b.num_samples(), 1);
  std::vector<int32_t> two = {1, 2};
  EXPECT_THROW(sched.postprocess(b, two, {}), Error);
  EXPECT_THROW(sched.schedule(), Error);  // the step was not postprocessed yet
}

}  // namespace
}  // namespace verl::rollout
