// DataLoader: per-epoch Philox permutations, drop_last, exact resume, and a bounded prefetch
// of whole batches by worker threads (as torch's DataLoader workers, in order, timing-independent).
#include "data/dataloader.h"

#include <algorithm>
#include <system_error>

#include "config/config.h"
#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/timer.h"

namespace verl::data {

namespace {
// Philox stream tag of the data order, kept apart from other consumers of the same seed.
constexpr uint64_t kShuffleStream = 0xDA7A5EEDull << 32;
constexpr int64_t kStateVersion = 1;
}  // namespace

std::vector<int64_t> shuffled_order(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  Rng rng(seed, kShuffleStream | static_cast<uint64_t>(epoch));
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

LoaderOptions LoaderOptions::train_from_config(const config::Config& cfg) {
  LoaderOptions o;
  o.batch_size = cfg.get<int64_t>("data.gen_batch_size");
  o.shuffle = cfg.get<bool>("data.shuffle");
  o.seed = static_cast<uint64_t>(cfg.get<std::optional<int64_t>>("data.seed").value_or(1));
  o.drop_last = true;
  o.total_epochs = cfg.get<int64_t>("trainer.total_epochs");
  o.num_workers = cfg.get<int64_t>("data.dataloader_num_workers");
  o.prefetch_factor = cfg.get<int64_t>("data.prefetch_factor");
  return o;
}

LoaderOptions LoaderOptions::val_from_config(const config::Config& cfg, int64_t dataset_size) {
  LoaderOptions o;
  o.batch_size = cfg.get<std::optional<int64_t>>("data.val_batch_size")
                     .value_or(std::max<int64_t>(dataset_size, 1));
  o.shuffle = cfg.get<bool>("data.validation_shuffle");
  o.seed = static_cast<uint64_t>(cfg.get<std::optional<int64_t>>("data.seed").value_or(1));
  o.drop_last = false;
  o.total_epochs = 1;
  // Validation has few batches (often one): two threads are plenty.
  o.num_workers = std::min<int64_t>(cfg.get<int64_t>("data.dataloader_num_workers"), 2);
  o.prefetch_factor = cfg.get<int64_t>("data.prefetch_factor");
  return o;
}

DataLoader::DataLoader(const RLDataset& dataset, const LoaderOptions& opts)
    : ds_(&dataset), opts_(opts) {
  VERL_CHECK(opts_.batch_size >= 1, "data loader: batch size must be >= 1, got {}",
             opts_.batch_size);
  VERL_CHECK(opts_.total_epochs >= 1, "data loader: total_epochs must be >= 1, got {}",
             opts_.total_epochs);
  VERL_CHECK(opts_.num_workers >= 0, "data.dataloader_num_workers must be >= 0, got {}",
             opts_.num_workers);
  VERL_CHECK(opts_.prefetch_factor >= 1, "data.prefetch_factor must be >= 1, got {}",
             opts_.prefetch_factor);
  const int64_t n = ds_->size();
  batches_per_epoch_ =
      opts_.drop_last ? n / opts_.batch_size : (n + opts_.batch_size - 1) / opts_.batch_size;
  VERL_CHECK(batches_per_epoch_ > 0,
             "data loader: the dataset has {} rows, fewer than one batch of {} "
             "(drop_last drops an incomplete batch); lower data.train_batch_size or add rows",
             n, opts_.batch_size);
}

DataLoader::~DataLoader() {
  stop_workers();
}

std::shared_ptr<const std::vector<int64_t>> DataLoader::order_for(int64_t epoch) const {
  std::lock_guard<std::mutex> lock(order_mu_);
  auto it = orders_.find(epoch);
  if (it != orders_.end()) return it->second;
  std::vector<int64_t> order;
  if (opts_.shuffle) {
    order = shuffled_order(ds_->size(), opts_.seed, epoch);
  } else {
    order.resize(static_cast<size_t>(ds_->size()));
    for (int64_t i = 0; i < ds_->size(); ++i) order[i] = i;
  }
  auto shared = std::make_shared<const std::vector<int64_t>>(std::move(order));
  orders_[epoch] = shared;
  // Workers are at most a few batches apart, so two epochs cover them.
  while (orders_.size() > 2) orders_.erase(orders_.begin());
  return shared;
}

std::vector<int64_t> DataLoader::epoch_order(int64_t epoch) const {
  return *order_for(epoch);
}

Batch DataLoader::make_batch(int64_t global) const {
  Batch b;
  b.epoch = global / batches_per_epoch_;
  b.batch = global % batches_per_epoch_;
  auto order = order_for(b.epoch);
  const int64_t begin = b.batch * opts_.batch_size;
  const int64_t end =
      std::min<int64_t>(begin + opts_.batch_size, static_cast<int64_t>(order->size()));
  b.indices.assign(order->begin() + begin, order->begin() + end);
  b.samples.reserve(b.indices.size());
  for (int64_t i : b.indices) b.samples.push_back(ds_->get(i));
  return b;
}

void DataLoader::worker_loop() {
  const int64_t capacity = opts_.num_workers * opts_.prefetch_factor;
  const int64_t total = total_batches();
  while (true) {
    int64_t ticket, global;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || (next_ticket_ < consumed_ + capacity && start_ + next_ticket_ < total);
      });
      if (stop_) return;
      ticket = next_ticket_++;
      global = start_ + ticket;
    }
    Slot slot;
    try {
      slot.batch = make_batch(global);
    } catch (...) {
      slot.error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      ready_[ticket] = std::move(slot);
    }
    cv_.notify_all();
  }
}

