// run_program: posix_spawn of /bin/sh with a new session (POSIX_SPAWN_SETSID: no controlling
// terminal, its own process group), the limits set by the shell before it evaluates the command,
// pipes read with poll under one deadline. The group is SIGKILLed at the end whatever happened,
// so a child forked into the background never outlives the call.
#include "agent/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>

#include "core/error.h"
#include "core/signals.h"

extern char** environ;

namespace verl::agent {
namespace {

constexpr size_t kStderrTail = 2048;

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
  return fmt::format("ended with wait status {}", status);
}

void nonblocking(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
}

}  // namespace

ProgramResult run_program(const std::string& command, std::string_view input,
                          const ProgramLimits& limits) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  ProgramResult res;
  // stdin is a socket so a program that never reads cannot make our write raise SIGPIPE.
  int in[2], out[2], err[2];
  VERL_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in) == 0,
             "tool command: socketpair failed: {}", strerror(errno));
  VERL_CHECK(pipe2(out, O_CLOEXEC) == 0 && pipe2(err, O_CLOEXEC) == 0,
             "tool command: pipe failed: {}", strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[1], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, err[1], STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t defaults, mask;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  sigemptyset(&mask);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setsigmask(&attr, &mask);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  // The shell sets the limits on itself, then evaluates the command ($1) under them.
  std::string script;
  if (limits.cpu_seconds > 0)
    script += fmt::format("ulimit -t {} || exit 126; ", limits.cpu_seconds);
  if (limits.memory_mb > 0)
    script += fmt::format("ulimit -v {} || exit 126; ", limits.memory_mb * 1024);
  script += "eval \"$1\"";
  std::string sh = "/bin/sh", dash_c = "-c", name = "verl-tool", cmd = command;
  char* argv[] = {sh.data(), dash_c.data(), script.data(), name.data(), cmd.data(), nullptr};
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, "/bin/sh", &fa, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(in[1]);
  close(out[1]);
  close(err[1]);
  if (rc != 0) {
    close(in[0]);
    close(out[0]);
    close(err[0]);
    VERL_FAIL("tool command '{}': cannot start /bin/sh: {}", command, strerror(rc));
  }
  register_child_group(pid);  // setsid: its group id is its pid
  nonblocking(in[0]);
  nonblocking(out[0]);
  nonblocking(err[0]);

  const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(limits.timeout_s));
  size_t written = 0;
  bool writing = true, out_open = true, err_open = true, exited = false;
  int status = 0;
  char buf[1 << 16];
  while (true) {
    if (!exited) {
      const pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == pid) exited = true;
    }
    // Done when the program exited and its pipes are drained, or closed (a background child may
    // hold them open: it is killed below, not waited for).
    if (exited && !out_open && !err_open) break;
    const auto now = Clock::now();
    if (now >= deadline) {
      res.failure = fmt::format("no answer within {} s (killed)", limits.timeout_s);
      break;
    }
    if (writing && written >= input.size()) {
      shutdown(in[0], SHUT_WR);  // end of the request
      writing = false;
    }
    pollfd fds[3];
    int nfds = 0, io = -1, ie = -1, iw = -1;
    if (out_open) fds[io = nfds++] = {out[0], POLLIN, 0};
    if (err_open) fds[ie = nfds++] = {err[0], POLLIN, 0};
    if (writing) fds[iw = nfds++] = {in[0], POLLOUT, 0};
    const double left_ms = std::chrono::duration<double, std::milli>(deadline - now).count();
    // While it runs, wake every 10 ms to notice its exit (children may keep the pipes open).
    const int wait_ms =
        std::max(1, std::min(exited ? 0 : 10, static_cast<int>(std::ceil(left_ms))));
    const int pr = poll(fds, static_cast<nfds_t>(nfds), exited ? 0 : wait_ms);
    if (pr < 0 && errno != EINTR) {
      res.failure = fmt::format("poll failed: {}", strerror(errno));
      break;
    }
    bool progressed = false;
    if (iw >= 0 && fds[iw].revents != 0) {
      const ssize_t w =
          send(in[0], input.data() + written, input.size() - written, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        written += static_cast<size_t>(w);
      } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
        writing = false;  // it closed its stdin; its answer (or exit) tells the rest
      }
    }
    if (io >= 0 && fds[io].revents != 0) {
      const ssize_t r = read(out[0], buf, sizeof buf);
      if (r > 0) {
        progressed = true;
        res.out.append(buf, static_cast<size_t>(r));
        if (static_cast<int64_t>(res.out.size()) > limits.max_output_bytes) {
          res.out.resize(static_cast<size_t>(limits.max_output_bytes));
          res.failure = fmt::format("printed more than {} bytes (killed)", limits.max_output_bytes);
          break;
        }
      } else if (r == 0) {
        out_open = false;
      }
    }
    if (ie >= 0 && fds[ie].revents != 0) {
      const ssize_t r = read(err[0], buf, sizeof buf);
      if (r > 0) {
        progressed = true;
        res.err.append(buf, static_cast<size_t>(r));
        if (res.err.size() > 2 * kStderrTail) res.err.erase(0, res.err.size() - kStderrTail);
      } else if (r == 0) {
        err_open = false;
      }
    }
    // Exited and nothing more to read right now: what a background child may still write is
    // not this call's answer.
    if (exited && !progressed) break;
  }
  kill(-pid, SIGKILL);  // the whole group: background children included
  if (!exited) {
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  unregister_child_group(pid);
  close(in[0]);
  close(out[0]);
  close(err[0]);
  if (res.err.size() > kStderrTail) res.err.erase(0, res.err.size() - kStderrTail);
  res.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (res.failure.empty()) {
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      res.ok = true;
    } else {
      res.failure = describe_status(status);
      if (WIFSIGNALED(status) && WTERMSIG(status) == SIGXCPU)
        res.failure += fmt::format(" (its CPU time limit of {} s)", limits.cpu_seconds);
    }
  }
  return res;
}

}  // namespace verl::agent
