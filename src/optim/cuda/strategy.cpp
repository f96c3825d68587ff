// Data parallelism over the GPU storage: the stage-0 overlapped all-reduce and LightweightSync
// (optim/cuda/strategy.h).
#include "optim/cuda/strategy.h"

#include "core/error.h"
#include "optim/cuda/carry.h"
#include "optim/cuda/sparse_sync.h"

namespace verl::optim::cuda {

using ops::cuda::DeviceBuffer;

CudaDataParallel::CudaDataParallel(CudaTrainState& st, dist::Communicator& comm,
                                   const std::optional<LightweightConfig>& lw)
    : Strategy(st), gpu_(st), comm_(comm) {
  VERL_CHECK(st.trainable(), "data parallelism: the state is forward-only (a reference policy)");
  if (!lw) return;
  check_lightweight_config(*lw);
  lw_ = lw;
  if (lw->needs_carry()) {
    carry_ = DeviceBuffer<float>(static_cast<size_t>(st.numel()));
    carry_.zero(st.ctx().stream);
  }
  scratch_ = DeviceBuffer<uint8_t>(sparse_scratch_bytes(st.numel()));
}

void CudaDataParallel::start_sparse(int64_t begin, int64_t end) {
  const int world = comm_.world_size();
  SparseBucket b{begin, end, sparse_layout(end - begin, lw_->top_k, lw_->values)};
  DeviceBuffer<uint8_t>& buf = messages_[begin];
  const size_t bytes = b.layout.bytes;
  if (buf.size() != bytes * static_cast<size_t>(world))
    buf = DeviceBuffer<uint8_t>(bytes * static_cast<size_t>(world));
  uint8_t* mine = buf.data() + bytes * static_cast<size_t>(comm_.rank());
  const ops::cuda::CudaContext& ctx = gpu_.ctx();
  sparse_compress(ctx, gpu_.grads() + begin, carry_.size() > 0 ? carry_.data() + begin : nullptr,
                  lw_->error_feedback, b.layout, mine, scratch_.data());
  pending_.push_back(comm_.start_all_gather(mine, buf.data(), bytes, dist::DataType::U8,
                                            dist::Place::device(ctx.stream)));
  sync_stats_.add_all_gather(world, bytes, end - begin);
  sparse_.push_back(b);
}

void CudaDataParallel::finish_sparse() {
  for (auto& p : pending_) p->wait();
  pending_.clear();
  // Every rank's decoded message added in rank order into the bucket: the same sum everywhere.
  const ops::cuda::CudaContext& ctx = gpu_.ctx();
  for (const SparseBucket& b : sparse_) {
    float* out = gpu_.grads() + b.begin;
    VERL_CUDA_CHECK(
        cudaMemsetAsync(out, 0, static_cast<size_t>(b.end - b.begin) * sizeof(float), ctx.stream));
    const uint8_t* all = messages_.at(b.begin).data();
    for (int r = 0; r < comm_.world_size(); ++r)
      sparse_accumulate(ctx, all + b.layout.bytes * static_cast<size_t>(r), b.layout, out);
  }
  sparse_.clear();
}

void CudaDataParallel::defer_grads() {
  VERL_CHECK(carry_.size() > 0, "defer_grads: no LightweightSync carry");
  add_into(gpu_.ctx(), carry_.data(), gpu_.grads(), gpu_.numel());
}

std::vector<float> CudaDataParallel::download_carry() const {
  return carry_.size() > 0 ? carry_.download() : std::vector<float>{};
}

void CudaDataParallel::upload_carry(const std::vector<float>& carry, int64_t calls) {
  VERL_CHECK(
      carry.empty() || carry_.size() == 0 || static_cast<int64_t>(carry.size()) == gpu_.numel(),
      "restore: a LightweightSync carry of {} floats for a model of {} parameters", carry.size(),
      gpu_.numel());
  if (carry_.size() > 0) {
    if (carry.empty())
      carry_.zero(gpu_.ctx().stream);
    else
      carry_.upload(carry);
  }
  sync_calls_ = calls;
}

void CudaDataParallel::grads_ready(int64_t begin, int64_t end) {
  if (!armed_ || end <= begin) return;
  if (lw_) {
    started_ = true;
    start_sparse(begin, end);
    while (!pending_.empty() && pending_.front()->test()) pending_.pop_front();
    return;
  }
  sync_stats_.add_all_reduce(comm_.world_size(), end - begin);
  started_ = true;
  pending_.push_back(comm_.start_all_reduce(gpu_.grads() + begin, static_cast<size_t>(end - begin),
                                            dist::DataType::F32, dist::ReduceOp::Sum,
                                            dist::Place::device(gpu_.ctx().stream)));
  while (!pending_.empty() && pending_.front()->test()) pending_.pop_front();
}

void CudaDataParallel::reduce_grads(dist::Communicator& comm) {
  armed_ = false;
  if (lw_) {
    if (!started_) start_sparse(0, gpu_.numel());  // the whole buffer as one bucket
    started_ = false;
    return finish_sparse();
  }
  // Nothing started during backward: the whole buffer at once.
  if (!started_) return all_reduce_whole_grads(gpu_, comm, sync_stats_);
  started_ = false;
  for (auto& p : pending_) p->wait();  // the update below reads every bucket's sum
  pending_.clear();
}

namespace {
std::unique_ptr<Strategy> build(TrainState& st, dist::Communicator& comm,
                                const std::optional<LightweightConfig>& lw) {
  return std::make_unique<CudaDataParallel>(static_cast<CudaTrainState&>(st), comm, lw);
}
}  // namespace

void register_cuda_data_parallel() {
  detail::register_data_parallel(Device::Cuda, &build);
}

}  // namespace verl::optim::cuda
