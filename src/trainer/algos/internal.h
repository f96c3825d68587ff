// Helpers shared by the algos/*.cpp files only (callers include advantages.h, kl.h, losses.h):
// input checks that name the function and the tensor, torch's gradients of clamp / maximum /
// minimum, and the lookup in a {value, name, ...} table that turns a config string into an enum.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include "core/error.h"
#include "trainer/algos/aggregation.h"

namespace verl::trainer::detail {

// The entry of `table` named `name`, else an Error naming the config `key` and listing every name.
template <class Entry, size_t N>
const Entry& entry_named(const Entry (&table)[N], std::string_view name, std::string_view key,
                         std::string_view kind) {
  for (const Entry& x : table)
    if (x.name == name) return x;
  std::string known;
  for (const Entry& x : table) known += (known.empty() ? "" : ", ") + std::string(x.name);
  VERL_FAIL("{}: unknown {} '{}'; known: {}", key, kind, name, known);
}

// The entry of `table` whose value is `v`, or null.
template <class Entry, size_t N, class Value>
const Entry* entry_of(const Entry (&table)[N], Value v) {
  for (const Entry& x : table)
    if (x.value == v) return &x;
  return nullptr;
}

// The name of value `v` in `table` ("?" if absent).
template <class Entry, size_t N, class Value>
std::string_view name_of(const Entry (&table)[N], Value v) {
  const Entry* x = entry_of(table, v);
  return x ? x->name : "?";
}

inline void check_size(std::span<const float> x, int64_t n, const char* what, const char* fn) {
  VERL_CHECK(static_cast<int64_t>(x.size()) == n, "{}: {} has {} elements, expected {}", fn, what,
             x.size(), n);
}

inline void check_shape(Shape s, const char* fn) {
  VERL_CHECK(s.batch >= 0 && s.length >= 0, "{}: invalid shape [{}, {}]", fn, s.batch, s.length);
}

// One [B, L] input of a function, named for its error message.
struct NamedMatrix {
  const char* what;
  std::span<const float> x;
};

// check_shape, then check_size of each input against B * L, in order.
inline void check_matrices(Shape s, const char* fn, std::initializer_list<NamedMatrix> inputs) {
  check_shape(s, fn);
  for (const NamedMatrix& m : inputs) check_size(m.x, s.numel(), m.what, fn);
}

// torch.clamp passes the gradient where lo <= x <= hi (inclusive).
inline double clamp(double x, double lo, double hi) {
  return std::min(std::max(x, lo), hi);
}
inline double clamp_grad(double x, double lo, double hi) {
  return (x >= lo && x <= hi) ? 1.0 : 0.0;
}

// Gradient of torch.maximum(a, b) / torch.minimum(a, b): the larger (smaller) side takes it all,
// a tie splits it in halves.
inline double max_grad(double a, double b, double da, double db) {
  if (a > b) return da;
  if (a < b) return db;
  return 0.5 * (da + db);
}
inline double min_grad(double a, double b, double da, double db) {
  if (a < b) return da;
  if (a > b) return db;
  return 0.5 * (da + db);
}

// sum_t w_t * x_t over the slots of non-zero weight (masked-out slots may hold anything, even
// NaN).
inline double weighted_sum(std::span<const float> w, std::span<const float> x) {
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (w[i] != 0) s += static_cast<double>(w[i]) * x[i];
  return s;
}

}  // namespace verl::trainer::detail
