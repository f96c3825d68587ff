// GPU utilisation and memory sampling through NVML (metrics/nvml.h: loaded at run time, so the
// binary runs on CPU-only machines, where available() is false and nothing happens), plus the
// process's CPU memory (peak and current RSS) for the perf/ metrics.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "metrics/metrics.h"

namespace verl::metrics {

class Nvml;

// One sample of one device, as NVML reports it.
struct GpuReading {
  bool ok = false;            // the queries succeeded
  double util_pct = 0.0;      // nvmlUtilization_t.gpu: % of time a kernel ran in the last period
  uint64_t memory_used = 0;   // bytes (nvmlMemory_t.used)
  uint64_t memory_total = 0;  // bytes
};

// The NVML calls the monitor needs, behind one function so tests can inject a fake device.
struct GpuSource {
  int device_count = 0;
  std::function<GpuReading(int device)> read;
};

struct GpuDeviceStats {
  int device = 0;
  double mean_util_pct = 0.0;  // mean of the samples since the last snapshot
  uint64_t peak_memory_used = 0;
  uint64_t memory_total = 0;
};

struct GpuSnapshot {
  bool available = false;
  int64_t samples = 0;            // samples per device in this window
  double mean_util_pct = 0.0;     // mean over devices of their mean utilisation
  uint64_t peak_memory_used = 0;  // max over devices
  std::vector<GpuDeviceStats> devices;
};

struct GpuMonitorOptions {
  int interval_ms = 100;     // sampling period of the background thread; 0: no thread
  std::vector<int> devices;  // NVML indices to watch; empty: all
  std::string library = "libnvidia-ml.so.1";
};

class GpuMonitor {
 public:
  // Loads NVML and starts sampling; without NVML (or without GPUs) available() is false.
  explicit GpuMonitor(const GpuMonitorOptions& opts = {});
  // Samples an injected source instead of NVML (tests).
  GpuMonitor(GpuSource source, const GpuMonitorOptions& opts);
  ~GpuMonitor();
  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;

  bool available() const { return available_; }
  // Why NVML is not used (empty when available).
  const std::string& unavailable_reason() const { return reason_; }

  // Takes one sample of every watched device now (the thread calls this every interval).
  void sample_once();
  // Mean utilisation and peak memory since the previous snapshot; starts a new window.
  GpuSnapshot snapshot();
  // Stops the background thread (also done by the destructor).
  void stop();

 private:
  struct Accum {
    double util_sum = 0.0;
    int64_t n = 0;
    uint64_t peak_used = 0;
    uint64_t total = 0;
  };
  void init_devices(const std::vector<int>& wanted);
  void start(int interval_ms);
  void run(int interval_ms);

  GpuSource source_;
  bool available_ = false;
  std::string reason_;
  std::vector<int> devices_;
  std::vector<Accum> accum_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
  std::unique_ptr<Nvml> nvml_;  // null with an injected source or without NVML
};

// perf/gpu_util_mean (%) and perf/gpu_memory_used_peak_gb from a snapshot; nothing when
// unavailable.
void add_gpu_metrics(Metrics& m, const GpuSnapshot& s);

// Peak resident set size of this process in bytes (getrusage ru_maxrss).
uint64_t peak_rss_bytes();
// Current resident set size in bytes (/proc/self/statm); 0 when unknown.
uint64_t current_rss_bytes();
// perf/cpu_memory_peak_gb (peak RSS) and perf/cpu_memory_used_gb (current RSS) of this process.
void add_cpu_memory_metrics(Metrics& m);

}  // namespace verl::metrics
