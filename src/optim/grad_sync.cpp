#include "optim/grad_sync.h"

#include <algorithm>
#include <exception>

#include "core/error.h"
#include "core/timer.h"

namespace verl::optim {
namespace {

// Stage 2 keeps at most this many range buffers alive (open or in flight); opening one more waits
// for the oldest reduction. Two would serialise backward and communication; three lets one reduce
// while the next layer computes and a tied embedding stays open.
constexpr int kMaxSlots = 3;

}  // namespace

GradSync::GradSync(dist::Communicator& comm, int stage, int64_t numel, int64_t chunk, float* grads,
                   SyncStats& stats)
    : comm_(comm), stage_(stage), numel_(numel), chunk_(chunk), grads_(grads), stats_(stats) {
  VERL_CHECK(stage >= 0 && stage <= 2, "GradSync: ZeRO stage {} (0, 1 or 2)", stage);
  VERL_CHECK(stage == 0 || chunk * comm.world_size() >= numel,
             "GradSync: shards of {} x {} ranks do not cover {} elements", chunk, comm.world_size(),
             numel);
}

void GradSync::use_lightweight(const LightweightConfig& cfg, float* carry) {
  VERL_CHECK(stage_ < 2, "LightweightSync needs each rank's whole gradient (ZeRO stage {}: 0 or 1)",
             stage_);
  lw_ = cfg;
  carry_ = carry;
}

GradSync::~GradSync() {
  // Reductions still in flight own pointers into our buffers: let them land first (an error
  // unwinding ends the job without waiting, see dist::MpiCommunicator).
  if (std::uncaught_exceptions() == 0) finish();
}

float* GradSync::open(int64_t begin, int64_t end) {
  VERL_CHECK(begin >= 0 && begin <= end && end <= numel_,
             "GradSync: range [{}, {}) outside {} elements", begin, end, numel_);
  if (stage_ < 2) return grads_ + begin;
  for (Slot& s : slots_)
    if (s.open && s.begin == begin && s.end == end) return s.buf.data();
  Timer t;
  while (busy_slots() >= kMaxSlots) complete_front();
  stats_.seconds += t.seconds();
  int free = -1;
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i)
    if (!slots_[i].open && slots_[i].pending == 0) {
      // Prefer a buffer large enough already (no reallocation once the layers have been seen).
      if (free < 0 || slots_[i].buf.size() >= static_cast<size_t>(end - begin)) free = i;
    }
  if (free < 0) {
    slots_.emplace_back();
    free = static_cast<int>(slots_.size()) - 1;
  }
  Slot& s = slots_[free];
  if (s.buf.size() < static_cast<size_t>(end - begin))
    s.buf.resize(static_cast<size_t>(end - begin));
  std::fill_n(s.buf.begin(), end - begin, 0.0f);
  s.begin = begin;
  s.end = end;
  s.open = true;
  return s.buf.data();
}

void GradSync::ready(int64_t begin, int64_t end) {
  Timer t;
  int slot = -1;
  float* data = grads_ + begin;
  if (stage_ == 2) {
    for (int i = 0; i < static_cast<int>(slots_.size()); ++i)
      if (slots_[i].open && slots_[i].begin == begin && slots_[i].end == end) slot = i;
    VERL_CHECK(slot >= 0, "GradSync: range [{}, {}) is ready but was never opened", begin, end);
    slots_[slot].open = false;
    data = slots_[slot].buf.data();
  }
  if (armed_ && end > begin) start(data, begin, end, slot);
  progress();
  stats_.seconds += t.seconds();
}

void GradSync::start(float* data, int64_t begin, int64_t end, int slot) {
  started_ = true;
  if (lw_) return start_sparse(begin, end);
  if (stage_ == 0) {
    ops_.push_back({comm_.start_all_reduce(data, static_cast<size_t>(end - begin),
                                           dist::DataType::F32, dist::ReduceOp::Sum),
                    slot, begin, end, -1});
    stats_.add_all_reduce(comm_.world_size(), end - begin);
    return;
  }
  // One reduction per owner whose shard the range overlaps.
  for (int64_t b = begin; b < end;) {
    const int owner = static_cast<int>(b / chunk_);
    const int64_t e = std::min(end, (owner + 1) * chunk_);
    ops_.push_back({comm_.start_reduce(data + (b - begin), static_cast<size_t>(e - b),
                                       dist::DataType::F32, dist::ReduceOp::Sum, owner),
                    slot, b, e, owner});
    if (slot >= 0) ++slots_[slot].pending;
    stats_.add_reduce_to_owners(comm_.world_size(), e - b);
    b = e;
  }
}

void GradSync::start_sparse(int64_t begin, int64_t end) {
  const int world = comm_.world_size(), rank = comm_.rank();
  Op op;
  op.begin = begin;
  op.end = end;
  op.layout = sparse_layout(end - begin, lw_->top_k, lw_->values);
  std::vector<uint8_t>& buf = messages_[begin];
  buf.resize(op.layout.bytes * static_cast<size_t>(world));
  uint8_t* mine = buf.data() + op.layout.bytes * static_cast<size_t>(rank);
  sparse_compress(grads_ + begin, carry_ ? carry_ + begin : nullptr, lw_->error_feedback, op.layout,
                  mine);
  op.gathered = &buf;
  op.pending = comm_.start_all_gather(mine, buf.data(), op.layout.bytes, dist::DataType::U8);
  stats_.add_all_gather(world, op.layout.bytes, end - begin);
  ops_.push_back(std::move(op));
}

void GradSync::sync_whole() {  // timed by the caller (AdamW::step)
  start_sparse(0, numel_);
  while (!ops_.empty()) complete_front();
}

void GradSync::progress() {
  for (Op& op : ops_) op.pending->test();
  // Completed in start order, so a shard's sums are added in the same order on every run.
  while (!ops_.empty() && ops_.front().pending->test()) complete_front();
}

void GradSync::complete_front() {
  Op op = std::move(ops_.front());
  ops_.pop_front();
  op.pending->wait();
  if (op.gathered != nullptr) {
    // Every rank's decoded message, added in rank order: the same sum on every rank.
    float* out = grads_ + op.begin;
    std::fill(out, out + (op.end - op.begin), 0.0f);
    for (int r = 0; r < comm_.world_size(); ++r)
      sparse_accumulate(op.gathered->data() + op.layout.bytes * static_cast<size_t>(r), op.layout,
                        out);
    return;
  }
  if (op.slot < 0) return;
  Slot& s = slots_[op.slot];
  if (op.owner == comm_.rank()) {
    // This rank's shard receives the range's sum over ranks, added to the earlier micro-batches'.
    const float* src = s.buf.data() + (op.begin - s.begin);
    float* dst = grads_ + (op.begin - static_cast<int64_t>(comm_.rank()) * chunk_);
    for (int64_t i = 0; i < op.end - op.begin; ++i) dst[i] += src[i];
  }
  --s.pending;
}

int GradSync::busy_slots() const {
  int n = 0;
  for (const Slot& s : slots_) n += (s.open || s.pending > 0) ? 1 : 0;
  return n;
}

bool GradSync::finish() {
  while (!ops_.empty()) complete_front();  // its time is the optimizer step's (AdamW::step)
  const bool started = started_;
  started_ = false;
  return started;
}

}  // namespace verl::optim
