// Waiting for a collective within actor_rollout_ref.nccl_timeout: the MPI and NCCL communicators
// poll their requests through poll_until and, past the deadline, print report_timeout's line
// before ending the job their own way.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

namespace verl::dist {

// Calls done() (true once the collective has completed) until it returns true, then returns true;
// returns false once `timeout_s` seconds have passed. Polls fast first, then every millisecond.
template <typename Done>
bool poll_until(double timeout_s, Done&& done) {
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(1);
  for (;;) {
    if (done()) return true;
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (waited > timeout_s) return false;
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::milliseconds(1)) pause *= 2;
  }
}

// The line a rank prints when `what` (e.g. "all_reduce", "NCCL all_reduce") timed out; `who` is
// the communicator's describe_rank() ("rank 0 of 2", with the group in a split child).
inline void report_timeout(const std::string& who, const char* what, const std::string& stage,
                           double timeout_s) {
  std::fprintf(stderr,
               "error: %s: %s in stage '%s' did not complete within %.0f s "
               "(actor_rollout_ref.nccl_timeout): another rank died or is stuck\n",
               who.c_str(), what, stage.c_str(), timeout_s);
  std::fflush(stderr);
}

}  // namespace verl::dist
