#include "optim/cuda/train_state.h"

#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/cuda/glue.h"
#include "optim/cuda/carry.h"
#include "optim/cuda/sparse_sync.h"
#include "dist/communicator.h"

namespace verl::optim::cuda {

using ops::cuda::bf16;
using ops::cuda::DeviceBuffer;

CudaTrainState::CudaTrainState(const ops::cuda::CudaContext& ctx, const model::Weights& w,
                               bool trainable)
    : TrainState(w.config, w.layout, trainable), ctx_(ctx) {
  const size_t n = static_cast<size_t>(numel());
  wbf_ = DeviceBuffer<bf16>(n);
  if (trainable_) {
    master_ = DeviceBuffer<float>(n);
    grads_ = DeviceBuffer<float>(n);
    m_ = DeviceBuffer<float>(n);
    v_ = DeviceBuffer<float>(n);
    norm_ = DeviceBuffer<double>(1);
    grads_.zero(ctx_.stream);
    m_.zero(ctx_.stream);
    v_.zero(ctx_.stream);
  }
  upload(w.data, nullptr);
}

size_t CudaTrainState::device_bytes() const {
  return master_.bytes() + grads_.bytes() + m_.bytes() + v_.bytes() + wbf_.bytes() + norm_.bytes();
}

void CudaTrainState::zero_grad() {
  require_trainable("zero_grad");
  grads_.zero(ctx_.stream);
}

void CudaTrainState::all_reduce_grads(dist::Communicator& comm) {
  require_trainable("all_reduce_grads");
  VERL_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));  // the backward's gradients are complete
  sync_stats_.add_all_reduce(comm.world_size(), static_cast<int64_t>(grads_.size()));
  comm.all_reduce(grads_.data(), grads_.size(), dist::DataType::F32, dist::ReduceOp::Sum,
                  dist::Place::device(ctx_.stream));
}

void CudaTrainState::enable_data_parallel(dist::Communicator& comm, int zero_stage) {
  require_trainable("enable_data_parallel");
  TrainState::enable_data_parallel(comm, zero_stage);  // refuses stages 1 and 2 by name
  dp_ = &comm;
}

void CudaTrainState::use_lightweight_sync(const LightweightConfig& cfg) {
  require_trainable("use_lightweight_sync");
  VERL_CHECK(dp_ != nullptr, "use_lightweight_sync: enable_data_parallel first");
  check_lightweight_config(cfg);
  lw_ = cfg;
  if (cfg.needs_carry()) {
    carry_ = DeviceBuffer<float>(static_cast<size_t>(numel()));
    carry_.zero(ctx_.stream);
  }
  scratch_ = DeviceBuffer<uint8_t>(sparse_scratch_bytes(numel()));
}

void CudaTrainState::start_sparse(int64_t begin, int64_t end) {
  const int world = dp_->world_size();
  SparseBucket b{begin, end, sparse_layout(end - begin, lw_->top_k, lw_->values)};
  DeviceBuffer<uint8_t>& buf = messages_[begin];
  const size_t bytes = b.layout.bytes;
  if (buf.size() != bytes * static_cast<size_t>(world)) buf = DeviceBuffer<uint8_t>(bytes * static_cast<size_t>(world));
  uint8_t* mine = buf.data() + bytes * static_cast<size_t>(dp_->rank());
  sparse_compress(ctx_, grads_.data() + begin, carry_.size() > 0 ? carry_.data() + begin : nullptr,
                  lw_->error_feedback, b.layout, mine, scratch_.data());
  pending_.push_back(dp_->start_all_gather(mine, buf.data(), bytes, dist::DataType::U8,
                                           dist::Place::device(ctx_.stream)));
  sync_stats_.add_all_gather(world, bytes, end - begin);
  sparse_.push_back(b);
}

void CudaTrainState::finish_sparse() {
  for (auto& p : pending_) p->wait();
  pending_.clear();
  // Every rank's decoded message added in rank order into the bucket: the same sum everywhere.
  for (const SparseBucket& b : sparse_) {
    float* out = grads_.data() + b.begin;
    VERL_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(b.end - b.begin) * sizeof(float), ctx_.stream));
    const uint8_t* all = messages_.at(b.begin).data();
    for (int r = 0; r < dp_->world_size(); ++r)
      sparse_accumulate(ctx_, all + b.layout.bytes * static_cast<size_t>(r), b.layout, out);
  }
  sparse_.clear();
}

void CudaTrainState::defer_grads() {
  VERL_CHECK(carry_.size() > 0, "defer_grads: no LightweightSync carry");
  add_into(ctx_, carry_.data(), grads_.data(), numel());
}

