#include "optim/zero3.h"

#include <algorithm>

#include "core/error.h"
#include "core/timer.h"

namespace verl::optim {

ZeroGather::ZeroGather(dist::Communicator& comm, int64_t numel, int64_t chunk, const float* shard,
                       GatherStats& stats)
    : comm_(comm), numel_(numel), chunk_(chunk), shard_(shard), stats_(stats) {
  VERL_CHECK(chunk > 0 && chunk * comm.world_size() >= numel,
             "ZeroGather: a chunk of {} for {} elements over {} ranks", chunk, numel,
             comm.world_size());
}

ZeroGather::~ZeroGather() {
  // A gather still in flight writes its buffer: wait before freeing (unless an error unwinds, when
  // the job ends without waiting; see dist::abort_job_on_error).
  if (std::uncaught_exceptions() > 0) return;
  for (auto& [range, b] : buffers_)
    if (b.pending) b.pending->wait();
}

ZeroGather::Buffer& ZeroGather::start(int64_t begin, int64_t end, float* out) {
  VERL_CHECK(0 <= begin && begin < end && end <= numel_,
             "ZeRO-3: a weight range [{}, {}) of a layout of {}", begin, end, numel_);
  Buffer b;
  const int world = comm_.world_size(), rank = comm_.rank();
  b.counts.assign(static_cast<size_t>(world), 0);
  b.displs.assign(static_cast<size_t>(world), 0);
  for (int r = 0; r < world; ++r) {
    const int64_t lo = std::max(begin, r * chunk_), hi = std::min({end, (r + 1) * chunk_, numel_});
    if (hi <= lo) continue;
    b.counts[static_cast<size_t>(r)] = static_cast<size_t>(hi - lo);
    b.displs[static_cast<size_t>(r)] = static_cast<size_t>(lo - begin);
  }
  const size_t mine = b.counts[static_cast<size_t>(rank)];
  const float* send = shard_ + (mine ? std::max(begin, rank * chunk_) - rank * chunk_ : 0);
  if (out == nullptr) {
    b.data.resize(static_cast<size_t>(end - begin));
    out = b.data.data();
    live_bytes_ += b.data.size() * sizeof(float);
    peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  }
  b.pending = comm_.start_all_gather_v(send, out, b.counts, b.displs, dist::DataType::F32);
  stats_.bytes += static_cast<double>(world - 1) * static_cast<double>(mine) * sizeof(float);
  ++stats_.gathers;
  auto [it, inserted] = buffers_.emplace(std::pair{begin, end}, std::move(b));
  VERL_CHECK(inserted, "internal: ZeRO-3 range [{}, {}) gathered twice", begin, end);
  return it->second;
}

void ZeroGather::wait(Buffer& b) {
  if (!b.pending) return;
  Timer t;
  b.pending->wait();
  b.pending.reset();
  stats_.seconds += t.seconds();
}

const float* ZeroGather::acquire(int64_t begin, int64_t end) {
  if (full_) return full_ + begin;
  auto it = buffers_.find({begin, end});
  Buffer& b = it != buffers_.end() ? it->second : start(begin, end, nullptr);
  wait(b);
  return b.data.data();
}

void ZeroGather::prefetch(int64_t begin, int64_t end) {
  if (full_ || buffers_.count({begin, end})) return;
  start(begin, end, nullptr);
}

void ZeroGather::release(int64_t begin, int64_t end) {
  if (full_) return;
  auto it = buffers_.find({begin, end});
  VERL_CHECK(it != buffers_.end(),
             "internal: ZeRO-3 range [{}, {}) released without being acquired", begin, end);
  wait(it->second);
  live_bytes_ -= it->second.data.size() * sizeof(float);
  buffers_.erase(it);
}

void ZeroGather::gather_all(float* out, int64_t bucket) {
  VERL_CHECK(bucket > 0, "ZeRO-3 reshard: a bucket of {} elements", bucket);
  VERL_CHECK(buffers_.empty(), "internal: ZeRO-3 reshard while {} layer gathers are alive",
             buffers_.size());
  // Two buckets in flight: the next one's gather starts before the previous one is waited for.
  std::pair<int64_t, int64_t> prev{-1, -1};
  for (int64_t b = 0; b < numel_; b += bucket) {
    const int64_t e = std::min(numel_, b + bucket);
    start(b, e, out + b);
    if (prev.first >= 0) {
      wait(buffers_.at(prev));
      buffers_.erase(prev);
    }
    prev = {b, e};
  }
  if (prev.first >= 0) {
    wait(buffers_.at(prev));
    buffers_.erase(prev);
  }
}

size_t ZeroGather::take_peak_bytes() {
  const size_t p = peak_bytes_;
  peak_bytes_ = live_bytes_;
  return p;
}

}  // namespace verl::optim
