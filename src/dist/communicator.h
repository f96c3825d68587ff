// The data-parallel communicator. Every collective verl runs across data-parallel ranks (token and
// sequence counts for loss aggregation, metric means, gradient all-reduce and reduce-scatter,
// parameter all-gather, sequence exchange) goes through this interface, so MPI and NCCL backends
// plug in without touching callers. SingleProcess, the one-rank backend, lives here too.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"

namespace verl::dist {

enum class ReduceOp { Sum, Max, Min };

// Element types a collective moves. Not verl::DType (tensor storage): collectives also move f64
// metrics and never f16.
enum class DataType { F32, F64, I32, I64, BF16, U8 };

size_t data_type_size(DataType t);
const char* to_string(DataType t);  // "f32", "f64", "i32", "i64", "bf16", "u8"

// C++ element types of the typed span wrappers. bf16 has no C++ type of its own (it is stored as
// uint16_t), so bf16 buffers go through the raw calls.
template <class T>
concept CommElement = std::same_as<T, float> || std::same_as<T, double> ||
    std::same_as<T, int32_t> || std::same_as<T, int64_t> || std::same_as<T, uint8_t>;

template <CommElement T>
constexpr DataType data_type_of() {
  if constexpr (std::is_same_v<T, float>) return DataType::F32;
  if constexpr (std::is_same_v<T, double>) return DataType::F64;
  if constexpr (std::is_same_v<T, int32_t>) return DataType::I32;
  if constexpr (std::is_same_v<T, int64_t>) return DataType::I64;
  if constexpr (std::is_same_v<T, uint8_t>) return DataType::U8;
}

// Where a collective's buffers live. On the host a call is complete when it returns. On the device
// it is enqueued on `stream` (a cudaStream_t, held as void* so this header needs no CUDA header;
// nullptr is the default stream), and the buffers must stay valid until the stream reaches it.
struct Place {
  enum class Kind { Host, Device };
  Kind kind = Kind::Host;
  void* stream = nullptr;

  static Place host() { return {}; }
  static Place device(void* stream) { return {Kind::Device, stream}; }
  bool on_device() const { return kind == Kind::Device; }
};

// A collective started by a Communicator::start_* call. Its buffer must stay valid and untouched
// until wait() has returned or test() has returned true. test() also moves the collective along
// (MPI progresses non-blocking collectives only inside MPI calls); wait() honours the
// communicator's deadline as the blocking calls do.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual bool test() = 0;
  virtual void wait() = 0;
};

// The color a rank passes to Communicator::split to join no group (MPI_UNDEFINED's role).
inline constexpr int kNoColor = -1;

// What Communicator::split has worked out before a backend forms the group: this rank's color
// and key, its rank in the group and the group's members as ranks of the parent, in group rank
// order (by key, then parent rank). Under kNoColor: rank -1 and no members.
struct SplitGroup {
  int color = kNoColor;
  int key = 0;
  int rank = -1;
  std::vector<int> members;
};

