// `verl doctor`: checks what a run needs from this machine (the build, GPUs, the CUDA libraries,
// MPI and the launcher, the interconnect, host memory, disk, BLAS threads), with --config a run's
// configuration against the pre-flight checklist, and with --run a finished run's GPU
// utilisation. One line per check: PASS, WARN or FAIL, what was found, and after "->" what to do
// (docs/doctor.md). Exit 1 when a check FAILs.
#include <cblas.h>
#include <dlfcn.h>
// The MPI C API only (Open MPI and MPICH would otherwise pull in their C++ bindings).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <thread>

#include <nlohmann/json.hpp>

#ifdef VERL_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nccl.h>
#endif

#include "cli/command.h"
#include "cli/io.h"
#include "config/config.h"
#include "core/error.h"
#include "core/file.h"
#include "core/timer.h"
#include "data/dynamic_batch.h"
#include "data/parquet.h"
#include "data/rl_dataset.h"
#include "dist/launch.h"
#include "model/config.h"
#include "model/weights.h"
#include "rollout/kv_sizing.h"
#include "tokenizer/tokenizer.h"
#ifdef VERL_HAVE_CUDA
#include "ops/cuda/cublaslt_lazy.h"
#endif

// Set by CMake on the verl target; a build without them still compiles.
#ifndef VERL_CUDA_ARCHS
#define VERL_CUDA_ARCHS ""
#endif
#ifndef VERL_BUILD_TYPE
#define VERL_BUILD_TYPE "unknown"
#endif

namespace verl::cli {
namespace {

namespace fs = std::filesystem;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr int64_t kLongRun = 20;  // steps: past this, per-step checkpoints and tables cost
const char* const kCpuRun = "training runs on the CPU (trainer.device=cpu)";

// ------------------------------------------------------------------------------------------------
// The report

enum class Status { Pass, Warn, Fail };

struct Check {
  Status status;
  std::string name, found, advice;  // advice: what to do, for WARN and FAIL
};

class Report {
 public:
  void pass(std::string name, std::string found) {
    add(Status::Pass, std::move(name), std::move(found), "");
  }
  void warn(std::string name, std::string found, std::string advice) {
    add(Status::Warn, std::move(name), std::move(found), std::move(advice));
  }
  void fail(std::string name, std::string found, std::string advice) {
    add(Status::Fail, std::move(name), std::move(found), std::move(advice));
  }
  // Checks added from here on align their names apart from the ones before (the machine's short
  // names, the config's keys).
  void section() { sections_.push_back(checks_.size()); }
  bool failed() const {
    return std::any_of(checks_.begin(), checks_.end(),
                       [](const Check& c) { return c.status == Status::Fail; });
  }
  // Names padded to one column per section. Under a launcher the ranks other than 0 print only
  // their FAILs (tagged with the rank): their other lines repeat rank 0's.
  void print(std::ostream& out, int rank) const {
    std::vector<size_t> width(checks_.size(), 0), ends = sections_;
    ends.push_back(checks_.size());
    size_t begin = 0;
    for (size_t end : ends) {
      size_t w = 0;
      for (size_t i = begin; i < end; ++i) w = std::max(w, checks_[i].name.size());
      for (size_t i = begin; i < end; ++i) width[i] = w;
      begin = end;
    }
    for (size_t i = 0; i < checks_.size(); ++i) {
      const Check& c = checks_[i];
      if (rank != 0 && c.status != Status::Fail) continue;
      const char* tag = c.status == Status::Pass   ? "PASS"
                        : c.status == Status::Warn ? "WARN"
                                                   : "FAIL";
      std::string line = rank == 0
                             ? fmt::format("{}  {:<{}}  {}", tag, c.name, width[i], c.found)
                             : fmt::format("{}  [rank {}] {}: {}", tag, rank, c.name, c.found);
      if (!c.advice.empty()) line += " -> " + c.advice;
      out << line << '\n';
    }
    out.flush();
  }

 private:
  void add(Status s, std::string name, std::string found, std::string advice) {
    checks_.push_back({s, std::move(name), std::move(found), std::move(advice)});
  }
  std::vector<Check> checks_;
  std::vector<size_t> sections_;  // indices into checks_ where a section starts
};

// What the machine checks found, for the config checks.
struct Machine {
  int gpus = 0;
  double gpu_memory = 0;  // bytes of the smallest GPU
  unsigned cores = 0;
  dist::LaunchInfo launch;
  bool launch_ok = true;
  int local_ranks = 1;  // ranks of this launch on this node
};

std::string gib(double bytes) {
  return fmt::format("{:.1f} GiB", bytes / kGiB);
}

// GiB, or MiB under one GiB (a tiny model's state).
std::string size_of(double bytes) {
  return bytes < kGiB ? fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024.0)) : gib(bytes);
}

// An Error's message without the "[src/file.cpp:line]" it ends with.
std::string message_of(const std::exception& e) {
  std::string m = e.what();
  const size_t at = m.rfind(" [src/");
  if (at != std::string::npos && m.back() == ']') m.resize(at);
  return m;
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : fallback;
}

// A thread or rank count from the environment: nullopt when unset, -1 when not a positive number.
// OMP_NUM_THREADS may list one count per nesting level ("8,1"); the first is the outer one.
std::optional<int64_t> env_count(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (end == v || (*end != '\0' && *end != ',') || n < 1) return -1;
  return n;
}

std::optional<std::string> first_line(const fs::path& p) {
  std::ifstream f(p);
  std::string line;
  if (!f || !std::getline(f, line)) return std::nullopt;
  return line;
}

// ------------------------------------------------------------------------------------------------
// NVML, loaded at run time as metrics/gpu_monitor.cpp does (nothing NVML at build or link time):
// the driver's version and the NVLink state of each GPU, entry points declared as in nvml.h.

class Nvml {
 public:
  Nvml() {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) {
      const char* err = dlerror();
      reason_ = err ? err : "cannot load libnvidia-ml.so.1";
      return;
    }
    auto init = sym<Return (*)()>("nvmlInit_v2");
    shutdown_ = sym<Return (*)()>("nvmlShutdown");
    driver_version_ = sym<Return (*)(char*, unsigned)>("nvmlSystemGetDriverVersion");
    count_ = sym<Return (*)(unsigned*)>("nvmlDeviceGetCount_v2");
    handle_ = sym<Return (*)(unsigned, DeviceHandle*)>("nvmlDeviceGetHandleByIndex_v2");
    nvlink_state_ = sym<Return (*)(DeviceHandle, unsigned, int*)>("nvmlDeviceGetNvLinkState");
    if (!init || !shutdown_ || !driver_version_ || !count_ || !handle_ || !nvlink_state_) {
      reason_ = "libnvidia-ml.so.1 lacks an entry point the doctor needs";
    } else if (const Return rc = init(); rc != kSuccess) {
      reason_ = fmt::format("nvmlInit_v2 failed with code {}", rc);
    } else {
      return;
    }
    dlclose(lib_);
    lib_ = nullptr;
  }
  ~Nvml() {
    if (lib_ == nullptr) return;
    shutdown_();
    dlclose(lib_);
  }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool ok() const { return lib_ != nullptr; }
  const std::string& reason() const { return reason_; }

  std::string driver_version() const {
    char buf[96] = {};  // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE is 80
    if (!ok() || driver_version_(buf, sizeof(buf)) != kSuccess) return "";
    return buf;
  }
  int device_count() const {
    unsigned n = 0;
    return ok() && count_(&n) == kSuccess ? static_cast<int>(n) : 0;
  }
  // Active NVLink links of NVML device i; GPUs without NVLink answer NOT_SUPPORTED for every link.
  int active_nvlinks(int i) const {
    DeviceHandle dev = nullptr;
    if (!ok() || handle_(static_cast<unsigned>(i), &dev) != kSuccess) return 0;
    int active = 0;
    for (unsigned link = 0; link < kMaxLinks; ++link) {
      int state = 0;  // nvmlEnableState_t: NVML_FEATURE_ENABLED = 1
      if (nvlink_state_(dev, link, &state) == kSuccess && state == 1) ++active;
    }
    return active;
  }

 private:
  using Return = int;  // nvmlReturn_t
  using DeviceHandle = void*;
  static constexpr Return kSuccess = 0;
  static constexpr unsigned kMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS

  template <typename F>
  F sym(const char* name) const {
    return reinterpret_cast<F>(dlsym(lib_, name));
  }

  void* lib_ = nullptr;
  std::string reason_;
  Return (*shutdown_)() = nullptr;
  Return (*driver_version_)(char*, unsigned) = nullptr;
  Return (*count_)(unsigned*) = nullptr;
  Return (*handle_)(unsigned, DeviceHandle*) = nullptr;
  Return (*nvlink_state_)(DeviceHandle, unsigned, int*) = nullptr;
};

