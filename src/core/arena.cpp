#include "core/arena.h"

#include <cstdlib>

#include "core/error.h"

namespace verl {

static constexpr size_t kAlign = 64;

static size_t round_up(size_t x) {
  return (x + kAlign - 1) / kAlign * kAlign;
}

void Arena::FreeDeleter::operator()(uint8_t* p) const {
  std::free(p);
}

Arena::Arena(std::string name, size_t capacity_bytes)
    : name_(std::move(name)), capacity_(round_up(capacity_bytes)) {
  if (capacity_ > 0) {
    void* p = std::aligned_alloc(kAlign, capacity_);
    VERL_CHECK(p != nullptr, "arena '{}': cannot allocate {} bytes", name_, capacity_);
    base_.reset(static_cast<uint8_t*>(p));
  }
}

void* Arena::alloc(size_t bytes) {
  size_t n = round_up(bytes);
  VERL_CHECK(used_ + n <= capacity_, "arena '{}' is full: {} bytes asked, {} of {} used", name_,
             bytes, used_, capacity_);
  void* p = base_.get() + used_;
  used_ += n;
  if (used_ > peak_) peak_ = used_;
  return p;
}

void Arena::release() {
  base_.reset();
  capacity_ = used_ = 0;
}

}  // namespace verl
