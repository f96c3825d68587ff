// Tests of the GPU monitor: NVML absent on this machine (reports unavailable, does nothing), the
// window statistics on an injected fake device, and the process memory helpers; and the NVML
// loader both the monitor and `verl doctor` use.
#include "metrics/gpu_monitor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include "metrics/nvml.h"

using namespace verl::metrics;

TEST(GpuMonitor, MissingLibraryIsUnavailableNotAnError) {
  GpuMonitorOptions o;
  o.library = "libverl-no-such-nvml.so.1";
  GpuMonitor g(o);
  EXPECT_FALSE(g.available());
  EXPECT_NE(g.unavailable_reason().find("libverl-no-such-nvml"), std::string::npos);
  g.sample_once();
  const GpuSnapshot s = g.snapshot();
  EXPECT_FALSE(s.available);
  EXPECT_TRUE(s.devices.empty());
  Metrics m;
  add_gpu_metrics(m, s);
  EXPECT_TRUE(m.empty());
}

// Without the library every query answers "nothing" and the reason names the library.
TEST(Nvml, MissingLibraryAnswersNothing) {
  const Nvml nvml("libverl-no-such-nvml.so.1");
  EXPECT_FALSE(nvml.ok());
  EXPECT_NE(nvml.reason().find("libverl-no-such-nvml.so.1"), std::string::npos);
  EXPECT_EQ(nvml.device_count(), 0);
  EXPECT_EQ(nvml.driver_version(), "");
  EXPECT_EQ(nvml.device(0), nullptr);
  EXPECT_EQ(nvml.active_nvlinks(0), 0);
  Nvml::Usage u;
  EXPECT_FALSE(nvml.usage(nullptr, u));
}

// A library without NVML's entry points is refused naming the first one it lacks.
TEST(Nvml, LibraryWithoutTheEntryPointsIsRefused) {
  const Nvml nvml("libc.so.6");
  EXPECT_FALSE(nvml.ok());
  EXPECT_NE(nvml.reason().find("lacks the NVML entry point nvmlInit_v2"), std::string::npos)
      << nvml.reason();
}

TEST(GpuMonitor, DefaultConstructionWorksWithOrWithoutNvml) {
  // On this CPU-only machine NVML is absent; on a GPU machine it is present. Both must be fine.
  GpuMonitor g;
  const GpuSnapshot s = g.snapshot();
  EXPECT_EQ(s.available, g.available());
  if (!g.available()) {
    EXPECT_FALSE(g.unavailable_reason().empty());
  }
}

TEST(GpuMonitor, WindowMeanAndPeakFromFakeDevices) {
  // Device 0 reports 10, 20, 60 % and memory 1, 3, 2 GB; device 1 always fails.
  auto calls = std::make_shared<int>(0);
  GpuSource src;
  src.device_count = 2;
  src.read = [calls](int d) {
    GpuReading r;
    if (d == 1) return r;
    static const double util[] = {10, 20, 60, 90};
    static const uint64_t mem[] = {1, 3, 2, 5};
    const int i = (*calls)++;
    r.ok = true;
    r.util_pct = util[i % 4];
    r.memory_used = mem[i % 4] << 30;
    r.memory_total = 80ull << 30;
    return r;
  };
  GpuMonitorOptions o;
  o.interval_ms = 0;  // no thread: samples only when asked
  GpuMonitor g(src, o);
  ASSERT_TRUE(g.available());
  g.sample_once();
  g.sample_once();
  g.sample_once();
  GpuSnapshot s = g.snapshot();
  EXPECT_TRUE(s.available);
  EXPECT_EQ(s.samples, 3);
  ASSERT_EQ(s.devices.size(), 2u);
  EXPECT_DOUBLE_EQ(s.devices[0].mean_util_pct, 30.0);
  EXPECT_EQ(s.devices[0].peak_memory_used, 3ull << 30);
  EXPECT_EQ(s.devices[1].peak_memory_used, 0u);
  EXPECT_DOUBLE_EQ(s.mean_util_pct, 30.0);  // device 1 had no readings and is left out
  EXPECT_EQ(s.peak_memory_used, 3ull << 30);
  Metrics m;
  add_gpu_metrics(m, s);
  EXPECT_DOUBLE_EQ(m.get("perf/gpu_util_mean"), 30.0);
  EXPECT_DOUBLE_EQ(m.get("perf/gpu_memory_used_peak_gb"), 3.0);
  EXPECT_DOUBLE_EQ(m.get("perf/gpu_idle_share"), 0.7);  // 30% of the time a kernel ran

  // A new window: only the fourth reading counts.
  g.sample_once();
  s = g.snapshot();
  EXPECT_EQ(s.samples, 1);
  EXPECT_DOUBLE_EQ(s.mean_util_pct, 90.0);
  EXPECT_EQ(s.peak_memory_used, 5ull << 30);
  // An empty window takes one reading itself (the first value again).
  s = g.snapshot();
  EXPECT_EQ(s.samples, 1);
  EXPECT_DOUBLE_EQ(s.mean_util_pct, 10.0);
}

TEST(GpuMonitor, SelectedDevicesOnly) {
  GpuSource src;
  src.device_count = 3;
  src.read = [](int d) {
    GpuReading r;
    r.ok = true;
    r.util_pct = 10.0 * d;
    r.memory_used = static_cast<uint64_t>(d);
    return r;
  };
  GpuMonitorOptions o;
  o.interval_ms = 0;
  o.devices = {2, 7};  // 7 does not exist and is ignored
  GpuMonitor g(src, o);
  const GpuSnapshot s = g.snapshot();
  ASSERT_EQ(s.devices.size(), 1u);
  EXPECT_EQ(s.devices[0].device, 2);
  EXPECT_DOUBLE_EQ(s.mean_util_pct, 20.0);
}

TEST(GpuMonitor, BackgroundThreadSamplesAndStops) {
  auto calls = std::make_shared<std::atomic<int>>(0);
  GpuSource src;
  src.device_count = 1;
  src.read = [calls](int) {
    calls->fetch_add(1);
    GpuReading r;
    r.ok = true;
    r.util_pct = 50;
    return r;
  };
  GpuMonitorOptions o;
  o.interval_ms = 1;
  {
    GpuMonitor g(src, o);
    // Wait (bounded) until the thread has sampled a few times; no timing is asserted.
    for (int i = 0; i < 5000 && calls->load() < 3; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_GE(calls->load(), 3);
    const GpuSnapshot s = g.snapshot();
    EXPECT_GE(s.samples, 1);
    EXPECT_DOUBLE_EQ(s.mean_util_pct, 50.0);
  }  // the destructor joins the thread
  const int after = calls->load();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(calls->load(), after);
}

TEST(CpuMemory, PeakRssCoversATouchedAllocation) {
  const size_t n = 64u << 20;
  auto buf = std::make_unique<char[]>(n);
  std::memset(buf.get(), 1, n);
  EXPECT_GE(peak_rss_bytes(), n);
  EXPECT_GT(current_rss_bytes(), 0u);
  EXPECT_GE(peak_rss_bytes() + (1u << 20), current_rss_bytes());
  Metrics m;
  add_cpu_memory_metrics(m);
  EXPECT_GE(m.get("perf/cpu_memory_peak_gb"), 64.0 / 1024.0);
  EXPECT_EQ(buf[n - 1], 1);
}