// ------------------------------------------------------------------------------------------------
// The machine

std::string compiler() {
#if defined(__clang__)
  return fmt::format("clang {}.{}.{}", __clang_major__, __clang_minor__, __clang_patchlevel__);
#elif defined(__GNUC__)
  return fmt::format("GCC {}.{}.{}", __GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__);
#else
  return "an unknown compiler";
#endif
}

#ifdef VERL_HAVE_CUDA
std::string cuda_version(int v) {  // CUDA's encoding: 1000 * major + 10 * minor
  return fmt::format("{}.{}", v / 1000, v % 1000 / 10);
}

// Whether this build's kernels run on a GPU of compute capability `cc` (10 * major + minor).
// CMake's CUDA_ARCHITECTURES entries: "90" is sm_90 machine code plus compute_90 PTX, "-real"
// drops the PTX, "-virtual" keeps only it, an "a" suffix is arch-specific (no newer GPU runs it).
// Machine code for sm_XY runs on sm_XZ with Z >= Y; the driver compiles PTX for any newer GPU
// when the program loads.
enum class ArchFit { Native, Jit, None, Unknown };

ArchFit arch_fit(const std::string& archs, int cc) {
  if (archs.empty()) return ArchFit::Unknown;
  ArchFit best = ArchFit::None;
  size_t start = 0;
  while (start <= archs.size()) {
    const size_t comma = std::min(archs.find(',', start), archs.size());
    const std::string a = archs.substr(start, comma - start);
    start = comma + 1;
    size_t digits = 0;
    while (digits < a.size() && std::isdigit(static_cast<unsigned char>(a[digits]))) ++digits;
    if (digits == 0) return ArchFit::Unknown;  // native, all, all-major
    const int sm = std::stoi(a.substr(0, digits));
    const std::string suffix = a.substr(digits);
    const bool specific = !suffix.empty() && suffix[0] == 'a';
    const bool sass = suffix.find("-virtual") == std::string::npos;
    const bool ptx = suffix.find("-real") == std::string::npos && !specific;
    if (sass && (specific ? sm == cc : sm / 10 == cc / 10 && sm <= cc)) return ArchFit::Native;
    if (ptx && sm <= cc) best = ArchFit::Jit;
  }
  return best;
}
#endif

void check_build(Report& r) {
  const std::string type = VERL_BUILD_TYPE;
#ifdef VERL_HAVE_CUDA
  const std::string found =
      fmt::format("CUDA {} compiled in (VERL_HAVE_CUDA) for sm {}, {}, {} build",
                  cuda_version(CUDART_VERSION), VERL_CUDA_ARCHS, compiler(), type);
#else
  const std::string found = fmt::format("CPU-only (VERL_CUDA=OFF), {}, {} build", compiler(), type);
#endif
  if (type == "Debug") {
    r.warn("build", found,
           "unoptimised code trains many times slower: configure with -DCMAKE_BUILD_TYPE=Release");
    return;
  }
#ifdef VERL_HAVE_CUDA
  r.pass("build", found);
#else
  r.warn("build", found,
         std::string(kCpuRun) +
             "; for GPUs configure with -DVERL_CUDA=ON on a machine with the CUDA toolkit");
#endif
}

void check_gpus(Report& r, Machine& m, const Nvml& nvml) {
#ifdef VERL_HAVE_CUDA
  int n = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess) {
    (void)cudaGetLastError();  // clear it, so later calls do not report this one
    r.warn("gpus", fmt::format("none: cudaGetDeviceCount says \"{}\"", cudaGetErrorString(e)),
           kCpuRun);
    return;
  }
  if (n == 0) {
    r.warn("gpus",
           fmt::format("none visible (CUDA_VISIBLE_DEVICES={})",
                       env_or("CUDA_VISIBLE_DEVICES", "unset")),
           kCpuRun);
    return;
  }
  // One entry per kind of GPU, in device order: "8 x NVIDIA H200 (139.8 GiB, sm_90)".
  std::vector<std::pair<std::string, int>> kinds;
  std::vector<int> without_kernels, jit;
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp p{};
    if (const cudaError_t e = cudaGetDeviceProperties(&p, d); e != cudaSuccess) {
      (void)cudaGetLastError();
      r.warn(
          "gpus",
          fmt::format("{} visible, but device {} does not answer: {}", n, d, cudaGetErrorString(e)),
          "check nvidia-smi and the driver; " + std::string(kCpuRun) + " until it answers");
      return;
    }
    const double mem = static_cast<double>(p.totalGlobalMem);
    m.gpu_memory = d == 0 ? mem : std::min(m.gpu_memory, mem);
    const std::string kind = fmt::format("{} ({}, sm_{}{})", p.name, gib(mem), p.major, p.minor);
    auto it =
        std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) { return k.first == kind; });
    if (it == kinds.end())
      kinds.emplace_back(kind, 1);
    else
      ++it->second;
    const ArchFit fit = arch_fit(VERL_CUDA_ARCHS, 10 * p.major + p.minor);
    if (fit == ArchFit::None) without_kernels.push_back(10 * p.major + p.minor);
    if (fit == ArchFit::Jit) jit.push_back(10 * p.major + p.minor);
  }
  m.gpus = n;
  std::string found;
  for (const auto& [kind, count] : kinds)
    found += fmt::format("{}{} x {}", found.empty() ? "" : ", ", count, kind);
  if (!without_kernels.empty()) {
    r.fail("gpus",
           fmt::format("{}; this build has no kernels for sm_{} (built for sm {})", found,
                       without_kernels[0], VERL_CUDA_ARCHS),
           fmt::format("reconfigure with -DCMAKE_CUDA_ARCHITECTURES={}", without_kernels[0]));
  } else if (!jit.empty()) {
    r.warn(
        "gpus",
        fmt::format("{}; sm_{} runs the build's sm {} PTX, compiled by the driver at start", found,
                    jit[0], VERL_CUDA_ARCHS),
        fmt::format("for native kernels reconfigure with -DCMAKE_CUDA_ARCHITECTURES={}", jit[0]));
  } else {
    r.pass("gpus", found);
  }
#else
  const int seen = nvml.device_count();
  if (seen > 0) {
    r.warn("gpus", fmt::format("this build has no CUDA backend; NVML sees {} GPU(s)", seen),
           std::string(kCpuRun) + "; to use them configure with -DVERL_CUDA=ON");
  } else {
    r.warn("gpus", "this build has no CUDA backend (VERL_CUDA=OFF)", kCpuRun);
  }
#endif
}

void check_cuda_driver(Report& r, const Nvml& nvml) {
#ifdef VERL_HAVE_CUDA
  int driver = 0, runtime = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = CUDART_VERSION;
  (void)cudaGetLastError();
  const std::string nvidia = nvml.driver_version();
  const std::string driver_name = nvidia.empty() ? "" : fmt::format(" (NVIDIA {})", nvidia);
  if (driver == 0) {
    r.warn("cuda driver",
           fmt::format("no NVIDIA driver loaded; this binary's CUDA runtime is {}",
                       cuda_version(runtime)),
           kCpuRun);
  } else if (driver < runtime) {
    r.fail("cuda driver",
           fmt::format("the driver{} supports CUDA {}, older than this binary's runtime {}",
                       driver_name, cuda_version(driver), cuda_version(runtime)),
           fmt::format(
               "install an NVIDIA driver for CUDA {} or newer, or build with a CUDA {} toolkit",
               cuda_version(runtime), cuda_version(driver)));
  } else {
    r.pass("cuda driver", fmt::format("driver{} supports CUDA {}, runtime {}", driver_name,
                                      cuda_version(driver), cuda_version(runtime)));
  }
#else
  (void)r;
  (void)nvml;
#endif
}

