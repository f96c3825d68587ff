// Device discovery (core/device.h). The CUDA runtime is asked only in builds with VERL_HAVE_CUDA.
#include "core/device.h"

#include <algorithm>
#include <atomic>

#include "core/error.h"

#ifdef VERL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace verl {

const char* to_string(Device d) {
  return d == Device::Cuda ? "cuda" : "cpu";
}

#ifdef VERL_HAVE_CUDA

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear it, so later calls do not report this one
    return 0;
  }
  return n;
}

int cuda_sm_count() {
  static const int count = [] {
    int device = 0, n = 0;
    VERL_CHECK(
        cudaGetDevice(&device) == cudaSuccess &&
            cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) == cudaSuccess,
        "cannot read the SM count of the current CUDA device");
    return n;
  }();
  return count;
}

std::string cuda_device_name() {
  if (!cuda_available()) return "";
  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
    return "";
  return prop.name;
}

void cuda_set_device(int device) {
  const int n = cuda_device_count();
  VERL_CHECK(device >= 0 && device < n, "CUDA device {} does not exist: this node has {} visible",
             device, n);
  const cudaError_t e = cudaSetDevice(device);
  VERL_CHECK(e == cudaSuccess, "cudaSetDevice({}) failed: {}", device, cudaGetErrorString(e));
}

namespace {
void mem_info(size_t& free_b, size_t& total_b) {
  const cudaError_t e = cudaMemGetInfo(&free_b, &total_b);
  VERL_CHECK(e == cudaSuccess, "cudaMemGetInfo failed: {}", cudaGetErrorString(e));
}
}  // namespace

size_t device_memory_in_use() {
  if (!cuda_available()) return 0;
  size_t free_b = 0, total_b = 0;
  mem_info(free_b, total_b);
  return total_b - free_b;
}

size_t device_memory_total() {
  if (!cuda_available()) return 0;
  size_t free_b = 0, total_b = 0;
  mem_info(free_b, total_b);
  return total_b;
}

#else

int cuda_device_count() {
  return 0;
}
int cuda_sm_count() {
  VERL_FAIL("cuda_sm_count: this build has no CUDA backend");
}
std::string cuda_device_name() {
  return "";
}
void cuda_set_device(int device) {
  VERL_FAIL("cuda_set_device({}): this build has no CUDA backend", device);
}
size_t device_memory_in_use() {
  return 0;
}
size_t device_memory_total() {
  return 0;
}

#endif

namespace {
std::atomic<int64_t> g_device_now{0}, g_device_peak{0}, g_pinned_now{0};
}  // namespace

void note_device_memory(int64_t delta_bytes) {
  const int64_t now = g_device_now.fetch_add(delta_bytes) + delta_bytes;
  int64_t peak = g_device_peak.load();
  while (now > peak && !g_device_peak.compare_exchange_weak(peak, now)) {
  }
}

void note_pinned_memory(int64_t delta_bytes) {
  g_pinned_now.fetch_add(delta_bytes);
}

size_t tracked_device_memory() {
  return static_cast<size_t>(std::max<int64_t>(0, g_device_now.load()));
}

size_t take_tracked_device_peak() {
  const int64_t peak = g_device_peak.exchange(g_device_now.load());
  return static_cast<size_t>(std::max<int64_t>(0, peak));
}

size_t pinned_host_memory() {
  return static_cast<size_t>(std::max<int64_t>(0, g_pinned_now.load()));
}

bool cuda_available() {
  return cuda_device_count() > 0;
}

Device resolve_device(const std::string& value, const std::string& key) {
  if (value == "cpu") return Device::Cpu;
  if (value == "auto") return cuda_available() ? Device::Cuda : Device::Cpu;
  VERL_CHECK(value == "cuda", "{} must be cpu, cuda or auto, got '{}'", key, value);
#ifdef VERL_HAVE_CUDA
  VERL_CHECK(cuda_available(),
             "{0}=cuda but no CUDA device is visible (no driver, or CUDA_VISIBLE_DEVICES hides "
             "them); set {0}=cpu or auto",
             key);
#else
  VERL_FAIL(
      "{0}=cuda but this build has no CUDA backend (configure with -DVERL_CUDA=ON on a machine "
      "with the CUDA toolkit); set {0}=cpu or auto",
      key);
#endif
  return Device::Cuda;
}

}  // namespace verl
