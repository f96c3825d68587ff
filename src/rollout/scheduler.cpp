// Scheduler: one step = (1) running sequences in admission order, each asking for its uncomputed
// tokens (1 when decoding, a chunk when prefilling or re-prefilling), preempting from the back
// of the running list when blocks run out; (2) if nothing was preempted, admission of waiting
// heads under the seat and token budgets; (3) forks of the groups whose prompt completed;
// (4) the flat metadata. A token is sampled for an item iff its chunk reaches the last token.
#include "rollout/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace verl::rollout {

void ScheduledBatch::clear() {
  items.clear();
  block_copies.clear();
  input_ids.clear();
  positions.clear();
  cu_seqlens.clear();
  context_lens.clear();
  slot_mapping.clear();
  block_tables.clear();
  sample_seqs.clear();
  sample_token_indices.clear();
  max_seqlen_q = 0;
  max_context_len = 0;
}

Scheduler::Scheduler(const SchedulerConfig& config)
    : config_(config), blocks_(config.num_blocks, config.block_size) {
  VERL_CHECK(config.max_num_seqs > 0, "scheduler: max_num_seqs must be positive, got {}",
             config.max_num_seqs);
  VERL_CHECK(config.max_num_batched_tokens > 0,
             "scheduler: max_num_batched_tokens must be positive, got {}",
             config.max_num_batched_tokens);
  VERL_CHECK(config.max_model_len > 1, "scheduler: max_model_len must be > 1, got {}",
             config.max_model_len);
  VERL_CHECK(config.admission_watermark >= 0.0f && config.admission_watermark < 1.0f,
             "scheduler: admission_watermark must be in [0, 1), got {}",
             config.admission_watermark);
  watermark_blocks_ =
      static_cast<int32_t>(config.admission_watermark * static_cast<float>(config.num_blocks));
  batch_.max_blocks_per_seq = blocks_.blocks_for_tokens(config.max_model_len);
  running_.reserve(static_cast<size_t>(config.max_num_seqs));
  finished_.reserve(static_cast<size_t>(config.max_num_seqs));
  step_forks_.reserve(static_cast<size_t>(config.max_num_seqs));
}

void Scheduler::add_group(std::span<Sequence* const> samples) {
  VERL_CHECK(!samples.empty(), "scheduler: add_group with no sequences");
  const Sequence* first = samples[0];
  VERL_CHECK(first != nullptr, "scheduler: add_group got a null sequence");
  for (Sequence* s : samples) {
    VERL_CHECK(s != nullptr, "scheduler: add_group got a null sequence");
    VERL_CHECK(s->status == SequenceStatus::Waiting && s->num_computed_tokens == 0 &&
                   s->block_table.empty() && s->num_output_tokens() == 0,
               "scheduler: sequence {} was already scheduled (status {}, {} output tokens)",
               s->id(), to_string(s->status), s->num_output_tokens());
    VERL_CHECK(std::ranges::equal(s->prompt_tokens(), first->prompt_tokens()),
               "scheduler: sequence {} is in the group of sequence {} but its prompt differs",
               s->id(), first->id());
    const int64_t prompt = s->num_prompt_tokens();
    VERL_CHECK(
        prompt < config_.max_model_len,
        "scheduler: sequence {} has a prompt of {} tokens, leaving no room to generate under "
        "max_model_len {}",
        s->id(), prompt, config_.max_model_len);
    const int64_t longest =
        std::min<int64_t>(prompt + s->params().max_tokens, config_.max_model_len);
    const int32_t need = blocks_.blocks_for_tokens(longest);
    VERL_CHECK(
        need <= blocks_.num_blocks(),
        "scheduler: sequence {} can never fit: prompt {} + max_tokens {} = {} tokens need {} KV "
        "blocks "
        "of {} tokens, but the whole pool has {} blocks; generate fewer tokens "
        "(data.max_response_length "
        "in training, --max-tokens in verl generate) or give the KV cache more memory (rollout."
        "gpu_memory_utilization on a GPU, --kv-cache-mb in verl generate)",
        s->id(), prompt, s->params().max_tokens, longest, need, blocks_.block_size(),
        blocks_.num_blocks());
  }
  if (!config_.enable_prefix_sharing) {
    for (Sequence* s : samples) waiting_.push_back(s);
    return;
  }
  // Sub-groups of at most max_num_seqs: a head is admitted only once its whole sub-group has seats.
  const size_t cap = static_cast<size_t>(config_.max_num_seqs);
  for (size_t begin = 0; begin < samples.size(); begin += cap) {
    const size_t end = std::min(samples.size(), begin + cap);
    Sequence* head = samples[begin];
    waiting_.push_back(head);
    if (end - begin > 1) {
      auto [it, inserted] = pending_forks_.try_emplace(head);
      VERL_CHECK(inserted, "scheduler: sequence {} added twice", head->id());
      it->second.assign(samples.begin() + static_cast<std::ptrdiff_t>(begin) + 1,
                        samples.begin() + static_cast<std::ptrdiff_t>(end));
    }
  }
}