void check_cuda_libraries(Report& r) {
#ifdef VERL_HAVE_CUDA
  // cuBLAS encodes 10000 * major + 100 * minor + patch; so does NCCL since 2.9.
  auto version = [](long v) {
    return v >= 10000 ? fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
                      : fmt::format("{}.{}.{}", v / 1000, v / 100 % 10, v % 100);
  };
  // The library is opened on first use (ops/cuda/cublaslt_lazy.h): opened here, or named as missing.
  const std::string lt_problem = ops::cuda::cublaslt_load_problem();
  const long lt = lt_problem.empty() ? static_cast<long>(cublasLtGetVersion()) : -1;
  const std::string lt_found =
      lt < 0 ? lt_problem : fmt::format("cuBLASLt {} (built against {})", version(lt), version(CUBLAS_VERSION));
  if (lt < 0) {
    r.fail("cublaslt", lt_found, "GEMMs on the GPU need it");
  } else if (lt < CUBLAS_VERSION) {
    r.warn("cublaslt", lt_found,
           "an older libcublasLt than the build's is loaded: check LD_LIBRARY_PATH");
  } else {
    r.pass("cublaslt", lt_found);
  }

  int nccl = 0;
  if (ncclGetVersion(&nccl) != ncclSuccess) {
    r.warn("nccl", "ncclGetVersion failed",
           "check that libnccl.so.2 is the one the build linked (LD_LIBRARY_PATH)");
  } else {
    const std::string found =
        fmt::format("NCCL {} (built against {})", version(nccl), version(NCCL_VERSION_CODE));
    if (nccl < NCCL_VERSION_CODE) {
      r.warn("nccl", found, "an older libnccl than the build's is loaded: check LD_LIBRARY_PATH");
    } else {
      r.pass("nccl", found);
    }
  }
  // NVLink multicast (NVLS) can take a shared host's GPUs out of service; verl's NCCL communicator
  // turns it off for itself when the variable is unset, other programs on the machine do not.
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  if (nvls == nullptr) {
    r.warn("nccl nvls",
           "NCCL_NVLS_ENABLE is unset (verl's communicator sets 0 for itself, other NCCL programs "
           "do not)",
           "export NCCL_NVLS_ENABLE=0");
  } else if (std::string(nvls) != "0") {
    r.warn("nccl nvls", fmt::format("NCCL_NVLS_ENABLE={}: NVLink multicast may be used", nvls),
           "export NCCL_NVLS_ENABLE=0");
  } else {
    r.pass("nccl nvls", "NCCL_NVLS_ENABLE=0 (NVLink multicast off)");
  }
#else
  r.warn("cublaslt", "not in this build (VERL_CUDA=OFF)",
         "GPU training needs a -DVERL_CUDA=ON build");
  r.warn("nccl", "not in this build (VERL_CUDA=OFF)",
         "multi-GPU gradient sync needs a -DVERL_CUDA=ON build");
#endif
}

void check_mpi(Report& r) {
  // Both calls are allowed before MPI_Init (MPI 3.1, section 8.1.1).
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0, major = 0, minor = 0;
  if (MPI_Get_library_version(lib, &len) != MPI_SUCCESS ||
      MPI_Get_version(&major, &minor) != MPI_SUCCESS) {
    r.warn("mpi", "the MPI library does not say its version",
           "check the Open MPI installation (mpirun --version)");
    return;
  }
  std::string name(lib, static_cast<size_t>(std::max(len, 0)));
  name = name.substr(
      0, name.find_first_of(",\n"));  // "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4"
  r.pass("mpi", fmt::format("{} (MPI {}.{})", name, major, minor));
}

// The first executable `program` in $PATH, as a shell would find it; "" when there is none.
std::string find_on_path(const std::string& program) {
  const std::string path = env_or("PATH", "");
  size_t start = 0;
  while (start <= path.size()) {
    const size_t colon = std::min(path.find(':', start), path.size());
    const std::string dir = colon > start ? path.substr(start, colon - start) : ".";
    start = colon + 1;
    const fs::path candidate = fs::path(dir) / program;
    std::error_code ec;
    if (fs::is_regular_file(candidate, ec) && access(candidate.c_str(), X_OK) == 0)
      return candidate.string();
  }
  return "";
}

void check_launcher(Report& r, Machine& m) {
  const std::string mpirun = find_on_path("mpirun");
  const std::string where = mpirun.empty() ? "mpirun not on PATH" : "mpirun at " + mpirun;
  try {
    m.launch = dist::detect_launch();
  } catch (const std::exception& e) {
    m.launch_ok = false;
    r.fail("launcher", fmt::format("{}; {}", where, message_of(e)),
           "fix the launcher's rank variables (docs/distributed.md)");
    return;
  }
  for (const char* local_size : {"OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"}) {
    if (auto n = env_count(local_size); n && *n > 0) {
      m.local_ranks = static_cast<int>(*n);
      break;
    }
  }
  const dist::LaunchInfo& li = m.launch;
  if (li.launcher == "single") {
    if (mpirun.empty()) {
      r.warn("launcher", where + "; one process (no launcher variables)",
             "multi-process runs need Open MPI's mpirun on PATH, or torchrun-style RANK / "
             "WORLD_SIZE variables "
             "(docs/distributed.md)");
    } else {
      r.pass("launcher", where + "; one process (no launcher variables)");
    }
    return;
  }
  const std::string found = fmt::format("{}; under {}: rank {} of {} (local rank {})", where,
                                        li.launcher, li.rank, li.world_size, li.local_rank);
  if (li.launcher == "torchrun" && li.world_size > 1 &&
      (env_or("MASTER_ADDR", "").empty() || env_or("MASTER_PORT", "").empty())) {
    m.launch_ok = false;
    r.fail("launcher", found + "; MASTER_ADDR / MASTER_PORT unset",
           "set both to rank 0's address and a free port, the same on every rank");
    return;
  }
  r.pass("launcher", found);
}

// An all-reduce ping-pong through the communicator `verl train` would use: the small message
// every step's counts and metrics pay, and a 4 MiB one for the bandwidth (nccl-tests' bus
// bandwidth: 2 (n - 1) / n bytes per byte reduced). Host buffers: on GPUs this is the control
// path beside NCCL, on CPUs the gradients' path too.
void check_link(Report& r, const Machine& m) {
  if (!m.launch_ok || m.launch.world_size < 2) {
    r.pass("link probe",
           "skipped: one process (`mpirun -np 2 verl doctor` times the link between two ranks)");
    return;
  }
  try {
    auto comm = dist::make_communicator(m.launch, /*timeout_s=*/60.0);
    comm->set_stage("doctor");
    // The slowest rank's seconds per all-reduce of `buf`.
    auto seconds_per_all_reduce = [&](std::vector<float>& buf, int reps) {
      comm->barrier();
      Timer t;
      for (int i = 0; i < reps; ++i) comm->all_reduce(std::span<float>(buf), dist::ReduceOp::Sum);
      std::vector<double> s = {t.seconds() / reps};
      comm->all_reduce(std::span<double>(s), dist::ReduceOp::Max);
      return s[0];
    };
    std::vector<float> small(2), big((4u << 20) / sizeof(float));
    seconds_per_all_reduce(small, 20);  // warm-up: connections, buffers
    const double latency = seconds_per_all_reduce(small, 200);
    seconds_per_all_reduce(big, 1);
    const double big_s = seconds_per_all_reduce(big, 5);
    const int n = comm->world_size();
    const double bus = 2.0 * (n - 1) / n * static_cast<double>(big.size() * sizeof(float)) / big_s;
    const std::string found = fmt::format(
        "{} ranks ({}), host buffers: 8-byte all-reduce {:.1f} us, 4 MiB all-reduce {:.2f} GB/s "
        "bus bandwidth",
        n, m.launch.launcher, latency * 1e6, bus / 1e9);
    if (latency > 1e-3) {
      r.warn("link probe", found,
             "a slow link or oversubscribed cores: every step's small collectives wait this long; "
             "check the "
             "interconnect, and across nodes consider trainer.gradient_sync_method=lightweight");
    } else {
      r.pass("link probe", found);
    }
  } catch (const std::exception& e) {
    r.fail("link probe", message_of(e),
           "check that every rank reaches the others (docs/distributed.md)");
  }
}

