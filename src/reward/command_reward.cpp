// CommandRewardFn: a user's reward program behind /bin/sh -c, spoken to in JSON lines. The
// program runs in its own process group so that a timeout can kill everything it started; its
// stdin is a socket so that writing to a program that died returns EPIPE instead of raising
// SIGPIPE in the trainer.
#include "reward/command_reward.h"

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
#include <thread>

#include "core/error.h"
#include "core/json_depth.h"
#include "core/signals.h"

extern char** environ;

namespace verl::reward {
namespace {

constexpr size_t kMaxLineBytes = 1 << 20;  // an answer line longer than this is a protocol error
constexpr double kMaxScore = 1e9;          // |score| beyond this fails the row (docs/rewards.md)

std::string excerpt(std::string_view line) {
  constexpr size_t kMax = 200;
  if (line.size() <= kMax) return std::string(line);
  return std::string(line.substr(0, kMax)) + "...";
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return fmt::format("ended with wait status {}", status);
}

void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  VERL_CHECK(flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0,
             "reward command: fcntl(O_NONBLOCK) failed: {}", strerror(errno));
}

}  // namespace

OnError parse_on_error(std::string_view s) {
  if (s == "continue") return OnError::Continue;
  if (s == "stop") return OnError::Stop;
  VERL_FAIL("custom_reward_function.on_error must be 'continue' or 'stop', got '{}'", s);
}

CommandRewardFn::CommandRewardFn(CommandRewardConfig cfg) : cfg_(std::move(cfg)) {
  VERL_CHECK(!cfg_.command.empty(), "custom_reward_function.command is empty");
  VERL_CHECK(cfg_.timeout_s > 0, "custom_reward_function.timeout_s must be > 0, got {}",
             cfg_.timeout_s);
}

CommandRewardFn::~CommandRewardFn() {
  if (pid_ <= 0) return;
  // Closing its stdin asks the program to finish; it gets a moment before being killed.
  shutdown(stdin_fd_, SHUT_WR);
  reap(500);
}

void CommandRewardFn::close_fds() {
  if (stdin_fd_ >= 0) close(stdin_fd_);
  if (stdout_fd_ >= 0) close(stdout_fd_);
  stdin_fd_ = stdout_fd_ = -1;
  pending_.clear();
}

void CommandRewardFn::start() {
  int sv[2], out[2];
  VERL_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0,
             "reward command: socketpair failed: {}", strerror(errno));
  if (pipe2(out, O_CLOEXEC) != 0) {
    int e = errno;
    close(sv[0]);
    close(sv[1]);
    VERL_FAIL("reward command: pipe failed: {}", strerror(e));
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, sv[1], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t defaults, mask;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);  // the program gets normal SIGPIPE handling whatever ours is
  sigemptyset(&mask);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setsigmask(&attr, &mask);
  posix_spawnattr_setpgroup(&attr, 0);  // its own process group, killed as a whole
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  std::string sh = "/bin/sh", dash_c = "-c";
  char* argv[] = {sh.data(), dash_c.data(), cfg_.command.data(), nullptr};
  pid_t pid = -1;
  int rc = posix_spawn(&pid, "/bin/sh", &fa, &attr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(sv[1]);
  close(out[1]);
  if (rc != 0) {
    close(sv[0]);
    close(out[0]);
    VERL_FAIL("reward command '{}': cannot start /bin/sh: {}", cfg_.command, strerror(rc));
  }
  pid_ = pid;
  register_child_group(
      pid_);  // its group id is its pid (setpgroup 0); killed if the run ends on a signal
  stdin_fd_ = sv[0];
  stdout_fd_ = out[0];
  set_nonblocking(stdin_fd_);
  set_nonblocking(stdout_fd_);
  pending_.clear();
  ++starts_;
}