size_t Scheduler::num_waiting() const {
  size_t n = waiting_.size();
  for (const auto& [head, forks] : pending_forks_) n += forks.size();
  return n;
}

int32_t Scheduler::seats_taken() const {
  return static_cast<int32_t>(running_.size() + step_forks_.size()) + reserved_seats_;
}

void Scheduler::preempt(Sequence* victim) {
  VERL_CHECK(!running_.empty() && running_.back() == victim,
             "scheduler: preempting sequence {} out of order", victim->id());
  running_.pop_back();
  if (auto it = pending_forks_.find(victim); it != pending_forks_.end()) {
    reserved_seats_ -= static_cast<int32_t>(it->second.size());  // re-reserved on readmission
  }
  ++stats_.num_preemptions;
  stats_.preempted_tokens += victim->num_computed_tokens;
  // Recompute, not swap: drop the KV; the next prefill covers prompt + output so far, and its
  // last chunk samples the token this sequence would have produced next.
  blocks_.free(*victim);
  victim->status = SequenceStatus::Waiting;
  ++victim->num_preemptions;
  waiting_.push_front(victim);
}

void Scheduler::schedule_item(Sequence* seq, int32_t n) {
  const int64_t start = seq->num_computed_tokens;
  const bool samples = start + n == seq->num_tokens();
  batch_.items.push_back({seq, n, static_cast<int32_t>(start), samples});
  const size_t copies_before = batch_.block_copies.size();
  blocks_.allocate(*seq, n, batch_.block_copies);
  stats_.num_block_copies += static_cast<int64_t>(batch_.block_copies.size() - copies_before);
  const int64_t prompt = seq->num_prompt_tokens();
  const int64_t prompt_part = std::max<int64_t>(0, std::min<int64_t>(start + n, prompt) - start);
  stats_.prompt_tokens_computed += prompt_part;
  stats_.output_tokens_computed += n - prompt_part;

  if (!samples || seq->num_output_tokens() != 0) return;
  auto it = pending_forks_.find(seq);
  if (it == pending_forks_.end()) return;
  // The head's prompt KV is complete once this step's forward has run; its samples share those
  // blocks and draw their first token from the same logits row.
  const int32_t item = static_cast<int32_t>(batch_.items.size()) - 1;
  for (Sequence* child : it->second) {
    blocks_.fork(*seq, *child, prompt);
    child->status = SequenceStatus::Running;
    step_forks_.push_back({item, child});
    ++stats_.num_forks;
    stats_.prompt_tokens_shared += prompt;
  }
  reserved_seats_ -= static_cast<int32_t>(it->second.size());
  pending_forks_.erase(it);
}

const ScheduledBatch& Scheduler::schedule() {
  VERL_CHECK(!awaiting_postprocess_,
             "scheduler: schedule() called before postprocess() of the previous step");
  batch_.clear();
  step_forks_.clear();
  int32_t budget = config_.max_num_batched_tokens;
  bool preempted = false;

  // (1) Running sequences, oldest first. Victims are taken from the back, so a sequence already
  // scheduled this step is never preempted.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence* seq = running_[i];
    const int64_t want = seq->num_tokens() - seq->num_computed_tokens;
    VERL_CHECK(want > 0,
               "scheduler: running sequence {} has nothing to compute ({} of {} tokens computed)",
               seq->id(), seq->num_computed_tokens, seq->num_tokens());
    int32_t n = static_cast<int32_t>(std::min<int64_t>(want, budget));
    bool runs = true;
    while (!blocks_.can_allocate(*seq, n)) {
      // A long (re-)prefill chunk shrinks to the memory left before anyone is preempted.
      const int64_t fit = blocks_.max_new_tokens(*seq);
      if (fit >= 1 && fit < n) {
        n = static_cast<int32_t>(fit);
        continue;
      }
      // Paused samples (waiting for their tools) give their KV up before a running one does.
      if (evict_paused()) continue;
      Sequence* victim = running_.back();
      preempt(victim);
      preempted = true;
      if (victim == seq) {
        runs = false;
        break;
      }
    }
    if (!runs) break;
    schedule_item(seq, n);
    budget -= n;
  }

  // (2) Admission, FIFO, only when memory was not short this step.
  while (!preempted && !waiting_.empty() && budget > 0) {
    Sequence* head = waiting_.front();
    auto it = pending_forks_.find(head);
    const int32_t group =
        1 + (it == pending_forks_.end() ? 0 : static_cast<int32_t>(it->second.size()));
    if (seats_taken() + group > config_.max_num_seqs) break;
    const int64_t want = head->num_tokens() - head->num_computed_tokens;
    int32_t n = static_cast<int32_t>(std::min<int64_t>(want, budget));
    // Nothing else holds memory: admit with no watermark so the largest admissible sequence runs.
    const bool alone = running_.empty() && step_forks_.empty();
    const int32_t watermark = alone ? 0 : watermark_blocks_;
    // No shrinking to the memory left here (unlike running sequences): a chunk admitted into a
    // nearly full pool would soon be preempted again.
    if (!blocks_.can_allocate(*head, n, watermark) &&
        !(alone && evict_paused() && blocks_.can_allocate(*head, n, 0)))
      break;
    waiting_.pop_front();
    head->status = SequenceStatus::Running;
    running_.push_back(head);
    reserved_seats_ += group - 1;
    schedule_item(head, n);
    budget -= n;
  }

  // (3) Forks join the running list after everyone admitted this step.
  for (const auto& [item, child] : step_forks_) running_.push_back(child);
  build_metadata();
  if (!batch_.empty()) {
    ++stats_.num_steps;
    awaiting_postprocess_ = true;
  }
  return batch_;
}

