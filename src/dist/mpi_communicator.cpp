#include "dist/mpi_communicator.h"

// The C API only: Open MPI's deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <vector>

#include "core/error.h"
#include "dist/deadline.h"

namespace verl::dist {
namespace {

MPI_Datatype mpi_type(DataType t) {
  switch (t) {
    case DataType::F32:
      return MPI_FLOAT;
    case DataType::F64:
      return MPI_DOUBLE;
    case DataType::I32:
      return MPI_INT32_T;
    case DataType::I64:
      return MPI_INT64_T;
    case DataType::BF16:
      return MPI_UINT16_T;  // moved, never reduced (see reduce_op)
    case DataType::U8:
      return MPI_UINT8_T;
  }
  VERL_FAIL("MPI: unknown DataType {}", static_cast<int>(t));
}

MPI_Op mpi_op(ReduceOp op, DataType t, const char* what) {
  VERL_CHECK(t != DataType::BF16, "MPI {}: bf16 reductions are not supported on the host", what);
  switch (op) {
    case ReduceOp::Sum:
      return MPI_SUM;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
  }
  VERL_FAIL("MPI {}: unknown ReduceOp {}", what, static_cast<int>(op));
}

int count_of(size_t n, const char* what) {
  VERL_CHECK(n <= static_cast<size_t>(std::numeric_limits<int>::max()),
             "MPI {}: {} elements exceed MPI's int counts", what, n);
  return static_cast<int>(n);
}

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  VERL_FAIL("MPI {} failed: {}", what, std::string(text, static_cast<size_t>(len)));
}

}  // namespace

struct MpiCommunicator::Handle {
  MPI_Comm comm;
};

MpiCommunicator::MpiCommunicator(double timeout_s)
    : comm_(std::make_unique<Handle>(Handle{MPI_COMM_WORLD})), timeout_s_(timeout_s) {
  VERL_CHECK(timeout_s > 0, "actor_rollout_ref.nccl_timeout must be > 0 seconds, got {}",
             timeout_s);
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "init");
    owns_init_ = true;
  }
  // Errors come back as codes (then verl::Error), not as MPI's default abort.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiCommunicator::MpiCommunicator(std::unique_ptr<Handle> comm, double timeout_s)
    : comm_(std::move(comm)), timeout_s_(timeout_s) {
  MPI_Comm_set_errhandler(comm_->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_->comm, &rank_);
  MPI_Comm_size(comm_->comm, &size_);
}

MpiCommunicator::~MpiCommunicator() {
  // While an error unwinds, the other ranks may still wait in a collective: MPI_Finalize could
  // block. abort_job (called where the error is caught) ends the job instead.
  if (std::uncaught_exceptions() > 0) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (comm_->comm != MPI_COMM_WORLD) MPI_Comm_free(&comm_->comm);
  if (owns_init_) MPI_Finalize();
}

std::unique_ptr<Communicator> MpiCommunicator::split_impl(const SplitGroup& g) {
  // split() has just all-gathered on this communicator within the deadline, so every rank is
  // here: MPI_Comm_split, which has no non-blocking form, waits for no rank that died.
  MPI_Comm child = MPI_COMM_NULL;
  check_mpi(
      MPI_Comm_split(comm_->comm, g.color == kNoColor ? MPI_UNDEFINED : g.color, g.key, &child),
      "split");
  if (child == MPI_COMM_NULL) return nullptr;
  return std::unique_ptr<Communicator>(
      new MpiCommunicator(std::make_unique<Handle>(Handle{child}), timeout_s_));
}

void abort_job_on_error(const char* what) {
  int inited = 0, finalized = 0, size = 1, rank = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (!inited || finalized) return;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size == 1) return;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "error: rank %d of %d: %s\n", rank, size, what);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);  // the launcher stops the other ranks
}

void MpiCommunicator::host_only(Place place, const char* what) const {
  VERL_CHECK(!place.on_device(),
             "MPI {}: the MPI communicator moves host buffers; device buffers go through the NCCL "
             "communicator",
             what);
}

