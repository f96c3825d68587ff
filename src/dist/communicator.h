// The data-parallel communicator the trainer reduces through. Everything verl reduces across
// data-parallel ranks (global valid-token and sequence counts for loss aggregation, micro-batch
// counts under dynamic batching, metric means, gradients) goes through this interface, so MPI and
// NCCL implementations plug in without touching the trainer. This file has the single-process one.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

namespace verl::dist {

enum class ReduceOp { Sum, Max, Min };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // In-place all-reduce of `data` over all ranks.
  virtual void all_reduce(std::span<float> data, ReduceOp op) = 0;
  virtual void all_reduce(std::span<double> data, ReduceOp op) = 0;
  virtual void all_reduce(std::span<int64_t> data, ReduceOp op) = 0;
  virtual void barrier() = 0;

  // Conveniences over all_reduce.
  double sum(double x);
  int64_t sum(int64_t x);
  int64_t max(int64_t x);
  // Mean of a metric over ranks (verl reduces metrics by mean).
  double mean(double x) { return sum(x) / world_size(); }
};

// One process: every reduction is the identity.
class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void all_reduce(std::span<float>, ReduceOp) override {}
  void all_reduce(std::span<double>, ReduceOp) override {}
  void all_reduce(std::span<int64_t>, ReduceOp) override {}
  void barrier() override {}
};

}  // namespace verl::dist
