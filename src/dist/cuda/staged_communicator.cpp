#include "dist/cuda/staged_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "dist/cuda/nccl_communicator.h"

namespace verl::dist {
namespace {

class Completed final : public PendingCollective {
 public:
  bool test() override { return true; }
  void wait() override {}
};

class StagedCommunicator final : public Communicator {
 public:
  explicit StagedCommunicator(std::unique_ptr<Communicator> host) : host_(std::move(host)) {
    VERL_CHECK(host_ != nullptr, "staged communicator: no host communicator");
  }
  ~StagedCommunicator() override { release_staging(); }
  StagedCommunicator(const StagedCommunicator&) = delete;
  StagedCommunicator& operator=(const StagedCommunicator&) = delete;

  int rank() const override { return host_->rank(); }
  int world_size() const override { return host_->world_size(); }
  bool distributed() const override { return host_->distributed(); }
  void set_stage(std::string stage) override {
    host_->set_stage(stage);
    Communicator::set_stage(std::move(stage));
  }
  void barrier() override { host_->barrier(); }

 protected:
  void all_reduce_impl(void* data, size_t count, DataType type, ReduceOp op, Place place) override {
    if (!place.on_device()) return host_->all_reduce(data, count, type, op, place);
    const size_t bytes = count * data_type_size(type);
    char* h = staging(bytes, 0);
    download(h, data, bytes, place, "all_reduce");
    host_all_reduce(h, count, type, op);
    upload(data, h, bytes, place, "all_reduce");
  }

  void reduce_scatter_impl(const void* send, void* recv, size_t recv_count, DataType type,
                           ReduceOp op, Place place) override {
    if (!place.on_device()) return host_->reduce_scatter(send, recv, recv_count, type, op, place);
    const size_t out = recv_count * data_type_size(type), in = out * world_size();
    char* h = staging(in, out);
    download(h, send, in, place, "reduce_scatter");
    char* h_recv = h + aligned(in);
    if (type == DataType::BF16) {
      to_f32(h, recv_count * world_size());
      f32_recv_.resize(recv_count);
      host_->reduce_scatter(f32_.data(), f32_recv_.data(), recv_count, DataType::F32, op);
      from_f32(h_recv, f32_recv_.data(), recv_count);
    } else {
      host_->reduce_scatter(h, h_recv, recv_count, type, op);
    }
    upload(recv, h_recv, out, place, "reduce_scatter");
  }

  void all_gather_impl(const void* send, void* recv, size_t send_count, DataType type,
                       Place place) override {
    if (!place.on_device()) return host_->all_gather(send, recv, send_count, type, place);
    const size_t in = send_count * data_type_size(type), out = in * world_size();
    char* h = staging(in, out);
    download(h, send, in, place, "all_gather");
    host_->all_gather(h, h + aligned(in), send_count, type);
    upload(recv, h + aligned(in), out, place, "all_gather");
  }

  void broadcast_impl(void* data, size_t count, DataType type, int root, Place place) override {
    if (!place.on_device()) return host_->broadcast(data, count, type, root, place);
    const size_t bytes = count * data_type_size(type);
    char* h = staging(bytes, 0);
    // Only the root's bytes travel; the root's buffer is left as it is.
    if (rank() == root) download(h, data, bytes, place, "broadcast");
    host_->broadcast(h, count, type, root);
    if (rank() != root) upload(data, h, bytes, place, "broadcast");
  }

  void all_to_all_impl(const void* send, void* recv, size_t count_per_rank, DataType type,
                       Place place) override {
    if (!place.on_device()) return host_->all_to_all(send, recv, count_per_rank, type, place);
    const size_t bytes = count_per_rank * data_type_size(type) * world_size();
    char* h = staging(bytes, bytes);
    download(h, send, bytes, place, "all_to_all");
    host_->all_to_all(h, h + aligned(bytes), count_per_rank, type);
    upload(recv, h + aligned(bytes), bytes, place, "all_to_all");
  }

  void all_to_allv_impl(const void* send, std::span<const size_t> send_counts,
                        std::span<const size_t> send_displs, void* recv,
                        std::span<const size_t> recv_counts, std::span<const size_t> recv_displs,
                        DataType type, Place place) override {
    if (!place.on_device()) {
      return host_->all_to_allv(send, send_counts, send_displs, recv, recv_counts, recv_displs,
                                type, place);
    }
    // The staging buffers mirror send and recv up to their last slice; only the slices move, so
    // recv outside the received slices stays untouched.
    const size_t es = data_type_size(type);
    const size_t in = extent(send_counts, send_displs) * es,
                 out = extent(recv_counts, recv_displs) * es;
    char* h = staging(in, out);
    char* h_recv = h + aligned(in);
    copy_slices(h, send, send_counts, send_displs, es, cudaMemcpyDeviceToHost, place);
    sync(place, "all_to_allv");
    host_->all_to_allv(h, send_counts, send_displs, h_recv, recv_counts, recv_displs, type);
    copy_slices(recv, h_recv, recv_counts, recv_displs, es, cudaMemcpyHostToDevice, place);
    sync(place, "all_to_allv");
  }

