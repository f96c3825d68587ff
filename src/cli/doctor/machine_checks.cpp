// `verl doctor`'s machine checks: the build, the GPUs and their driver, the CUDA libraries
// (cuBLASLt, NCCL), MPI and the launcher, an all-reduce between ranks, the interconnect (NVLink,
// InfiniBand), host memory, the disk, BLAS threads.
#include <cblas.h>
// The MPI C API only (Open MPI and MPICH would otherwise pull in their C++ bindings).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <fmt/format.h>
#include <mpi.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>

#ifdef VERL_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nccl.h>
#endif

#include "cli/doctor/doctor.h"
#include "core/timer.h"
#include "dist/launch.h"
#include "metrics/nvml.h"
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

namespace verl::cli::doctor {
namespace {

namespace fs = std::filesystem;

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

void check_gpus(Report& r, Machine& m, const metrics::Nvml& nvml) {
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

void check_cuda_driver(Report& r, const metrics::Nvml& nvml) {
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
  // The library is opened on first use (ops/cuda/cublaslt_lazy.h): opened here, or named as
  // missing.
  const std::string lt_problem = ops::cuda::cublaslt_load_problem();
  const long lt = lt_problem.empty() ? static_cast<long>(cublasLtGetVersion()) : -1;
  const std::string lt_found =
      lt < 0 ? lt_problem
             : fmt::format("cuBLASLt {} (built against {})", version(lt), version(CUBLAS_VERSION));
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

void check_interconnect(Report& r, const metrics::Nvml& nvml) {
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

}  // namespace

void check_machine(Report& r, Machine& m, const std::string& dir) {
  const metrics::Nvml nvml;  // the driver's version, the GPUs without CUDA, NVLink
  check_build(r);
  check_gpus(r, m, nvml);
  check_cuda_driver(r, nvml);
  check_cuda_libraries(r);
  check_mpi(r);
  check_launcher(r, m);
  check_link(r, m);
  check_interconnect(r, nvml);
  check_host_memory(r);
  check_disk(r, dir);
  check_blas_threads(r, m);
}

}  // namespace verl::cli::doctor