void DataLoader::start_workers() {
  if (!workers_.empty() || opts_.num_workers == 0) return;
  stop_ = false;
  try {
    for (int64_t w = 0; w < opts_.num_workers; ++w)
      workers_.emplace_back([this] { worker_loop(); });
  } catch (const std::system_error& e) {  // a process or container limit on threads
    const size_t started = workers_.size();
    stop_workers();
    VERL_FAIL(
        "data loader: could start only {} of {} worker threads ({}); lower "
        "data.dataloader_num_workers",
        started, opts_.num_workers, e.what());
  }
}

void DataLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

std::optional<Batch> DataLoader::next() {
  Timer timer;
  last_wait_s_ = 0;
  if (failed_) std::rethrow_exception(failed_);
  if (position() >= total_batches()) return std::nullopt;
  Slot slot;
  if (opts_.num_workers == 0) {
    try {
      slot.batch = make_batch(position());
    } catch (...) {
      slot.error = std::current_exception();
    }
  } else {
    start_workers();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return ready_.count(consumed_) > 0; });
    auto it = ready_.find(consumed_);
    slot = std::move(it->second);
    ready_.erase(it);
  }
  last_wait_s_ = timer.seconds();
  total_wait_s_ += last_wait_s_;
  if (slot.error) {
    failed_ = slot.error;
    std::rethrow_exception(failed_);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++consumed_;
  }
  cv_.notify_all();  // a slot in the prefetch window is free again
  return std::move(slot.batch);
}

void DataLoader::seek(int64_t global) {
  stop_workers();
  std::lock_guard<std::mutex> lock(mu_);
  ready_.clear();
  failed_ = nullptr;
  start_ = global;
  consumed_ = 0;
  next_ticket_ = 0;
  stop_ = false;
  // Workers restart lazily on the next call to next().
}

void DataLoader::rewind(int64_t epoch) {
  VERL_CHECK(epoch >= 0 && epoch < opts_.total_epochs,
             "data loader: cannot rewind to epoch {} of {}", epoch, opts_.total_epochs);
  seek(epoch * batches_per_epoch_);
}

nlohmann::json DataLoader::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t pos = start_ + consumed_;
  return nlohmann::json{{"version", kStateVersion},          {"epoch", pos / batches_per_epoch_},
                        {"batch", pos % batches_per_epoch_}, {"seed", opts_.seed},
                        {"shuffle", opts_.shuffle},          {"batch_size", opts_.batch_size},
                        {"drop_last", opts_.drop_last},      {"dataset_size", ds_->size()}};
}

void DataLoader::load_state(const nlohmann::json& st) {
  VERL_CHECK(st.is_object(), "data loader state: expected a JSON object, got {}", st.type_name());
  auto get_int = [&](const char* key) -> int64_t {
    VERL_CHECK(st.contains(key) && st[key].is_number_integer(),
               "data loader state: '{}' is missing or not "
               "an integer",
               key);
    return st[key].get<int64_t>();
  };
  const int64_t version = get_int("version");
  VERL_CHECK(version == kStateVersion,
             "data loader state: version {} is not supported (expected {})", version,
             kStateVersion);
  // The saved position only means the same thing when the order and the batch layout match.
  auto expect_same = [&](const char* key, const nlohmann::json& ours, const char* hint) {
    VERL_CHECK(st.contains(key) && st[key] == ours,
               "data loader state: '{}' is {} in the checkpoint but {} now; "
               "{}",
               key, st.contains(key) ? st[key].dump() : "missing", ours.dump(), hint);
  };
  expect_same("dataset_size", ds_->size(),
              "the dataset changed since the checkpoint (files, filters, max_samples)");
  expect_same("batch_size", opts_.batch_size, "data.train_batch_size/gen_batch_size changed");
  expect_same("shuffle", opts_.shuffle, "data.shuffle changed");
  expect_same("drop_last", opts_.drop_last, "drop_last changed");
  if (opts_.shuffle) expect_same("seed", opts_.seed, "data.seed changed");
  const int64_t epoch = get_int("epoch"), batch = get_int("batch");
  VERL_CHECK(epoch >= 0 && batch >= 0 && batch < batches_per_epoch_,
             "data loader state: position (epoch {}, "
             "batch {}) is outside an epoch of {} batches",
             epoch, batch, batches_per_epoch_);
  seek(epoch * batches_per_epoch_ + batch);
}

}  // namespace verl::data