void check_interconnect(Report& r, const Nvml& nvml) {
  std::string nvlink;
  int links = 0;
  if (!nvml.ok()) {
    nvlink = fmt::format("NVLink unknown (NVML: {})", nvml.reason());
  } else {
    const int n = nvml.device_count();
    for (int d = 0; d < n; ++d) links += nvml.active_nvlinks(d);
    nvlink = n == 0      ? "NVLink: no GPU"
             : links > 0 ? fmt::format("NVLink: {} active links on {} GPU(s)", links, n)
                         : fmt::format("NVLink: none active on {} GPU(s)", n);
  }
  // RDMA devices (InfiniBand, or RoCE: link_layer Ethernet), each with its ports' states.
  const fs::path root = "/sys/class/infiniband";
  std::error_code ec;
  std::vector<std::string> devices;
  int active_ports = 0;
  for (const auto& dev : fs::directory_iterator(root, ec)) {
    int ports = 0, active = 0;
    std::string layer;
    for (const auto& port : fs::directory_iterator(dev.path() / "ports", ec)) {
      ++ports;
      if (first_line(port.path() / "state").value_or("").find("ACTIVE") != std::string::npos)
        ++active;
      if (layer.empty()) layer = first_line(port.path() / "link_layer").value_or("");
    }
    active_ports += active;
    devices.push_back(fmt::format("{} ({}/{} ports active{})", dev.path().filename().string(),
                                  active, ports, layer.empty() ? "" : ", " + layer));
  }
  std::sort(devices.begin(), devices.end());
  std::string ib =
      devices.empty() ? "InfiniBand: none (" + root.string() + " empty or absent)" : "InfiniBand: ";
  for (size_t i = 0; i < devices.size(); ++i) ib += (i ? ", " : "") + devices[i];
  const std::string found = nvlink + "; " + ib;
  if (links > 0 || active_ports > 0) {
    r.pass("interconnect", found);
  } else {
    r.warn("interconnect", found,
           "no NVLink/InfiniBand seen: multi-node sync over TCP; consider "
           "trainer.gradient_sync_method=lightweight");
  }
}

void check_host_memory(Report& r) {
  std::ifstream f("/proc/meminfo");
  std::map<std::string, double> kib;
  std::string key;
  double value = 0;
  std::string unit;
  while (f >> key >> value) {
    kib[key] = value;
    std::getline(f, unit);
  }
  if (!kib.count("MemTotal:") || !kib.count("MemAvailable:")) {
    r.warn("host memory", "unknown (/proc/meminfo unreadable)",
           "check free -g by hand: a run wants 16 GiB or more");
    return;
  }
  double total = kib["MemTotal:"] * 1024, available = kib["MemAvailable:"] * 1024;
  // A container's cgroup limit (v2, then v1) caps what this process may use below the host's.
  std::string limit_note;
  for (const auto& [max_file, used_file] :
       {std::pair{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
        std::pair{"/sys/fs/cgroup/memory/memory.limit_in_bytes",
                  "/sys/fs/cgroup/memory/memory.usage_in_bytes"}}) {
    const auto max_s = first_line(max_file);
    if (!max_s || max_s->empty() || !std::isdigit(static_cast<unsigned char>((*max_s)[0])))
      continue;
    const double limit = std::strtod(max_s->c_str(), nullptr);
    if (limit >= total) break;
    const double used = std::strtod(first_line(used_file).value_or("0").c_str(), nullptr);
    total = limit;
    available = std::min(available, std::max(0.0, limit - used));
    limit_note = " (cgroup limit)";
    break;
  }
  const std::string found =
      fmt::format("{} total{}, {} available", gib(total), limit_note, gib(available));
  if (available < 16 * kGiB) {
    r.warn("host memory", found + ", under 16 GiB",
           "the dataset, the CPU-side model copies and checkpoint writes need room: free memory, "
           "or use a smaller "
           "model or batch");
  } else {
    r.pass("host memory", found);
  }
}

void check_disk(Report& r, const std::string& dir) {
  std::error_code ec, ec_path;
  const fs::space_info s = fs::space(dir, ec);
  const fs::path full = fs::canonical(dir, ec_path);
  const std::string where = ec_path ? dir : full.string();
  if (ec) {
    r.warn("disk", fmt::format("cannot read free space at {}: {}", where, ec.message()),
           "check df -h by hand");
    return;
  }
  const double free_b = static_cast<double>(s.available);
  const std::string found =
      fmt::format("{} free of {} at {}", gib(free_b), gib(static_cast<double>(s.capacity)), where);
  if (free_b < 20 * kGiB) {
    r.warn("disk", found + ", under 20 GiB",
           "each checkpoint holds the model and its optimizer state (about 16 bytes per "
           "parameter): free space, "
           "or put trainer.default_local_dir (and --dir) on a larger disk");
  } else {
    r.pass("disk", found);
  }
}

void check_blas_threads(Report& r, const Machine& m) {
  const unsigned cores = m.cores;
  const int ranks = std::max(1, m.local_ranks);
  const int64_t share = std::max<int64_t>(1, static_cast<int64_t>(cores) / ranks);
  const std::string per_node = ranks > 1 ? fmt::format(" x {} ranks on this node", ranks) : "";
  std::string found;
  std::vector<std::string> problems;
  bool any_set = false;
  for (const char* name : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}) {
    const auto n = env_count(name);
    found += fmt::format("{}{}={}", found.empty() ? "" : ", ", name, env_or(name, "unset"));
    if (!n) continue;
    any_set = true;
    if (*n < 0)
      problems.push_back(fmt::format("{}='{}' is not a thread count", name, env_or(name, "")));
    else if (cores > 0 && *n * ranks > cores)
      problems.push_back(fmt::format("{}={}{} exceeds {} cores", name, *n, per_node, cores));
  }
  found += fmt::format(" (threads: OpenMP {}, OpenBLAS {}); {} cores{}", omp_get_max_threads(),
                       openblas_get_num_threads(), cores,
                       ranks > 1 ? fmt::format(", {} ranks on this node", ranks) : "");
  // Under a launcher the ranks per node are known; before one, the rule.
  const std::string fix =
      m.local_ranks > 1 || m.launch.world_size > 1
          ? fmt::format(
                "export OMP_NUM_THREADS={0} OPENBLAS_NUM_THREADS={0} (cores / ranks on "
                "this node)",
                share)
          : fmt::format(
                "export OMP_NUM_THREADS=N OPENBLAS_NUM_THREADS=N with N = {} cores / "
                "ranks per node (mpirun: -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS)",
                cores);
  if (!problems.empty()) {
    std::string what;
    for (const std::string& p : problems) what += "; " + p;
    r.warn("blas threads", found + what, fix);
  } else if (!any_set && (cores >= 16 || ranks > 1)) {
    r.warn("blas threads",
           found + ": unset, OpenMP and OpenBLAS each start a thread per core in every rank", fix);
  } else {
    r.pass("blas threads", found);
  }
}

// ------------------------------------------------------------------------------------------------
// The configuration (verl doctor --config)

// Rows of one data file when counting them is cheap: JSON lines are counted, a Parquet footer
// says; a .json array would have to be parsed whole (nullopt). Throws naming a missing file.
std::optional<int64_t> count_rows(const std::string& given) {
  const std::string path = data::expand_user(given);
  std::error_code ec;
  VERL_CHECK(fs::is_regular_file(path, ec), "{}: no such file", path);
  if (path.ends_with(".parquet")) return data::ParquetFile::open(path).num_rows();
  if (!path.ends_with(".jsonl")) return std::nullopt;
  std::ifstream f(path);
  std::string line;
  int64_t rows = 0;
  while (std::getline(f, line)) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) ++rows;
  }
  return rows;
}