void Scheduler::build_metadata() {
  ScheduledBatch& b = batch_;
  const int32_t W = b.max_blocks_per_seq;
  int32_t total = 0;
  for (const ScheduledItem& it : b.items) total += it.num_new_tokens;
  b.input_ids.resize(static_cast<size_t>(total));
  b.positions.resize(static_cast<size_t>(total));
  b.slot_mapping.resize(static_cast<size_t>(total));
  b.block_tables.resize(b.items.size() * static_cast<size_t>(W), -1);
  b.cu_seqlens.push_back(0);
  size_t fork = 0;
  int32_t offset = 0;
  for (size_t i = 0; i < b.items.size(); ++i) {
    const ScheduledItem& it = b.items[i];
    const Sequence& seq = *it.seq;
    const auto tokens = seq.token_ids();
    for (int32_t j = 0; j < it.num_new_tokens; ++j) {
      b.input_ids[static_cast<size_t>(offset + j)] = tokens[static_cast<size_t>(it.start_pos + j)];
      b.positions[static_cast<size_t>(offset + j)] = it.start_pos + j;
    }
    blocks_.slot_mapping(seq, it.start_pos, it.num_new_tokens, b.slot_mapping.data() + offset);
    offset += it.num_new_tokens;
    b.cu_seqlens.push_back(offset);
    const int32_t ctx = it.start_pos + it.num_new_tokens;
    b.context_lens.push_back(ctx);
    b.max_seqlen_q = std::max(b.max_seqlen_q, it.num_new_tokens);
    b.max_context_len = std::max(b.max_context_len, ctx);
    VERL_CHECK(static_cast<int32_t>(seq.block_table.size()) <= W,
               "scheduler: sequence {} holds {} blocks, more than max_model_len allows ({})",
               seq.id(), seq.block_table.size(), W);
    std::copy(seq.block_table.begin(), seq.block_table.end(),
              b.block_tables.begin() + static_cast<std::ptrdiff_t>(i) * W);
    if (it.samples) {
      b.sample_seqs.push_back(it.seq);
      b.sample_token_indices.push_back(offset - 1);
      for (; fork < step_forks_.size() && step_forks_[fork].first == static_cast<int32_t>(i);
           ++fork) {
        b.sample_seqs.push_back(step_forks_[fork].second);
        b.sample_token_indices.push_back(offset - 1);
      }
    }
  }
}

bool Scheduler::evict_paused() {
  bool freed = false;
  for (Sequence* p : paused_) {
    if (p->block_table.empty()) continue;
    ++stats_.num_preemptions;
    stats_.preempted_tokens += p->num_computed_tokens;
    ++p->num_preemptions;
    blocks_.free(*p);
    freed = true;
  }
  return freed;
}

void Scheduler::resume(Sequence* seq, std::span<const int32_t> tokens) {
  VERL_CHECK(!awaiting_postprocess_,
             "scheduler: resume() of sequence {} while a step awaits postprocess()", seq->id());
  VERL_CHECK(seq->status == SequenceStatus::Paused,
             "scheduler: resume() of sequence {}, which is {}, not paused", seq->id(),
             to_string(seq->status));
  VERL_CHECK(seq->num_tokens() + static_cast<int64_t>(tokens.size()) < config_.max_model_len,
             "scheduler: resuming sequence {} with {} tokens would pass max_model_len {}",
             seq->id(), tokens.size(), config_.max_model_len);
  std::erase(paused_, seq);
  stats_.appended_tokens += static_cast<int64_t>(tokens.size());
  stats_.kv_reused_tokens += seq->num_computed_tokens;
  seq->append_context(tokens);
  seq->status = SequenceStatus::Waiting;
  // First in line: its prefix is cached, and a trajectory mid-way should finish before new ones.
  waiting_.push_front(seq);
}

