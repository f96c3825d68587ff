// Continuous-batching scheduler of the rollout engine (as vLLM v1 / nano-vllm): each step picks
// which sequences run and how many tokens each computes (chunked prefill, decode, re-prefill
// after preemption), forks the samples of a prompt from its first sample so the prompt's KV is
// computed once per group, and builds the flat per-step metadata a model runner (CPU or CUDA)
// consumes. postprocess() takes the sampled tokens back and retires finished sequences.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

#include "rollout/block_manager.h"
#include "rollout/sequence.h"

namespace verl::rollout {

struct SchedulerConfig {
  int32_t max_num_seqs = 256;  // running sequences at most (verl: rollout.max_num_seqs)
  int32_t max_num_batched_tokens =
      8192;                      // new tokens per step at most (rollout.max_num_batched_tokens)
  int32_t max_model_len = 4096;  // prompt + output at most; fixes the block-table width
  int32_t num_blocks = 1024;     // KV pool size in blocks
  int32_t block_size = 16;       // tokens per block
  bool enable_prefix_sharing = true;  // samples of one prompt fork from its first sample
  // Blocks kept free when admitting a new sequence while others run, so running sequences can
  // keep decoding without immediately preempting (vLLM's watermark, as a fraction of the pool).
  float admission_watermark = 0.01f;
};

// One sequence that runs the forward this step: it computes KV for positions
// [start_pos, start_pos + num_new_tokens) of its token_ids().
struct ScheduledItem {
  Sequence* seq;
  int32_t num_new_tokens;
  int32_t start_pos;  // = seq->num_computed_tokens when scheduled
  bool samples;       // the chunk reaches the sequence's last token, so a token is sampled
};

// The whole plan of one step, built once by schedule() and reused (cleared, capacity kept) by
// the next. T = total new tokens, B = items.size(), S = tokens to sample, W = max_blocks_per_seq.
struct ScheduledBatch {
  std::vector<ScheduledItem> items;     // [B]
  std::vector<BlockCopy> block_copies;  // copy-on-write, to apply in order before the forward
  std::vector<int32_t> input_ids;       // [T] tokens to feed
  std::vector<int32_t> positions;       // [T]
  std::vector<int32_t> cu_seqlens;      // [B+1] prefix sums of num_new_tokens (varlen query)
  std::vector<int32_t> context_lens;    // [B] cached + new tokens, the keys each item attends to
  std::vector<int32_t> slot_mapping;  // [T] KV slot (block * block_size + offset) of each new token
  std::vector<int32_t> block_tables;  // [B, W] row-major, padded with -1
  int32_t max_blocks_per_seq = 0;     // W, fixed by max_model_len
  int32_t max_seqlen_q = 0;           // max num_new_tokens over items
  int32_t max_context_len = 0;        // max context_lens
  // Sampling: one entry per token to draw. sample_token_indices[s] is the index in [0, T) of the
  // token whose logits (the next-token distribution after it) sample s uses. Forked samples of a
  // group point at their first sample's last prompt token, so one logits row serves n draws.
  std::vector<Sequence*> sample_seqs;         // [S]
  std::vector<int32_t> sample_token_indices;  // [S]

  int32_t num_tokens() const { return static_cast<int32_t>(input_ids.size()); }
  int32_t num_seqs() const { return static_cast<int32_t>(items.size()); }
  int32_t num_samples() const { return static_cast<int32_t>(sample_seqs.size()); }
  bool empty() const { return items.empty() && sample_seqs.empty(); }
  // A pure decode step: every item one new token and one sample.
  bool decode() const {
    return num_tokens() > 0 && num_tokens() == num_seqs() && num_samples() == num_seqs();
  }
  void clear();
};

// Counters a benchmark reports. "Without sharing" = what prefill would cost if every sample
// prefilled its own prompt.
struct SchedulerStats {
  int64_t num_steps = 0;
  int64_t prompt_tokens_computed = 0;  // KV computed at prompt positions (re-prefills included)
  int64_t prompt_tokens_shared = 0;    // prompt positions forks received instead of computing
  int64_t output_tokens_computed = 0;  // KV computed at generated positions (decode + re-prefill)
  int64_t num_forks = 0;
  int64_t num_block_copies = 0;
  int64_t num_preemptions = 0;
  int64_t preempted_tokens = 0;  // computed KV thrown away by preemption (computed again later)
  // Multi-turn: tokens appended to paused sequences, and the KV they kept (the prefix a
  // re-prefill of the whole context would have computed again).
  int64_t appended_tokens = 0;
  int64_t kv_reused_tokens = 0;
  int64_t prompt_tokens_without_sharing() const {
    return prompt_tokens_computed + prompt_tokens_shared;
  }
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config);

