#include "dist/communicator.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#ifdef VERL_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace verl::dist {

size_t data_type_size(DataType t) {
  switch (t) {
    case DataType::F32:
      return 4;
    case DataType::F64:
      return 8;
    case DataType::I32:
      return 4;
    case DataType::I64:
      return 8;
    case DataType::BF16:
      return 2;
    case DataType::U8:
      return 1;
  }
  VERL_FAIL("data_type_size: unknown DataType {}", static_cast<int>(t));
}

const char* to_string(DataType t) {
  switch (t) {
    case DataType::F32:
      return "f32";
    case DataType::F64:
      return "f64";
    case DataType::I32:
      return "i32";
    case DataType::I64:
      return "i64";
    case DataType::BF16:
      return "bf16";
    case DataType::U8:
      return "u8";
  }
  return "unknown";
}

// ---- argument checks shared by every backend --------------------------------------------------

void Communicator::all_reduce(void* data, size_t count, DataType type, ReduceOp op, Place place) {
  VERL_CHECK(data || count == 0, "all_reduce: data is null with count {}", count);
  all_reduce_impl(data, count, type, op, place);
}

void Communicator::reduce_scatter(const void* send, void* recv, size_t recv_count, DataType type,
                                  ReduceOp op, Place place) {
  VERL_CHECK((send && recv) || recv_count == 0,
             "reduce_scatter: send or recv is null with recv_count {}", recv_count);
  reduce_scatter_impl(send, recv, recv_count, type, op, place);
}

void Communicator::all_gather(const void* send, void* recv, size_t send_count, DataType type,
                              Place place) {
  VERL_CHECK((send && recv) || send_count == 0,
             "all_gather: send or recv is null with send_count {}", send_count);
  all_gather_impl(send, recv, send_count, type, place);
}

void Communicator::broadcast(void* data, size_t count, DataType type, int root, Place place) {
  VERL_CHECK(root >= 0 && root < world_size(),
             "broadcast: root {} is not a rank (world size {}, ranks 0 to {})", root, world_size(),
             world_size() - 1);
  VERL_CHECK(data || count == 0, "broadcast: data is null with count {}", count);
  broadcast_impl(data, count, type, root, place);
}

void Communicator::all_to_all(const void* send, void* recv, size_t count_per_rank, DataType type,
                              Place place) {
  VERL_CHECK((send && recv) || count_per_rank == 0,
             "all_to_all: send or recv is null with count_per_rank {}", count_per_rank);
  all_to_all_impl(send, recv, count_per_rank, type, place);
}

void Communicator::all_to_allv(const void* send, std::span<const size_t> send_counts,
                               std::span<const size_t> send_displs, void* recv,
                               std::span<const size_t> recv_counts,
                               std::span<const size_t> recv_displs, DataType type, Place place) {
  const size_t n = static_cast<size_t>(world_size());
  const std::pair<const char*, size_t> lengths[] = {{"send_counts", send_counts.size()},
                                                    {"send_displs", send_displs.size()},
                                                    {"recv_counts", recv_counts.size()},
                                                    {"recv_displs", recv_displs.size()}};
  for (const auto& [name, len] : lengths) {
    VERL_CHECK(len == n, "all_to_allv: {} has {} entries, want one per rank (world size {})", name,
               len, n);
  }
  const auto any = [](std::span<const size_t> counts) {
    return std::any_of(counts.begin(), counts.end(), [](size_t c) { return c > 0; });
  };
  VERL_CHECK(send || !any(send_counts), "all_to_allv: send is null but send_counts are not all 0");
  VERL_CHECK(recv || !any(recv_counts), "all_to_allv: recv is null but recv_counts are not all 0");
  all_to_allv_impl(send, send_counts, send_displs, recv, recv_counts, recv_displs, type, place);
}

void Communicator::check_slices(const char* which, size_t size, std::span<const size_t> counts,
                                std::span<const size_t> displs) const {
  // Span lengths are the raw call's check; look only at the entries both spans have.
  const size_t n = std::min(counts.size(), displs.size());
  for (size_t j = 0; j < n; ++j) {
    VERL_CHECK(displs[j] <= size && counts[j] <= size - displs[j],
               "all_to_allv: {} slice for rank {} ([{}, {} + {})) runs past {}'s {} elements",
               which, j, displs[j], displs[j], counts[j], which, size);
  }
}

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

// ---- split --------------------------------------------------------------------------------------

