// The strategy interface's shared part, the whole all-reduce at the step, and the one factory that
// picks a strategy for (device, ZeRO stage, LightweightSync) and refuses what is not built.
#include "optim/strategy.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "core/error.h"
#include "optim/strategy_cpu.h"

namespace verl::optim {

void all_reduce_whole_grads(TrainState& st, dist::Communicator& comm, SyncStats& stats) {
  VERL_CHECK(st.trainable(), "all_reduce_grads: the state is forward-only (a reference policy)");
  st.synchronize();              // the backward's gradients are complete
  const int64_t n = st.numel();  // whole buffers: no strategy shards this state
  stats.add_all_reduce(comm.world_size(), n);
  comm.all_reduce(st.grads(), static_cast<size_t>(n), dist::DataType::F32, dist::ReduceOp::Sum,
                  st.place());
}

void AllReduceAtStep::reduce_grads(dist::Communicator& comm) {
  all_reduce_whole_grads(st_, comm, sync_stats_);
}

namespace detail {
namespace {
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<Device, DataParallelBuilder>& registry() {
  static std::map<Device, DataParallelBuilder> r;
  return r;
}
}  // namespace

void register_data_parallel(Device device, DataParallelBuilder build) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[device] = build;
}
}  // namespace detail

std::unique_ptr<Strategy> make_strategy(TrainState& st, dist::Communicator& comm,
                                        const StrategyConfig& cfg) {
  // One process that sends nothing: the gradients are already the whole batch's.
  if (comm.world_size() == 1 && !comm.distributed()) return std::make_unique<AllReduceAtStep>(st);
  VERL_CHECK(st.trainable(), "data parallelism: the {} state is forward-only (a reference policy)",
             to_string(st.device()));
  const char* key = cfg.zero_stage_key.c_str();
  // A one-rank NCCL communicator still reduces (through NCCL): its buckets go as with more ranks,
  // but there is nothing to shard.
  const int stage = comm.world_size() == 1 ? 0 : cfg.zero_stage;
  VERL_CHECK(stage >= 0 && stage <= 3, "{}={}: 0, 1, 2 or 3", key, stage);
  VERL_CHECK(st.device() == Device::Cpu || stage <= 2,
             "{}={} on trainer.device={}: the GPU training state has ZeRO 1 and 2 but no ZeRO-3 "
             "yet (issue 43: its bf16 weights would be gathered layer by layer); use {}=2",
             key, stage, to_string(st.device()), key);
  if (cfg.lightweight) {
    VERL_CHECK(stage < 2,
               "trainer.gradient_sync_method=lightweight with {}={}: LightweightSync compresses "
               "each rank's whole gradient (its top-k and carry), which ZeRO-{} does not keep; "
               "use {}=1 (sharded moments) or 0",
               key, stage, stage, key);
    check_lightweight_config(*cfg.lightweight);
  }
  if (st.device() == Device::Cpu)
    return std::make_unique<CpuDataParallel>(static_cast<CpuTrainState&>(st), comm, stage,
                                             cfg.lightweight);
  detail::DataParallelBuilder build = nullptr;
  {
    std::lock_guard<std::mutex> lock(detail::registry_mutex());
    auto it = detail::registry().find(st.device());
    if (it != detail::registry().end()) build = it->second;
  }
  VERL_CHECK(build != nullptr,
             "internal: no data-parallel strategy registered for trainer.device={}",
             to_string(st.device()));
  return build(st, comm, stage, cfg);
}

AdamWState Strategy::gather_sharded_moments(int64_t chunk, dist::Communicator& comm) const {
  AdamWState mine = st_.download_optimizer_state();
  AdamWState whole;
  whole.step = mine.step;
  for (auto [part, out] :
       {std::pair{&mine.exp_avg, &whole.exp_avg}, std::pair{&mine.exp_avg_sq, &whole.exp_avg_sq}}) {
    std::vector<float> all(static_cast<size_t>(chunk * comm.world_size()), 0.0f);
    std::copy(part->begin(), part->end(), all.begin() + comm.rank() * chunk);
    comm.all_gather(all.data() + comm.rank() * chunk, all.data(), static_cast<size_t>(chunk),
                    dist::DataType::F32);
    all.resize(static_cast<size_t>(st_.numel()));
    *out = std::move(all);
  }
  return whole;
}

}  // namespace verl::optim