  std::unique_ptr<PendingCollective> start_all_gather_v_impl(const void* send, void* recv,
                                                             std::span<const size_t> counts,
                                                             std::span<const size_t> displs,
                                                             DataType type, Place place) override {
    if (!place.on_device()) return host_->start_all_gather_v(send, recv, counts, displs, type);
    const size_t es = data_type_size(type);
    const size_t in = counts[static_cast<size_t>(rank())] * es, out = extent(counts, displs) * es;
    char* h = staging(in, out);
    char* h_recv = h + aligned(in);
    download(h, send, in, place, "all_gather_v");
    host_->all_gather_v(h, h_recv, counts, displs, type);
    copy_slices(recv, h_recv, counts, displs, es, cudaMemcpyHostToDevice, place);
    sync(place, "all_gather_v");
    return std::make_unique<Completed>();
  }

  // On the device: the blocking collective (complete on return, so the PendingCollective is too).
  std::unique_ptr<PendingCollective> start_all_reduce_impl(void* data, size_t count, DataType type,
                                                           ReduceOp op, Place place) override {
    if (!place.on_device()) return host_->start_all_reduce(data, count, type, op, place);
    all_reduce_impl(data, count, type, op, place);
    return std::make_unique<Completed>();
  }
  std::unique_ptr<PendingCollective> start_reduce_impl(void* data, size_t count, DataType type,
                                                       ReduceOp op, int root) override {
    return host_->start_reduce(data, count, type, op, root);
  }
  std::unique_ptr<PendingCollective> start_all_gather_impl(const void* send, void* recv,
                                                           size_t send_count, DataType type,
                                                           Place place) override {
    if (!place.on_device()) return host_->start_all_gather(send, recv, send_count, type, place);
    all_gather_impl(send, recv, send_count, type, place);
    return std::make_unique<Completed>();
  }

  // The host communicator's child of the same split, staged as this one.
  std::unique_ptr<Communicator> split_impl(const SplitGroup& g) override {
    std::unique_ptr<Communicator> host = host_->split(g.color, g.key);
    if (host == nullptr) return nullptr;
    return std::make_unique<StagedCommunicator>(std::move(host));
  }

 private:
  static size_t aligned(size_t bytes) { return (bytes + 255) / 256 * 256; }

  // One past the last element any slice reaches.
  static size_t extent(std::span<const size_t> counts, std::span<const size_t> displs) {
    size_t end = 0;
    for (size_t j = 0; j < counts.size(); ++j)
      if (counts[j] > 0) end = std::max(end, displs[j] + counts[j]);
    return end;
  }

  // The pinned staging buffer, holding `in` bytes and then (256-byte aligned) `out` bytes; it
  // grows and is never shrunk. Every use has completed (the stream synchronised) when the
  // collective returns, so the next one may overwrite it.
  char* staging(size_t in, size_t out) {
    const size_t need = aligned(in) + out;
    if (need > capacity_) {
      release_staging();
      const size_t bytes = std::max(need, size_t{1} << 20);
      const cudaError_t e = cudaHostAlloc(&pinned_, bytes, cudaHostAllocDefault);
      if (e != cudaSuccess) {
        pinned_ = nullptr;
        (void)cudaGetLastError();
        VERL_FAIL(
            "staged communicator on {}: cannot pin {} bytes of host memory for stage '{}': {}",
            describe_rank(), bytes, stage(), cudaGetErrorString(e));
      }
      capacity_ = bytes;
      note_pinned_memory(static_cast<int64_t>(bytes));
    }
    return static_cast<char*>(pinned_);
  }
  void release_staging() noexcept {
    if (pinned_ == nullptr) return;
    cudaFreeHost(pinned_);
    note_pinned_memory(-static_cast<int64_t>(capacity_));
    pinned_ = nullptr;
    capacity_ = 0;
  }