void MpiCommunicator::wait(void* request, const char* what) {
  MPI_Request* req = static_cast<MPI_Request*>(request);
  const bool done = poll_until(timeout_s_, [&] {
    int flag = 0;
    check_mpi(MPI_Test(req, &flag, MPI_STATUS_IGNORE), what);
    return flag != 0;
  });
  if (done) return;
  // A peer died or is stuck inside another stage: nothing this rank can finish. Say where and end
  // the whole job (the launcher stops the other ranks).
  report_timeout(describe_rank(), what, stage(), timeout_s_);
  MPI_Abort(MPI_COMM_WORLD, 3);
  std::_Exit(3);
}

// A started MPI collective: its request, waited for with the communicator's deadline.
class MpiCommunicator::Pending final : public PendingCollective {
 public:
  Pending(MpiCommunicator& comm, const char* what) : comm_(comm), what_(what) {}
  ~Pending() override {
    // Never freed while in flight: MPI would still write the buffer. An unwinding error ends the
    // job (abort_job_on_error) without waiting.
    if (!done_ && std::uncaught_exceptions() == 0) wait();
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    check_mpi(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE), what_);
    done_ = flag != 0;
    return done_;
  }
  void wait() override {
    if (done_) return;
    comm_.wait(&req_, what_);
    done_ = true;
  }
  MPI_Request* request() { return &req_; }
  // Arrays a vector collective reads while it runs.
  void keep(std::vector<int> a, std::vector<int> b) {
    ints_[0] = std::move(a);
    ints_[1] = std::move(b);
  }
  const std::vector<int>& ints(int i) const { return ints_[i]; }

 private:
  std::vector<int> ints_[2];
  MpiCommunicator& comm_;
  const char* what_;
  MPI_Request req_ = MPI_REQUEST_NULL;
  bool done_ = false;
};

std::unique_ptr<PendingCollective> MpiCommunicator::start_all_reduce_impl(void* data, size_t count,
                                                                          DataType type,
                                                                          ReduceOp op,
                                                                          Place place) {
  host_only(place, "all_reduce");
  auto p = std::make_unique<Pending>(*this, "gradient all_reduce");
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, count_of(count, "all_reduce"), mpi_type(type),
                           mpi_op(op, type, "all_reduce"), comm_->comm, p->request()),
            "all_reduce");
  return p;
}

std::unique_ptr<PendingCollective> MpiCommunicator::start_reduce_impl(void* data, size_t count,
                                                                      DataType type, ReduceOp op,
                                                                      int root) {
  auto p = std::make_unique<Pending>(*this, "gradient reduce");
  check_mpi(
      MPI_Ireduce(rank_ == root ? MPI_IN_PLACE : data, data, count_of(count, "reduce"),
                  mpi_type(type), mpi_op(op, type, "reduce"), root, comm_->comm, p->request()),
      "reduce");
  return p;
}

std::unique_ptr<PendingCollective> MpiCommunicator::start_all_gather_impl(
    const void* send, void* recv, size_t send_count, DataType type, Place place) {
  host_only(place, "all_gather");
  const size_t bytes = send_count * data_type_size(type);
  const bool in_place = send == static_cast<const char*>(recv) + static_cast<size_t>(rank_) * bytes;
  auto p = std::make_unique<Pending>(*this, "gradient all_gather");
  const int n = count_of(send_count, "all_gather");
  check_mpi(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, mpi_type(type), recv, n,
                           mpi_type(type), comm_->comm, p->request()),
            "all_gather");
  return p;
}

std::unique_ptr<PendingCollective> MpiCommunicator::start_all_gather_v_impl(
    const void* send, void* recv, std::span<const size_t> counts, std::span<const size_t> displs,
    DataType type, Place place) {
  host_only(place, "all_gather_v");
  std::vector<int> c(counts.size()), d(displs.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    c[i] = count_of(counts[i], "all_gather_v");
    d[i] = count_of(displs[i], "all_gather_v");
  }
  auto p = std::make_unique<Pending>(*this, "weight all_gather_v");
  // MPI reads the count and displacement arrays until the request completes: they live in p.
  p->keep(std::move(c), std::move(d));
  check_mpi(MPI_Iallgatherv(send, p->ints(0)[static_cast<size_t>(rank_)], mpi_type(type), recv,
                            p->ints(0).data(), p->ints(1).data(), mpi_type(type), comm_->comm,
                            p->request()),
            "all_gather_v");
  return p;
}

