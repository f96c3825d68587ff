// Checkpoints: a run stopped after a save and resumed with resume_mode=auto continues exactly as an
// uninterrupted run (same metrics, same weights); an interrupted save (a leftover temporary
// directory) is ignored; only the newest max_actor_ckpt_to_keep checkpoints remain; export works.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../common/test_util.h"
#include "config/config.h"
#include "core/error.h"
#include "model/safetensors.h"
#include "trainer/checkpoint.h"
#include "trainer/ppo_trainer.h"

namespace verl::trainer {
namespace {

namespace fs = std::filesystem;
const std::string kRoot = VERL_SOURCE_DIR;

config::Config cfg_for(const std::string& out, int64_t steps, std::vector<std::string> extra = {}) {
  std::vector<std::string> o = {
      "actor_rollout_ref.model.path=" + kRoot + "/assets/demo/model",
      "data.train_files=[" + kRoot + "/assets/demo/train.jsonl]",
      "data.val_files=null",
      "data.train_batch_size=4",
      "actor_rollout_ref.actor.ppo_mini_batch_size=2",  // two mini-batches: old_log_prob is
                                                        // computed
      "actor_rollout_ref.rollout.n=2",
      "trainer.total_training_steps=" + std::to_string(steps),
      "trainer.logger=[jsonl]",
      "trainer.save_freq=2",
      "trainer.max_actor_ckpt_to_keep=2",
      "trainer.default_local_dir=" + out,
  };
  o.insert(o.end(), extra.begin(), extra.end());
  return test::demo_config(o);
}

std::vector<nlohmann::json> read_metrics(const std::string& dir) {
  std::ifstream f(dir + "/metrics.jsonl");
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

// Metrics that must repeat exactly (timings and throughput do not).
void expect_same_learning(const nlohmann::json& a, const nlohmann::json& b) {
  for (const char* k : {"critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/entropy",
                        "response_length/mean", "critic/advantages/mean"}) {
    ASSERT_TRUE(a.contains(k) && b.contains(k)) << k;
    EXPECT_EQ(a[k].get<double>(), b[k].get<double>()) << k << " at step " << a["step"];
  }
}

TEST(Checkpoint, ResumeContinuesExactlyAndKeepsTheNewest) {
  const test::TempDir scratch("test_ckpt");
  const fs::path& tmp = scratch.path();
  const std::string full = (tmp / "full").string(), part = (tmp / "part").string();
  std::vector<float> full_weights;
  {
    PpoTrainer t(cfg_for(full, 6));
    t.fit();
    full_weights = t.actor().data;
  }
  // Retention: saves at 2, 4, 6; the two newest stay.
  EXPECT_FALSE(fs::exists(fs::path(full) / "global_step_2"));
  EXPECT_TRUE(
      fs::exists(fs::path(full) / "global_step_4" / "actor" / "huggingface" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(fs::path(full) / "global_step_6" / "trainer_state.json"));
  EXPECT_EQ(find_latest_checkpoint(full), (fs::path(full) / "global_step_6").string());

  {  // A run that stops after step 4 (its save at 4 is complete)...
    PpoTrainer t(cfg_for(part, 6, {"trainer.total_training_steps=4"}));
    t.fit();
  }
  // ... and a save of step 6 that was killed half way: a temporary directory without its rename.
  fs::create_directories(fs::path(part) / ".tmp_global_step_6" / "actor");
  std::ofstream(fs::path(part) / ".tmp_global_step_6" / "actor" / "optim.safetensors") << "partial";
  std::vector<float> resumed_weights;
  {
    PpoTrainer t(cfg_for(part, 6));
    t.fit();
    EXPECT_EQ(t.global_step(), 6);
    resumed_weights = t.actor().data;
  }
  auto a = read_metrics(full), b = read_metrics(part);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);  // steps 1-4 from the first run, 5-6 appended after resuming
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(a[i]["step"], b[i]["step"]);
    expect_same_learning(a[i], b[i]);
  }
  ASSERT_EQ(full_weights.size(), resumed_weights.size());
  EXPECT_TRUE(full_weights == resumed_weights)
      << "resumed weights differ from the uninterrupted run";
}

TEST(Checkpoint, BadCheckpointsAreClearErrors) {
  const test::TempDir scratch("test_ckpt_bad");
  const fs::path& tmp = scratch.path();
  std::ofstream(tmp / "latest_checkpointed_iteration.txt") << "8";
  const std::string msg = test::expected_error_of([&] { find_latest_checkpoint(tmp.string()); });
  EXPECT_NE(msg.find("global_step_8"), std::string::npos) << msg;
}

TEST(Checkpoint, TrackerHoldingGarbageSaysSo) {
  const test::TempDir scratch("test_ckpt_garbage");
  const fs::path& tmp = scratch.path();
  std::ofstream(tmp / "latest_checkpointed_iteration.txt") << "garbage\n";
  const std::string msg = test::expected_error_of([&] { find_latest_checkpoint(tmp.string()); });
  EXPECT_NE(msg.find((tmp / "latest_checkpointed_iteration.txt").string() +
                     " should hold a step number but holds "
                     "'garbage'"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("step 0"), std::string::npos) << msg;
}

// A directory holding steps 4 and 6 (another run's) and a save of step 2 with keep = 2: the
// checkpoint just written stays and the tracker names it; the oldest other one goes.
TEST(Checkpoint, RetentionNeverDeletesTheCheckpointJustWritten) {
  const test::TempDir scratch("test_ckpt_keep");
  const fs::path& tmp = scratch.path();
  for (int s : {4, 6}) {
    fs::create_directories(tmp / ("global_step_" + std::to_string(s)));
    std::ofstream(tmp / ("global_step_" + std::to_string(s)) / "trainer_state.json") << "{}";
  }
  const model::Weights w = model::Weights::load(kRoot + "/assets/demo/model");
  AdamWState opt = fresh_optimizer_state(w.layout.total);
  const std::string dir = save_checkpoint(tmp.string(), 2, ModelState{&w, &opt, std::nullopt, 0},
                                          std::nullopt, nlohmann::json::object(), "", /*keep=*/2);
  EXPECT_EQ(dir, (tmp / "global_step_2").string());
  EXPECT_TRUE(fs::exists(tmp / "global_step_2" / "trainer_state.json"));
  EXPECT_EQ(find_latest_checkpoint(tmp.string()), dir);
  EXPECT_FALSE(fs::exists(tmp / "global_step_4"));
  EXPECT_TRUE(fs::exists(tmp / "global_step_6"));
}

// trainer.resume_mode=disable in a directory that holds checkpoints is an explicit error.
TEST(Checkpoint, FreshRunInADirectoryWithCheckpointsIsAnError) {
  const test::TempDir scratch("test_ckpt_fresh");
  const fs::path& tmp = scratch.path();
  for (int s : {4, 6}) fs::create_directories(tmp / ("global_step_" + std::to_string(s)));
  PpoTrainer t(cfg_for(tmp.string(), 2, {"trainer.resume_mode=disable"}));
  const std::string msg = test::expected_error_of([&] { t.fit(); });
  EXPECT_NE(msg.find(tmp.string() + " already holds checkpoints (steps 4, 6)"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("trainer.resume_mode=auto"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(tmp / "global_step_2"));
}

}  // namespace
}  // namespace verl::trainer

namespace verl::trainer {
namespace {

// Optimizer shards (checkpoint.h): a slice written as one rank's shard loads back whole or as any
// other slice (resharding on load), and a missing or inconsistent shard is an error naming the
// file.
TEST(Checkpoint, OptimizerShardsReshardOnLoad) {
  const test::TempDir scratch("test_ckpt_shards");
  const fs::path& tmp = scratch.path();
  model::Weights w = model::Weights::load(kRoot + "/assets/demo/model");
  const int64_t n = w.layout.total;
  AdamWState whole;
  whole.step = 7;
  for (int64_t i = 0; i < n; ++i) {
    whole.exp_avg.push_back(0.001f * static_cast<float>(i % 1000));
    whole.exp_avg_sq.push_back(1e-6f * static_cast<float>(i % 777));
  }
  // One rank's sharded state covering everything: written as optim_world_size_1_rank_0.
  ModelState ms{&w, &whole, optim::ShardSpec{0, n}, n};
  const std::string dir =
      save_checkpoint(tmp.string(), 3, ms, std::nullopt, {{"dataloader", {}}}, "", 0);
  ASSERT_TRUE(fs::exists(fs::path(dir) / "actor" / "optim_world_size_1_rank_0.safetensors"));
  ASSERT_FALSE(fs::exists(fs::path(dir) / "actor" / "optim.safetensors"));
  model::Weights back{w.config, w.layout, {}};
  AdamWState opt;
  load_checkpoint(dir, back, opt, nullptr, nullptr);
  EXPECT_EQ(opt.step, 7);
  EXPECT_TRUE(opt.exp_avg == whole.exp_avg && opt.exp_avg_sq == whole.exp_avg_sq);
  EXPECT_TRUE(back.data == w.data);
  // Any slice, e.g. rank 1 of 3.
  const int64_t chunk = (n + 2) / 3;
  const optim::ShardSpec mine{chunk, 2 * chunk};
  load_checkpoint(dir, back, opt, nullptr, nullptr, &mine);
  ASSERT_EQ(static_cast<int64_t>(opt.exp_avg.size()), chunk);
  EXPECT_TRUE(std::equal(opt.exp_avg.begin(), opt.exp_avg.end(), whole.exp_avg.begin() + chunk));
  EXPECT_TRUE(
      std::equal(opt.exp_avg_sq.begin(), opt.exp_avg_sq.end(), whole.exp_avg_sq.begin() + chunk));
  // A second shard set of another world size, then a missing shard.
  const fs::path actor = fs::path(dir) / "actor";
  fs::copy_file(actor / "optim_world_size_1_rank_0.safetensors",
                actor / "optim_world_size_2_rank_0.safetensors");
  std::string err = test::error_of([&] { load_checkpoint(dir, back, opt, nullptr, nullptr); });
  EXPECT_NE(err.find("optimizer shards of world sizes"), std::string::npos) << err;
  fs::remove(actor / "optim_world_size_1_rank_0.safetensors");
  err = test::error_of([&] { load_checkpoint(dir, back, opt, nullptr, nullptr); });
  EXPECT_NE(err.find("optim_world_size_2_rank_1.safetensors: shard 1 of 2 is missing"),
            std::string::npos)
      << err;
}

// A file of another kind in the optimizer's place (its metadata "format" says so: a corrupted
// header used to load as long as the tensors fit), and a global_step_N directory whose N overflows
// int64 (was "error: stoll"), are errors naming the path.
TEST(Checkpoint, ForeignFilesAndStepNamesAreNamed) {
  const test::TempDir scratch("test_ckpt_foreign");
  const fs::path& tmp = scratch.path();
  model::Weights w = model::Weights::load(kRoot + "/assets/demo/model");
  const int64_t n = w.layout.total;
  AdamWState opt = fresh_optimizer_state(n);
  const std::string dir = save_checkpoint(tmp.string(), 1, ModelState{&w, &opt, std::nullopt, 0},
                                          std::nullopt, {{"dataloader", {}}}, "", 0);
  const fs::path optim = fs::path(dir) / "actor" / "optim.safetensors";
  model::write_safetensors(optim.string(),
                           {{"exp_avg", DType::F32, {n}, opt.exp_avg.data()},
                            {"exp_avg_sq", DType::F32, {n}, opt.exp_avg_sq.data()}},
                           {{"format", "9erl.cpp-adamw"}, {"step", "1"}});
  model::Weights back{w.config, w.layout, {}};
  std::string err = test::error_of([&] { load_checkpoint(dir, back, opt, nullptr, nullptr); });
  EXPECT_NE(err.find(optim.string() +
                     ": metadata 'format' is '9erl.cpp-adamw', expected 'verl.cpp-adamw'"),
            std::string::npos)
      << err;
  fs::create_directories(tmp / "global_step_99999999999999999999999");
  err = test::error_of([&] { check_fresh_run_dir(tmp.string()); });
  EXPECT_NE(
      err.find("global_step_99999999999999999999999: not a checkpoint step this trainer writes"),
      std::string::npos)
      << err;
}

}  // namespace
}  // namespace verl::trainer