void Scheduler::finish(Sequence* seq, FinishReason reason) {
  VERL_CHECK(!awaiting_postprocess_,
             "scheduler: finish() of sequence {} while a step awaits postprocess()", seq->id());
  VERL_CHECK(seq->status != SequenceStatus::Finished, "scheduler: sequence {} finished twice",
             seq->id());
  // Samples still waiting to fork from seq lose their head: they become a group of their own.
  std::vector<Sequence*> orphans;
  if (auto it = pending_forks_.find(seq); it != pending_forks_.end()) {
    orphans = std::move(it->second);
    pending_forks_.erase(it);
    if (seq->status == SequenceStatus::Running)
      reserved_seats_ -= static_cast<int32_t>(orphans.size());
  }
  if (seq->status == SequenceStatus::Running) {
    std::erase(running_, seq);
  } else if (seq->status == SequenceStatus::Paused) {
    std::erase(paused_, seq);
  } else if (auto w = std::find(waiting_.begin(), waiting_.end(), seq); w != waiting_.end()) {
    waiting_.erase(w);
  } else {
    bool found = false;
    for (auto& [head, forks] : pending_forks_) {
      if (auto f = std::find(forks.begin(), forks.end(), seq); f != forks.end()) {
        forks.erase(f);
        if (head->status == SequenceStatus::Running) --reserved_seats_;
        found = true;
        break;
      }
    }
    VERL_CHECK(found, "scheduler: finish() of sequence {}, which this scheduler does not hold",
               seq->id());
  }
  blocks_.free(*seq);
  seq->status = SequenceStatus::Finished;
  seq->finish_reason = reason;
  if (!orphans.empty()) {
    Sequence* head = orphans.front();
    if (orphans.size() > 1)
      pending_forks_.emplace(head, std::vector<Sequence*>(orphans.begin() + 1, orphans.end()));
    waiting_.push_front(head);
  }
}

const std::vector<Sequence*>& Scheduler::postprocess(const ScheduledBatch& batch,
                                                     std::span<const int32_t> tokens,
                                                     std::span<const float> logprobs) {
  VERL_CHECK(&batch == &batch_, "scheduler: postprocess() got a batch this scheduler did not plan");
  VERL_CHECK(awaiting_postprocess_ || batch.empty(),
             "scheduler: postprocess() called twice for one step");
  VERL_CHECK(static_cast<int32_t>(tokens.size()) == batch.num_samples(),
             "scheduler: postprocess() got {} sampled tokens for a batch of {} samples",
             tokens.size(), batch.num_samples());
  VERL_CHECK(logprobs.empty() || logprobs.size() == tokens.size(),
             "scheduler: postprocess() got {} log-probs for {} sampled tokens", logprobs.size(),
             tokens.size());
  awaiting_postprocess_ = false;
  finished_.clear();
  turn_ended_.clear();
  for (const ScheduledItem& it : batch.items) it.seq->num_computed_tokens += it.num_new_tokens;
  for (size_t s = 0; s < tokens.size(); ++s) {
    Sequence* seq = batch.sample_seqs[s];
    const int32_t tok = tokens[s];
    seq->append_token(tok, logprobs.empty() ? 0.0f : logprobs[s]);
    const SamplingParams& p = seq->params();
    FinishReason reason = FinishReason::None;
    if (!p.ignore_eos && p.is_stop_token(tok)) {
      reason = FinishReason::Stop;
    } else if (seq->num_output_tokens() >= p.max_tokens ||
               seq->num_tokens() >= config_.max_model_len) {
      reason = p.stop_at_max_tokens && seq->num_output_tokens() >= p.max_tokens
                   ? FinishReason::Stop
                   : FinishReason::Length;
    }
    if (reason == FinishReason::Stop && seq->pause_on_stop && p.is_stop_token(tok)) {
      seq->status = SequenceStatus::Paused;  // its KV stays for the next turn
      turn_ended_.push_back(seq);
      paused_.push_back(seq);
    } else if (reason != FinishReason::None) {
      seq->status = SequenceStatus::Finished;
      seq->finish_reason = reason;
      blocks_.free(*seq);
      finished_.push_back(seq);
    }
  }
  if (!finished_.empty() || !turn_ended_.empty()) {
    std::erase_if(running_, [](const Sequence* s) {
      return s->status == SequenceStatus::Finished || s->status == SequenceStatus::Paused;
    });
  }
  return finished_;
}

}  // namespace verl::rollout