std::vector<float> CudaTrainState::download_carry() const {
  return carry_.size() > 0 ? carry_.download() : std::vector<float>{};
}

void CudaTrainState::upload_carry(const std::vector<float>& carry, int64_t calls) {
  VERL_CHECK(carry.empty() || carry_.size() == 0 || static_cast<int64_t>(carry.size()) == numel(),
             "restore: a LightweightSync carry of {} floats for a model of {} parameters", carry.size(), numel());
  if (carry_.size() > 0) {
    if (carry.empty()) carry_.zero(ctx_.stream);
    else carry_.upload(carry);
  }
  sync_calls_ = calls;
}

uint64_t CudaTrainState::weights_digest() {
  ops::cuda::sum_squares(ctx_, norm_.data(), master_.data(), numel());
  double sq = 0;
  VERL_CUDA_CHECK(cudaMemcpyAsync(&sq, norm_.data(), sizeof(double), cudaMemcpyDeviceToHost, ctx_.stream));
  VERL_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  uint64_t bits;
  std::memcpy(&bits, &sq, sizeof(bits));
  return bits;
}

void CudaTrainState::grads_ready(int64_t begin, int64_t end) {
  if (!armed_ || end <= begin) return;
  if (lw_) {
    started_ = true;
    start_sparse(begin, end);
    while (!pending_.empty() && pending_.front()->test()) pending_.pop_front();
    return;
  }
  sync_stats_.add_all_reduce(dp_->world_size(), end - begin);
  started_ = true;
  pending_.push_back(dp_->start_all_reduce(grads_.data() + begin, static_cast<size_t>(end - begin),
                                           dist::DataType::F32, dist::ReduceOp::Sum,
                                           dist::Place::device(ctx_.stream)));
  while (!pending_.empty() && pending_.front()->test()) pending_.pop_front();
}

void CudaTrainState::reduce_grads(dist::Communicator& comm) {
  armed_ = false;
  if (lw_) {
    if (!started_) start_sparse(0, numel());  // the whole buffer as one bucket
    started_ = false;
    return finish_sparse();
  }
  if (!started_) return all_reduce_grads(comm);  // nothing started during backward
  started_ = false;
  for (auto& p : pending_) p->wait();  // the update below reads every bucket's sum
  pending_.clear();
}

double CudaTrainState::grad_sum_squares() {
  require_trainable("grad_sum_squares");
  ops::cuda::sum_squares(ctx_, norm_.data(), grads_.data() + shard_.begin, shard_.size());
  double sq = 0;
  VERL_CUDA_CHECK(
      cudaMemcpyAsync(&sq, norm_.data(), sizeof(double), cudaMemcpyDeviceToHost, ctx_.stream));
  VERL_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  return sq;
}

void CudaTrainState::adamw_update(const AdamWConfig& cfg, float lr, float grad_scale) {
  require_trainable("adamw_update");
  ++steps_;
  const int64_t b = shard_.begin;
  ops::cuda::adamw_step(ctx_, master_.data() + b, wbf_.data() + b, grads_.data() + b,
                        m_.data() + b, v_.data() + b, shard_.size(), lr, cfg.beta1, cfg.beta2,
                        cfg.eps, cfg.weight_decay, steps_, grad_scale);
}

std::vector<float> CudaTrainState::download_weights() const {
  if (trainable_) return master_.download();
  const std::vector<bf16> h = wbf_.download();
  std::vector<float> out(h.size());
  for (size_t i = 0; i < h.size(); ++i) {
    uint16_t bits;
    std::memcpy(&bits, &h[i], sizeof(bits));
    out[i] = bf16_to_f32(bits);
  }
  return out;
}

AdamWState CudaTrainState::download_optimizer_state() const {
  require_trainable("download_optimizer_state");
  AdamWState s;
  s.exp_avg = m_.download();
  s.exp_avg_sq = v_.download();
  s.step = steps_;
  return s;
}

void CudaTrainState::upload(const std::vector<float>& weights, const AdamWState* opt) {
  check_upload(weights, opt);
  VERL_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));  // nothing may still read the old ones
  if (trainable_) {
    master_.upload(weights);
    ops::cuda::convert(ctx_, wbf_.data(), master_.data(), numel());
    if (opt != nullptr) {
      m_.upload(opt->exp_avg);
      v_.upload(opt->exp_avg_sq);
      steps_ = opt->step;
    }
    VERL_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
    return;
  }
  // Forward-only: no fp32 copy on the device; round on the host (to nearest even, as the device
  // conversion does).
  std::vector<uint16_t> h(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) h[i] = f32_to_bf16(weights[i]);
  ops::cuda::copy_to_device(wbf_.data(), h.data(), h.size() * sizeof(uint16_t));
}

}  // namespace verl::optim::cuda
