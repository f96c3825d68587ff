#include "core/tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace verl {

int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

int64_t Tensor::numel() const {
  return shape_numel(shape);
}
std::string Tensor::shape_str() const {
  return shape_to_string(shape);
}

}  // namespace verl
