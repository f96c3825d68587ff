// Every key that docs/config.md lists as supported is read by the code that runs it. The PPO
// trainer (a GRPO run with a reference policy, validation and the generation dumps; a PPO run with
// a critic and a KL penalty in the reward; a resume of it; a run with data.dynamic_batch and
// rollout.length_dist) and the SFT trainer run on the demo configs; the Config records every key
// they read (Config::read_keys). A supported key that nothing read is one whose setting would
// silently change nothing: mark it @ignored or @unsupported with a reason in configs/*.yaml, or
// make the code read it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "../common/test_util.h"
#include "config/config.h"
#include "config/detail.h"
#include "core/file.h"
#include "core/rng.h"
#include "demo_reward_model.h"
#include "model/config.h"
#include "model/hf_files.h"
#include "model/weights.h"
#include "trainer/ppo_trainer.h"
#include "trainer/sft.h"

namespace verl::trainer {
namespace {

namespace fs = std::filesystem;
const std::string kRoot = VERL_SOURCE_DIR;

// Supported keys none of these runs reads, each with why. Keep it short: a key belongs here only
// when the mode that reads it cannot run in this test and a test elsewhere runs it.
const std::map<std::string, std::string> kPpoAllowed = {
    // Read only with several data-parallel ranks (tests/e2e/data_parallel runs them).
    {"trainer.balance_batch", "one rank has nothing to balance; read with several ranks"},
};
const std::map<std::string, std::string> kSftAllowed = {};

// The leaves `runs` read. A key that a read key takes through its default ${...} is read too
// (trainer.project_name through trainer.default_local_dir).
std::set<std::string> keys_read(const config::Schema& schema,
                                const std::vector<const config::Config*>& runs) {
  std::set<std::string> read;
  for (const config::Config* c : runs)
    for (const auto& k : c->read_keys()) read.insert(k);
  static const std::regex interp(R"(\$\{([^}]*)\})");
  for (std::vector<std::string> todo(read.begin(), read.end()); !todo.empty();) {
    const config::KeySpec& k = schema.at(todo.back());
    todo.pop_back();
    for (std::sregex_iterator it(k.default_text.begin(), k.default_text.end(), interp), end;
         it != end; ++it) {
      const std::string ref = config::detail::parse_ref((*it)[1].str(), k.path).path;
      const config::KeySpec* r = ref.empty() ? nullptr : schema.find(ref);
      if (!r || !r->is_leaf() || !read.insert(ref).second) continue;
      todo.push_back(ref);
    }
  }
  return read;
}

// The supported leaves of `schema` that none of `runs` read and `allowed` does not excuse; a key
// whose only allowed value is its default carries nothing to read. An allowlisted key that was
// read after all is listed too: the allowlist only holds keys that need it.
std::vector<std::string> unread_supported(const config::Schema& schema,
                                          const std::vector<const config::Config*>& runs,
                                          const std::map<std::string, std::string>& allowed) {
  const std::set<std::string> read = keys_read(schema, runs);
  std::vector<std::string> out;
  for (const auto& [k, why] : allowed)
    if (read.count(k)) out.push_back(k + " is read: remove it from the allowlist");
  for (const config::KeySpec& k : schema.keys()) {
    if (!k.is_leaf() || k.support != config::Support::Supported) continue;
    if (read.count(k.path) || allowed.count(k.path)) continue;
    if (k.choices.size() == 1 && !k.nullable && k.type == config::Type::String) continue;
    if (k.group) continue;  // a Hydra group choice (model_engine=dp): the loader acts on it
    out.push_back(k.path + " (" + schema.source() + ":" + std::to_string(k.line) + ")");
  }
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& e : v) s += "\n  " + e;
  return s;
}

config::Config demo_config(const std::string& out, std::vector<std::string> extra) {
  std::vector<std::string> o = {
      "actor_rollout_ref.model.path=" + kRoot + "/assets/demo/model",
      "critic.model.path=" + kRoot + "/assets/demo/model",
      "data.train_files=[" + kRoot + "/assets/demo/train.jsonl]",
      "data.val_files=[" + kRoot + "/assets/demo/val.jsonl]",
      "data.val_max_samples=4",
      "data.train_batch_size=4",
      "actor_rollout_ref.actor.ppo_mini_batch_size=4",
      "actor_rollout_ref.rollout.n=2",
      "trainer.total_training_steps=1",
      "trainer.logger=[jsonl]",
      "trainer.default_local_dir=" + out,
  };
  o.insert(o.end(), extra.begin(), extra.end());
  return test::demo_config(o);
}

TEST(ConfigReads, EverySupportedPpoKeyIsRead) {
  const test::TempDir scratch("rc_reads_ppo");
  const fs::path& tmp = scratch.path();
  // GRPO: the reference policy (KL loss), validation (sampled) before and after the step, the
  // dumps, and micro-batches by sequence count (the deprecated global sizes among them).
  config::Config grpo = demo_config(
      (tmp / "grpo").string(), {"actor_rollout_ref.actor.use_kl_loss=true", "trainer.test_freq=1",
                                "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
                                "actor_rollout_ref.actor.use_dynamic_bsz=false",
                                "actor_rollout_ref.actor.ppo_micro_batch_size=4",
                                "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=3",
                                "trainer.rollout_data_dir=" + (tmp / "grpo_rollouts").string(),
                                "trainer.validation_data_dir=" + (tmp / "grpo_val").string(),
                                "trainer.log_val_generations=2"});
  {
    PpoTrainer t(grpo);
    t.fit();
  }
  // verl's _dump_generations: one line per sample of the step (4 prompts x n=2), and per
  // validation (4 prompts x val_kwargs.n=1) before training (step 0) and after step 1.
  auto lines = [](const fs::path& p) {
    std::vector<nlohmann::json> out;
    std::ifstream f(p);
    for (std::string l; std::getline(f, l);) out.push_back(nlohmann::json::parse(l));
    return out;
  };
  const auto rollouts = lines(tmp / "grpo_rollouts" / "1.jsonl");
  ASSERT_EQ(rollouts.size(), 8u);
  for (const char* k : {"input", "output", "gts", "score", "step"})
    EXPECT_TRUE(rollouts[0].contains(k)) << k;
  EXPECT_EQ(rollouts[0]["step"], 1);
  EXPECT_EQ(lines(tmp / "grpo_val" / "0.jsonl").size(), 4u);
  EXPECT_EQ(lines(tmp / "grpo_val" / "1.jsonl").size(), 4u);
  // PPO: a critic (GAE), the KL penalty in the reward (old log-probs and the reference policy),
  // off-policy mini-batches, checkpoints, sequence-count micro-batches for the old log-probs and
  // the critic.
  config::Config ppo = demo_config(
      (tmp / "ppo").string(),
      {"algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true",
       "actor_rollout_ref.actor.ppo_mini_batch_size=2", "trainer.save_freq=1",
       "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=false",
       "actor_rollout_ref.rollout.log_prob_micro_batch_size=3", "critic.use_dynamic_bsz=false",
       "critic.ppo_micro_batch_size=2", "trainer.total_training_steps=2",
       "trainer.max_critic_ckpt_to_keep=1", "actor_rollout_ref.rollout.response_length=4",
       "trainer.val_before_train=false", "data.val_files=null"});
  {
    PpoTrainer t(ppo);
    t.fit();
  }
  // rollout.response_length bounds the responses (the demo's are longer than 4 tokens);
  // max_critic_ckpt_to_keep=1 keeps the newest critic only, every actor stays.
  {
    std::ifstream f(tmp / "ppo" / "metrics.jsonl");
    std::string l;
    int steps = 0;
    while (std::getline(f, l)) {
      const auto j = nlohmann::json::parse(l);
      EXPECT_LE(j["response_length/max"].get<double>(), 4.0);
      EXPECT_GT(j["response_length/clip_ratio"].get<double>(), 0.0);
      ++steps;
    }
    EXPECT_EQ(steps, 2);
  }
  EXPECT_TRUE(fs::exists(tmp / "ppo" / "global_step_1" / "actor"));
  EXPECT_FALSE(fs::exists(tmp / "ppo" / "global_step_1" / "critic"));
  EXPECT_TRUE(fs::exists(tmp / "ppo" / "global_step_2" / "critic"));
  // A resume from a named checkpoint with a reward command (the run is complete: no step, nothing
  // scored).
  config::Config resumed =
      demo_config((tmp / "ppo").string(),
                  {"algorithm.adv_estimator=gae", "trainer.total_training_steps=2",
                   "trainer.resume_mode=resume_path",
                   "trainer.resume_from_path=" + (tmp / "ppo" / "global_step_2").string(),
                   "custom_reward_function.command=cat", "trainer.val_before_train=false",
                   "data.val_files=null"});
  {
    PpoTrainer t(resumed);
    t.fit();
    EXPECT_EQ(t.global_step(), 2);
  }
  // A reward model scores the responses (micro-batches by sequence count, a length cap).
  config::Config rm = demo_config(
      (tmp / "rm").string(),
      {"reward_model.enable=true",
       "reward_model.model.path=" + test::make_demo_reward_model(tmp / "rm_model"),
       "reward_model.use_dynamic_bsz=false", "reward_model.micro_batch_size_per_gpu=3",
       "reward_model.max_length=64", "trainer.val_before_train=false", "data.val_files=null"});
  {
    PpoTrainer t(rm);
    t.fit();
  }
  // data.dynamic_batch and rollout.length_dist (their keys are read only when they are on), with
  // GDPO over a Python reward's components (read only with gdpo and a reward file).
  config::Config dyn = demo_config(
      (tmp / "dyn").string(),
      {"data.dynamic_batch.enable=true", "data.dynamic_batch.base_batch_size=2",
       "data.dynamic_batch.min_sequence_length=1", "trainer.val_before_train=false",
       "actor_rollout_ref.rollout.length_dist.type=lognormal",
       "actor_rollout_ref.rollout.length_dist.mean=8",
       "actor_rollout_ref.rollout.length_dist.cap=16", "data.val_files=null",
       "custom_reward_function.path=" + kRoot + "/tests/fixtures/python_reward/arith_reward.py",
       "custom_reward_function.name=compute_score_parts", "algorithm.adv_estimator=gdpo",
       "algorithm.gdpo_reward_keys=[acc,format]", "algorithm.gdpo_reward_weights=[1.0,0.5]"});
  {
    PpoTrainer t(dyn);
    t.fit();
  }
  const std::vector<std::string> unread =
      unread_supported(ppo.schema(), {&grpo, &ppo, &resumed, &rm, &dyn}, kPpoAllowed);
  EXPECT_TRUE(unread.empty())
      << unread.size()
      << " supported keys of the PPO config were never read (mark them @ignored or "
         "@unsupported with a reason in configs/ppo_trainer.yaml, or read them):"
      << join(unread);
  for (const auto& [k, why] : kPpoAllowed) {
    EXPECT_NE(ppo.schema().find(k), nullptr) << "allowlisted key " << k << " is not in the schema";
    EXPECT_EQ(ppo.schema().at(k).support, config::Support::Supported)
        << k << " is allowlisted but not supported";
  }
}

TEST(ConfigReads, EverySupportedSftKeyIsRead) {
  const test::TempDir scratch("rc_reads_sft");
  const fs::path& tmp = scratch.path();
  {
    std::ifstream in(kRoot + "/assets/demo/sft.jsonl");
    std::ofstream out(tmp / "sft.jsonl");
    std::string line;
    for (int i = 0; i < 16 && std::getline(in, line); ++i) out << line << '\n';
  }
  config::LoadOptions lo;
  lo.defaults_path = kRoot + "/configs/sft_trainer.yaml";
  config::Config cfg = config::load_config(
      kRoot + "/configs/demo/sft.yaml",
      {"model.partial_pretrain=" + kRoot + "/assets/demo/model",
       "data.train_files=[" + (tmp / "sft.jsonl").string() + "]",
       "data.val_files=[" + (tmp / "sft.jsonl").string() + "]", "data.train_batch_size=8",
       "trainer.total_training_steps=1", "trainer.logger=[jsonl]",
       "trainer.default_local_dir=" + (tmp / "out").string()},
      lo);
  run_sft(cfg);
  const std::vector<std::string> unread = unread_supported(cfg.schema(), {&cfg}, kSftAllowed);
  EXPECT_TRUE(unread.empty())
      << unread.size()
      << " supported keys of the SFT config were never read (mark them @ignored or "
         "@unsupported with a reason, or read them):"
      << join(unread);
}

// The record itself: reads through an alias count for the target, printing counts for nothing,
// copies share one record.
TEST(ConfigReads, RecordFollowsAliasesAndCopies) {
  config::Config cfg = config::load_config("", {});
  (void)cfg.to_yaml();
  (void)cfg.to_json();
  EXPECT_TRUE(cfg.read_keys().empty());
  config::Config copy = cfg;
  (void)copy.get<int64_t>("trainer.total_epochs");
  EXPECT_TRUE(cfg.was_read("trainer.total_epochs"));
  EXPECT_FALSE(cfg.was_read("trainer.test_freq"));
  (void)cfg.get<std::optional<int64_t>>(
      "trainer.save_total_limit");  // alias of max_actor_ckpt_to_keep, ...
  EXPECT_TRUE(cfg.was_read("trainer.max_actor_ckpt_to_keep"));
  cfg.clear_reads();
  EXPECT_TRUE(copy.read_keys().empty());
}

}  // namespace
}  // namespace verl::trainer
