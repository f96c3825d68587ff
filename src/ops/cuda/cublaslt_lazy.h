// cuBLASLt is loaded when the first GEMM needs it, not when the program starts: linking
// libcublasLt.so costs every process 0.2-0.5 s and 210 MB of resident memory in the library's own
// initialisers (measured on the 2-core development VM with an empty main()), which `verl --help`, a
// CPU run and each test binary paid without touching a GPU. src/ops/cuda/cublaslt_lazy.cpp defines
// the cuBLASLt functions the project calls (the header's own prototypes, so a signature that
// drifts does not compile); each forwards to the real one, found with dlopen/dlsym on first use.
#pragma once

#include <string>

namespace verl::ops::cuda {

// Loads libcublasLt.so.<CUDA major> (the loader's search path: LD_LIBRARY_PATH, the binary's
// RUNPATH; then the toolkit's library directory of the build) and resolves every function the
// project calls. Returns "" when all are there, else what failed; never throws. `verl doctor`
// reports it; a GEMM that finds the library missing throws an Error with the same text.
std::string cublaslt_load_problem();

}  // namespace verl::ops::cuda
