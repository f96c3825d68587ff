// A non-owning view of a dense row-major tensor: pointer, dtype, shape and device.
// Storage is owned elsewhere (a flat parameter buffer, an arena); views are cheap to copy.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace verl {

enum class Device : uint8_t { CPU, CUDA };

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  std::vector<int64_t> shape;

  Tensor() = default;
  Tensor(void* d, DType t, std::vector<int64_t> s, Device dev = Device::CPU)
      : data(d), dtype(t), device(dev), shape(std::move(s)) {}

  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int ndim() const { return static_cast<int>(shape.size()); }
  int64_t size(int dim) const { return shape.at(dim < 0 ? dim + ndim() : dim); }
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  std::string shape_str() const;  // "[2, 3]"
};

std::string shape_to_string(const std::vector<int64_t>& shape);
int64_t shape_numel(const std::vector<int64_t>& shape);

}  // namespace verl
