// Which device a model runs on, and the few facts about the GPU that host code needs (is there
// one, how much memory is in use, how many SMs): the one place that asks the CUDA runtime for
// them. Host-only header; without a CUDA build every query answers "no GPU".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace verl {

enum class Device { Cpu, Cuda };
const char* to_string(Device d);

// Whether this build has the CUDA backend (VERL_HAVE_CUDA) and the driver sees a device.
bool cuda_available();
// CUDA devices the driver sees; 0 without a driver, a device or a CUDA build (never throws).
int cuda_device_count();
// Streaming multiprocessors of the current device, read once (kernels size their grids by it;
// a process drives one device). Throws without a device.
int cuda_sm_count();
// The current CUDA device's name ("NVIDIA H200"); "" when there is no GPU.
std::string cuda_device_name();
// Makes `device` the current CUDA device of this process (a data-parallel rank takes its local
// rank's); throws naming the device count when there is no such device.
void cuda_set_device(int device);
// Device memory in use on the current device (cudaMemGetInfo: total - free), in bytes; 0 when
// there is no GPU.
size_t device_memory_in_use();
// Total memory of the current device in bytes; 0 when there is no GPU.
size_t device_memory_total();

// Memory the project's allocators hold (ops/cuda/device.h: DeviceBuffer, DeviceArena, the
// sessions' workspaces, PinnedBuffer), counted as they allocate and free, so that a phase's peak
// is known after it ends (cudaMemGetInfo reads only the present):
// perf/device_memory_peak_gib/<phase>. Thread-safe; all zero without a CUDA build.
void note_device_memory(int64_t delta_bytes);
void note_pinned_memory(int64_t delta_bytes);
size_t tracked_device_memory();
// The most tracked device memory held at once since the last call; the mark restarts at now.
size_t take_tracked_device_peak();
// Page-locked host memory held now (the offloaded training state: perf/host_pinned_gib).
size_t pinned_host_memory();

// A device key's value (trainer.device, a CLI flag; `key` names it in errors): cpu | cuda | auto
// (cuda when cuda_available(), else cpu). cuda without a usable device is an error naming the key
// rather than a silent fallback.
Device resolve_device(const std::string& value, const std::string& key = "trainer.device");

}  // namespace verl
