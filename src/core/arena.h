// A bump allocator over one aligned allocation. Memory is planned up front: a phase (weights,
// rollout, train) reserves its arena once, hands out aligned slices, and is reset or freed as a
// whole when the phase ends. No allocation happens in the step or decode loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace verl {

class Arena {
 public:
  Arena() = default;
  Arena(std::string name, size_t capacity_bytes);
  Arena(Arena&&) noexcept = default;
  Arena& operator=(Arena&&) noexcept = default;

  // Returns `bytes` of memory aligned to 64 bytes; throws naming the arena when full.
  void* alloc(size_t bytes);
  template <typename T>
  T* alloc_n(size_t n) {
    return static_cast<T*>(alloc(n * sizeof(T)));
  }
  void reset() { used_ = 0; }
  void release();

  size_t capacity() const { return capacity_; }
  size_t used() const { return used_; }
  size_t peak() const { return peak_; }
  const std::string& name() const { return name_; }

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  std::string name_;
  std::unique_ptr<uint8_t, FreeDeleter> base_;
  size_t capacity_ = 0, used_ = 0, peak_ = 0;
};

}  // namespace verl
