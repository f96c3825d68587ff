// Device memory and the per-stream context of the CUDA ops: DeviceBuffer<T>
// (one cudaMalloc, freed on destruction), DeviceArena (one cudaMalloc, bump slices, reset per
// phase: no cudaMalloc in the step loop), CudaContext (stream, cuBLASLt handle and workspace
// passed to every op) and CudaSession (owns what a CudaContext points to).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"  // cuda_device_count(), cuda_sm_count()
#include "core/numerics.h"
#include "ops/cuda/cuda_check.h"

namespace verl::ops::cuda {

// Copies host bytes to the device and returns once they have landed. A plain cudaMemcpy from
// pageable memory returns when the bytes are staged, with the DMA possibly still in flight on the
// legacy default stream, which our non-blocking streams do not wait for: a kernel enqueued right
// after could read the old contents. Setup and tests only (it synchronises the device).
void copy_to_device(void* dst, const void* src, size_t bytes);

// Copies device bytes to the host after every stream's queued work (the non-blocking streams'
// kernels included, which a plain cudaMemcpy does not wait for). Setup and tests only.
void copy_to_host(void* dst, const void* src, size_t bytes);

// Everything a CUDA op needs besides its tensors. Ops enqueue work on `stream` and return
// without synchronising. `workspace` is scratch shared by the ops of this stream (cuBLASLt,
// two-pass reductions): ops on one stream run in order, so they may all reuse it.
struct CudaContext {
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // The numerics mode (core/numerics.h) of the forward GEMMs (op(A) = A^T, op(B) = B, bf16
  // operands; gemm.h). BatchInvariant: bits per row that do not depend on how many rows the call
  // has (cuBLASLt where it does not split k, else the kernel of gemm_invariant.cu). MatchTrainer:
  // never split k, so a row has the same bits at every row count, in the rollout's decode steps
  // and in the trainer's forward alike, for about 0.5 us more per decode MLP down projection.
  Numerics numerics = Numerics::Fast;
  bool batch_invariant() const { return numerics == Numerics::BatchInvariant; }
  bool unsplit_k() const { return verl::unsplit_k(numerics); }
};

namespace detail {

// Where the two owned buffers below get their bytes: acquire() throws naming the size, release()
// never throws (destructors call it); both keep the memory counters of core/device.h.
struct DeviceAlloc {
  static void* acquire(size_t bytes) {
    void* p = nullptr;
    VERL_CUDA_CHECK(cudaMalloc(&p, bytes));
    note_device_memory(static_cast<int64_t>(bytes));
    return p;
  }
  static void release(void* p, size_t bytes) noexcept {
    cudaFree(p);  // errors surface on the next call
    note_device_memory(-static_cast<int64_t>(bytes));
  }
};
struct PinnedAlloc {
  static void* acquire(size_t bytes) {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      VERL_CUDA_REQUIRE(false, "cannot pin " + std::to_string(bytes) + " bytes of host memory (" +
                                   cudaGetErrorString(e) +
                                   "); lower the offload ratio or free host memory");
    }
    note_pinned_memory(static_cast<int64_t>(bytes));
    return p;
  }
  static void release(void* p, size_t bytes) noexcept {
    cudaFreeHost(p);
    note_pinned_memory(-static_cast<int64_t>(bytes));
  }
};

// n elements of T from Alloc, owned: move-only, released on destruction or reset().
template <typename T, typename Alloc>
class OwnedBuffer {
 public:
  OwnedBuffer() = default;
  explicit OwnedBuffer(size_t n) {
    if (n > 0) p_ = static_cast<T*>(Alloc::acquire(n * sizeof(T)));
    n_ = n;
  }
  ~OwnedBuffer() { reset(); }
  OwnedBuffer(const OwnedBuffer&) = delete;
  OwnedBuffer& operator=(const OwnedBuffer&) = delete;
  OwnedBuffer(OwnedBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  OwnedBuffer& operator=(OwnedBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }

  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }
  void reset() {
    if (p_ != nullptr) Alloc::release(p_, bytes());
    p_ = nullptr;
    n_ = 0;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace detail

// A typed device allocation of n elements (cudaMalloc). Move-only. upload/download are synchronous
// (setup and tests); hot paths use cudaMemcpyAsync on the context's stream.
template <typename T>
class DeviceBuffer : public detail::OwnedBuffer<T, detail::DeviceAlloc> {
 public:
  using Base = detail::OwnedBuffer<T, detail::DeviceAlloc>;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : Base(n) {}
  explicit DeviceBuffer(const std::vector<T>& host) : Base(host.size()) { upload(host); }

  void upload(const std::vector<T>& host) {
    VERL_CUDA_REQUIRE(host.size() == this->size(),
                      "DeviceBuffer::upload: " + std::to_string(host.size()) +
                          " elements into a buffer of " + std::to_string(this->size()));
    copy_to_device(this->data(), host.data(), this->bytes());
  }
  std::vector<T> download() const {
    std::vector<T> host(this->size());
    copy_to_host(host.data(), this->data(), this->bytes());
    return host;
  }
  void zero(cudaStream_t stream) {
    if (this->size() > 0) VERL_CUDA_CHECK(cudaMemsetAsync(this->data(), 0, this->bytes(), stream));
  }
};

// A typed page-locked host allocation of n elements (cudaHostAlloc), which copies on a stream
// overlap with kernels only from: the offloaded training state. Counted in pinned_host_memory().
template <typename T>
using PinnedBuffer = detail::OwnedBuffer<T, detail::PinnedAlloc>;

// Bump allocator over one device allocation, the GPU twin of verl::Arena: a phase reserves its
// arena once, takes 256-byte aligned slices, and resets it as a whole.
class DeviceArena {
 public:
  DeviceArena() = default;
  DeviceArena(std::string name, size_t capacity_bytes);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  DeviceArena(DeviceArena&& o) noexcept;
  DeviceArena& operator=(DeviceArena&& o) noexcept;

  // `bytes` of device memory aligned to 256 bytes; throws naming the arena when full.
  void* alloc(size_t bytes);
  template <typename T>
  T* alloc_n(size_t n) {
    return static_cast<T*>(alloc(n * sizeof(T)));
  }
  void reset() { used_ = 0; }
  void release();

  size_t capacity() const { return capacity_; }
  size_t used() const { return used_; }
  size_t peak() const { return peak_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  uint8_t* base_ = nullptr;
  size_t capacity_ = 0, used_ = 0, peak_ = 0;
};

// Owns a stream, a cuBLASLt handle and a workspace on the current device; ctx() is the view
// passed to the ops. One per stream (per rank / per overlapping stage).
class CudaSession {
 public:
  static constexpr size_t kDefaultWorkspace = size_t{32} << 20;  // cuBLASLt asks for <= 32 MiB
  explicit CudaSession(size_t workspace_bytes = kDefaultWorkspace);
  ~CudaSession();
  CudaSession(const CudaSession&) = delete;
  CudaSession& operator=(const CudaSession&) = delete;

  const CudaContext& ctx() const { return ctx_; }
  void synchronize() const;  // waits for the stream; throws on an asynchronous kernel error

 private:
  void destroy() noexcept;
  CudaContext ctx_;
};

}  // namespace verl::ops::cuda