std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  VERL_CHECK(color >= 0 || color == kNoColor,
             "split on {}: color {} is negative; a color is >= 0, or kNoColor ({}) to join no "
             "group",
             describe_rank(), color, kNoColor);
  // Every rank learns every (color, key), so each works out the same groups.
  const int n = world_size();
  const int64_t mine[2] = {color, key};
  std::vector<int64_t> all(2 * static_cast<size_t>(n));
  all_gather(mine, all.data(), 2, DataType::I64);
  SplitGroup g{color, key, -1, {}};
  if (color != kNoColor) {
    for (int r = 0; r < n; ++r)
      if (all[2 * r] == color) g.members.push_back(r);
    // Members are in rank order already: a stable sort by key gives (key, rank).
    std::stable_sort(g.members.begin(), g.members.end(),
                     [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
    g.rank =
        static_cast<int>(std::find(g.members.begin(), g.members.end(), rank()) - g.members.begin());
  }
  std::unique_ptr<Communicator> child = split_impl(g);
  if (color == kNoColor) {
    VERL_CHECK(child == nullptr, "split on {}: kNoColor gave a communicator", describe_rank());
    return nullptr;
  }
  const int size = static_cast<int>(g.members.size());
  VERL_CHECK(child != nullptr && child->rank() == g.rank && child->world_size() == size,
             "split on {}: group color {} was formed as rank {} of {}, want rank {} of {}",
             describe_rank(), color, child ? child->rank() : -1, child ? child->world_size() : 0,
             g.rank, size);
  child->group_.color = color;
  for (int m : g.members)
    child->group_.world_ranks.push_back(group_.world_ranks.empty() ? m : group_.world_ranks[m]);
  child->set_stage(stage());
  return child;
}

std::string Communicator::describe_rank() const {
  std::string s = fmt::format("rank {} of {}", rank(), world_size());
  if (!group_.world_ranks.empty()) {
    s += fmt::format(" in group color {} (world rank {})", group_.color,
                     group_.world_ranks[static_cast<size_t>(rank())]);
  }
  return s;
}

std::string Communicator::describe_peer(int peer) const {
  if (group_.world_ranks.empty() || peer < 0 || peer >= world_size())
    return fmt::format("rank {}", peer);
  return fmt::format("rank {} (world rank {})", peer,
                     group_.world_ranks[static_cast<size_t>(peer)]);
}

// ---- SingleProcess -----------------------------------------------------------------------------

namespace {

// A build without the CUDA runtime cannot touch device pointers, so it rejects a device Place
// rather than treating the call as a host no-op.
void require_backend(Place place, const char* what) {
#ifndef VERL_HAVE_CUDA
  VERL_CHECK(!place.on_device(),
             "{}: the buffers are on the device, but this build has no CUDA backend "
             "(configure with -DVERL_CUDA=ON)",
             what);
#endif
}

// Copies `count` elements from src to dst. Host ranges may overlap (memmove); cudaMemcpyAsync
// does not allow that, so overlapping device ranges are an error.
void copy_elements(void* dst, const void* src, size_t count, DataType type, Place place,
                   const char* what) {
  require_backend(place, what);
  const size_t bytes = count * data_type_size(type);
  if (dst == src || bytes == 0) return;
  if (!place.on_device()) {
    std::memmove(dst, src, bytes);
    return;
  }
#ifdef VERL_HAVE_CUDA
  const auto d = reinterpret_cast<uintptr_t>(dst);
  const auto s = reinterpret_cast<uintptr_t>(src);
  VERL_CHECK(d + bytes <= s || s + bytes <= d,
             "{}: device send and recv overlap ({} bytes at {} and {})", what, bytes, src, dst);
  const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                          static_cast<cudaStream_t>(place.stream));
  VERL_CHECK(err == cudaSuccess, "{}: cudaMemcpyAsync of {} bytes ({} {}) failed: {} ({})", what,
             bytes, count, to_string(type), cudaGetErrorName(err), cudaGetErrorString(err));
#endif
}

}  // namespace

namespace {
class Completed final : public PendingCollective {
 public:
  bool test() override { return true; }
  void wait() override {}
};
}  // namespace

std::unique_ptr<PendingCollective> Communicator::start_all_reduce(void* data, size_t count,
                                                                  DataType type, ReduceOp op,
                                                                  Place place) {
  VERL_CHECK(data != nullptr || count == 0, "start_all_reduce: null buffer of {} elements", count);
  return start_all_reduce_impl(data, count, type, op, place);
}

std::unique_ptr<PendingCollective> Communicator::start_reduce(void* data, size_t count,
                                                              DataType type, ReduceOp op,
                                                              int root) {
  VERL_CHECK(data != nullptr || count == 0, "start_reduce: null buffer of {} elements", count);
  VERL_CHECK(root >= 0 && root < world_size(), "start_reduce: root {} is not a rank of {}", root,
             world_size());
  return start_reduce_impl(data, count, type, op, root);
}

std::unique_ptr<PendingCollective> Communicator::start_all_gather(const void* send, void* recv,
                                                                  size_t send_count, DataType type,
                                                                  Place place) {
  VERL_CHECK((send != nullptr && recv != nullptr) || send_count == 0,
             "start_all_gather: null buffer of {} elements", send_count);
  return start_all_gather_impl(send, recv, send_count, type, place);
}