  // Queues the n samples of one prompt (same prompt tokens). The caller owns the sequences and
  // keeps them alive until postprocess() reports them finished. With prefix sharing on, the
  // first is prefilled and the others fork from it. Throws if a sequence can never fit.
  void add_group(std::span<Sequence* const> samples);
  void add(Sequence* seq) { add_group({&seq, 1}); }

  // Plans the next step. The returned batch stays valid until the next schedule() call.
  const ScheduledBatch& schedule();
  // Takes the S sampled tokens (and log-probs, may be empty) of `batch`, in sample order; marks
  // computed KV, appends tokens, applies stop conditions, frees finished sequences' blocks and
  // returns the sequences that finished this step (valid until the next postprocess()).
  const std::vector<Sequence*>& postprocess(const ScheduledBatch& batch,
                                            std::span<const int32_t> tokens,
                                            std::span<const float> logprobs);

  // Ends a sequence outside postprocess() (a stop string matched, an abort): frees its blocks,
  // sets the reason, and drops it from the queues. Call between postprocess() and schedule().
  void finish(Sequence* seq, FinishReason reason);

  // Multi-turn. postprocess() pauses a sequence with pause_on_stop at a stop token instead of
  // finishing it (its blocks stay); turn_ended() lists those paused this step. resume() appends
  // `tokens` (a tool response) and queues it: the next prefill computes only the new tokens (and
  // the stop token whose KV a decode would have written). finish() ends a paused one. Call both
  // between postprocess() and schedule().
  const std::vector<Sequence*>& turn_ended() const { return turn_ended_; }
  void resume(Sequence* seq, std::span<const int32_t> tokens);

  bool has_unfinished() const { return !waiting_.empty() || !running_.empty() || !paused_.empty(); }
  // Something can run now (not only paused sequences waiting for their tools).
  bool has_runnable() const { return !waiting_.empty() || !running_.empty(); }
  size_t num_paused() const { return paused_.size(); }
  size_t num_waiting() const;  // sequences not running (group members not yet forked included)
  size_t num_running() const { return running_.size(); }
  const SchedulerConfig& config() const { return config_; }
  const SchedulerStats& stats() const { return stats_; }
  const BlockManager& block_manager() const { return blocks_; }

 private:
  // Schedules `n` tokens of `seq` (blocks already checked) and forks its group if this chunk
  // completes the prompt of a group's first sample.
  void schedule_item(Sequence* seq, int32_t n);
  void preempt(Sequence* victim);
  void build_metadata();
  // Frees the KV of paused sequences (they re-prefill when resumed) so a waiting head fits.
  bool evict_paused();
  int32_t seats_taken() const;

  SchedulerConfig config_;
  BlockManager blocks_;
  int32_t watermark_blocks_;
  std::deque<Sequence*> waiting_;   // heads to prefill: group first samples and preempted sequences
  std::vector<Sequence*> running_;  // in admission order; the last is preempted first
  // Samples waiting to fork from a head (keyed by the head). Their seats are reserved while
  // the head runs so the fork always has room.
  std::unordered_map<const Sequence*, std::vector<Sequence*>> pending_forks_;
  int32_t reserved_seats_ = 0;
  std::vector<std::pair<int32_t, Sequence*>> step_forks_;  // (item index, fork) this step
  ScheduledBatch batch_;
  bool awaiting_postprocess_ = false;  // a planned step must be postprocessed before the next
  std::vector<Sequence*> finished_;
  std::vector<Sequence*> turn_ended_;
  std::vector<Sequence*> paused_;  // holding their blocks until resumed or finished
  SchedulerStats stats_;
};

}  // namespace verl::rollout
