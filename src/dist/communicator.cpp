#include "dist/communicator.h"

namespace verl::dist {

double Communicator::sum(double x) {
  all_reduce(std::span<double>(&x, 1), ReduceOp::Sum);
  return x;
}

int64_t Communicator::sum(int64_t x) {
  all_reduce(std::span<int64_t>(&x, 1), ReduceOp::Sum);
  return x;
}

int64_t Communicator::max(int64_t x) {
  all_reduce(std::span<int64_t>(&x, 1), ReduceOp::Max);
  return x;
}

}  // namespace verl::dist