std::unique_ptr<PendingCollective> Communicator::start_all_gather_impl(const void* send, void* recv,
                                                                       size_t send_count,
                                                                       DataType type, Place place) {
  all_gather_impl(send, recv, send_count, type, place);
  return std::make_unique<Completed>();
}

void Communicator::all_gather_v(const void* send, void* recv, std::span<const size_t> counts,
                                std::span<const size_t> displs, DataType type, Place place) {
  start_all_gather_v(send, recv, counts, displs, type, place)->wait();
}

std::unique_ptr<PendingCollective> Communicator::start_all_gather_v(const void* send, void* recv,
                                                                    std::span<const size_t> counts,
                                                                    std::span<const size_t> displs,
                                                                    DataType type, Place place) {
  const auto world = static_cast<size_t>(world_size());
  VERL_CHECK(counts.size() == world && displs.size() == world,
             "all_gather_v: {} counts and {} displacements for {} ranks", counts.size(),
             displs.size(), world);
  const size_t mine = counts[static_cast<size_t>(rank())];
  VERL_CHECK((send != nullptr || mine == 0) &&
                 (recv != nullptr ||
                  std::all_of(counts.begin(), counts.end(), [](size_t c) { return c == 0; })),
             "all_gather_v: a null buffer with {} elements to send", mine);
  return start_all_gather_v_impl(send, recv, counts, displs, type, place);
}

std::unique_ptr<PendingCollective> Communicator::start_all_gather_v_impl(
    const void* send, void* recv, std::span<const size_t> counts, std::span<const size_t> displs,
    DataType type, Place place) {
  // Every rank's send slice is the same buffer (displacement 0), counts[rank()] to each.
  const auto world = static_cast<size_t>(world_size());
  const std::vector<size_t> send_counts(world, counts[static_cast<size_t>(rank())]),
      send_displs(world, 0);
  all_to_allv_impl(send, send_counts, send_displs, recv, counts, displs, type, place);
  return std::make_unique<Completed>();
}

std::unique_ptr<PendingCollective> Communicator::start_all_reduce_impl(void* data, size_t count,
                                                                       DataType type, ReduceOp op,
                                                                       Place place) {
  all_reduce_impl(data, count, type, op, place);
  return std::make_unique<Completed>();
}

std::unique_ptr<PendingCollective> Communicator::start_reduce_impl(void* data, size_t count,
                                                                   DataType type, ReduceOp op,
                                                                   int root) {
  (void)root;
  all_reduce_impl(data, count, type, op, Place::host());
  return std::make_unique<Completed>();
}

std::unique_ptr<Communicator> SingleProcess::split_impl(const SplitGroup& g) {
  if (g.color == kNoColor) return nullptr;
  return std::make_unique<SingleProcess>();
}

void SingleProcess::all_reduce_impl(void*, size_t, DataType, ReduceOp, Place place) {
  require_backend(place, "all_reduce");
}

void SingleProcess::reduce_scatter_impl(const void* send, void* recv, size_t recv_count,
                                        DataType type, ReduceOp, Place place) {
  copy_elements(recv, send, recv_count, type, place, "reduce_scatter");
}

void SingleProcess::all_gather_impl(const void* send, void* recv, size_t send_count, DataType type,
                                    Place place) {
  copy_elements(recv, send, send_count, type, place, "all_gather");
}

void SingleProcess::broadcast_impl(void*, size_t, DataType, int, Place place) {
  require_backend(place, "broadcast");  // the root is rank 0, checked by broadcast()
}

void SingleProcess::all_to_all_impl(const void* send, void* recv, size_t count_per_rank,
                                    DataType type, Place place) {
  copy_elements(recv, send, count_per_rank, type, place, "all_to_all");
}

void SingleProcess::all_to_allv_impl(const void* send, std::span<const size_t> send_counts,
                                     std::span<const size_t> send_displs, void* recv,
                                     std::span<const size_t> recv_counts,
                                     std::span<const size_t> recv_displs, DataType type,
                                     Place place) {
  // One entry each, checked by all_to_allv(): rank 0 sends to itself.
  VERL_CHECK(send_counts[0] == recv_counts[0],
             "all_to_allv: rank 0 sends {} elements to itself but expects to receive {}",
             send_counts[0], recv_counts[0]);
  if (send_counts[0] == 0) {  // send and recv may be null then
    require_backend(place, "all_to_allv");
    return;
  }
  const size_t size = data_type_size(type);
  copy_elements(static_cast<char*>(recv) + recv_displs[0] * size,
                static_cast<const char*>(send) + send_displs[0] * size, send_counts[0], type, place,
                "all_to_allv");
}

}  // namespace verl::dist
