// Workspace vectors that grow to the largest size asked for and are then reused, so a loop that
// sees its largest batch first allocates only once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace verl {

// At least n elements of `v`, contents unspecified.
template <typename T>
T* grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

// At least n elements of `v`, the first n zero.
template <typename T>
T* zeroed(std::vector<T>& v, int64_t n) {
  T* p = grow(v, n);
  std::fill(p, p + n, T(0));
  return p;
}

}  // namespace verl
