// NVML through dlopen/dlsym (metrics/nvml.h): nothing NVML at build or link time.
#include "metrics/nvml.h"

#include <dlfcn.h>

#include <type_traits>

namespace verl::metrics {

namespace {
constexpr int kSuccess = 0;         // NVML_SUCCESS
constexpr unsigned kMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS
}  // namespace

Nvml::Nvml(const std::string& library) {
  lib_ = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib_ == nullptr) {
    const char* err = dlerror();  // names the library
    reason_ = err ? err : "cannot load " + library;
    return;
  }
  std::string missing;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib_, name));
    if (fn == nullptr && missing.empty()) missing = name;
  };
  Return (*init)() = nullptr;
  sym(init, "nvmlInit_v2");
  sym(shutdown_, "nvmlShutdown");
  sym(driver_version_, "nvmlSystemGetDriverVersion");
  sym(count_, "nvmlDeviceGetCount_v2");
  sym(handle_, "nvmlDeviceGetHandleByIndex_v2");
  sym(nvlink_state_, "nvmlDeviceGetNvLinkState");
  sym(utilization_, "nvmlDeviceGetUtilizationRates");
  sym(memory_, "nvmlDeviceGetMemoryInfo");
  if (!missing.empty()) {
    reason_ = library + " lacks the NVML entry point " + missing;
  } else if (const Return rc = init(); rc != kSuccess) {
    reason_ = "nvmlInit_v2 failed with code " + std::to_string(rc);
  } else {
    return;
  }
  dlclose(lib_);
  lib_ = nullptr;
}

Nvml::~Nvml() {
  if (lib_ == nullptr) return;
  shutdown_();
  dlclose(lib_);
}

std::string Nvml::driver_version() const {
  char buf[96] = {};  // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE is 80
  if (!ok() || driver_version_(buf, sizeof(buf)) != kSuccess) return "";
  return buf;
}

int Nvml::device_count() const {
  unsigned n = 0;
  return ok() && count_(&n) == kSuccess ? static_cast<int>(n) : 0;
}

Nvml::Device Nvml::device(int index) const {
  Device dev = nullptr;
  if (!ok() || index < 0 || handle_(static_cast<unsigned>(index), &dev) != kSuccess) return nullptr;
  return dev;
}

int Nvml::active_nvlinks(int index) const {
  const Device dev = device(index);
  if (dev == nullptr) return 0;
  int active = 0;
  for (unsigned link = 0; link < kMaxLinks; ++link) {
    int state = 0;  // nvmlEnableState_t: NVML_FEATURE_ENABLED = 1
    if (nvlink_state_(dev, link, &state) == kSuccess && state == 1) ++active;
  }
  return active;
}

bool Nvml::usage(Device dev, Usage& out) const {
  Utilization u{};
  Memory m{};
  if (!ok() || dev == nullptr || utilization_(dev, &u) != kSuccess || memory_(dev, &m) != kSuccess)
    return false;
  out.util_pct = u.gpu;
  out.memory_used = m.used;
  out.memory_total = m.total;
  return true;
}

}  // namespace verl::metrics