void MpiCommunicator::barrier() {
  MPI_Request req;
  check_mpi(MPI_Ibarrier(comm_->comm, &req), "barrier");
  wait(&req, "barrier");
}

void MpiCommunicator::all_reduce_impl(void* data, size_t count, DataType type, ReduceOp op,
                                      Place place) {
  host_only(place, "all_reduce");
  MPI_Request req;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, count_of(count, "all_reduce"), mpi_type(type),
                           mpi_op(op, type, "all_reduce"), comm_->comm, &req),
            "all_reduce");
  wait(&req, "all_reduce");
}

void MpiCommunicator::reduce_scatter_impl(const void* send, void* recv, size_t recv_count,
                                          DataType type, ReduceOp op, Place place) {
  host_only(place, "reduce_scatter");
  const size_t bytes = recv_count * data_type_size(type);
  const char* mine = static_cast<const char*>(send) + static_cast<size_t>(rank_) * bytes;
  // MPI's in-place form takes the whole send buffer as recv; stage through a copy instead when
  // recv is this rank's block (NCCL's in-place rule).
  std::vector<char> staged;
  void* out = recv;
  if (mine == recv) {
    staged.resize(bytes);
    out = staged.data();
  }
  MPI_Request req;
  check_mpi(
      MPI_Ireduce_scatter_block(send, out, count_of(recv_count, "reduce_scatter"), mpi_type(type),
                                mpi_op(op, type, "reduce_scatter"), comm_->comm, &req),
      "reduce_scatter");
  wait(&req, "reduce_scatter");
  if (!staged.empty()) std::memcpy(recv, staged.data(), bytes);
}

void MpiCommunicator::all_gather_impl(const void* send, void* recv, size_t send_count,
                                      DataType type, Place place) {
  host_only(place, "all_gather");
  const size_t bytes = send_count * data_type_size(type);
  const bool in_place = send == static_cast<const char*>(recv) + static_cast<size_t>(rank_) * bytes;
  MPI_Request req;
  const int n = count_of(send_count, "all_gather");
  check_mpi(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, n, mpi_type(type), recv, n,
                           mpi_type(type), comm_->comm, &req),
            "all_gather");
  wait(&req, "all_gather");
}

void MpiCommunicator::broadcast_impl(void* data, size_t count, DataType type, int root,
                                     Place place) {
  host_only(place, "broadcast");
  MPI_Request req;
  check_mpi(MPI_Ibcast(data, count_of(count, "broadcast"), mpi_type(type), root, comm_->comm, &req),
            "broadcast");
  wait(&req, "broadcast");
}

void MpiCommunicator::all_to_all_impl(const void* send, void* recv, size_t count_per_rank,
                                      DataType type, Place place) {
  host_only(place, "all_to_all");
  MPI_Request req;
  const int n = count_of(count_per_rank, "all_to_all");
  check_mpi(MPI_Ialltoall(send, n, mpi_type(type), recv, n, mpi_type(type), comm_->comm, &req),
            "all_to_all");
  wait(&req, "all_to_all");
}

void MpiCommunicator::all_to_allv_impl(const void* send, std::span<const size_t> send_counts,
                                       std::span<const size_t> send_displs, void* recv,
                                       std::span<const size_t> recv_counts,
                                       std::span<const size_t> recv_displs, DataType type,
                                       Place place) {
  host_only(place, "all_to_allv");
  auto ints = [](std::span<const size_t> v) {
    std::vector<int> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = count_of(v[i], "all_to_allv");
    return out;
  };
  const std::vector<int> sc = ints(send_counts), sd = ints(send_displs), rc = ints(recv_counts),
                         rd = ints(recv_displs);
  MPI_Request req;
  check_mpi(MPI_Ialltoallv(send, sc.data(), sd.data(), mpi_type(type), recv, rc.data(), rd.data(),
                           mpi_type(type), comm_->comm, &req),
            "all_to_allv");
  wait(&req, "all_to_allv");
}

}  // namespace verl::dist
