#include "optim/cuda/train_state.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "ops/cuda/glue.h"
#include "optim/cuda/strategy.h"

namespace verl::optim::cuda {

using ops::cuda::bf16;
using ops::cuda::DeviceBuffer;

namespace {
// A share of n elements as a count of elements, rounded up to a multiple of 256 (at most n).
int64_t offloaded_elems(double share, int64_t n) {
  VERL_CHECK(share >= 0 && share <= 1, "offload share {} is outside 0..1", share);
  const int64_t k =
      static_cast<int64_t>(std::llround(share * static_cast<double>(n)) + 255) / 256 * 256;
  return std::min(k, n);
}
}  // namespace

void CudaTrainState::SplitBuffer::allocate(int64_t n, int64_t resident_elems) {
  resident = resident_elems;
  dev = DeviceBuffer<float>(static_cast<size_t>(resident));
  host = ops::cuda::PinnedBuffer<float>(static_cast<size_t>(n - resident));
}

// The device part may be longer than `resident` (ZeRO's padding to world x chunk): only the
// resident elements are the buffer's.
void CudaTrainState::SplitBuffer::upload(const std::vector<float>& x) {
  const auto n = static_cast<size_t>(resident) + host.size();
  VERL_CHECK(x.size() == n, "internal: {} floats into a buffer of {}", x.size(), n);
  if (resident > 0)
    ops::cuda::copy_to_device(dev.data(), x.data(), static_cast<size_t>(resident) * sizeof(float));
  if (host.size() > 0) std::memcpy(host.data(), x.data() + resident, host.bytes());
}

void CudaTrainState::SplitBuffer::zero(cudaStream_t stream) {
  dev.zero(stream);
  if (host.size() > 0) std::memset(host.data(), 0, host.bytes());
}

std::vector<float> CudaTrainState::SplitBuffer::download() const {
  std::vector<float> x(static_cast<size_t>(resident) + host.size());
  if (resident > 0)
    ops::cuda::copy_to_host(x.data(), dev.data(), static_cast<size_t>(resident) * sizeof(float));
  if (host.size() > 0) std::memcpy(x.data() + resident, host.data(), host.bytes());
  return x;
}

CudaTrainState::CudaTrainState(const ops::cuda::CudaContext& ctx, const model::Weights& w,
                               bool trainable, const OffloadConfig& offload)
    : CudaTrainState(ctx, w.layout, w.data, trainable, offload) {}

CudaTrainState::CudaTrainState(const ops::cuda::CudaContext& ctx, const model::ParamLayout& layout,
                               const std::vector<float>& init, bool trainable,
                               const OffloadConfig& offload)
    : TrainState(layout, trainable), ctx_(ctx), offload_(offload) {
  register_cuda_data_parallel();  // make_strategy builds a GPU state's strategy from here on
  const int64_t n = numel();
  if (!sleeps()) wbf_ = DeviceBuffer<bf16>(static_cast<size_t>(n));
  if (trainable_) {
    VERL_CHECK(offload.bucket > 0, "internal: an offload bucket of {} elements", offload.bucket);
    master_.allocate(n, n - offloaded_elems(offload.params, n));
    m_.allocate(n, n - offloaded_elems(offload.optimizer, n));
    v_.allocate(n, m_.resident);
    grads_ = DeviceBuffer<float>(static_cast<size_t>(n + kZeroSlack));
    norm_ = DeviceBuffer<double>(1);
    grads_.zero(ctx_.stream);
    m_.zero(ctx_.stream);
    v_.zero(ctx_.stream);
    if (first_offloaded() < n) {
      VERL_CUDA_CHECK(cudaStreamCreateWithFlags(&up_, cudaStreamNonBlocking));
      VERL_CUDA_CHECK(cudaStreamCreateWithFlags(&down_, cudaStreamNonBlocking));
      for (int s = 0; s < kSlots; ++s) {
        VERL_CUDA_CHECK(cudaEventCreateWithFlags(&up_done_[s], cudaEventDisableTiming));
        VERL_CUDA_CHECK(cudaEventCreateWithFlags(&slot_free_[s], cudaEventDisableTiming));
        VERL_CUDA_CHECK(cudaEventCreateWithFlags(&computed_[s], cudaEventDisableTiming));
      }
      stage_ = DeviceBuffer<float>(static_cast<size_t>(kSlots * 3 * std::min(offload.bucket, n)));
    }
  }
  upload(init, nullptr);
}

CudaTrainState::~CudaTrainState() {
  if (ctx_.stream != nullptr)
    cudaStreamSynchronize(ctx_.stream);  // no copy may outlive its buffers
  for (int s = 0; s < kSlots; ++s) {
    if (up_done_[s] != nullptr) cudaEventDestroy(up_done_[s]);
    if (slot_free_[s] != nullptr) cudaEventDestroy(slot_free_[s]);
    if (computed_[s] != nullptr) cudaEventDestroy(computed_[s]);
  }
  if (up_ != nullptr) cudaStreamDestroy(up_);
  if (down_ != nullptr) cudaStreamDestroy(down_);
}

size_t CudaTrainState::device_bytes() const {
  return master_.device_bytes() + grads_.bytes() + shard_grads_.bytes() + m_.device_bytes() +
         v_.device_bytes() + wbf_.bytes() + norm_.bytes() + stage_.bytes();
}

size_t CudaTrainState::host_bytes() const {
  return master_.host.bytes() + m_.host.bytes() + v_.host.bytes() + wbf_host_.bytes();
}

int64_t CudaTrainState::first_offloaded() const {
  // A sharded state has no offload (set_shard refuses it); its moments hold the shard only.
  if (!trainable_ || shard_.stage > 0) return numel();
  return std::min({master_.resident, m_.resident, v_.resident});
}

void CudaTrainState::stream_offloaded(int64_t begin, int64_t end, unsigned parts, bool write_back,
                                      const BucketFn& fn) {
  SplitBuffer* bufs[3] = {&master_, &m_, &v_};
  begin = std::max(begin, first_offloaded());
  const int64_t bucket = std::min(offload_.bucket, numel());
  int i = 0;
  for (int64_t lo = begin; lo < end; ++i) {
    // A bucket never straddles a part's boundary: each piece is wholly on the device or the host.
    int64_t hi = std::min(end, lo + bucket);
    for (SplitBuffer* b : bufs)
      if (b->resident > lo && b->resident < hi) hi = b->resident;
    const int s = i % kSlots;
    const size_t bytes = static_cast<size_t>(hi - lo) * sizeof(float);
    float* ptr[3] = {};
    bool staged[3] = {};
    // The slot's previous bucket must be updated and home before its pieces are overwritten.
    VERL_CUDA_CHECK(cudaStreamWaitEvent(up_, slot_free_[s]));
    for (int k = 0; k < 3; ++k) {
      SplitBuffer& b = *bufs[k];
      if (lo < b.resident) {
        ptr[k] = b.dev.data() + lo;
        continue;
      }
      ptr[k] = stage_.data() + (static_cast<size_t>(s) * 3 + k) * static_cast<size_t>(bucket);
      staged[k] = (parts >> k & 1u) != 0;
      if (staged[k])
        VERL_CUDA_CHECK(cudaMemcpyAsync(ptr[k], b.host.data() + (lo - b.resident), bytes,
                                        cudaMemcpyHostToDevice, up_));
    }
    VERL_CUDA_CHECK(cudaEventRecord(up_done_[s], up_));
    VERL_CUDA_CHECK(cudaStreamWaitEvent(ctx_.stream, up_done_[s]));
    fn(ptr, lo, hi - lo);
    VERL_CUDA_CHECK(cudaEventRecord(computed_[s], ctx_.stream));
    if (write_back) {
      VERL_CUDA_CHECK(cudaStreamWaitEvent(down_, computed_[s]));
      for (int k = 0; k < 3; ++k) {
        if (!staged[k]) continue;
        SplitBuffer& b = *bufs[k];
        VERL_CUDA_CHECK(cudaMemcpyAsync(b.host.data() + (lo - b.resident), ptr[k], bytes,
                                        cudaMemcpyDeviceToHost, down_));
      }
      VERL_CUDA_CHECK(cudaEventRecord(slot_free_[s], down_));
    } else {
      VERL_CUDA_CHECK(cudaEventRecord(slot_free_[s], ctx_.stream));
    }
    lo = hi;
  }
  // Whoever synchronises the compute stream, or enqueues after this, sees every piece home.
  for (int s = 0; s < std::min(i, kSlots); ++s)
    VERL_CUDA_CHECK(cudaStreamWaitEvent(ctx_.stream, slot_free_[s]));
}

void CudaTrainState::synchronize() {
  VERL_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
}

void CudaTrainState::zero_grad() {
  require_trainable("zero_grad");
  grads_.zero(ctx_.stream);
  shard_grads_.zero(ctx_.stream);
}

float* CudaTrainState::shard_grads() {
  return shard_.stage == 2 ? shard_grads_.data() : grads_.data() + shard_.begin;
}

void CudaTrainState::round_weights_bf16() {
  require_trainable("round_weights_bf16");
  VERL_CHECK(master_.resident == numel(), "internal: the bf16 copy of an offloaded master");
  ops::cuda::convert(ctx_, wbf_.data(), master_.dev.data(), numel());
}

void CudaTrainState::set_shard(const ShardSpec& spec) {
  require_trainable("set_shard");
  VERL_CHECK(shard_.stage == 0, "internal: the training state is sharded already");
  VERL_CHECK(spec.stage >= 1 && spec.stage <= 2 && spec.chunk > 0 &&
                 spec.chunk * spec.world >= numel() && spec.begin <= spec.end &&
                 spec.end <= numel() && spec.chunk * spec.world <= numel() + kZeroSlack,
             "internal: a ZeRO-{} shard [{}, {}) of chunks of {} x {} ranks for {} elements of "
             "the GPU state (stages 1 and 2, at most {} ranks)",
             spec.stage, spec.begin, spec.end, spec.chunk, spec.world, numel(), kZeroSlack);
  VERL_CHECK(!offload_.any(),
             "internal: ZeRO-{} of an offloaded GPU state (the strategy's factory refuses it)",
             spec.stage);
  VERL_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  shard_ = spec;
  const int64_t n = numel(), padded = spec.chunk * spec.world;
  // The master weights padded to world x chunk: the all-gather after the update writes in place.
  DeviceBuffer<float> master(static_cast<size_t>(padded));
  VERL_CUDA_CHECK(cudaMemcpyAsync(master.data(), master_.dev.data(), n * sizeof(float),
                                  cudaMemcpyDeviceToDevice, ctx_.stream));
  VERL_CUDA_CHECK(cudaMemsetAsync(master.data() + n, 0, (padded - n) * sizeof(float), ctx_.stream));
  VERL_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  master_.dev = std::move(master);
  // Moments of the shard only (a fresh state: resume uploads its slice after this).
  m_.allocate(spec.size(), spec.size());
  v_.allocate(spec.size(), spec.size());
  m_.zero(ctx_.stream);
  v_.zero(ctx_.stream);
  if (spec.stage == 2) {
    shard_grads_ = DeviceBuffer<float>(static_cast<size_t>(spec.chunk));
    shard_grads_.zero(ctx_.stream);
  }
  VERL_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
}

uint64_t CudaTrainState::weights_digest() {
  double sq = 0;
  if (master_.resident > 0) {
    ops::cuda::sum_squares(ctx_, norm_.data(), master_.dev.data(), master_.resident);
    VERL_CUDA_CHECK(
        cudaMemcpyAsync(&sq, norm_.data(), sizeof(double), cudaMemcpyDeviceToHost, ctx_.stream));
  }
  VERL_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  for (size_t i = 0; i < master_.host.size(); ++i) {  // the offloaded part, in order
    const double x = master_.host.data()[i];
    sq += x * x;
  }
  uint64_t bits;
  std::memcpy(&bits, &sq, sizeof(bits));
  return bits;
}

double CudaTrainState::grad_sum_squares() {
  require_trainable("grad_sum_squares");
  ops::cuda::sum_squares(ctx_, norm_.data(), shard_grads(), shard_.size());
  double sq = 0;
  VERL_CUDA_CHECK(
      cudaMemcpyAsync(&sq, norm_.data(), sizeof(double), cudaMemcpyDeviceToHost, ctx_.stream));
  VERL_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  return sq;
}

void CudaTrainState::adamw_update(const AdamWConfig& cfg, float lr, float grad_scale) {
  require_trainable("adamw_update");
  ++steps_;
  if (shard_.stage > 0) {  // ZeRO: the shard's elements, its moments from their first element
    const int64_t b = shard_.begin;
    ops::cuda::adamw_step(ctx_, master_.dev.data() + b, wbf_.data() + b, shard_grads(),
                          m_.dev.data(), v_.dev.data(), shard_.size(), lr, cfg.beta1, cfg.beta2,
                          cfg.eps, cfg.weight_decay, steps_, grad_scale);
    return;
  }
  const auto update = [&](float* const* p, int64_t begin, int64_t n) {
    ops::cuda::adamw_step(ctx_, p[0], wbf_.data() + begin, grads_.data() + begin, p[1], p[2], n, lr,
                          cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay, steps_, grad_scale);
  };
  // The device-resident elements in one launch, then the offloaded ones bucket by bucket (the
  // kernel is elementwise: the same bits either way).
  const int64_t b = shard_.begin, split = std::clamp(first_offloaded(), b, shard_.end);
  float* const resident[3] = {master_.dev.data() + b, m_.dev.data() + b, v_.dev.data() + b};
  update(resident, b, split - b);
  if (split < shard_.end) stream_offloaded(split, shard_.end, 7u, /*write_back=*/true, update);
}

std::vector<float> CudaTrainState::download_weights() const {
  if (trainable_) return master_.download();  // copy_to_host drains every stream first
  std::vector<float> out(static_cast<size_t>(numel()));
  if (sleeps()) {  // the pinned copy is the weights, awake or not
    for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_f32(wbf_host_.data()[i]);
    return out;
  }
  const std::vector<bf16> h = wbf_.download();
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
  VERL_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));  // offloaded pieces are home
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
    ops::cuda::convert(ctx_, wbf_.data(), master_.dev.data(), master_.resident);
    if (master_.resident < numel()) {  // the bf16 copy of the offloaded master, through the slots
      stream_offloaded(master_.resident, numel(), 1u, /*write_back=*/false,
                       [&](float* const* p, int64_t begin, int64_t n) {
                         ops::cuda::convert(ctx_, wbf_.data() + begin, p[0], n);
                       });
    }
    if (opt != nullptr) {
      if (shard_.stage > 0 && static_cast<int64_t>(opt->exp_avg.size()) == numel()) {
        // A whole checkpoint's moments (or another world size's, re-split): this rank's slice.
        const auto b = opt->exp_avg.begin() + shard_.begin,
                   bsq = opt->exp_avg_sq.begin() + shard_.begin;
        m_.upload(std::vector<float>(b, b + shard_.size()));
        v_.upload(std::vector<float>(bsq, bsq + shard_.size()));
      } else {
        m_.upload(opt->exp_avg);
        v_.upload(opt->exp_avg_sq);
      }
      steps_ = opt->step;
    }
    VERL_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
    return;
  }
  // Forward-only: no fp32 copy on the device; round on the host (to nearest even, as the device
  // conversion does). A sleeping state keeps the bf16 words in pinned memory for wake().
  if (sleeps()) {
    if (wbf_host_.size() == 0) wbf_host_ = ops::cuda::PinnedBuffer<uint16_t>(weights.size());
    for (size_t i = 0; i < weights.size(); ++i) wbf_host_.data()[i] = f32_to_bf16(weights[i]);
    if (wbf_.size() > 0)
      ops::cuda::copy_to_device(wbf_.data(), wbf_host_.data(), wbf_host_.bytes());
    return;
  }
  std::vector<uint16_t> h(weights.size());
  for (size_t i = 0; i < weights.size(); ++i) h[i] = f32_to_bf16(weights[i]);
  ops::cuda::copy_to_device(wbf_.data(), h.data(), h.size() * sizeof(uint16_t));
}

void CudaTrainState::wake() {
  if (!sleeps() || wbf_.size() > 0) return;
  wbf_ = DeviceBuffer<bf16>(wbf_host_.size());
  VERL_CUDA_CHECK(cudaMemcpyAsync(wbf_.data(), wbf_host_.data(), wbf_host_.bytes(),
                                  cudaMemcpyHostToDevice, ctx_.stream));
}

void CudaTrainState::sleep() {
  if (!sleeps() || wbf_.size() == 0) return;
  VERL_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));  // the pass that read them is done
  wbf_.reset();
}

}  // namespace verl::optim::cuda
