// The MPI communicator (Open MPI): the ranks that `mpirun` / `srun` started, with host-buffer
// collectives (the data path on CPUs, the control path beside NCCL on GPUs). Every collective is
// started non-blocking and waited for with a deadline (actor_rollout_ref.nccl_timeout): a rank that
// died or hangs makes the others stop with a message naming the stage and the collective, never a
// hang. Device buffers are the NCCL communicator's business and are refused here.
#pragma once

#include <memory>
#include <string>

#include "dist/communicator.h"

namespace verl::dist {

class MpiCommunicator final : public Communicator {
 public:
  // Initialises MPI unless it already is (MPI_THREAD_FUNNELED: collectives come from one thread).
  explicit MpiCommunicator(double timeout_s);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  void barrier() override;
  double timeout_s() const { return timeout_s_; }

 protected:
  void all_reduce_impl(void* data, size_t count, DataType type, ReduceOp op, Place place) override;
  void reduce_scatter_impl(const void* send, void* recv, size_t recv_count, DataType type,
                           ReduceOp op, Place place) override;
  void all_gather_impl(const void* send, void* recv, size_t send_count, DataType type,
                       Place place) override;
  void broadcast_impl(void* data, size_t count, DataType type, int root, Place place) override;
  void all_to_all_impl(const void* send, void* recv, size_t count_per_rank, DataType type,
                       Place place) override;
  void all_to_allv_impl(const void* send, std::span<const size_t> send_counts,
                        std::span<const size_t> send_displs, void* recv,
                        std::span<const size_t> recv_counts, std::span<const size_t> recv_displs,
                        DataType type, Place place) override;
  std::unique_ptr<PendingCollective> start_all_reduce_impl(void* data, size_t count, DataType type,
                                                           ReduceOp op, Place place) override;
  std::unique_ptr<PendingCollective> start_reduce_impl(void* data, size_t count, DataType type,
                                                       ReduceOp op, int root) override;
  std::unique_ptr<PendingCollective> start_all_gather_impl(const void* send, void* recv,
                                                           size_t send_count, DataType type,
                                                           Place place) override;
  std::unique_ptr<PendingCollective> start_all_gather_v_impl(const void* send, void* recv,
                                                             std::span<const size_t> counts,
                                                             std::span<const size_t> displs,
                                                             DataType type, Place place) override;
  // MPI_Comm_split; the child owns its MPI_Comm and frees it when destroyed.
  std::unique_ptr<Communicator> split_impl(const SplitGroup& g) override;

 private:
  class Pending;
  struct Handle;  // the MPI_Comm (mpi.h stays out of this header)
  // A split's child over `comm`, which it frees.
  MpiCommunicator(std::unique_ptr<Handle> comm, double timeout_s);
  void host_only(Place place, const char* what) const;
  // Waits for `request` (an MPI_Request) until the deadline; past it, reports and aborts the job.
  void wait(void* request, const char* what);

  std::unique_ptr<Handle> comm_;  // MPI_COMM_WORLD, or a split's communicator
  int rank_ = 0, size_ = 1;
  double timeout_s_;
  bool owns_init_ = false;
};

// An error on this rank of a multi-rank MPI job: prints it with the rank and aborts the whole job
// (the other ranks would otherwise wait in their next collective until the timeout). Returns
// without doing anything when MPI is not running with several ranks.
void abort_job_on_error(const char* what);

}  // namespace verl::dist