  void check(cudaError_t e, const char* what, const char* step) {
    VERL_CHECK(e == cudaSuccess, "staged {} on {} in stage '{}': {} failed: {}", what,
               describe_rank(), stage(), step, cudaGetErrorString(e));
  }
  static cudaStream_t stream_of(Place place) { return static_cast<cudaStream_t>(place.stream); }
  // After the work enqueued so far on place.stream (what wrote the buffer).
  void sync(Place place, const char* what) {
    check(cudaStreamSynchronize(stream_of(place)), what, "cudaStreamSynchronize");
  }
  void download(char* h, const void* d, size_t bytes, Place place, const char* what) {
    if (bytes > 0) {
      check(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, stream_of(place)), what,
            "copy to host");
    }
    sync(place, what);
  }
  // Waits for the copy too: the blocking device collectives are complete on return.
  void upload(void* d, const char* h, size_t bytes, Place place, const char* what) {
    if (bytes > 0) {
      check(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, stream_of(place)), what,
            "copy to device");
    }
    sync(place, what);
  }
  // Copies each rank's slice [displs[j], displs[j] + counts[j]) (elements of `es` bytes) between
  // the device buffer and its staging mirror, in `kind`'s direction; enqueued, not waited for.
  void copy_slices(void* dst, const void* src, std::span<const size_t> counts,
                   std::span<const size_t> displs, size_t es, cudaMemcpyKind kind, Place place) {
    for (size_t j = 0; j < counts.size(); ++j) {
      if (counts[j] == 0) continue;
      check(cudaMemcpyAsync(static_cast<char*>(dst) + displs[j] * es,
                            static_cast<const char*>(src) + displs[j] * es, counts[j] * es, kind,
                            stream_of(place)),
            "slice copy", kind == cudaMemcpyDeviceToHost ? "copy to host" : "copy to device");
    }
  }

  // The host communicators reduce every type but bf16: that one goes through fp32 (exact), and
  // the result is rounded to bf16 once.
  void host_all_reduce(char* h, size_t count, DataType type, ReduceOp op) {
    if (type != DataType::BF16) return host_->all_reduce(h, count, type, op);
    to_f32(h, count);
    host_->all_reduce(f32_.data(), count, DataType::F32, op);
    from_f32(h, f32_.data(), count);
  }
  void to_f32(const char* h, size_t count) {
    f32_.resize(count);
    const auto* x = reinterpret_cast<const uint16_t*>(h);
    for (size_t i = 0; i < count; ++i) f32_[i] = bf16_to_f32(x[i]);
  }
  static void from_f32(char* h, const float* x, size_t count) {
    auto* out = reinterpret_cast<uint16_t*>(h);
    for (size_t i = 0; i < count; ++i) out[i] = f32_to_bf16(x[i]);
  }

  std::unique_ptr<Communicator> host_;
  void* pinned_ = nullptr;
  size_t capacity_ = 0;
  std::vector<float> f32_, f32_recv_;  // bf16 reductions in fp32
};

const char* host_backend(const LaunchInfo& launch) {
  if (launch.launcher == "torchrun") return "TCP";
  if (launch.launcher == "single") return "one process";
  return "MPI";
}

}  // namespace

std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> host) {
  return std::make_unique<StagedCommunicator>(std::move(host));
}

std::unique_ptr<Communicator> make_device_communicator(std::unique_ptr<Communicator> host,
                                                       const LaunchInfo& launch, double timeout_s,
                                                       DeviceCommChoice* chosen) {
  // Read before any collective so that a bad value fails on every rank alike.
  const DeviceComm mode = device_comm_from_env();
  DeviceSlot mine;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) std::strcpy(name, "localhost");
  mine.node = name;
  VERL_CHECK(cudaGetDevice(&mine.device) == cudaSuccess,
             "device communicator on rank {}: no current CUDA device", host->rank());
  char bus[64] = {};
  mine.device_id = cudaDeviceGetPCIBusId(bus, sizeof(bus), mine.device) == cudaSuccess
                       ? std::string(bus)
                       : fmt::format("cuda:{}", mine.device);
  int version = 0;
  int32_t nccl_ok = ncclGetVersion(&version) == ncclSuccess ? 1 : 0;
  host->all_reduce(std::span<int32_t>(&nccl_ok, 1), ReduceOp::Min);
  const std::vector<DeviceSlot> slots = gather_device_slots(*host, mine);
  const DeviceCommChoice choice = choose_device_comm(slots, nccl_ok == 1, mode);
  if (host->rank() == 0) {
    if (choice.staged) {
      log::info("device collectives: staged through host memory over {} ({})", host_backend(launch),
                choice.reason);
    } else {
      log::info("device collectives: NCCL ({})", choice.reason);
    }
  }
  if (chosen != nullptr) *chosen = choice;
  if (choice.staged) return make_staged_communicator(std::move(host));
  return make_nccl_communicator(std::move(host), timeout_s);
}

}  // namespace verl::dist
