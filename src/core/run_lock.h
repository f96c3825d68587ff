// One run per output directory: a run holds an exclusive flock on <dir>/.verl_run.lock (which
// records its pid) for as long as it lives, so a second run on the same trainer.default_local_dir
// fails at once instead of interleaving metrics.jsonl and checkpoints. The kernel drops the lock
// when the process ends, however it ends, so a stale file never blocks a later run.
#pragma once

#include <string>

namespace verl {

class RunLock {
 public:
  // Creates `dir` if needed and takes its lock; an Error naming the directory and the holder's pid
  // when another process holds it.
  explicit RunLock(const std::string& dir);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace verl