// The rows of a data.*_files list (`rows` unset when one file's count is not cheap); FAILs the
// check `key` when a file is missing or unreadable.
struct DataFiles {
  bool ok = false;
  std::optional<int64_t> rows;
};

DataFiles check_files(Report& r, const std::string& key, const std::vector<std::string>& files) {
  int64_t rows = 0;
  bool counted = true;
  try {
    for (const std::string& f : files) {
      const auto n = count_rows(f);
      if (n)
        rows += *n;
      else
        counted = false;
    }
  } catch (const std::exception& e) {
    r.fail(key, message_of(e),
           fmt::format("point {} at the data (.parquet, .jsonl or .json files)", key));
    return {};
  }
  const std::string what = files.size() == 1 ? files[0] : fmt::format("{} files", files.size());
  r.pass(key, counted ? fmt::format("{}: {} rows", what, rows)
                      : what + ": rows not counted (a .json array)");
  return {true, counted ? std::optional<int64_t>(rows) : std::nullopt};
}

struct RunLength {
  std::optional<int64_t> steps;  // nullopt: unknown
  std::string how;
};

RunLength check_run_length(Report& r, const config::Config& cfg, std::optional<int64_t> rows) {
  const auto cap = cfg.get<std::optional<int64_t>>("trainer.total_training_steps");
  const int64_t epochs = cfg.get<int64_t>("trainer.total_epochs");
  const int64_t batch = cfg.get<int64_t>("data.train_batch_size");
  const int64_t max_samples = cfg.get<int64_t>("data.train_max_samples");
  if (rows && max_samples >= 0) rows = std::min(*rows, max_samples);
  RunLength len;
  if (rows) {
    const int64_t per_epoch = *rows / batch;  // the train loader drops the last partial batch
    if (per_epoch == 0) {
      r.fail("run length",
             fmt::format("{} rows, fewer than data.train_batch_size={}: an epoch has no batch",
                         *rows, batch),
             fmt::format("consider data.train_batch_size={} or more data",
                         std::max<int64_t>(1, *rows)));
      return len;
    }
    const int64_t from_epochs = epochs * per_epoch;
    len.steps = cap ? std::min(*cap, from_epochs) : from_epochs;
    len.how =
        fmt::format("{} epochs x {} batches of data.train_batch_size={}", epochs, per_epoch, batch);
    if (cap && *cap < from_epochs)
      len.how = fmt::format("trainer.total_training_steps={}; {} = {}", *cap, len.how, from_epochs);
  } else if (cap) {
    len.steps = *cap;
    len.how = fmt::format("trainer.total_training_steps={} (rows not counted)", *cap);
  }
  if (len.steps)
    r.pass("run length", fmt::format("{} steps ({})", *len.steps, len.how));
  else
    r.pass("run length", "unknown: rows not counted and trainer.total_training_steps unset");
  return len;
}

void check_save_freq(Report& r, const config::Config& cfg, const RunLength& len) {
  const std::string key = "trainer.save_freq";
  const int64_t freq = cfg.get<int64_t>(key);
  const bool long_run = !len.steps || *len.steps > kLongRun;
  const std::string steps =
      len.steps ? fmt::format("{} steps", *len.steps) : "a run of unknown length";
  const int64_t suggest = std::max<int64_t>(10, len.steps.value_or(0) / 10);
  if (freq <= 0) {
    if (long_run) {
      r.warn(key,
             fmt::format("{}: no checkpoint in {}; a crash or a kill loses the whole run", freq,
                         steps),
             fmt::format("consider trainer.save_freq={}", suggest));
    } else {
      r.pass(key, fmt::format("{}: no checkpoint (a short run of {})", freq, steps));
    }
  } else if (freq < 5 && long_run) {
    r.warn(key,
           fmt::format(
               "checkpoints every {} over {}: each save writes the model and optimizer state while "
               "training waits",
               freq == 1 ? "step" : fmt::format("{} steps", freq), steps),
           fmt::format("consider trainer.save_freq={}", suggest));
  } else if (len.steps && freq >= *len.steps) {
    r.pass(key, fmt::format("{}: one checkpoint, after the last of {}", freq, steps));
  } else {
    r.pass(key, fmt::format("checkpoints every {} steps over {}, and after the last", freq, steps));
  }
}

void check_logging_steps(Report& r, const config::Config& cfg, const RunLength& len) {
  const std::string key = "trainer.logging_steps";
  const int64_t every = cfg.get<int64_t>(key);
  const std::string steps =
      len.steps ? fmt::format("{} steps", *len.steps) : "a run of unknown length";
  if (every == 1 && (!len.steps || *len.steps > kLongRun)) {
    r.warn(key,
           fmt::format("1: the console prints the full metrics table every step of {}, burying the "
                       "progress line "
                       "(jsonl and tensorboard get every step whatever this is)",
                       steps),
           "consider trainer.logging_steps=10");
  } else if (len.steps && every > *len.steps) {
    r.warn(
        key,
        fmt::format("{}: more than the run's {}: the console shows the table only after the last",
                    every, steps),
        fmt::format("consider trainer.logging_steps={}", std::max<int64_t>(1, *len.steps / 10)));
  } else {
    r.pass(key, fmt::format("the metrics table every {} steps of {}", every, steps));
  }
}

void check_loader_threads(Report& r, const config::Config& cfg, const Machine& m) {
  const std::string key = "data.dataloader_num_workers";
  const int64_t workers = cfg.get<int64_t>(key);
  const int ranks = std::max(1, m.local_ranks);
  const std::string where =
      fmt::format("{} cores, {} GPU(s){}", m.cores, m.gpus,
                  ranks > 1 ? fmt::format(", {} ranks on this node", ranks) : "");
  if (workers == 0) {
    r.warn(key,
           fmt::format("0: rows are read and tokenized on the training thread, between steps ({})",
                       where),
           "consider data.dataloader_num_workers=2 or more");
  } else if (m.cores > 0 && workers * ranks > 2 * static_cast<int64_t>(m.cores)) {
    // A few idle loader threads cost nothing (they wait on a full prefetch queue); many more
    // than cores compete with the trainer's math threads while they fill it.
    r.warn(key,
           fmt::format("{} loader threads per rank ({}): far more than the cores", workers, where),
           fmt::format("consider data.dataloader_num_workers={}",
                       std::max<int64_t>(1, m.cores / ranks)));
  } else {
    r.pass(key, fmt::format("{} loader thread{} read and tokenize ahead of the trainer ({})",
                            workers, workers == 1 ? "" : "s", where));
  }
}

// Parameters of the policy model, from its config.json; FAILs the check when it cannot be read.
std::optional<model::ModelConfig> check_model(Report& r, const config::Config& cfg,
                                              int64_t* params) {
  const std::string key = "actor_rollout_ref.model.path";
  const std::string path = data::expand_user(cfg.get<std::string>(key));
  try {
    model::ModelConfig mc = model::load_model_config(path);
    *params = model::ParamLayout::build(mc).total;
    const std::string count = *params >= 1'000'000'000 ? fmt::format("{:.2f} B", *params / 1e9)
                                                       : fmt::format("{:.1f} M", *params / 1e6);
    r.pass(key, fmt::format("{}: {}, {} parameters, {} layers", path, mc.architecture, count,
                            mc.num_hidden_layers));
    return mc;
  } catch (const std::exception& e) {
    r.fail(
        key, message_of(e),
        "point actor_rollout_ref.model.path at an HF model directory (config.json + safetensors)");
    return std::nullopt;
  }
}