std::string CommandRewardFn::kill_and_reap() {
  if (pid_ <= 0) return "not running";
  kill(-pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  unregister_child_group(pid_);
  pid_ = -1;
  close_fds();
  return describe_status(status);
}

std::string CommandRewardFn::reap(int wait_ms) {
  if (pid_ <= 0) return "not running";
  for (int waited = 0;; waited += 5) {
    int status = 0;
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      unregister_child_group(pid_);
      pid_ = -1;
      close_fds();
      return describe_status(status);
    }
    if (waited >= wait_ms) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return "closed its stdout and was killed, " + kill_and_reap();
}

CommandBatchResult CommandRewardFn::score(std::span<const RewardRow> rows) {
  const int64_t n = static_cast<int64_t>(rows.size());
  CommandBatchResult res;
  res.scores.assign(n, 0.0);
  if (n == 0) return res;

  // A program that exited after the previous batch is started again.
  if (pid_ > 0) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      unregister_child_group(pid_);
      pid_ = -1;
      close_fds();
    }
  }
  if (pid_ <= 0) start();

  std::string payload;
  for (int64_t i = 0; i < n; ++i) {
    nlohmann::json j = {{"index", i},
                        {"data_source", rows[i].data_source},
                        {"solution_str", rows[i].solution_str},
                        {"ground_truth", rows[i].ground_truth},
                        {"extra_info", rows[i].extra_info}};
    // Invalid UTF-8 in a decoded response is replaced rather than failing the batch.
    payload += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    payload += '\n';
  }

  std::vector<char> answered(n, 0);
  std::vector<std::string> row_error(n);
  int64_t n_answered = 0;
  std::string failure;  // why the unanswered rows failed; set once
  bool program_ended = false, timed_out = false;

  // Consumes the complete lines in pending_; sets `failure` on a line that breaks the protocol.
  auto take_lines = [&] {
    size_t nl;
    while (failure.empty() && (nl = pending_.find('\n')) != std::string::npos) {
      std::string line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank lines are noise
      if (!json_depth_ok(line)) {
        failure =
            fmt::format("the reward command printed JSON nested more than {} levels deep: '{}'",
                        kMaxJsonDepth, excerpt(line));
        return;
      }
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded()) {
        failure =
            fmt::format("the reward command printed a line that is not JSON: '{}'", excerpt(line));
        return;
      }
      if (!j.is_object() || !j.contains("index") || !j["index"].is_number_integer()) {
        failure = fmt::format("the reward command printed a line without an integer \"index\": {}",
                              excerpt(line));
        return;
      }
      const int64_t idx = j["index"].get<int64_t>();
      if (idx < 0 || idx >= n) {
        failure = fmt::format(
            "the reward command answered index {}, which is not in this batch of {} rows: {}", idx,
            n, excerpt(line));
        return;
      }
      if (answered[idx]) {
        failure = fmt::format("the reward command answered row {} twice: {}", idx, excerpt(line));
        return;
      }
      answered[idx] = 1;
      ++n_answered;
      if (j.contains("error")) {
        const nlohmann::json& e = j["error"];
        row_error[idx] = fmt::format("the reward function failed: {}",
                                     excerpt(e.is_string() ? e.get<std::string>() : e.dump()));
      } else if (!j.contains("score") || !j["score"].is_number()) {
        row_error[idx] = fmt::format("the answer has no numeric \"score\": {}", excerpt(line));
      } else if (const double v = j["score"].get<double>(); !(std::abs(v) <= kMaxScore)) {
        // Rewards are float32 in training, and sums and variances of them must stay finite: a
        // score past this turned a whole step's advantages into NaN, and every update was skipped.
        row_error[idx] = fmt::format("the score {} is outside [-{:g}, {:g}]: {}", v, kMaxScore,
                                     kMaxScore, excerpt(line));
      } else {
        res.scores[idx] = v;
        for (const auto& [key, val] : j.items()) {
          if (key == "index" || key == "score" || !(val.is_number() || val.is_boolean())) continue;
          std::vector<double>& col = res.extras[key];
          if (col.empty()) col.assign(static_cast<size_t>(n), std::nan(""));
          col[static_cast<size_t>(idx)] =
              val.is_boolean() ? (val.get<bool>() ? 1.0 : 0.0) : val.get<double>();
        }
      }
    }
    if (failure.empty() && pending_.size() > kMaxLineBytes)
      failure =
          fmt::format("the reward command printed a line longer than {} bytes", kMaxLineBytes);
  };

  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(cfg_.timeout_s));
  size_t written = 0;
  bool can_write = true;
  while (n_answered < n && failure.empty()) {
    const auto now = Clock::now();
    if (now >= deadline) {
      timed_out = true;
      break;
    }
    const double left_ms = std::chrono::duration<double, std::milli>(deadline - now).count();
    pollfd fds[2] = {{stdout_fd_, POLLIN, 0}, {stdin_fd_, POLLOUT, 0}};
    const int nfds = (can_write && written < payload.size()) ? 2 : 1;
    int pr = poll(fds, nfds, std::max(1, static_cast<int>(std::ceil(left_ms))));
    if (pr < 0) {
      if (errno == EINTR) continue;
      VERL_FAIL("reward command: poll failed: {}", strerror(errno));
    }
    if (nfds == 2 && fds[1].revents != 0) {
      ssize_t w = send(stdin_fd_, payload.data() + written, payload.size() - written,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        written += static_cast<size_t>(w);
      } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        can_write = false;  // it closed its stdin: what it does next shows on its stdout
      }
    }
    if (fds[0].revents != 0) {
      char buf[1 << 16];
      ssize_t r = read(stdout_fd_, buf, sizeof buf);
      if (r > 0) {
        pending_.append(buf, static_cast<size_t>(r));
        take_lines();
      } else if (r == 0) {
        program_ended = true;
        break;
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        failure = fmt::format("reading the reward command's output failed: {}", strerror(errno));
      }
    }
  }

  if (n_answered < n || failure.size() > 0) {
    if (timed_out) {
      kill_and_reap();
      failure = fmt::format("no answer within timeout_s = {} s (the reward command was killed)",
                            cfg_.timeout_s);
    } else if (program_ended) {
      failure = fmt::format("the reward command {} before answering", reap(200));
    } else {
      kill_and_reap();
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!answered[i]) {
      res.errors.push_back({i, failure});
    } else if (!row_error[i].empty()) {
      res.errors.push_back({i, row_error[i]});
    }
  }
  if (res.errors.empty()) return res;
  if (pid_ > 0) kill_and_reap();  // a program that failed a row starts afresh next batch
  for (const RowError& e : res.errors) {
    res.scores[e.index] = 0.0;
    for (auto& [key, col] : res.extras) col[static_cast<size_t>(e.index)] = std::nan("");
  }

  const RowError& first = res.errors.front();
  std::string more =
      res.errors.size() > 1 ? fmt::format(" ({} more rows failed)", res.errors.size() - 1) : "";
  if (cfg_.on_error == OnError::Stop)
    VERL_FAIL("reward command '{}': row {}: {}{}", cfg_.command, first.index, first.message, more);
  return res;  // the caller reports the failed rows (the trainer with its step, `verl reward` by
               // line)
}

}  // namespace verl::reward
