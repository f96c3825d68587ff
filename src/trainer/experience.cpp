#include "trainer/experience.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "data/seqlen_balancing.h"

namespace verl::trainer {

PackedResponses::PackedResponses(const Experience& exp, std::vector<int64_t> rows)
    : rows_(std::move(rows)), L_(exp.L) {
  std::vector<std::vector<int32_t>> seqs;
  seqs.reserve(rows_.size());
  for (int64_t b : rows_) {
    std::vector<int32_t> s = exp.sample[b]->prompt_ids;
    s.insert(s.end(), exp.response[b].begin(), exp.response[b].end());
    seqs.push_back(std::move(s));
  }
  batch_ = model::PackedBatch::from_sequences(seqs);
  base_.resize(rows_.size());
  len_.resize(rows_.size());
  // The passes read the log-probs of the positions that predict response tokens only: those are
  // the LM head's rows (head_rows).
  for (size_t i = 0; i < rows_.size(); ++i) {
    const int64_t b = rows_[i];
    base_[i] = batch_.cu_seqlens[i] + static_cast<int64_t>(exp.sample[b]->prompt_ids.size()) - 1;
    len_[i] = static_cast<int64_t>(exp.response[b].size());
    for (int64_t j = 0; j < len_[i]; ++j)
      batch_.head_rows.push_back(static_cast<int32_t>(base_[i] + j));
  }
}

std::vector<float> PackedResponses::gather(const std::vector<float>& packed) const {
  VERL_CHECK(static_cast<int64_t>(packed.size()) >= batch_.num_tokens(),
             "PackedResponses::gather: {} values for a micro-batch of {} tokens", packed.size(),
             batch_.num_tokens());
  std::vector<float> out(rows_.size() * static_cast<size_t>(L_), 0.0f);
  for (size_t i = 0; i < rows_.size(); ++i) {
    for (int64_t j = 0; j < len_[i]; ++j) out[i * L_ + j] = packed[base_[i] + j];
  }
  return out;
}

void PackedResponses::gather_into(const std::vector<float>& packed,
                                  std::vector<float>& matrix) const {
  VERL_CHECK(static_cast<int64_t>(packed.size()) >= batch_.num_tokens(),
             "PackedResponses::gather_into: {} values for a micro-batch of {} tokens",
             packed.size(), batch_.num_tokens());
  for (size_t i = 0; i < rows_.size(); ++i) {
    for (int64_t j = 0; j < len_[i]; ++j) matrix[rows_[i] * L_ + j] = packed[base_[i] + j];
  }
}

std::vector<float> PackedResponses::row(const std::vector<float>& packed, size_t i) const {
  VERL_CHECK(i < rows_.size() && static_cast<int64_t>(packed.size()) >= batch_.num_tokens(),
             "PackedResponses::row: row {} of {} from {} values for {} tokens", i, rows_.size(),
             packed.size(), batch_.num_tokens());
  const auto first = packed.begin() + base_[i];
  return std::vector<float>(first, first + len_[i]);
}

std::vector<float> PackedResponses::scatter(const std::vector<float>& per_row) const {
  if (per_row.empty()) return {};
  VERL_CHECK(per_row.size() == rows_.size() * static_cast<size_t>(L_),
             "PackedResponses::scatter: {} values for {} rows of {}", per_row.size(), rows_.size(),
             L_);
  std::vector<float> out(static_cast<size_t>(batch_.num_tokens()), 0.0f);
  for (size_t i = 0; i < rows_.size(); ++i) {
    for (int64_t j = 0; j < len_[i]; ++j) out[base_[i] + j] = per_row[i * L_ + j];
  }
  return out;
}

}  // namespace verl::trainer

namespace verl::trainer {
namespace {

// A row's wire format: i64 group, i32 length, i32 finish-reason bytes, f32 score, then length x
// (i32 token, f32 rollout log-prob, f32 mask, f32 token score), then the finish reason's bytes.
class RowWriter {
 public:
  explicit RowWriter(std::vector<uint8_t>& out) : out_(out) {}
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  void put_bytes(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    out_.insert(out_.end(), p, p + n);
  }