// Whether the run trains on the GPU: trainer.device, resolved as core/device.h does.
bool check_device(Report& r, const config::Config& cfg, const Machine& m) {
  const std::string key = "trainer.device";
  const std::string dev = cfg.get<std::string>(key);
  if (dev == "cuda" && m.gpus == 0) {
    r.fail(key, "cuda, but no CUDA device is visible here (see the gpus line)",
           "set trainer.device=cpu or auto");
    return false;
  }
  if (dev == "cpu" && m.gpus > 0) {
    r.warn(key, fmt::format("cpu on a machine with {} GPU(s)", m.gpus),
           "consider trainer.device=auto");
    return false;
  }
  const bool cuda = dev == "cuda" || (dev == "auto" && m.gpus > 0);
  r.pass(key, dev == "auto" ? fmt::format("auto: {} here", cuda ? "cuda" : "cpu") : dev);
  return cuda;
}

void check_attention(Report& r, const config::Config& cfg, bool on_cuda) {
  const std::string name = "fused attention";
  const std::string impl = cfg.get<std::string>("actor_rollout_ref.model.attn_implementation");
  const std::string ignored =
      impl == "flash_attention_2"
          ? ""
          : fmt::format(" (actor_rollout_ref.model.attn_implementation={} has no effect)", impl);
  if (!on_cuda) {
    r.pass(name,
           "trainer.device=cpu: the CPU reference attention (fused kernels run on "
           "trainer.device=cuda)" +
               ignored);
  } else if (cfg.get<bool>("actor_rollout_ref.rollout.batch_invariant")) {
    r.warn(name,
           "actor_rollout_ref.rollout.batch_invariant=true: batch-invariant kernels, bit-equal "
           "log-probs, slower" +
               ignored,
           "unless bit equality is needed consider actor_rollout_ref.rollout.batch_invariant=false "
           "(match_trainer_numerics "
           "keeps rollout log-probs within ~1e-6)");
  } else {
    r.pass(name, "fused attention kernels on the GPU, in the actor and the rollout" + ignored);
  }
}

void check_hybrid_engine(Report& r, const config::Config& cfg) {
  const std::string key = "actor_rollout_ref.hybrid_engine";
  if (cfg.get<bool>(key)) {
    r.pass(key,
           "true: the rollout decodes from the actor's weights in place (no copy or resharding "
           "between phases)");
  } else {
    r.warn(key, "false: verl.cpp always runs the hybrid engine",
           "set actor_rollout_ref.hybrid_engine=true");
  }
}

void check_overlap(Report& r, const config::Config& cfg) {
  const std::string key = "trainer.actor_reward_parallel";
  if (cfg.get<bool>(key)) {
    r.pass(key, "true: rewards are scored as sequences finish, while generation runs");
  } else {
    r.warn(key, "false: rewards are scored after generation ends", "consider trainer.actor_reward_parallel=true");
  }
  // The seed's two further overlap switches (docs/overlap.md).
  const std::string pipe = "trainer.token_level_pipeline";
  if (cfg.get<bool>(pipe)) {
    r.pass(pipe, "true: the log-prob and value passes run on finished samples while generation runs");
  } else {
    r.warn(pipe, "false: the log-prob and value passes wait for the longest response",
           "consider trainer.token_level_pipeline=true (long-tailed response lengths gain most)");
  }
  const bool critic = cfg.get<std::string>("algorithm.adv_estimator") == "gae" ||
                      cfg.get<std::optional<bool>>("critic.enable").value_or(false);
  const std::string ca = "trainer.critic_actor_overlap";
  if (!critic) {
    r.pass(ca, "no critic in this run: nothing to overlap");
  } else if (cfg.get<bool>(ca)) {
    r.pass(ca, "true: the critic's update runs beside the actor's (one process; with several ranks they take turns)");
  } else {
    r.warn(ca, "false: the critic's update and the actor's run one after the other",
           "consider trainer.critic_actor_overlap=true on one process");
  }
}

void check_dynamic_batching(Report& r, const config::Config& cfg) {
  const std::string key = "actor_rollout_ref.actor.use_dynamic_bsz";
  const int64_t seq =
      cfg.get<int64_t>("data.max_prompt_length") + cfg.get<int64_t>("data.max_response_length");
  const int64_t budget = cfg.get<int64_t>("actor_rollout_ref.actor.ppo_max_token_len_per_gpu");
  if (cfg.get<bool>("data.dynamic_batch.enable")) {
    // data.dynamic_batch replaces use_dynamic_bsz's fixed budget (data/dynamic_batch.h).
    const std::string dkey = "data.dynamic_batch.enable";
    data::DynamicBatchConfig db;
    try {
      db = data::DynamicBatchConfig::from_config(cfg);
    } catch (const std::exception& e) {
      r.fail(dkey, message_of(e), "fix the data.dynamic_batch key it names");
      return;
    }
    const int64_t planned =
        std::min(db.max_sequence_length, cfg.get<int64_t>("data.max_prompt_length") +
                                             cfg.get<int64_t>("actor_rollout_ref.rollout.response_length"));
    if (budget < planned) {
      r.warn(dkey,
             fmt::format("true, but ppo_max_token_len_per_gpu={} is under one planned sequence of {} tokens: "
                         "longer kept samples cannot be packed",
                         budget, planned),
             fmt::format("consider actor_rollout_ref.actor.ppo_max_token_len_per_gpu={} or a lower "
                         "data.dynamic_batch.max_sequence_length",
                         planned));
      return;
    }
    r.pass(dkey, fmt::format("true: micro-batches of up to {} tokens (base_batch_size {} x {} planned tokens, at "
                             "most ppo_max_token_len_per_gpu {}), halved above {} GiB in use; samples outside "
                             "[{}, {}] tokens dropped",
                             std::min(budget, db.base_batch_size * planned), db.base_batch_size, planned, budget,
                             db.memory_threshold_gb, db.min_sequence_length, db.max_sequence_length));
    return;
  }
  if (!cfg.get<bool>(key)) {
    r.warn(key,
           "false: micro-batches by sample count: short responses leave them underfilled, long "
           "ones risk running out of memory",
           fmt::format("consider actor_rollout_ref.actor.use_dynamic_bsz=true with "
                       "ppo_max_token_len_per_gpu >= {}, or data.dynamic_batch.enable=true",
                       seq));
  } else if (budget < seq) {
    r.warn(key,
           fmt::format("true, but ppo_max_token_len_per_gpu={} is under one full-length sequence "
                       "(max_prompt_length + "
                       "max_response_length = {})",
                       budget, seq),
           fmt::format("consider actor_rollout_ref.actor.ppo_max_token_len_per_gpu={}", seq));
  } else {
    r.pass(key,
           fmt::format("true: micro-batches of up to {} tokens ({} full-length sequences of {})",
                       budget, budget / seq, seq));
  }
}

// The reward model's weights (reward_model.model.path): bf16 on the GPU, fp32 on the CPU, at
// load. Quantised on the GPU the linear layers keep their codes instead (ops/cuda/quant_linear.h):
// int8 1 byte a weight, int4 half a byte plus a 4-byte scale and a zero-point byte a group; the
// CPU keeps fp32 whatever the bits. Returns the bytes resident on the GPU beside the training
// state (0 without a reward model or on the CPU).
double check_reward_model(Report& r, const config::Config& cfg, const Machine& m, bool on_cuda) {
  const std::string key = "reward_model.quantization_bits";
  if (!cfg.get<bool>("reward_model.enable")) {
    r.pass(key,
           "reward_model.enable=false: rule-based or command rewards, no reward model to quantise");
    return 0;
  }
  const std::string path = data::expand_user(cfg.get<std::string>("reward_model.model.path"));
  model::ParamLayout layout;
  try {
    layout = model::ParamLayout::build(model::load_model_config(path));
  } catch (const std::exception& e) {
    r.fail(key, fmt::format("reward_model.model.path: {}", message_of(e)),
           "point reward_model.model.path at an HF ...ForSequenceClassification directory");
    return 0;
  }
  const int64_t params = layout.total;
  int64_t linear = 0;  // the quantisable weights: each layer's q|k|v, o, gate|up, down
  for (const model::LayerParams& lp : layout.layers)
    for (int i : {lp.wqkv, lp.wo, lp.wgu, lp.wdown})
      if (i >= 0) linear += layout.params[static_cast<size_t>(i)].numel;
  const int64_t bits = cfg.get<int64_t>(key);
  const auto group = static_cast<double>(cfg.get<int64_t>("reward_model.quantization_group_size"));
  const double per_linear = bits == 8 ? 1.0 : bits == 4 ? 0.5 + 5.0 / group : 2.0;
  const double bytes = on_cuda ? 2.0 * static_cast<double>(params - linear) +
                                     per_linear * static_cast<double>(linear)
                               : 4.0 * static_cast<double>(params);
  const std::string where =
      on_cuda ? fmt::format("{:.0f}% of the GPU", 100.0 * bytes / m.gpu_memory) : "host memory";
  if (bits != 16) {
    r.pass(key, fmt::format("{}: int{} weight-only reward model of {:.2f} B parameters, {} ({}; "
                            "scores can shift a little: compare with 16 on a validation batch)",
                            bits, bits, params / 1e9, size_of(bytes), where));
  } else if (on_cuda && bytes > 0.1 * m.gpu_memory) {
    r.warn(key,
           fmt::format("16: the reward model's bf16 weights take {} ({}) beside the training state",
                       size_of(bytes), where),
           "if GPU memory is tight, reward_model.quantization_bits=8 (about half of it) or 4 (about "
           "a quarter), or a smaller reward model");
  } else {
    r.pass(key, fmt::format("16: the reward model's weights take {} ({})", size_of(bytes), where));
  }
  return on_cuda ? bytes : 0;
}

