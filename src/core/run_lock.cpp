#include "core/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace verl {

RunLock::RunLock(const std::string& dir)
    : path_((std::filesystem::path(dir) / ".verl_run.lock").string()) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  VERL_CHECK(!ec, "cannot create the run directory {}: {}", dir, ec.message());
  // O_CLOEXEC: programs the run starts (a reward command) must not inherit, and so keep, the lock.
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  VERL_CHECK(fd_ >= 0, "cannot open the run lock {}: {}", path_, std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd_, buf, sizeof(buf) - 1, 0);
    std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    ::close(fd_);
    fd_ = -1;
    VERL_CHECK(err != EWOULDBLOCK,
               "{} is in use by another run (pid {}, holding {}); wait for it to end, or give "
               "this run another trainer.default_local_dir",
               dir, holder.empty() ? "unknown" : holder, path_);
    VERL_FAIL("cannot lock {}: {}", path_, std::strerror(err));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  VERL_CHECK(::ftruncate(fd_, 0) == 0 &&
                 ::pwrite(fd_, pid.data(), pid.size(), 0) == static_cast<ssize_t>(pid.size()),
             "cannot write the run lock {}: {}", path_, std::strerror(errno));
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the flock
}

}  // namespace verl
