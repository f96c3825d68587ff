// Kernel timeline of any CUDA program, graph replays included, through CUPTI's activity API.
//
// Build:  g++ -std=c++20 -O2 -shared -fPIC -I/usr/local/cuda/include tools/cupti_trace.cpp \
//             -o cupti_trace.so -L/usr/local/cuda/lib -lcupti
// Use:    CUDA_INJECTION64_PATH=$PWD/cupti_trace.so CUPTI_TRACE_OUT=trace.tsv \
//             build/bin/verl bench ...
//
// The CUDA driver loads the library and calls InitializeInjection() before the first CUDA call.
// Every kernel becomes one line: start_ns, end_ns, graph id, graph node id, grid, block, name
// (mangled).
// tools/cupti_summary.py turns the file into time per kernel and the idle gaps between kernels.
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace {

constexpr size_t kBufferBytes = 8u << 20;
std::FILE* g_out = nullptr;
std::mutex g_mutex;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mutex);
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
        record->kind != CUPTI_ACTIVITY_KIND_KERNEL)
      continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    if (g_out)
      std::fprintf(g_out, "%llu\t%llu\t%u\t%llu\t%d,%d,%d\t%d,%d,%d\t%s\n",
                   static_cast<unsigned long long>(k->start),
                   static_cast<unsigned long long>(k->end), k->graphId,
                   static_cast<unsigned long long>(k->graphNodeId), k->gridX, k->gridY, k->gridZ,
                   k->blockX, k->blockY, k->blockZ, k->name ? k->name : "?");
  }
  std::free(buffer);
}

void flush_at_exit() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_out) std::fclose(g_out);
  g_out = nullptr;
}

}  // namespace

extern "C" int InitializeInjection() {
  const char* path = std::getenv("CUPTI_TRACE_OUT");
  g_out = std::fopen(path ? path : "cupti_trace.tsv", "w");
  if (!g_out) return 0;
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "cupti_trace: could not enable kernel activity records\n");
    return 0;
  }
  std::atexit(flush_at_exit);
  return 1;
}