// reward_model.model.input_tokenizer: set (verl's default, the policy's path) and the reward
// model's directory holding a tokenizer.json, the trainer decodes every response and renders and
// encodes it again with the reward model's template (docs/reward_model.md). Worth it when the two
// tokenizers or templates differ; with the policy's own it only adds the template's end of the
// assistant's turn, for a decode and an encode of every response.
void check_reward_input(Report& r, const config::Config& cfg) {
  const std::string key = "reward_model.model.input_tokenizer";
  if (!cfg.get<bool>("reward_model.enable")) return;
  const auto input = cfg.get<std::optional<std::string>>(key);
  if (!input) {
    r.pass(key, "null: the policy's prompt and response tokens are scored as they are");
    return;
  }
  const std::filesystem::path rm = data::expand_user(cfg.get<std::string>("reward_model.model.path"));
  const std::filesystem::path policy = data::expand_user(*input);
  if (!std::filesystem::exists(rm / "tokenizer.json")) {
    r.pass(key, fmt::format("{}/tokenizer.json absent: the policy's tokens are scored as they are", rm.string()));
    return;
  }
  try {
    const bool same_vocab = read_file((rm / "tokenizer.json").string(), "reward model tokenizer") ==
                            read_file((policy / "tokenizer.json").string(), "policy tokenizer");
    const auto template_of = [](const std::filesystem::path& dir) {
      return tokenizer::load_tokenizer_config(dir.string()).value("chat_template", nlohmann::json());
    };
    if (same_vocab && template_of(rm) == template_of(policy)) {
      r.warn(key,
             fmt::format("{}: the reward model ({}) has the policy's tokenizer and chat template, yet "
                         "every response is decoded, rendered and encoded again",
                         *input, rm.string()),
             fmt::format("{}=null scores the policy's tokens as they are (without the template's end "
                         "of the assistant's turn)", key));
    } else {
      r.pass(key, fmt::format("{}: responses re-rendered with {}'s {} (verl's switch of chat template)",
                              *input, rm.string(), same_vocab ? "chat template" : "tokenizer and chat template"));
    }
  } catch (const std::exception& e) {
    r.warn(key, fmt::format("{}: {}", *input, message_of(e)),
           fmt::format("point {} at the policy's model directory, or null", key));
  }
}

// The rollout's KV cache gets gpu_memory_utilization x the GPU minus what is in use when it is
// built (vLLM's rule, rollout/kv_sizing.h): the training state, resident through generation. The
// activations that recomputation saves live only in the log-prob and update phases, after the
// cache is freed, so recomputation trades compute for update memory and the KV cache is sized
// against the training state.
void check_memory_plan(Report& r, const config::Config& cfg, const Machine& m, bool on_cuda,
                       const std::optional<model::ModelConfig>& mc, int64_t params,
                       double reward_model_bytes) {
  const std::string name = "recompute / KV cache";
  const bool recompute = cfg.get<bool>("actor_rollout_ref.model.enable_gradient_checkpointing");
  const double util = cfg.get<double>("actor_rollout_ref.rollout.gpu_memory_utilization");
  if (!on_cuda) {
    r.pass(name,
           "trainer.device=cpu: enable_gradient_checkpointing and rollout.gpu_memory_utilization "
           "have no effect");
    return;
  }
  if (!mc) {
    r.warn(name, "not sized: the model config is unreadable",
           "fix actor_rollout_ref.model.path first");
    return;
  }
  // optim/cuda/train_state.h: fp32 master, gradients and two AdamW moments plus the bf16 copy
  // (18 bytes a parameter); a forward-only reference keeps the bf16 copy (2); the critic (GAE or
  // critic.enable) trains a model of the same shape; the reward model's weights come on top.
  const bool ref = cfg.get<bool>("actor_rollout_ref.actor.use_kl_loss") ||
                   cfg.get<bool>("algorithm.use_kl_in_reward");
  const bool critic = cfg.get<std::string>("algorithm.adv_estimator") == "gae" ||
                      cfg.get<std::optional<bool>>("critic.enable").value_or(false);
  const double p = static_cast<double>(params);
  const double state = p * (18.0 + (ref ? 2.0 : 0.0) + (critic ? 18.0 : 0.0)) + reward_model_bytes;
  const int64_t seq =
      cfg.get<int64_t>("data.max_prompt_length") + cfg.get<int64_t>("data.max_response_length");
  const double per_seq = static_cast<double>(rollout::kv_block_bytes(*mc, 1, /*bf16*/ 2) * seq);
  const int64_t sequences = std::min(
      cfg.get<int64_t>("actor_rollout_ref.rollout.max_num_seqs"),
      cfg.get<int64_t>("data.gen_batch_size") * cfg.get<int64_t>("actor_rollout_ref.rollout.n"));
  const std::string rc =
      recompute
          ? "recompute on (one more forward per layer in backward, for less update memory)"
          : "recompute off (every layer's activations kept through backward: if update_actor "
            "runs out of memory set actor_rollout_ref.model.enable_gradient_checkpointing=true)";
  const std::string found = fmt::format("gpu_memory_utilization={} of {}, training state ~{}", util,
                                        size_of(m.gpu_memory), size_of(state));
  // Past this share of the GPU the training state leaves too little for the KV cache and the
  // update's activations, whatever gpu_memory_utilization says.
  constexpr double kMaxShare = 0.9;
  if (state > kMaxShare * m.gpu_memory) {
    r.fail(name,
           fmt::format("{}: the training state alone takes {:.0f}% of the GPU; {}", found,
                       100.0 * state / m.gpu_memory, rc),
           "a smaller model (the GPU training state is not sharded across ranks yet)");
    return;
  }
  // The share that holds the training state and every sequence of a round, rounded up to 0.05
  // and capped at kMaxShare; the sequences that share holds at once.
  const double want = std::ceil((state + per_seq * sequences) / m.gpu_memory * 20.0) / 20.0;
  const double share = std::min(kMaxShare, want);
  const int64_t fit_share = static_cast<int64_t>((share * m.gpu_memory - state) / per_seq);
  const std::string fewer = "fewer sequences per round (actor_rollout_ref.rollout.max_num_seqs)";
  const std::string suggest =
      share <= util
          ? "consider " + fewer
          : fmt::format(
                "consider actor_rollout_ref.rollout.gpu_memory_utilization={:.2f} ({} at "
                "once){}",
                share, std::min(fit_share, sequences), want > kMaxShare ? " or " + fewer : "");
  const double kv = util * m.gpu_memory - state;
  if (kv < per_seq) {
    r.fail(name, fmt::format("{}: no room left for the KV cache; {}", found, rc), suggest);
    return;
  }
  const int64_t fit = static_cast<int64_t>(kv / per_seq);
  if (fit < sequences) {
    r.warn(name,
           fmt::format("{}: a KV cache of {} holds {} of the {} sequences of a round ({} tokens "
                       "each), so generation runs in waves; {}",
                       found, size_of(kv), fit, sequences, seq, rc),
           suggest);
  } else {
    r.pass(name, fmt::format("{}: a KV cache of {} holds all {} sequences of a round; {}", found,
                             size_of(kv), sequences, rc));
  }
}

