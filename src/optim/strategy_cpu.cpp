// Data parallelism over the CPU storage: ZeRO 0/1/2/3 and LightweightSync (strategy_cpu.h).
#include "optim/strategy_cpu.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace verl::optim {

CpuDataParallel::CpuDataParallel(CpuTrainState& st, dist::Communicator& comm, int stage,
                                 const std::optional<LightweightConfig>& lw)
    : Strategy(st), cpu_(st), comm_(comm) {
  VERL_CHECK(st.trainable(), "data parallelism: the state is forward-only (a reference policy)");
  VERL_CHECK(stage >= 0 && stage <= 3, "zero_stage {}: 0, 1, 2 or 3", stage);
  if (stage >= 1) {
    const int64_t world = comm.world_size(), n = st.numel();
    chunk_ = (n + world - 1) / world;
    st.set_shard(ShardSpec{std::min(n, comm.rank() * chunk_),
                           std::min(n, (comm.rank() + 1) * chunk_), chunk_, comm.world_size(),
                           stage});
  }
  // The gradients of stage 3 go as stage 2's: each range reduced to its owners as backward ends it.
  sync_ = std::make_unique<GradSync>(comm, std::min(stage, 2), st.numel(), chunk_, st.grads(),
                                     sync_stats_);
  if (stage == 3)
    gather_ = std::make_unique<ZeroGather>(comm, st.numel(), chunk_, st.master(), gather_stats_);
  if (lw) {
    check_lightweight_config(*lw);
    lw_ = lw;
    carry_.assign(lw->needs_carry() ? static_cast<size_t>(st.numel()) : 0, 0.0f);
    sync_->use_lightweight(*lw, lw->needs_carry() ? carry_.data() : nullptr);
  }
}

void CpuDataParallel::reduce_grads(dist::Communicator& comm) {
  // The buckets backward started (stage 2: every micro-batch's) complete here.
  if (sync_->finish() || zero_stage() >= 2) return;
  if (sync_->lightweight()) return sync_->sync_whole();
  if (zero_stage() == 0) return all_reduce_whole_grads(st_, comm, sync_stats_);
  sync_stats_.add_reduce_to_owners(comm.world_size(), cpu_.grads_size());
  // This rank's block of the padded buffer receives the sum over ranks (in place).
  float* g = cpu_.grads();
  comm.reduce_scatter(g, g + comm.rank() * chunk_, static_cast<size_t>(chunk_), dist::DataType::F32,
                      dist::ReduceOp::Sum);
}

void CpuDataParallel::gather_weights(dist::Communicator& comm) {
  if (zero_stage() == 0 || zero_stage() == 3) return;  // ZeRO-3 gathers as the model reads
  const ShardSpec& sh = st_.shard();
  float* w = cpu_.master();
  std::vector<float> all(static_cast<size_t>(chunk_ * comm.world_size()), 0.0f);
  std::copy(w + sh.begin, w + sh.end, all.begin() + comm.rank() * chunk_);
  comm.all_gather(all.data() + comm.rank() * chunk_, all.data(), static_cast<size_t>(chunk_),
                  dist::DataType::F32);
  std::copy(all.begin(), all.begin() + st_.numel(), w);
}

void CpuDataParallel::gather_full_weights(int64_t bucket) {
  if (zero_stage() != 3 || cpu_.has_full_weights()) return;
  std::vector<float> full(static_cast<size_t>(st_.numel()), 0.0f);
  gather_->gather_all(full.data(), bucket);
  gather_->read_full(cpu_.hold_full_weights(std::move(full)));
}

void CpuDataParallel::drop_full_weights() {
  if (zero_stage() != 3 || !cpu_.has_full_weights()) return;
  gather_->read_full(nullptr);
  cpu_.release_full_weights();
}

AdamWState CpuDataParallel::download_optimizer_state() const {
  if (zero_stage() == 0) return st_.download_optimizer_state();
  return gather_sharded_moments(chunk_, comm_);  // sharded: every rank's moments (a collective)
}

void CpuDataParallel::defer_grads() {
  VERL_CHECK(!carry_.empty(), "defer_grads: no LightweightSync carry");
  const float* g = cpu_.grads();
  for (int64_t i = 0; i < st_.numel(); ++i) carry_[i] += g[i];
}

void CpuDataParallel::upload_carry(const std::vector<float>& carry, int64_t calls) {
  VERL_CHECK(carry.empty() || carry_.empty() || static_cast<int64_t>(carry.size()) == st_.numel(),
             "restore: a LightweightSync carry of {} floats for a model of {} parameters",
             carry.size(), st_.numel());
  if (!carry_.empty()) {
    if (carry.empty())
      std::fill(carry_.begin(), carry_.end(), 0.0f);
    else
      carry_ = carry;
  }
  sync_calls_ = calls;
}

}  // namespace verl::optim