// Every rank calls a collective with the same counts, type, op and root. Counts and displacements
// are in elements of the DataType, never bytes. The public calls check their arguments and then
// call the backend's *_impl; a backend overrides only those, so it never hides the overloads here.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Returns on each rank once every rank has entered it.
  virtual void barrier() = 0;

  // Whether collectives go to other processes or devices (a one-rank NCCL communicator does): the
  // optimizer all-reduces gradients then even with one rank.
  virtual bool distributed() const { return world_size() > 1; }

  // The pipeline stage the next collectives belong to ("gen", "update_actor", ...): a backend
  // names it when a collective fails or times out.
  virtual void set_stage(std::string stage) { stage_ = std::move(stage); }
  const std::string& stage() const { return stage_; }

  // data[i] becomes op over all ranks of data[i], on every rank. In place.
  void all_reduce(void* data, size_t count, DataType type, ReduceOp op, Place place = {});

  // `send` holds world_size * recv_count elements: block j is send[j * recv_count, (j + 1) *
  // recv_count). Rank r receives in `recv` (recv_count elements) op over all ranks of their block
  // r. In place when recv == send + rank * recv_count (NCCL's rule); otherwise no overlap.
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DataType type, ReduceOp op,
                      Place place = {});

  // `recv` holds world_size * send_count elements, rank-major: block j is rank j's `send`.
  // In place when send == recv + rank * send_count (NCCL's rule); otherwise no overlap.
  void all_gather(const void* send, void* recv, size_t send_count, DataType type, Place place = {});

  // Every rank's `data` becomes root's. In place.
  void broadcast(void* data, size_t count, DataType type, int root, Place place = {});

  // `send` and `recv` each hold world_size * count_per_rank elements. Block j of rank r's send goes
  // to rank j, where it lands as block r of recv. Not in place: send and recv must not overlap
  // (NCCL has no in-place all-to-all).
  void all_to_all(const void* send, void* recv, size_t count_per_rank, DataType type,
                  Place place = {});

  // Variable-size all-to-all; each span has one entry per rank. Rank r sends send_counts[j]
  // elements from send + send_displs[j] to rank j, and receives recv_counts[j] elements from rank j
  // into recv + recv_displs[j]; recv_counts[j] must equal rank j's send_counts[r]. Elements of recv
  // outside the received slices are left untouched. Not in place: send and recv must not overlap.
  void all_to_allv(const void* send, std::span<const size_t> send_counts,
                   std::span<const size_t> send_displs, void* recv,
                   std::span<const size_t> recv_counts, std::span<const size_t> recv_displs,
                   DataType type, Place place = {});

  // Non-blocking collectives for the gradient buckets that backward finishes while it goes on.
  // Every rank starts the same collectives in the same order. start_all_reduce: as all_reduce;
  // on the device it runs after the work enqueued so far on place.stream (the backward that wrote
  // the bucket) and beside what is enqueued there later. start_reduce (host): root's `data` becomes
  // op over all ranks of `data` (in place); on the other ranks `data` is left as it was or
  // overwritten (the caller must not read it).
  std::unique_ptr<PendingCollective> start_all_reduce(void* data, size_t count, DataType type,
                                                      ReduceOp op, Place place = {});
  std::unique_ptr<PendingCollective> start_reduce(void* data, size_t count, DataType type,
                                                  ReduceOp op, int root);
  // As all_gather (in place when send == recv + rank * send_count); on the device as
  // start_all_reduce: after what place.stream has enqueued so far.
  std::unique_ptr<PendingCollective> start_all_gather(const void* send, void* recv,
                                                      size_t send_count, DataType type,
                                                      Place place = {});

  // Variable-size all-gather (MPI's allgatherv): rank j contributes counts[j] elements, which
  // land on every rank at recv + displs[j]; `send` holds this rank's counts[rank()] elements.
  // Elements of recv outside the slices are left untouched. Not in place: send must not overlap
  // recv. ZeRO-3 gathers a layer's weights from the ranks owning parts of it this way.
  void all_gather_v(const void* send, void* recv, std::span<const size_t> counts,
                    std::span<const size_t> displs, DataType type, Place place = {});
  std::unique_ptr<PendingCollective> start_all_gather_v(const void* send, void* recv,
                                                        std::span<const size_t> counts,
                                                        std::span<const size_t> displs,
                                                        DataType type, Place place = {});

  // Typed wrappers over the calls above. A span may point at device memory when `place` says so.
  // all_reduce has plain overloads rather than a template, so callers passing a std::vector still
  // convert to the span.
  void all_reduce(std::span<float> data, ReduceOp op, Place place = {}) {
    all_reduce(data.data(), data.size(), DataType::F32, op, place);
  }
  void all_reduce(std::span<double> data, ReduceOp op, Place place = {}) {
    all_reduce(data.data(), data.size(), DataType::F64, op, place);
  }
  void all_reduce(std::span<int32_t> data, ReduceOp op, Place place = {}) {
    all_reduce(data.data(), data.size(), DataType::I32, op, place);
  }
  void all_reduce(std::span<int64_t> data, ReduceOp op, Place place = {}) {
    all_reduce(data.data(), data.size(), DataType::I64, op, place);
  }

  // T is deduced from the non-const span only, so a std::span<float> or a std::vector<float> also
  // passes as `send`; callers holding two vectors write reduce_scatter<float>(a, b, op).
  template <CommElement T>
  void reduce_scatter(std::span<const std::type_identity_t<T>> send, std::span<T> recv, ReduceOp op,
                      Place place = {}) {
    VERL_CHECK(send.size() == recv.size() * world_size(),
               "reduce_scatter: send has {} elements, want world_size {} x recv's {} = {}",
               send.size(), world_size(), recv.size(), recv.size() * world_size());
    reduce_scatter(send.data(), recv.data(), recv.size(), data_type_of<T>(), op, place);
  }

  template <CommElement T>
  void all_gather(std::span<const std::type_identity_t<T>> send, std::span<T> recv,
                  Place place = {}) {
    VERL_CHECK(recv.size() == send.size() * world_size(),
               "all_gather: recv has {} elements, want world_size {} x send's {} = {}", recv.size(),
               world_size(), send.size(), send.size() * world_size());
    all_gather(send.data(), recv.data(), send.size(), data_type_of<T>(), place);
  }

  template <CommElement T>
  void broadcast(std::span<T> data, int root, Place place = {}) {
    broadcast(data.data(), data.size(), data_type_of<T>(), root, place);
  }

  template <CommElement T>
  void all_to_all(std::span<const std::type_identity_t<T>> send, std::span<T> recv,
                  Place place = {}) {
    const size_t n = static_cast<size_t>(world_size());
    VERL_CHECK(send.size() == recv.size() && send.size() % n == 0,
               "all_to_all: send has {} and recv {} elements; both must be world_size {} x the "
               "same count per rank",
               send.size(), recv.size(), n);
    all_to_all(send.data(), recv.data(), send.size() / n, data_type_of<T>(), place);
  }

  template <CommElement T>
  void all_to_allv(std::span<const std::type_identity_t<T>> send,
                   std::span<const size_t> send_counts, std::span<const size_t> send_displs,
                   std::span<T> recv, std::span<const size_t> recv_counts,
                   std::span<const size_t> recv_displs, Place place = {}) {
    check_slices("send", send.size(), send_counts, send_displs);
    check_slices("recv", recv.size(), recv_counts, recv_displs);
    all_to_allv(send.data(), send_counts, send_displs, recv.data(), recv_counts, recv_displs,
                data_type_of<T>(), place);
  }

  // A collective over every rank, as MPI_Comm_split: the ranks passing the same color (>= 0) form
  // a new communicator, ranked by key, then by rank here; a rank passing kNoColor gets nullptr
  // and joins no group. The child is the same backend with this one's timeout and stage, and its
  // errors name its group (color, size, world ranks). Destroy a child before its parent (an MPI
  // parent that started MPI finalises it).
  std::unique_ptr<Communicator> split(int color, int key);

  // A split child's place in the job: the color it was split with and, per rank of the child,
  // its world rank (its rank in the communicator no split made). No world ranks when no split
  // made this communicator.
  struct Group {
    int color = kNoColor;
    std::vector<int> world_ranks;
  };
  const Group& group() const { return group_; }
  // How errors name this rank ("rank 1 of 4"; in a split child "rank 0 of 2 in group color 1
  // (world rank 3)") and a peer ("rank 2"; in a split child "rank 1 (world rank 3)").
  std::string describe_rank() const;
  std::string describe_peer(int peer) const;

  // Conveniences over all_reduce.
  double sum(double x);
  int64_t sum(int64_t x);
  int64_t max(int64_t x);
  // Mean of a metric over ranks (verl reduces metrics by mean).
  double mean(double x) { return sum(x) / world_size(); }

 protected:
  // Backend hooks, called after the public calls have checked null pointers, the root and the
  // all_to_allv span lengths.
  virtual void all_reduce_impl(void* data, size_t count, DataType type, ReduceOp op,
                               Place place) = 0;
  virtual void reduce_scatter_impl(const void* send, void* recv, size_t recv_count, DataType type,
                                   ReduceOp op, Place place) = 0;
  virtual void all_gather_impl(const void* send, void* recv, size_t send_count, DataType type,
                               Place place) = 0;
  virtual void broadcast_impl(void* data, size_t count, DataType type, int root, Place place) = 0;
  virtual void all_to_all_impl(const void* send, void* recv, size_t count_per_rank, DataType type,
                               Place place) = 0;
  virtual void all_to_allv_impl(const void* send, std::span<const size_t> send_counts,
                                std::span<const size_t> send_displs, void* recv,
                                std::span<const size_t> recv_counts,
                                std::span<const size_t> recv_displs, DataType type,
                                Place place) = 0;
  // By default the blocking all-reduce, complete on return (start_reduce too: every rank gets the
  // sum, which the contract allows). MPI overrides both with its non-blocking calls.
  virtual std::unique_ptr<PendingCollective> start_all_reduce_impl(void* data, size_t count,
                                                                   DataType type, ReduceOp op,
                                                                   Place place);
  virtual std::unique_ptr<PendingCollective> start_reduce_impl(void* data, size_t count,
                                                               DataType type, ReduceOp op,
                                                               int root);
  virtual std::unique_ptr<PendingCollective> start_all_gather_impl(const void* send, void* recv,
                                                                   size_t send_count, DataType type,
                                                                   Place place);
  // By default an all_to_allv that sends this rank's slice to every rank (blocking, complete on
  // return); MPI overrides it with MPI_Iallgatherv. `counts` and `displs` are checked already.
  virtual std::unique_ptr<PendingCollective> start_all_gather_v_impl(const void* send, void* recv,
                                                                     std::span<const size_t> counts,
                                                                     std::span<const size_t> displs,
                                                                     DataType type, Place place);
  // Forms this rank's group `g` (a backend's own connections or handle) and returns it, or
  // nullptr under kNoColor. Every rank calls it, kNoColor ones too, so a backend may run
  // collectives here. split() then checks the child's rank and size and sets its group and stage.
  virtual std::unique_ptr<Communicator> split_impl(const SplitGroup& g) = 0;

 private:
  std::string stage_ = "setup";
  Group group_;
  // Every slice [displs[j], displs[j] + counts[j]) lies inside a buffer of `size` elements.
  void check_slices(const char* which, size_t size, std::span<const size_t> counts,
                    std::span<const size_t> displs) const;
};

// One process: reductions and broadcast are the identity, the rest copy send to recv (nothing to
// move when they are the same buffer). Device buffers are copied on the Place's stream.
class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void barrier() override {}

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
  std::unique_ptr<Communicator> split_impl(const SplitGroup& g) override;
};

}  // namespace verl::dist
