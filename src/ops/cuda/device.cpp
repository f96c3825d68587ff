// Host side of the CUDA backend: error reporting, device discovery, the device arena and the
// session that owns a stream, a cuBLASLt handle and a workspace. Compiled by the host compiler
// (it uses fmt, which nvcc's front end does not accept).
#include "ops/cuda/device.h"

#include "core/error.h"

namespace verl::ops::cuda {

namespace detail {

void fail_call(const char* api, const char* stmt, const char* name, const char* text,
               const char* file, int line) {
  verl::detail::throw_error(file, line,
                            fmt::format("{} call `{}` failed: {} ({})", api, stmt, name, text));
}

void fail(const char* file, int line, const std::string& msg) {
  verl::detail::throw_error(file, line, msg);
}

}  // namespace detail

// ---- DeviceArena
// ----------------------------------------------------------------------------------

static constexpr size_t kArenaAlign = 256;  // cuBLASLt's preferred alignment; also fits float4

void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  VERL_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  VERL_CUDA_CHECK(cudaDeviceSynchronize());
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  VERL_CUDA_CHECK(cudaDeviceSynchronize());
  VERL_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}

static size_t round_up(size_t x) {
  return (x + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
}

DeviceArena::DeviceArena(std::string name, size_t capacity_bytes)
    : name_(std::move(name)), capacity_(round_up(capacity_bytes)) {
  if (capacity_ > 0) {
    const cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&base_), capacity_);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      VERL_FAIL("device arena '{}': cannot allocate {} bytes: {}", name_, capacity_,
                cudaGetErrorString(e));
    }
    note_device_memory(static_cast<int64_t>(capacity_));
  }
}

DeviceArena::~DeviceArena() {
  release();
}

DeviceArena::DeviceArena(DeviceArena&& o) noexcept
    : name_(std::move(o.name_)),
      base_(std::exchange(o.base_, nullptr)),
      capacity_(std::exchange(o.capacity_, 0)),
      used_(std::exchange(o.used_, 0)),
      peak_(std::exchange(o.peak_, 0)) {}

DeviceArena& DeviceArena::operator=(DeviceArena&& o) noexcept {
  if (this != &o) {
    release();
    name_ = std::move(o.name_);
    base_ = std::exchange(o.base_, nullptr);
    capacity_ = std::exchange(o.capacity_, 0);
    used_ = std::exchange(o.used_, 0);
    peak_ = std::exchange(o.peak_, 0);
  }
  return *this;
}

void* DeviceArena::alloc(size_t bytes) {
  const size_t n = round_up(bytes);
  VERL_CHECK(used_ + n <= capacity_, "device arena '{}' is full: {} bytes asked, {} of {} used",
             name_, bytes, used_, capacity_);
  void* p = base_ + used_;
  used_ += n;
  if (used_ > peak_) peak_ = used_;
  return p;
}

void DeviceArena::release() {
  if (base_ != nullptr) {
    cudaFree(base_);
    note_device_memory(-static_cast<int64_t>(capacity_));
  }
  base_ = nullptr;
  capacity_ = used_ = 0;
}

// ---- CudaSession
// ------------------------------------------------------------------------------------

CudaSession::CudaSession(size_t workspace_bytes) {
  VERL_CHECK(cuda_device_count() > 0, "CudaSession: no CUDA device (or no driver) on this machine");
  try {
    VERL_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_.stream, cudaStreamNonBlocking));
    VERL_CUBLAS_CHECK(cublasLtCreate(&ctx_.lt));
    if (workspace_bytes > 0) {
      VERL_CUDA_CHECK(cudaMalloc(&ctx_.workspace, workspace_bytes));
      ctx_.workspace_bytes = workspace_bytes;
      note_device_memory(static_cast<int64_t>(workspace_bytes));
    }
  } catch (...) {
    destroy();
    throw;
  }
}

CudaSession::~CudaSession() {
  destroy();
}

void CudaSession::destroy() noexcept {
  // Errors here cannot be thrown; the stream is drained first so nothing still uses the memory.
  if (ctx_.stream != nullptr) cudaStreamSynchronize(ctx_.stream);
  if (ctx_.workspace != nullptr) {
    cudaFree(ctx_.workspace);
    note_device_memory(-static_cast<int64_t>(ctx_.workspace_bytes));
  }
  if (ctx_.lt != nullptr) cublasLtDestroy(ctx_.lt);
  if (ctx_.stream != nullptr) cudaStreamDestroy(ctx_.stream);
  ctx_ = CudaContext{};
}

void CudaSession::synchronize() const {
  VERL_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
}

}  // namespace verl::ops::cuda
