#include "dist/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <vector>

#include "core/error.h"
#include "dist/deadline.h"
#include "dist/mpi_communicator.h"

namespace verl::dist {
namespace {

void check_nccl(ncclResult_t r, const char* what) {
  VERL_CHECK(r == ncclSuccess, "NCCL {} failed: {}", what, ncclGetErrorString(r));
}

void check_cuda(cudaError_t e, const char* what) {
  VERL_CHECK(e == cudaSuccess, "NCCL {}: CUDA error {}", what, cudaGetErrorString(e));
}

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::F32:
      return ncclFloat32;
    case DataType::F64:
      return ncclFloat64;
    case DataType::I32:
      return ncclInt32;
    case DataType::I64:
      return ncclInt64;
    case DataType::BF16:
      return ncclBfloat16;
    case DataType::U8:
      return ncclUint8;
  }
  VERL_FAIL("NCCL: unknown DataType {}", static_cast<int>(t));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  VERL_FAIL("NCCL: unknown ReduceOp {}", static_cast<int>(op));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<Communicator> host, double timeout_s)
      : host_(std::move(host)), timeout_s_(timeout_s) {
    VERL_CHECK(timeout_s > 0, "actor_rollout_ref.nccl_timeout must be > 0 seconds, got {}",
               timeout_s);
    setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // NVLink multicast off (GPU.md)
    ncclUniqueId id;
    if (host_->rank() == 0) check_nccl(ncclGetUniqueId(&id), "get unique id");
    host_->broadcast(reinterpret_cast<uint8_t*>(&id), sizeof(id), DataType::U8, 0);
    check_nccl(ncclCommInitRank(&comm_, host_->world_size(), id, host_->rank()), "init");
    check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "event");
    check_cuda(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "stream");
  }
  // A split's child: `comm` (which it destroys) beside `host`, the host communicator's child of
  // the same split.
  NcclCommunicator(std::unique_ptr<Communicator> host, ncclComm_t comm, double timeout_s)
      : host_(std::move(host)), timeout_s_(timeout_s), comm_(comm) {
    check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "event");
    check_cuda(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "stream");
  }
  ~NcclCommunicator() override {
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (side_ != nullptr) cudaStreamDestroy(side_);
    if (comm_ != nullptr) {
      if (std::uncaught_exceptions() > 0) {
        ncclCommAbort(comm_);  // peers may still wait in a collective
      } else {
        ncclCommDestroy(comm_);
      }
    }
  }

  int rank() const override { return host_->rank(); }
  int world_size() const override { return host_->world_size(); }
  bool distributed() const override { return true; }
  void set_stage(std::string stage) override {
    host_->set_stage(stage);
    Communicator::set_stage(std::move(stage));
  }
  void barrier() override { host_->barrier(); }

 protected:
  // The host communicator splits first: every rank has reached it within the deadline, so the
  // blocking ncclCommSplit waits for no rank that died. Both rank by (key, parent rank).
  std::unique_ptr<Communicator> split_impl(const SplitGroup& g) override {
    std::unique_ptr<Communicator> host = host_->split(g.color, g.key);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
    ncclComm_t child = nullptr;
    check_nccl(ncclCommSplit(comm_, g.color == kNoColor ? NCCL_SPLIT_NOCOLOR : g.color, g.key,
                             &child, nullptr),
               "split");
    if (child == nullptr) return nullptr;
    int nccl_rank = -1;
    check_nccl(ncclCommUserRank(child, &nccl_rank), "split");
    auto out = std::make_unique<NcclCommunicator>(std::move(host), child, timeout_s_);
    VERL_CHECK(nccl_rank == g.rank, "NCCL split on {}: group color {} gave NCCL rank {}, want {}",
               describe_rank(), g.color, nccl_rank, g.rank);
    return out;
#else
    VERL_FAIL("NCCL split on {}: ncclCommSplit needs NCCL 2.18 or newer; this build has {}.{}",
              describe_rank(), NCCL_MAJOR, NCCL_MINOR);
#endif
  }

  void all_reduce_impl(void* data, size_t count, DataType type, ReduceOp op, Place place) override {
    if (!place.on_device()) return host_->all_reduce(data, count, type, op, place);
    run(place, "all_reduce", [&](cudaStream_t s) {
      return ncclAllReduce(data, data, count, nccl_type(type), nccl_op(op), comm_, s);
    });
  }
  // A gradient bucket's all-reduce on the communicator's own stream, after what `place.stream`
  // has enqueued so far (the backward that wrote it) and beside what it enqueues next.
  std::unique_ptr<PendingCollective> start_all_reduce_impl(void* data, size_t count, DataType type,
                                                           ReduceOp op, Place place) override {
    if (!place.on_device()) return host_->start_all_reduce(data, count, type, op, place);
    auto p = std::make_unique<Pending>(*this, "gradient all_reduce");
    check_cuda(cudaEventRecord(p->ready, static_cast<cudaStream_t>(place.stream)), "event record");
    check_cuda(cudaStreamWaitEvent(side_, p->ready, 0), "stream wait");
    check_nccl(ncclAllReduce(data, data, count, nccl_type(type), nccl_op(op), comm_, side_),
               "all_reduce");
    check_cuda(cudaEventRecord(p->done, side_), "event record");
    return p;
  }
  std::unique_ptr<PendingCollective> start_all_gather_impl(const void* send, void* recv,
                                                           size_t send_count, DataType type,
                                                           Place place) override {
    if (!place.on_device()) return host_->start_all_gather(send, recv, send_count, type, place);
    auto p = std::make_unique<Pending>(*this, "gradient all_gather");
    check_cuda(cudaEventRecord(p->ready, static_cast<cudaStream_t>(place.stream)), "event record");
    check_cuda(cudaStreamWaitEvent(side_, p->ready, 0), "stream wait");
    check_nccl(ncclAllGather(send, recv, send_count, nccl_type(type), comm_, side_), "all_gather");
    check_cuda(cudaEventRecord(p->done, side_), "event record");
    return p;
  }
  void reduce_scatter_impl(const void* send, void* recv, size_t recv_count, DataType type,
                           ReduceOp op, Place place) override {
    if (!place.on_device()) return host_->reduce_scatter(send, recv, recv_count, type, op, place);
    run(place, "reduce_scatter", [&](cudaStream_t s) {
      return ncclReduceScatter(send, recv, recv_count, nccl_type(type), nccl_op(op), comm_, s);
    });
  }
  void all_gather_impl(const void* send, void* recv, size_t send_count, DataType type,
                       Place place) override {
    if (!place.on_device()) return host_->all_gather(send, recv, send_count, type, place);
    run(place, "all_gather", [&](cudaStream_t s) {
      return ncclAllGather(send, recv, send_count, nccl_type(type), comm_, s);
    });
  }
  void broadcast_impl(void* data, size_t count, DataType type, int root, Place place) override {
    if (!place.on_device()) return host_->broadcast(data, count, type, root, place);
    run(place, "broadcast", [&](cudaStream_t s) {
      return ncclBroadcast(data, data, count, nccl_type(type), root, comm_, s);
    });
  }
  void all_to_all_impl(const void* send, void* recv, size_t count_per_rank, DataType type,
                       Place place) override {
    if (!place.on_device()) return host_->all_to_all(send, recv, count_per_rank, type, place);
    const size_t bytes = count_per_rank * data_type_size(type);
    run(place, "all_to_all", [&](cudaStream_t s) {
      ncclResult_t r = ncclGroupStart();
      for (int j = 0; j < world_size() && r == ncclSuccess; ++j) {
        r = ncclSend(static_cast<const char*>(send) + j * bytes, count_per_rank, nccl_type(type), j,
                     comm_, s);
        if (r == ncclSuccess) {
          r = ncclRecv(static_cast<char*>(recv) + j * bytes, count_per_rank, nccl_type(type), j,
                       comm_, s);
        }
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }
  void all_to_allv_impl(const void* send, std::span<const size_t> send_counts,
                        std::span<const size_t> send_displs, void* recv,
                        std::span<const size_t> recv_counts, std::span<const size_t> recv_displs,
                        DataType type, Place place) override {
    if (!place.on_device()) {
      return host_->all_to_allv(send, send_counts, send_displs, recv, recv_counts, recv_displs,
                                type, place);
    }
    const size_t es = data_type_size(type);
    run(place, "all_to_allv", [&](cudaStream_t s) {
      ncclResult_t r = ncclGroupStart();
      for (int j = 0; j < world_size() && r == ncclSuccess; ++j) {
        if (send_counts[j] > 0) {
          r = ncclSend(static_cast<const char*>(send) + send_displs[j] * es, send_counts[j],
                       nccl_type(type), j, comm_, s);
        }
        if (r == ncclSuccess && recv_counts[j] > 0) {
          r = ncclRecv(static_cast<char*>(recv) + recv_displs[j] * es, recv_counts[j],
                       nccl_type(type), j, comm_, s);
        }
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }

 private:
  // A started device collective: complete when `done` (recorded after it) is reached.
  struct Pending final : PendingCollective {
    Pending(NcclCommunicator& c, const char* w) : comm(c), what(w) {
      check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "event");
      check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "event");
    }
    ~Pending() override {
      if (!finished && std::uncaught_exceptions() == 0) wait();
      cudaEventDestroy(ready);
      cudaEventDestroy(done);
    }
    bool test() override {
      if (!finished) finished = comm.reached(done, what);
      return finished;
    }
    void wait() override {
      if (!finished) comm.wait_for(done, what);
      finished = true;
    }
    NcclCommunicator& comm;
    const char* what;
    cudaEvent_t ready = nullptr, done = nullptr;
    bool finished = false;
  };

  // Whether `ev` has been reached, raising NCCL's and CUDA's asynchronous errors.
  bool reached(cudaEvent_t ev, const char* what) {
    const cudaError_t q = cudaEventQuery(ev);
    if (q == cudaSuccess) return true;
    VERL_CHECK(q == cudaErrorNotReady, "NCCL {} in stage '{}': CUDA error {}", what, stage(),
               cudaGetErrorString(q));
    ncclResult_t async = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(comm_, &async), what);
    VERL_CHECK(async == ncclSuccess || async == ncclInProgress,
               "NCCL {} in stage '{}' failed on rank {}: {}", what, stage(), rank(),
               ncclGetErrorString(async));
    return false;
  }

  // Waits for `ev` with the deadline; past it the communicator is aborted and the job ends.
  void wait_for(cudaEvent_t ev, const char* what) {
    if (poll_until(timeout_s_, [&] { return reached(ev, what); })) return;
    report_timeout(describe_rank(), (std::string("NCCL ") + what).c_str(), stage(), timeout_s_);
    ncclCommAbort(comm_);
    comm_ = nullptr;
    abort_job_on_error("NCCL timeout");
    std::_Exit(3);
  }

  // Enqueues `launch` on the Place's stream and waits for it with the deadline, watching NCCL's
  // asynchronous errors; past the deadline the communicator is aborted and the job ends.
  template <typename Launch>
  void run(Place place, const char* what, Launch&& launch) {
    cudaStream_t s = static_cast<cudaStream_t>(place.stream);
    check_nccl(launch(s), what);
    check_cuda(cudaEventRecord(done_, s), what);
    const bool done = poll_until(timeout_s_, [&] { return reached(done_, what); });
    if (done) return;
    report_timeout(describe_rank(), (std::string("NCCL ") + what).c_str(), stage(), timeout_s_);
    ncclCommAbort(comm_);
    comm_ = nullptr;
    abort_job_on_error("NCCL timeout");
    std::_Exit(3);
  }

  std::unique_ptr<Communicator> host_;
  double timeout_s_;
  ncclComm_t comm_ = nullptr;
  cudaEvent_t done_ = nullptr;
  cudaStream_t side_ = nullptr;  // where gradient buckets are reduced beside the backward
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host,
                                                     double timeout_s) {
  return std::make_unique<NcclCommunicator>(std::move(host), timeout_s);
}

}  // namespace verl::dist
