// The host communicator for torchrun-style launches (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT in the environment, no MPI): rank 0 listens on MASTER_ADDR:MASTER_PORT, every other
// rank connects to it, and the collectives run over these TCP connections through rank 0 (a
// star: rank 0 reduces in rank order, so results are deterministic). It carries the control path
// beside NCCL on GPUs (NCCL's unique id, counts, metrics) and the whole data path on CPUs, where it
// is slower than MPI for gradients (everything crosses rank 0) but needs nothing installed.
// Every wait is bounded by actor_rollout_ref.nccl_timeout: a rank that is stuck makes the others
// report the stage and exit non-zero; a rank that dies closes its connection, which the others
// see at once and name. Only this job's ranks are admitted (a handshake with magic, version and
// job id), and every message is framed (sequence number, collective, length), so a stranger on
// MASTER_PORT or ranks that fall out of step are named instead of read as data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace verl::dist {

class TcpCommunicator final : public Communicator {
 public:
  // Rank 0 binds `port` on `addr` (every interface when addr is a name of this host or
  // "0.0.0.0"), the others connect, retrying until `timeout_s` has passed. Each says hello with
  // verl's magic, the protocol version, its rank, the world size and `job_id` (dist/launch.h's
  // job_id(); at most 31 characters); rank 0 admits the ranks of its own job, refuses and names
  // strangers and other jobs' ranks, and answers with a session nonce that split groups check.
  TcpCommunicator(int rank, int world_size, const std::string& addr, int port, double timeout_s,
                  std::string job_id = "");
  ~TcpCommunicator() override;
  TcpCommunicator(const TcpCommunicator&) = delete;
  TcpCommunicator& operator=(const TcpCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  void barrier() override;
  // The connections rank 0 (of this communicator) refused while forming it, one line each.
  const std::vector<std::string>& refused() const { return refused_; }

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
  // The group's rank 0 listens on a port the system picks, its address travels over this
  // communicator, and the members connect to it: a star of the group's own, closed with the child.
  std::unique_ptr<Communicator> split_impl(const SplitGroup& g) override;

 private:
  // A split's child, not yet connected.
  TcpCommunicator(int rank, int world_size, double timeout_s, std::string job_id, uint64_t session);
  // Forms the star of the world (the public constructor's work): listen and admit, or connect
  // and greet.
  void join(const std::string& addr, int port);
  // The IPv4 address (host byte order) the other ranks reach this one at.
  uint32_t local_address() const;
  // The socket to rank `peer` (rank 0 holds one per rank; the others hold one, to rank 0).
  int fd(int peer) const;
  // One message of collective `what`: a frame (sequence number, collective, length) and the
  // payload; the receiver checks the frame against what it expects and names a mismatch.
  void send_bytes(int peer, const void* data, size_t n, const char* what);
  void recv_bytes(int peer, void* data, size_t n, const char* what);
  void send_raw(int peer, const void* data, size_t n, int flags, const char* what);
  void recv_raw(int peer, void* data, size_t n, const char* what);
  void host_only(Place place, const char* what) const;
  // Rank 0's copy of `bytes` bytes (data, from root) goes to every other rank.
  void fan_out(void* data, size_t bytes, const char* what);

  int rank_, world_;
  double timeout_s_;
  std::string job_;
  uint64_t session_ = 0;  // rank 0's nonce, the same on every rank once connected
  std::vector<int> fds_;  // indexed by peer rank; -1 where there is no connection
  std::vector<uint32_t> send_seq_, recv_seq_;  // the next frame's number, per peer
  std::vector<std::string> refused_;
};

}  // namespace verl::dist
