// NVML loaded at run time with dlopen, so the binary links no NVML and runs on machines without a
// driver: the library handle, the entry points that `verl doctor` and the GPU monitor use
// (declared here as in nvml.h), init at construction and shutdown at destruction.
#pragma once

#include <cstdint>
#include <string>

namespace verl::metrics {

class Nvml {
 public:
  // nvmlDevice_t, an opaque handle.
  using Device = void*;

  // Opens `library` and calls nvmlInit_v2; on any failure ok() is false and reason() says why
  // (the loader's message naming the library, the entry point it lacks, or nvmlInit's code).
  explicit Nvml(const std::string& library = "libnvidia-ml.so.1");
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool ok() const { return lib_ != nullptr; }
  const std::string& reason() const { return reason_; }

  // The queries answer "nothing" (empty, 0, null, false) when NVML is not loaded or the call fails.
  std::string driver_version() const;
  int device_count() const;
  Device device(int index) const;
  // Active NVLink links of NVML device i; GPUs without NVLink answer NOT_SUPPORTED for every link.
  int active_nvlinks(int index) const;
  struct Usage {
    double util_pct = 0;  // nvmlUtilization_t.gpu: % of time a kernel ran in the last period
    uint64_t memory_used = 0, memory_total = 0;  // nvmlMemory_t (v1), bytes
  };
  bool usage(Device dev, Usage& out) const;

 private:
  using Return = int;   // nvmlReturn_t; NVML_SUCCESS = 0
  struct Utilization {  // nvmlUtilization_t
    unsigned int gpu, memory;
  };
  struct Memory {  // nvmlMemory_t (v1)
    unsigned long long total, free, used;
  };

  void* lib_ = nullptr;
  std::string reason_;
  Return (*shutdown_)() = nullptr;
  Return (*driver_version_)(char*, unsigned) = nullptr;
  Return (*count_)(unsigned*) = nullptr;
  Return (*handle_)(unsigned, Device*) = nullptr;
  Return (*nvlink_state_)(Device, unsigned, int*) = nullptr;
  Return (*utilization_)(Device, Utilization*) = nullptr;
  Return (*memory_)(Device, Memory*) = nullptr;
};

}  // namespace verl::metrics
