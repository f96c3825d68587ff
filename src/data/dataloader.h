// A stateful prompt loader (verl's StatefulDataLoader + RandomSampler): fixed-size batches over
// an RLDataset, a fresh permutation per epoch from Philox(seed, epoch), drop_last, a position
// (epoch, batch) saved in checkpoints, and worker threads that render and tokenize the next
// batches while the trainer works.
//
//   DataLoader loader(train_ds, LoaderOptions::train_from_config(cfg));
//   while (auto batch = loader.next()) { ...; metrics["timing_s/data"] =
//   loader.last_wait_seconds(); }
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <vector>

#include "data/rl_dataset.h"

namespace verl::data {

struct LoaderOptions {
  int64_t batch_size = 1;  // prompts per batch (data.gen_batch_size, = train_batch_size by default)
  bool shuffle = true;     // data.shuffle: a new permutation every epoch
  uint64_t seed = 1;       // data.seed (null in the config means 1)
  bool drop_last = true;   // verl's train loader drops the last incomplete batch
  int64_t total_epochs = 1;  // next() returns nullopt after this many passes
  int64_t num_workers = 1;  // data.dataloader_num_workers: threads preparing batches (0: in next())
  int64_t prefetch_factor = 2;  // data.prefetch_factor: batches each worker prepares ahead

  // The training loader of a config: gen_batch_size, shuffle, seed, trainer.total_epochs,
  // dataloader_num_workers, prefetch_factor, drop_last.
  static LoaderOptions train_from_config(const config::Config& cfg);
  // The validation loader: every row once, val_batch_size (null: the whole set in one batch),
  // validation_shuffle, no drop_last.
  static LoaderOptions val_from_config(const config::Config& cfg, int64_t dataset_size);
};

struct Batch {
  int64_t epoch = 0;             // 0-based
  int64_t batch = 0;             // 0-based batch number within the epoch
  std::vector<int64_t> indices;  // dataset rows, in batch order
  std::vector<Sample> samples;   // rendered and tokenized, same order
};

// The permutation of [0, n) used in `epoch`: Fisher-Yates driven by Philox(seed, stream = epoch),
// so any epoch's order can be recomputed from (seed, epoch) alone.
std::vector<int64_t> shuffled_order(int64_t n, uint64_t seed, int64_t epoch);

class DataLoader {
 public:
  // `dataset` must outlive the loader. An empty epoch (drop_last with fewer rows than
  // batch_size) is an Error naming both sizes.
  DataLoader(const RLDataset& dataset, const LoaderOptions& opts);
  ~DataLoader();  // stops and joins the worker threads
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next batch, crossing epochs; nullopt once total_epochs are done. An exception raised
  // while preparing a batch (e.g. a prompt over the limit with truncation=error) is rethrown
  // here when that batch is due, and again on later calls until load_state()/rewind().
  std::optional<Batch> next();

  int64_t batches_per_epoch() const { return batches_per_epoch_; }  // len(dataloader)
  int64_t total_batches() const { return batches_per_epoch_ * opts_.total_epochs; }
  int64_t epoch() const { return position() / batches_per_epoch_; }
  // Dataset rows of `epoch` in the order they are served.
  std::vector<int64_t> epoch_order(int64_t epoch) const;

  // Checkpoint state: {"version", "epoch", "batch", "seed", "shuffle", "batch_size",
  // "dataset_size", "drop_last"}; epoch/batch is the next batch next() will return.
  nlohmann::json state() const;
  // Restores a state() (from this or another process); the following batches equal those the
  // saved loader would have produced. A state from a different seed, dataset size or batch
  // layout is an Error naming the key.
  void load_state(const nlohmann::json& state);
  // Back to the start of `epoch` (validation loaders rewind before each validation).
  void rewind(int64_t epoch = 0);

  // Seconds the consumer spent blocked in next() in total, and in the last call (timing_s/data).
  double data_wait_seconds() const { return total_wait_s_; }
  double last_wait_seconds() const { return last_wait_s_; }
  const LoaderOptions& options() const { return opts_; }

 private:
  struct Slot {
    std::optional<Batch> batch;
    std::exception_ptr error;
  };
  int64_t position() const { return start_ + consumed_; }  // global number of the next batch
  Batch make_batch(int64_t global) const;
  std::shared_ptr<const std::vector<int64_t>> order_for(int64_t epoch) const;
  void start_workers();
  void stop_workers();
  void worker_loop();
  void seek(int64_t global);

  const RLDataset* ds_;
  LoaderOptions opts_;
  int64_t batches_per_epoch_ = 0;

  // Batches are numbered globally (epoch * batches_per_epoch + batch). Tickets count from start_:
  // ticket t is global batch start_ + t. Workers claim tickets in order; the consumer takes them
  // in order from `ready_`, so the output never depends on thread timing.
  int64_t start_ = 0;
  int64_t consumed_ = 0;     // tickets handed to the consumer
  int64_t next_ticket_ = 0;  // next ticket a worker claims
  std::map<int64_t, Slot> ready_;
  std::exception_ptr failed_;
  bool stop_ = false;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::thread> workers_;

  mutable std::mutex order_mu_;
  mutable std::map<int64_t, std::shared_ptr<const std::vector<int64_t>>> orders_;  // recent epochs

  double total_wait_s_ = 0, last_wait_s_ = 0;
};

}  // namespace verl::data
