#include "core/signals.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <atomic>

namespace verl {
namespace {

constexpr int kMaxGroups = 16;
std::atomic<pid_t> g_groups[kMaxGroups];
std::atomic<int64_t> g_step{-1};  // the step running or last finished; -1: no training loop
std::atomic<bool> g_in_step{false};

void put(const char* s) {
  ssize_t r = ::write(STDERR_FILENO, s, strlen(s));
  (void)r;
}

void put_int(int64_t v) {
  char buf[24];
  int n = 0;
  bool neg = v < 0;
  uint64_t u = neg ? static_cast<uint64_t>(-(v + 1)) + 1 : static_cast<uint64_t>(v);
  do {
    buf[n++] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u > 0);
  if (neg) buf[n++] = '-';
  char out[24];
  for (int i = 0; i < n; ++i) out[i] = buf[n - 1 - i];
  out[n] = '\0';
  put(out);
}

void on_stop_signal(int sig) {
  int killed = 0;
  for (auto& g : g_groups) {
    const pid_t pgid = g.load();
    if (pgid > 0 && ::kill(-pgid, SIGKILL) == 0) ++killed;
  }
  put(sig == SIGINT ? "\nverl: SIGINT" : "\nverl: SIGTERM");
  const int64_t step = g_step.load();
  if (step < 0) {
    // Not a training loop (verl score, generate, ...): nothing to say about steps.
  } else if (step == 0 && !g_in_step.load()) {
    put(" before the first training step started");
  } else if (g_in_step.load()) {
    put(": step ");
    put_int(step);
    put(" was in progress and is abandoned (not logged, not saved)");
    if (step > 1) {
      put("; step ");
      put_int(step - 1);
      put(" was the last finished");
    }
  } else {
    put(": step ");
    put_int(step);
    put(" was finished (logged; saved if it was a save step)");
  }
  if (killed > 0) {
    put("; killed ");
    put_int(killed);
    put(" child program group(s)");
  }
  put("; stopping\n");
  // Die of the signal as without a handler: delivered when this handler returns.
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGINT);
  sigaddset(&sa.sa_mask, SIGTERM);
  sa.sa_flags = 0;
  for (int sig : {SIGINT, SIGTERM}) {
    struct sigaction old {};
    sigaction(sig, nullptr, &old);
    if (old.sa_handler == SIG_IGN)
      continue;  // ignored on purpose (nohup, a background job): stays so
    sigaction(sig, &sa, nullptr);
  }
}

void register_child_group(pid_t pgid) {
  for (auto& g : g_groups) {
    pid_t empty = 0;
    if (g.compare_exchange_strong(empty, pgid)) return;
  }
}

void unregister_child_group(pid_t pgid) {
  for (auto& g : g_groups) {
    pid_t want = pgid;
    if (g.compare_exchange_strong(want, 0)) return;
  }
}

void note_step(int64_t step, bool in_progress) {
  g_in_step.store(false);
  g_step.store(step);
  g_in_step.store(in_progress);
}

}  // namespace verl
