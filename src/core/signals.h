// What a run does on SIGINT or SIGTERM: programs it started (a reward command, in a process group
// of its own) are killed with it, one line on stderr says whether a training step was finished or
// abandoned, and the process then ends of the signal as it would have (exit status 128 + N).
// Everything in the handler is async-signal-safe (kill, write, raise).
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace verl {

// Installs the handlers (the CLI does, once, before running a command).
void install_stop_handlers();

// Process groups killed when the run ends on a signal; a reward command registers while it runs.
void register_child_group(pid_t pgid);
void unregister_child_group(pid_t pgid);

// The trainer's progress, for the handler's line: step `step` is running (in_progress) or done;
// a loop calls note_step(first_step - 1, false) before it starts (0 for a fresh run).
void note_step(int64_t step, bool in_progress);

}  // namespace verl
