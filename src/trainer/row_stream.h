// Rows of a generation as they finish, handed to observers (the reward scorer, the token
// pipeline) that work on threads of their own while the rest still decode.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace verl::trainer {

// Something that takes a generation's finished rows as they come.
class RowObserver {
 public:
  virtual ~RowObserver() = default;
  // Row b of the experience is complete (called on the generating thread; returns at once).
  virtual void push(int64_t b) = 0;
  // Generation has ended: waits for the rows pushed, rethrows the first error.
  virtual void finish() = 0;
};

// A thread that takes rows as generation finishes them and hands each to `handle` in order;
// `flush` runs after the last one. finish() says no more rows come, waits for the thread and
// rethrows its first error (the rows after an error are dropped). The destructor, on a way out
// by exception, stops the thread the same way without rethrowing.
class RowWorker {
 public:
  explicit RowWorker(std::function<void(int64_t)> handle, std::function<void()> flush = {})
      : handle_(std::move(handle)), flush_(std::move(flush)), thread_([this] { run(); }) {}
  ~RowWorker() { stop(); }
  RowWorker(const RowWorker&) = delete;
  RowWorker& operator=(const RowWorker&) = delete;

  void push(int64_t row) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(row);
    }
    cv_.notify_one();
  }
  void finish() {
    stop();
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void run() {
    for (;;) {
      int64_t row = 0;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return done_ || !queue_.empty(); });
        if (queue_.empty()) break;
        row = queue_.front();
        queue_.pop_front();
      }
      if (error_) continue;
      try {
        handle_(row);
      } catch (...) {
        error_ = std::current_exception();
      }
    }
    if (flush_ && !error_) {
      try {
        flush_();
      } catch (...) {
        error_ = std::current_exception();
      }
    }
  }

  std::function<void(int64_t)> handle_;
  std::function<void()> flush_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int64_t> queue_;
  bool done_ = false;
  std::exception_ptr error_;  // the thread's own until finish() joins it
  std::thread thread_;        // last: it starts once the members above exist
};

}  // namespace verl::trainer
