// One run of a user program for a tool call: /bin/sh -c COMMAND in a session and process group of
// its own (no terminal), fed one request on stdin, its stdout collected up to a byte limit, under
// a wall-clock timeout and CPU-time / address-space limits. Whatever it leaves behind (children
// it forked) is killed with its group when it ends, and with the run on SIGINT/SIGTERM.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace verl::agent {

struct ProgramLimits {
  double timeout_s = 30.0;             // wall clock, start to exit
  int64_t max_output_bytes = 1 << 20;  // stdout beyond this fails the call
  int64_t cpu_seconds = 30;            // RLIMIT_CPU (0: none)
  int64_t memory_mb = 4096;            // RLIMIT_AS in MiB (0: none)
};

struct ProgramResult {
  bool ok = false;      // exited with status 0 within the limits
  std::string out;      // its stdout (up to max_output_bytes)
  std::string err;      // the last bytes of its stderr (for messages)
  std::string failure;  // why it failed: timeout, output too long, exit status, signal
  double seconds = 0;
};

// Runs `command` with `input` on its stdin. Never throws for what the program does; throws
// verl::Error only when the program cannot be started at all.
ProgramResult run_program(const std::string& command, std::string_view input,
                          const ProgramLimits& limits);

}  // namespace verl::agent