void check_config(Report& r, const config::Config& cfg, const std::string& source,
                  const Machine& m) {
  r.pass("config", source);
  const bool on_cuda = check_device(r, cfg, m);
  int64_t params = 0;
  const auto mc = check_model(r, cfg, &params);
  const DataFiles train =
      check_files(r, "data.train_files", cfg.get<std::vector<std::string>>("data.train_files"));
  if (auto val = cfg.get<std::optional<std::vector<std::string>>>("data.val_files"))
    check_files(r, "data.val_files", *val);
  const RunLength len = train.ok ? check_run_length(r, cfg, train.rows) : RunLength{};
  check_save_freq(r, cfg, len);
  check_logging_steps(r, cfg, len);
  check_loader_threads(r, cfg, m);
  check_attention(r, cfg, on_cuda);
  check_hybrid_engine(r, cfg);
  check_overlap(r, cfg);
  check_dynamic_batching(r, cfg);
  const double reward_model_bytes = check_reward_model(r, cfg, m, on_cuda);
  check_reward_input(r, cfg);
  check_memory_plan(r, cfg, m, on_cuda, mc, params, reward_model_bytes);
}

// ------------------------------------------------------------------------------------------------
// A finished run (verl doctor --run DIR)

struct RunMetrics {
  std::string path;
  std::vector<double> gpu_util;                 // perf/gpu_util_mean of each line that has it
  std::map<std::string, double> stage_seconds;  // timing_s/<stage> summed over steps
  double step_seconds = 0;                      // timing_s/step summed
};

RunMetrics read_run(const std::string& dir) {
  std::error_code ec;
  VERL_CHECK(fs::is_directory(dir, ec),
             "--run {}: not a directory (give a run's trainer.default_local_dir)", dir);
  RunMetrics run;
  run.path = (fs::path(dir) / "metrics.jsonl").string();
  InputLines in(run.path, "--run metrics file");
  std::string line;
  while (in.next(line)) {
    const nlohmann::json j = in.json(line);
    VERL_CHECK(j.is_object(), "{}: expected a JSON object of metrics", in.where());
    if (auto it = j.find("perf/gpu_util_mean"); it != j.end() && it->is_number())
      run.gpu_util.push_back(it->get<double>());
    auto step = j.find("timing_s/step");
    if (step == j.end() || !step->is_number()) continue;
    run.step_seconds += step->get<double>();
    for (const auto& [k, v] : j.items()) {
      // Overlap spans (timing_s/reward_overlap_gen) count time already inside another stage.
      if (k.starts_with("timing_s/") && k != "timing_s/step" &&
          k.find("overlap") == std::string::npos && v.is_number())
        run.stage_seconds[k] += v.get<double>();
    }
  }
  return run;
}

void check_run(Report& r, const RunMetrics& run) {
  const std::string name = "gpu utilisation";
  if (run.gpu_util.empty()) {
    r.warn(
        name,
        fmt::format("perf/gpu_util_mean absent from {} (a CPU run, or NVML was not loadable)",
                    run.path),
        "GPU utilisation is unknown: train on a GPU with libnvidia-ml.so.1 loadable to record it");
    return;
  }
  double sum = 0;
  for (double u : run.gpu_util) sum += u;
  const double mean = sum / static_cast<double>(run.gpu_util.size());
  std::string found = fmt::format("perf/gpu_util_mean averages {:.1f}% over {} steps of {}", mean,
                                  run.gpu_util.size(), run.path);
  if (mean >= 85.0) {
    r.pass(name, found);
    return;
  }
  // Name the stage that takes the most of the step, and what shortens that stage's host gaps.
  static const std::map<std::string, std::string> kFixes = {
      {"timing_s/gen",
       "more sequences per round (data.train_batch_size, actor_rollout_ref.rollout.max_num_seqs)"},
      {"timing_s/reward", "trainer.actor_reward_parallel=true and a faster reward function"},
      {"timing_s/data", "data.dataloader_num_workers=2 or more"},
      {"timing_s/save", "a larger trainer.save_freq"},
      {"timing_s/testing", "a larger trainer.test_freq"},
      {"timing_s/update_actor",
       "actor_rollout_ref.actor.use_dynamic_bsz=true with a larger ppo_max_token_len_per_gpu"},
      {"timing_s/old_log_prob",
       "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true with a larger "
       "log_prob_max_token_len_per_gpu"},
  };
  std::string advice =
      "consider data.dataloader_num_workers=2 or more, trainer.actor_reward_parallel=true, "
      "actor_rollout_ref.actor.use_dynamic_bsz=true, larger batches";
  found += ", under 85%";
  if (!run.stage_seconds.empty() && run.step_seconds > 0) {
    const auto top =
        std::max_element(run.stage_seconds.begin(), run.stage_seconds.end(),
                         [](const auto& a, const auto& b) { return a.second < b.second; });
    found += fmt::format("; {} takes {:.0f}% of the step time", top->first,
                         100.0 * top->second / run.step_seconds);
    if (auto fix = kFixes.find(top->first); fix != kFixes.end()) advice = "consider " + fix->second;
  }
  r.warn(name, found, advice);
}

// ------------------------------------------------------------------------------------------------

struct Opts {
  std::string config, run, dir = ".";
  std::vector<std::string> overrides;
};

int run(const Opts& o) {
  // Inputs first, so a bad path or key is an error before any check runs.
  VERL_CHECK(!o.config.empty() || o.overrides.empty(),
             "key=value overrides ({} ...) apply to a config: give --config CONFIG",
             o.overrides[0]);
  for (const std::string& a : o.overrides) {
    VERL_CHECK(a.find('=') != std::string::npos || a.starts_with("~"),
               "argument '{}': expected key=value", a);
  }
  std::optional<config::Config> cfg;
  if (!o.config.empty()) cfg = config::load_config(o.config, o.overrides);
  std::optional<RunMetrics> finished;
  if (!o.run.empty()) finished = read_run(o.run);
  std::error_code ec;
  VERL_CHECK(fs::is_directory(o.dir, ec), "--dir {}: not a directory", o.dir);

  Report report;
  Machine m;
  m.cores = std::thread::hardware_concurrency();
  const Nvml nvml;
  check_build(report);
  check_gpus(report, m, nvml);
  check_cuda_driver(report, nvml);
  check_cuda_libraries(report);
  check_mpi(report);
  check_launcher(report, m);
  check_link(report, m);
  check_interconnect(report, nvml);
  check_host_memory(report);
  check_disk(report, o.dir);
  check_blas_threads(report, m);
  if (cfg) {
    std::string source = o.config;
    if (!o.overrides.empty()) source += fmt::format(" + {} override(s)", o.overrides.size());
    report.section();
    check_config(report, *cfg, source, m);
  }
  if (finished) {
    report.section();
    check_run(report, *finished);
  }
  report.print(std::cout, m.launch_ok ? m.launch.rank : 0);
  return report.failed() ? 1 : 0;
}

Command reg(
    "doctor",
    "Check this machine (and --config CONFIG, --run DIR) for what a run needs: PASS / WARN / FAIL",
    [](CLI::App& app) -> Action {
      auto o = std::make_shared<Opts>();
      app.add_option("--config", o->config,
                     "also check this run config against the pre-flight checklist");
      app.add_option("overrides", o->overrides, "key=value overrides of --config");
      app.add_option("--run", o->run,
                     "a finished run's directory (its metrics.jsonl): GPU utilisation");
      app.add_option("--dir", o->dir, "directory whose free disk space is checked (default .)");
      return [o] { return run(*o); };
    });

}  // namespace
}  // namespace verl::cli