 private:
  std::vector<uint8_t>& out_;
};

class RowReader {
 public:
  RowReader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  template <class T>
  T get() {
    T v;
    take(&v, sizeof(T));
    return v;
  }
  void take(void* dst, size_t n) {
    VERL_CHECK(static_cast<size_t>(end_ - p_) >= n,
               "balance_batch: a received row is truncated ({} bytes "
               "short)",
               n - static_cast<size_t>(end_ - p_));
    std::memcpy(dst, p_, n);
    p_ += n;
  }
  bool done() const { return p_ == end_; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

void write_row(const Experience& exp, int64_t b, RowWriter& w) {
  const auto len = static_cast<int32_t>(exp.response[b].size());
  w.put<int64_t>(exp.group[b]);
  w.put<int32_t>(len);
  w.put<int32_t>(static_cast<int32_t>(exp.finish_reason[b].size()));
  w.put<float>(exp.scores[b]);
  w.put_bytes(exp.response[b].data(), sizeof(int32_t) * static_cast<size_t>(len));
  for (const std::vector<float>* m : {&exp.rollout_log_prob, &exp.mask, &exp.token_level_scores})
    w.put_bytes(m->data() + b * exp.L, sizeof(float) * static_cast<size_t>(len));
  w.put_bytes(exp.finish_reason[b].data(), exp.finish_reason[b].size());
}

struct Row {
  int64_t group = 0;
  float score = 0;
  std::string finish_reason;
  std::vector<int32_t> tokens;
  std::vector<float> rollout_log_prob, mask, token_level_scores;
};

Row read_row(RowReader& r) {
  Row row;
  row.group = r.get<int64_t>();
  const auto len = r.get<int32_t>(), reason = r.get<int32_t>();
  VERL_CHECK(len >= 0 && reason >= 0, "balance_batch: a received row has length {} and reason {}",
             len, reason);
  row.score = r.get<float>();
  row.tokens.resize(static_cast<size_t>(len));
  r.take(row.tokens.data(), sizeof(int32_t) * row.tokens.size());
  for (std::vector<float>* m : {&row.rollout_log_prob, &row.mask, &row.token_level_scores}) {
    m->resize(static_cast<size_t>(len));
    r.take(m->data(), sizeof(float) * m->size());
  }
  row.finish_reason.resize(static_cast<size_t>(reason));
  r.take(row.finish_reason.data(), row.finish_reason.size());
  return row;
}

}  // namespace

BalanceResult balance_across_ranks(Experience& exp, const std::vector<data::Sample>& batch,
                                   dist::Communicator& comm) {
  const int64_t world = comm.world_size(), me = comm.rank(), B = exp.B;
  VERL_CHECK(exp.token_level_scores.size() == static_cast<size_t>(B * exp.L),
             "balance_batch: the experience must be scored before it is balanced");
  // Every rank's rows' lengths (prompt + response), in rank order: the global batch's rows.
  std::vector<int64_t> mine(static_cast<size_t>(B)), seqlens(static_cast<size_t>(B * world));
  for (int64_t b = 0; b < B; ++b) mine[b] = exp.tokens(b);
  comm.all_gather<int64_t>(mine, seqlens);
  BalanceResult out;
  data::RankBalance rb = data::balance_across_ranks(seqlens, world);
  out.metrics = std::move(rb.metrics);
  // Rank j's new rows are the global rows order[j B .. j B + B); global row g lives on rank g / B.
  std::vector<std::vector<uint8_t>> to(static_cast<size_t>(world));
  for (int64_t j = 0; j < world; ++j) {
    RowWriter w(to[j]);
    for (int64_t i = j * B; i < (j + 1) * B; ++i)
      if (rb.order[i] / B == me) write_row(exp, rb.order[i] % B, w);
  }
  std::vector<size_t> send_counts(world), send_displs(world), recv_counts(world),
      recv_displs(world);
  std::vector<uint8_t> send;
  for (int64_t j = 0; j < world; ++j) {
    send_displs[j] = send.size();
    send_counts[j] = to[j].size();
    send.insert(send.end(), to[j].begin(), to[j].end());
    out.bytes_sent += j == me ? 0 : to[j].size();
  }
  std::vector<int64_t> counts_out(send_counts.begin(), send_counts.end()), counts_in(world);
  comm.all_to_all<int64_t>(counts_out, counts_in);
  size_t total = 0;
  for (int64_t j = 0; j < world; ++j) {
    recv_counts[j] = static_cast<size_t>(counts_in[j]);
    recv_displs[j] = total;
    total += recv_counts[j];
  }
  std::vector<uint8_t> recv(total);
  comm.all_to_allv<uint8_t>(send, send_counts, send_displs, recv, recv_counts, recv_displs);

  // Rows from each source arrive in this rank's new order: walk the order, taking the next row of
  // the rank that held it.
  std::vector<RowReader> from;
  for (int64_t j = 0; j < world; ++j)
    from.emplace_back(recv.data() + recv_displs[j], recv_counts[j]);
  std::vector<Row> rows;
  rows.reserve(static_cast<size_t>(B));
  int64_t L = 1;
  for (int64_t i = me * B; i < (me + 1) * B; ++i) {
    rows.push_back(read_row(from[rb.order[i] / B]));
    L = std::max<int64_t>(L, static_cast<int64_t>(rows.back().tokens.size()));
  }
  for (int64_t j = 0; j < world; ++j)
    VERL_CHECK(from[j].done(),
               "balance_batch: rank {} sent more rows than this rank's partition holds", j);

  Experience next;
  next.B = B;
  next.L = L;
  next.mask.assign(B * L, 0.0f);
  next.rollout_log_prob.assign(B * L, 0.0f);
  next.token_level_scores.assign(B * L, 0.0f);
  for (int64_t b = 0; b < B; ++b) {
    Row& r = rows[b];
    VERL_CHECK(r.group >= 0 && r.group < static_cast<int64_t>(batch.size()),
               "balance_batch: a received row names prompt {} of a batch of {}", r.group,
               batch.size());
    next.group.push_back(r.group);
    next.sample.push_back(&batch[r.group]);
    next.scores.push_back(r.score);
    next.finish_reason.push_back(std::move(r.finish_reason));
    std::copy(r.rollout_log_prob.begin(), r.rollout_log_prob.end(),
              next.rollout_log_prob.begin() + b * L);
    std::copy(r.mask.begin(), r.mask.end(), next.mask.begin() + b * L);
    std::copy(r.token_level_scores.begin(), r.token_level_scores.end(),
              next.token_level_scores.begin() + b * L);
    next.response.push_back(std::move(r.tokens));
  }
  next.token_level_rewards = next.token_level_scores;
  exp = std::move(next);
  return out;
}

std::pair<std::vector<data::Sample>, int64_t> rank_share(const std::vector<data::Sample>& all,
                                                         const dist::Communicator& comm) {
  const int64_t world = comm.world_size(), n = static_cast<int64_t>(all.size());
  if (world == 1) return {all, 0};
  VERL_CHECK(n % world == 0,
             "a batch of {} prompts does not split evenly over {} data-parallel ranks", n, world);
  const int64_t per = n / world, first = comm.rank() * per;
  return {std::vector<data::Sample>(all.begin() + first, all.begin() + first + per), first};
}

GlobalRows::GlobalRows(dist::Communicator& comm, const Experience& exp)
    : comm_(comm), B_(exp.B), L_(exp.L), Lg_(comm.world_size() > 1 ? comm.max(exp.L) : exp.L) {}

std::vector<float> GlobalRows::gather(const std::vector<float>& m) {
  if (comm_.world_size() == 1 || m.empty()) return m;
  std::vector<float> padded(static_cast<size_t>(B_ * Lg_), 0.0f);
  for (int64_t b = 0; b < B_; ++b) std::copy_n(m.begin() + b * L_, L_, padded.begin() + b * Lg_);
  std::vector<float> out(padded.size() * comm_.world_size());
  comm_.all_gather<float>(padded, out);
  bytes_ += padded.size() * sizeof(float);
  return out;
}

std::vector<float> GlobalRows::gather_per_row(const std::vector<float>& v) {
  if (comm_.world_size() == 1) return v;
  std::vector<float> out(v.size() * comm_.world_size());
  comm_.all_gather<float>(v, out);
  bytes_ += v.size() * sizeof(float);
  return out;
}

std::vector<int64_t> GlobalRows::gather_index(const std::vector<int64_t>& group) {
  if (comm_.world_size() == 1) return group;
  std::vector<int64_t> out(group.size() * comm_.world_size());
  comm_.all_gather<int64_t>(group, out);
  bytes_ += group.size() * sizeof(int64_t);
  return out;
}

std::vector<float> GlobalRows::mine(const std::vector<float>& global) const {
  if (comm_.world_size() == 1 || global.empty()) return global;
  std::vector<float> out(static_cast<size_t>(B_ * L_));
  const int64_t row0 = comm_.rank() * B_;
  for (int64_t b = 0; b < B_; ++b)
    std::copy_n(global.begin() + (row0 + b) * Lg_, L_, out.begin() + b * L_);
  return out;
}

}  // namespace verl::trainer
