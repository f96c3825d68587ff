// Tests of the configuration system: verl's defaults, a ported verl GRPO config, overrides of every
// type, interpolation, error messages (unknown keys with suggestions, wrong types, values outside
// the allowed set, unsupported verl keys), aliases, round trips and the docs-in-sync check.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../common/test_util.h"
#include "config/config.h"
#include "core/error.h"

namespace verl::config {
namespace {

const std::string kRoot = VERL_SOURCE_DIR;

Config load(const std::vector<std::string>& overrides, const std::string& yaml = "") {
  return load_config_string(yaml, "user.yaml", overrides);
}

#define EXPECT_HAS(msg, part) \
  EXPECT_NE((msg).find(part), std::string::npos) << "missing '" << (part) << "' in:\n" << (msg)

TEST(ConfigDefaults, MatchVerl) {
  Config c = load({});
  // Values from verl's ppo_trainer.yaml.
  EXPECT_EQ(c.get<int64_t>("data.max_prompt_length"), 512);
  EXPECT_EQ(c.get<int64_t>("data.train_batch_size"), 1024);
  EXPECT_EQ(c.get<std::string>("data.prompt_key"), "prompt");
  EXPECT_EQ(c.get<std::string>("data.truncation"), "error");
  EXPECT_TRUE(c.get<bool>("data.shuffle"));
  EXPECT_DOUBLE_EQ(c.get<double>("actor_rollout_ref.actor.optim.lr"), 1e-6);
  EXPECT_DOUBLE_EQ(c.get<double>("critic.optim.lr"), 1e-5);
  EXPECT_DOUBLE_EQ(c.get<double>("actor_rollout_ref.actor.clip_ratio_c"), 3.0);
  EXPECT_EQ(c.get<std::string>("actor_rollout_ref.actor.loss_agg_mode"), "token-mean");
  EXPECT_EQ(c.get<std::string>("actor_rollout_ref.actor.kl_loss_type"), "low_var_kl");
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.actor.ppo_max_token_len_per_gpu"), 16384);
  EXPECT_EQ(c.get<int64_t>("critic.ppo_max_token_len_per_gpu"), 32768);
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.rollout.top_k"), -1);
  EXPECT_DOUBLE_EQ(c.get<double>("actor_rollout_ref.rollout.gpu_memory_utilization"), 0.5);
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.rollout.n"), 1);
  EXPECT_DOUBLE_EQ(c.get<double>("actor_rollout_ref.rollout.val_kwargs.temperature"), 0.0);
  EXPECT_FALSE(c.get<bool>("actor_rollout_ref.rollout.val_kwargs.do_sample"));
  EXPECT_EQ(c.get<std::string>("algorithm.adv_estimator"), "gae");
  EXPECT_DOUBLE_EQ(c.get<double>("algorithm.kl_ctrl.kl_coef"), 0.001);
  EXPECT_EQ(c.get<int64_t>("algorithm.kl_ctrl.horizon"), 10000);
  EXPECT_EQ(c.get<int64_t>("trainer.total_epochs"), 30);
  EXPECT_EQ(c.get<int64_t>("trainer.save_freq"), -1);
  EXPECT_EQ(c.get<std::string>("trainer.resume_mode"), "auto");
  EXPECT_EQ(c.get<std::string>("custom_reward_function.name"), "compute_score");
  EXPECT_EQ(c.get<std::vector<double>>("actor_rollout_ref.actor.optim.betas"),
            (std::vector<double>{0.9, 0.999}));
  // Nullable keys with a null default.
  EXPECT_TRUE(c.is_null("data.val_batch_size"));
  EXPECT_EQ(c.get<std::optional<int64_t>>("trainer.total_training_steps"), std::nullopt);
  // Defaults that interpolate other keys are resolved.
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.rollout.prompt_length"), 512);
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.rollout.response_length"), 512);
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"), 16384);
  EXPECT_EQ(c.get<int64_t>("critic.forward_max_token_len_per_gpu"), 32768);
  EXPECT_EQ(c.get<std::string>("trainer.default_local_dir"), "checkpoints/verl_examples/gsm8k");
  EXPECT_EQ(c.get<std::vector<std::string>>("actor_rollout_ref.actor.checkpoint.load_contents"),
            (std::vector<std::string>{"model", "optimizer", "extra"}));
  EXPECT_EQ(c.get<std::string>("actor_rollout_ref.ref.strategy"), "fsdp");
  // A single file name where verl allows "one file or a list" reads as a list.
  EXPECT_EQ(c.get<std::vector<std::string>>("data.train_files"),
            (std::vector<std::string>{"~/data/rlhf/gsm8k/train.parquet"}));
  // The seed's knobs are there.
  EXPECT_EQ(c.get<std::string>("trainer.gradient_sync_method"), "allreduce");
  EXPECT_DOUBLE_EQ(c.get<double>("trainer.lightweight_sync_config.top_k"), 0.1);
  EXPECT_EQ(c.get<std::string>("trainer.lightweight_sync_config.compression_dtype"), "int8");
  EXPECT_EQ(c.get<int64_t>("reward_model.quantization_bits"), 16);
  EXPECT_FALSE(c.get<bool>("data.dynamic_batch.enable"));
  EXPECT_TRUE(c.get<bool>("actor_rollout_ref.hybrid_engine"));
  EXPECT_EQ(c.origin("trainer.total_epochs"), "defaults");
}

TEST(ConfigSchema, EveryKeyDocumentedAndTyped) {
  auto s = Schema::builtin();
  size_t leaves = 0, unsupported = 0, ignored = 0, ours = 0;
  for (const auto& k : s->keys()) {
    EXPECT_FALSE(k.doc.empty()) << k.path;
    if (!k.is_leaf()) continue;
    ++leaves;
    unsupported += k.support == Support::Unsupported;
    ignored += k.support == Support::Ignored;
    ours += k.ours;
    if (!k.nullable) {
      EXPECT_FALSE(k.default_value.is_null()) << k.path;
    }
  }
  EXPECT_GT(leaves, 250u);
  EXPECT_GT(unsupported, 20u);
  EXPECT_GT(ignored, 20u);
  EXPECT_GT(ours, 15u);
  EXPECT_EQ(s->at("actor_rollout_ref.rollout.temperature").type, Type::Float);
  EXPECT_EQ(s->at("actor_rollout_ref.rollout.n").type, Type::Int);
  EXPECT_EQ(s->at("trainer.logger").type, Type::StringList);
  EXPECT_EQ(s->at("actor_rollout_ref.actor.optim.betas").type, Type::NumberList);
  EXPECT_EQ(s->at("data.apply_chat_template_kwargs").type, Type::Map);
  // Interpolated defaults take the type of the key they name.
  EXPECT_EQ(s->at("critic.ppo_epochs").type, Type::Int);
  EXPECT_EQ(s->at("critic.use_dynamic_bsz").type, Type::Bool);
  EXPECT_TRUE(s->at("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu").nullable);
  EXPECT_TRUE(s->at("trainer.actor_reward_parallel").ours);
  EXPECT_FALSE(s->at("trainer.total_epochs").ours);
  EXPECT_EQ(s->at("actor_rollout_ref.rollout.agent.custom_async_server.path").support,
            Support::Unsupported);  // inherited
  EXPECT_EQ(s->at("actor_rollout_ref.rollout.multi_turn.enable").support, Support::Supported);
  EXPECT_EQ(s->at("actor_rollout_ref.rollout.mode").support, Support::Ignored);  // own mark wins
  EXPECT_EQ(s->at("actor_rollout_ref.actor.profiler.enable").support,
            Support::Ignored);  // profiling: warned
  EXPECT_EQ(s->at("actor_rollout_ref.actor.profiler.ranks").support, Support::Ignored);
}

TEST(ConfigLoad, PortedVerlGrpoConfig) {
  // verl's run_qwen2-7b.sh as a YAML file, plus the `$@` overrides a user would append.
  Config c = load_config(kRoot + "/configs/examples/grpo_qwen2_7b.yaml",
                         {"trainer.total_epochs=2", "actor_rollout_ref.rollout.n=8",
                          "trainer.logger=[console,jsonl]"});
  EXPECT_EQ(c.get<std::string>("algorithm.adv_estimator"), "grpo");
  EXPECT_TRUE(c.get<bool>("actor_rollout_ref.actor.use_kl_loss"));
  EXPECT_EQ(c.get<std::string>("actor_rollout_ref.model.path"), "Qwen/Qwen2-7B-Instruct");
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"), 40);
  EXPECT_DOUBLE_EQ(c.get<double>("actor_rollout_ref.rollout.gpu_memory_utilization"), 0.6);
  EXPECT_DOUBLE_EQ(c.get<double>("actor_rollout_ref.actor.entropy_coeff"),
                   0.0);  // written as int 0
  EXPECT_TRUE(c.get<bool>("actor_rollout_ref.ref.fsdp_config.param_offload"));
  EXPECT_EQ(c.get<int64_t>("trainer.total_epochs"), 2);  // command line beats the file
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.rollout.n"), 8);
  EXPECT_EQ(c.get<int64_t>("critic.rollout_n"), 8);  // ${actor_rollout_ref.rollout.n} follows
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.rollout.response_length"), 1024);  // follows the file
  EXPECT_EQ(c.get<std::string>("trainer.default_local_dir"),
            "checkpoints/verl_grpo_example_gsm8k/qwen2_7b_function_rm");
  EXPECT_EQ(c.get<std::vector<std::string>>("trainer.logger"),
            (std::vector<std::string>{"console", "jsonl"}));
  EXPECT_EQ(c.get<std::vector<std::string>>("data.val_files"),
            (std::vector<std::string>{"~/data/gsm8k/test.parquet"}));
  EXPECT_NE(
      c.origin("actor_rollout_ref.rollout.gpu_memory_utilization").find("grpo_qwen2_7b.yaml:"),
      std::string::npos);
  EXPECT_EQ(c.origin("trainer.total_epochs"), "command line 'trainer.total_epochs=2'");

  // Without the override, verl's wandb logger is dropped (with a warning) rather than failing.
  Config d = load_config(kRoot + "/configs/examples/grpo_qwen2_7b.yaml");
  EXPECT_EQ(d.get<std::vector<std::string>>("trainer.logger"),
            (std::vector<std::string>{"console"}));
  EXPECT_EQ(d.get<int64_t>("critic.rollout_n"), 5);
}

TEST(ConfigLoad, OverridesOfEveryType) {
  Config c = load({
      "trainer.val_before_train=False",                  // bool, Python spelling
      "trainer.total_training_steps=100",                // int into a nullable int
      "actor_rollout_ref.actor.optim.lr=3e-7",           // float
      "actor_rollout_ref.rollout.top_p=1",               // int text into a float key
      "trainer.project_name=my proj",                    // string with a space
      "trainer.experiment_name='true'",                  // a quoted YAML scalar stays a string
      "trainer.logger=[console,tensorboard]",            // list of strings
      "actor_rollout_ref.actor.optim.betas=[0.8,0.95]",  // list of numbers
      "+data.apply_chat_template_kwargs.enable_thinking=false",  // new key inside a map key
      "data.val_batch_size=64",
      "data.val_batch_size=null",   // last one wins; null where verl allows it
      "trainer.rollout_data_dir=",  // Hydra's empty string
  });
  EXPECT_FALSE(c.get<bool>("trainer.val_before_train"));
  EXPECT_EQ(c.get<std::optional<int64_t>>("trainer.total_training_steps"), 100);
  EXPECT_DOUBLE_EQ(c.get<double>("actor_rollout_ref.actor.optim.lr"), 3e-7);
  EXPECT_DOUBLE_EQ(c.get<double>("actor_rollout_ref.rollout.top_p"), 1.0);
  EXPECT_EQ(c.get<std::string>("trainer.project_name"), "my proj");
  EXPECT_EQ(c.get<std::string>("trainer.experiment_name"), "true");
  EXPECT_EQ(c.get<std::vector<std::string>>("trainer.logger"),
            (std::vector<std::string>{"console", "tensorboard"}));
  EXPECT_EQ(c.get<std::vector<double>>("actor_rollout_ref.actor.optim.betas"),
            (std::vector<double>{0.8, 0.95}));
  EXPECT_EQ(c.get<Json>("data.apply_chat_template_kwargs"), Json({{"enable_thinking", false}}));
  EXPECT_TRUE(c.is_null("data.val_batch_size"));
  EXPECT_EQ(c.get<std::string>("trainer.rollout_data_dir"), "");
  EXPECT_EQ(c.get<std::string>("trainer.default_local_dir"), "checkpoints/my proj/true");

  // A whole section can be given as a mapping.
  Config d = load({"critic.optim={lr: 2e-5, weight_decay: 0.0}"});
  EXPECT_DOUBLE_EQ(d.get<double>("critic.optim.lr"), 2e-5);
  EXPECT_DOUBLE_EQ(d.get<double>("critic.optim.weight_decay"), 0.0);
  EXPECT_EQ(d.get<int64_t>("critic.optim.lr_warmup_steps"),
            -1);  // untouched siblings keep defaults
}

TEST(ConfigLoad, UserFileMergesOverDefaults) {
  Config c = load({}, R"(
trainer:
  total_epochs: 3
  logger: console
actor_rollout_ref:
  rollout:
    val_kwargs:
      n: 4
)");
  EXPECT_EQ(c.get<int64_t>("trainer.total_epochs"), 3);
  EXPECT_EQ(c.get<std::vector<std::string>>("trainer.logger"),
            (std::vector<std::string>{"console"}));
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.rollout.val_kwargs.n"), 4);
  EXPECT_DOUBLE_EQ(c.get<double>("actor_rollout_ref.rollout.val_kwargs.top_p"), 1.0);
  EXPECT_EQ(c.origin("trainer.total_epochs"), "user.yaml:3");
}

TEST(ConfigInterpolation, ReferencesResolve) {
  Config c =
      load({"data.max_prompt_length=1024", "data.val_batch_size=${data.train_batch_size}",
            "trainer.experiment_name=run_${data.max_prompt_length}_${algorithm.adv_estimator}",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=${oc.select:no.such.key,4096}",
            "actor_rollout_ref.actor.clip_ratio_high=${.clip_ratio_low}",
            "critic.model.path=${oc.env:VERL_TEST_UNSET_VAR_42,/models/critic}"});
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.rollout.prompt_length"), 1024);
  EXPECT_EQ(c.get<std::optional<int64_t>>("data.val_batch_size"), 1024);
  EXPECT_EQ(c.get<std::string>("trainer.experiment_name"), "run_1024_gae");
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.actor.ppo_max_token_len_per_gpu"), 4096);
  // Keys that interpolate the one just changed follow it.
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"), 4096);
  EXPECT_DOUBLE_EQ(c.get<double>("actor_rollout_ref.actor.clip_ratio_high"), 0.2);
  EXPECT_EQ(c.get<std::string>("critic.model.path"), "/models/critic");
  EXPECT_EQ(c.get<std::string>("trainer.default_local_dir"),
            "checkpoints/verl_examples/run_1024_gae");

  ::setenv("VERL_TEST_MODEL_DIR", "/data/m", 1);
  Config e = load({"actor_rollout_ref.model.path=${oc.env:VERL_TEST_MODEL_DIR}/qwen"});
  EXPECT_EQ(e.get<std::string>("actor_rollout_ref.model.path"), "/data/m/qwen");
  // The critic's tokenizer follows the actor's model path by default.
  EXPECT_EQ(e.get<std::string>("critic.model.tokenizer_path"), "/data/m/qwen");
}

TEST(ConfigInterpolation, Errors) {
  std::string m =
      test::expected_error_of([] { load({"data.val_batch_size=${data.train_batchsize}"}); });
  EXPECT_HAS(m, "data.val_batch_size");
  EXPECT_HAS(m, "unknown key 'data.train_batchsize'");
  EXPECT_HAS(m, "data.train_batch_size");  // suggestion
  m = test::expected_error_of([] {
    load({"data.max_prompt_length=${data.max_response_length}",
          "data.max_response_length=${data.max_prompt_length}"});
  });
  EXPECT_HAS(m, "interpolation cycle");
  // The resolved value is type-checked like a literal one.
  m = test::expected_error_of([] { load({"trainer.total_epochs=${trainer.project_name}"}); });
  EXPECT_HAS(m, "trainer.total_epochs expects an int");
  EXPECT_HAS(m, "verl_examples");
}

TEST(ConfigErrors, UnknownKeySuggestsNearest) {
  std::string m =
      test::expected_error_of([] { load({"actor_rollout_ref.rollout.temprature=0.7"}); });
  EXPECT_HAS(m, "command line 'actor_rollout_ref.rollout.temprature=0.7'");
  EXPECT_HAS(m, "unknown key 'actor_rollout_ref.rollout.temprature'");
  EXPECT_HAS(m, "Did you mean 'actor_rollout_ref.rollout.temperature'?");
  // Right name, wrong section: matched on the last component.
  m = test::expected_error_of([] { load({"trainer.ppo_epochs=2"}); });
  EXPECT_HAS(m, "actor_rollout_ref.actor.ppo_epochs");
  EXPECT_HAS(m, "critic.ppo_epochs");
  // A shortened path is matched as a suffix.
  m = test::expected_error_of([] { load({"rollout.n=4"}); });
  EXPECT_HAS(m, "Did you mean 'actor_rollout_ref.rollout.n'?");
  // In a file, the message names the file and line.
  m = test::expected_error_of([] { load({}, "trainer:\n  total_epochs: 2\n  sav_freq: 10\n"); });
  EXPECT_HAS(m, "user.yaml:3: unknown key 'trainer.sav_freq'");
  EXPECT_HAS(m, "trainer.save_freq");
  // Nothing close: the keys of the nearest section are listed.
  m = test::expected_error_of([] { load({"algorithm.zzzzzzzzzzzzzz=1"}); });
  EXPECT_HAS(m, "Keys under 'algorithm': gamma, lam, adv_estimator");
}

TEST(ConfigErrors, WrongTypeNamesKeyValueAndType) {
  std::string m = test::expected_error_of([] { load({"trainer.total_epochs=abc"}); });
  EXPECT_HAS(m, "trainer.total_epochs expects an int (type int), got abc");
  m = test::expected_error_of([] { load({"trainer.total_epochs=2.5"}); });
  EXPECT_HAS(m, "expects an int");
  m = test::expected_error_of([] { load({"trainer.val_before_train=maybe"}); });
  EXPECT_HAS(m, "trainer.val_before_train expects a bool");
  m = test::expected_error_of([] { load({"actor_rollout_ref.actor.optim.betas=[0.9,abc]"}); });
  EXPECT_HAS(m, "actor_rollout_ref.actor.optim.betas[1] expects a number, got abc");
  m = test::expected_error_of([] { load({"trainer.total_epochs=null"}); });
  EXPECT_HAS(m, "trainer.total_epochs may not be null");
  m = test::expected_error_of([] { load({"trainer=3"}); });
  EXPECT_HAS(m, "'trainer' is a section");
  m = test::expected_error_of([] { load({}, "data:\n  max_prompt_length: [1, 2]\n"); });
  EXPECT_HAS(m, "user.yaml:2: data.max_prompt_length expects an int (type int), got [1, 2]");
}

// A string that is not UTF-8 (a Latin-1 byte in a file or an override) is refused at load, naming
// the key; it used to pass and make nlohmann's dump() throw a bare type_error (found by
// tools/fuzz/fuzz_config.cpp), which a checkpoint's copy of the config would have met too.
TEST(ConfigErrors, NonUtf8StringsNameTheKey) {
  std::string m =
      test::expected_error_of([] { load({}, "trainer:\n  experiment_name: caf\xe9\n"); });
  EXPECT_HAS(m, "user.yaml:2: trainer.experiment_name: the value is not valid UTF-8");
  m = test::expected_error_of([] { load({"trainer.project_name=\xbfx"}); });
  EXPECT_HAS(m, "trainer.project_name: the value is not valid UTF-8");
  m = test::expected_error_of(
      [] { load({}, "trainer:\n  experiment_name: \"\xe9${trainer.project_name}\"\n"); });
  EXPECT_HAS(m, "trainer.experiment_name: the value is not valid UTF-8");
  EXPECT_EQ(
      load({"trainer.experiment_name=caf\xc3\xa9"}).get<std::string>("trainer.experiment_name"),
      "caf\xc3\xa9");
}

// Aliases of aliases ("billion laughs": 9 lines that expand to 10^9 values) and deep nesting in a
// free-form mapping: refused naming the key, in bounded time and memory (this one took 44 s and
// 3 GB before failing to allocate).
TEST(ConfigErrors, ValuesThatExpandWithoutBoundNameTheKey) {
  std::string bomb =
      "data:\n  apply_chat_template_kwargs:\n    a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 9; ++i) {
    bomb += fmt::format("    a{}: &a{} [", i, i);
    for (int k = 0; k < 10; ++k) bomb += fmt::format("{}*a{}", k ? ", " : "", i - 1);
    bomb += "]\n";
  }
  std::string m = test::expected_error_of([&] { load({}, bomb); });
  EXPECT_HAS(m,
             "user.yaml:2: data.apply_chat_template_kwargs: the value expands to more than 65536 "
             "YAML nodes");
  m = test::expected_error_of([] {
    load({"data.apply_chat_template_kwargs={a: " + std::string(300, '[') + std::string(300, ']') +
          "}"});
  });
  EXPECT_HAS(m, "data.apply_chat_template_kwargs: the value nests more than 256 levels deep");
  // An alias used the ordinary way still loads.
  const Config c = load({}, "data:\n  apply_chat_template_kwargs: {x: &v [1, 2], y: *v}\n");
  EXPECT_EQ(c.get<Json>("data.apply_chat_template_kwargs").dump(), R"({"x":[1,2],"y":[1,2]})");
}

TEST(ConfigErrors, ValuesOutsideTheAllowedSet) {
  std::string m = test::expected_error_of([] { load({"algorithm.adv_estimator=ppo"}); });
  EXPECT_HAS(m, "algorithm.adv_estimator = ppo is not allowed");
  EXPECT_HAS(m, "gae, grpo, rloo, reinforce_plus_plus, reinforce_plus_plus_baseline, remax");
  m = test::expected_error_of([] { load({"algorithm.kl_penalty=low_var_kll"}); });
  EXPECT_HAS(m, "did you mean 'low_var_kl'?");
  // A value verl has and we do not is named as such.
  m = test::expected_error_of([] { load({"algorithm.adv_estimator=optimal_token_baseline"}); });
  EXPECT_HAS(m, "optimal_token_baseline is a verl option that verl.cpp does not support yet");
  // List elements are checked one by one.
  m = test::expected_error_of([] { load({"trainer.logger=[console,stdout]"}); });
  EXPECT_HAS(m, "trainer.logger = stdout is not allowed");
  // Int choices and numeric ranges.
  m = test::expected_error_of([] { load({"reward_model.quantization_bits=3"}); });
  EXPECT_HAS(m, "allowed values: 4, 8, 16");
  m = test::expected_error_of([] { load({"actor_rollout_ref.rollout.top_p=1.5"}); });
  EXPECT_HAS(m,
             "actor_rollout_ref.rollout.top_p = 1.5 is out of range; expected a value in (0, 1]");
  // An excluded bound: top_p = 0 would keep no token (the sampler rejects it mid-run).
  m = test::expected_error_of([] { load({"actor_rollout_ref.rollout.top_p=0"}); });
  EXPECT_HAS(m,
             "actor_rollout_ref.rollout.top_p = 0.0 is out of range; expected a value in (0, 1]");
  m = test::expected_error_of([] { load({"actor_rollout_ref.rollout.val_kwargs.top_p=0"}); });
  EXPECT_HAS(m, "actor_rollout_ref.rollout.val_kwargs.top_p = 0.0 is out of range");
  m = test::expected_error_of([] { load({"actor_rollout_ref.rollout.top_k=-5"}); });
  EXPECT_HAS(m, "actor_rollout_ref.rollout.top_k = -5 is out of range; expected a value >= -1");
  m = test::expected_error_of([] { load({"data.train_batch_size=0"}); });
  EXPECT_HAS(m, "expected a value >= 1");
  // Every value in range and in the set loads.
  Config c = load({"algorithm.kl_penalty=k3", "actor_rollout_ref.rollout.top_p=0.9",
                   "trainer.gradient_sync_method=nccl"});
  EXPECT_DOUBLE_EQ(c.get<double>("actor_rollout_ref.rollout.top_p"), 0.9);
  // Seed options not built yet are rejected by name rather than ignored.
  m = test::expected_error_of([] { load({"trainer.gradient_sync_method=sparse"}); });
  EXPECT_HAS(m, "trainer.gradient_sync_method");
  EXPECT_HAS(m, "allreduce, nccl, lightweight");
  m = test::expected_error_of([] { load({"trainer.lightweight_sync_config.top_k=0"}); });
  EXPECT_HAS(m, "trainer.lightweight_sync_config.top_k = 0.0 is out of range");
  m = test::expected_error_of(
      [] { load({"trainer.lightweight_sync_config.compression_dtype=int4"}); });
  EXPECT_HAS(m, "int8, bf16, fp32");
  m = test::expected_error_of([] { load({"reward_model.quantization_bits=2"}); });
  EXPECT_HAS(m, "reward_model.quantization_bits");
  EXPECT_EQ(
      load({"reward_model.quantization_bits=4"}).get<int64_t>("reward_model.quantization_bits"), 4);
}

TEST(ConfigErrors, UnsupportedVerlKeysRejectedByName) {
  // The critic's LoRA is not supported (the actor's is: issue 39).
  std::string m = test::expected_error_of([] { load({"critic.model.lora_rank=8"}); });
  EXPECT_HAS(m, "critic.model.lora_rank is a verl key that verl.cpp does not support yet");
  EXPECT_HAS(m, "default (0), got 8");
  EXPECT_EQ(load({"actor_rollout_ref.model.lora_rank=8"})
                .get<int64_t>("actor_rollout_ref.model.lora_rank"),
            8);
  // Inherited from an unsupported section.
  m = test::expected_error_of([] {
    load({},
         "actor_rollout_ref:\n  rollout:\n    agent:\n      custom_async_server:\n        "
         "path: x.py\n");
  });
  EXPECT_HAS(m,
             "user.yaml:5: actor_rollout_ref.rollout.agent.custom_async_server.path is a verl key");
  // Set to the default, an unsupported key is fine (full verl configs list every key).
  Config c = load({"actor_rollout_ref.model.lora_rank=0",
                   "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1"});
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.model.lora_rank"), 0);
  // A key without effect here is accepted (with a warning) and keeps its value.
  Config d = load({"actor_rollout_ref.actor.use_torch_compile=false", "ray_init.num_cpus=4"});
  EXPECT_FALSE(d.get<bool>("actor_rollout_ref.actor.use_torch_compile"));
}

TEST(ConfigErrors, AllProblemsReportedTogether) {
  std::string m = test::expected_error_of([] {
    load({"trainer.total_epochs=x", "trainer.nosuchkey=1", "algorithm.lam=2"});
  });
  EXPECT_HAS(m, "3 problems");
  EXPECT_HAS(m, "trainer.total_epochs");
  EXPECT_HAS(m, "trainer.nosuchkey");
  EXPECT_HAS(m, "algorithm.lam = 2.0 is out of range");
}

TEST(ConfigErrors, OverrideSyntax) {
  EXPECT_HAS(test::expected_error_of([] { load({"trainer.total_epochs"}); }), "expected key=value");
  EXPECT_HAS(test::expected_error_of([] { load({"~trainer.total_epochs"}); }), "deleting keys");
  EXPECT_HAS(test::expected_error_of([] { load({"+trainer.brand_new_key=1"}); }),
             "unknown key 'trainer.brand_new_key'");
  EXPECT_HAS(test::expected_error_of([] { load({"trainer.logger=[console"}); }), "not valid YAML");
  EXPECT_HAS(test::expected_error_of([] { load({}, "trainer: [1, 2\n"); }), "user.yaml");
  EXPECT_HAS(test::expected_error_of([] { load_config("/nonexistent/cfg.yaml"); }),
             "cannot open config file /nonexistent/cfg.yaml");
}

TEST(ConfigAliases, SeedNamesSetVerlKeys) {
  Config c =
      load({"trainer.save_steps=500", "trainer.save_total_limit=3",
            "actor_rollout_ref.actor.optim.warmup_style=cosine", "critic.optim.clip_grad=0.5"});
  EXPECT_EQ(c.get<int64_t>("trainer.save_freq"), 500);
  EXPECT_EQ(c.get<int64_t>("trainer.save_steps"), 500);  // reading an alias reads its target
  EXPECT_EQ(c.get<std::optional<int64_t>>("trainer.max_actor_ckpt_to_keep"), 3);
  EXPECT_EQ(c.get<std::optional<int64_t>>("trainer.max_critic_ckpt_to_keep"), 3);
  EXPECT_EQ(c.get<std::string>("actor_rollout_ref.actor.optim.lr_scheduler_type"), "cosine");
  EXPECT_DOUBLE_EQ(c.get<double>("critic.grad_clip"), 0.5);
  EXPECT_NE(c.origin("trainer.save_freq").find("(as trainer.save_steps)"), std::string::npos);
  // Aliases check values like their targets, and do not show up in the output.
  EXPECT_HAS(
      test::expected_error_of([] { load({"actor_rollout_ref.actor.optim.warmup_style=linear"}); }),
      "allowed values: constant, cosine");
  EXPECT_EQ(c.to_yaml().find("save_steps"), std::string::npos);
  // The alias and its target disagreeing in one source is an error.
  std::string m = test::expected_error_of([] {
    load({"trainer.save_steps=500", "trainer.save_freq=100"});
  });
  EXPECT_HAS(m, "trainer.save_freq is set twice with different values");
  // verl's older checkpoint.contents.
  Config d = load({}, "critic:\n  checkpoint:\n    contents: [model]\n");
  EXPECT_EQ(d.get<std::vector<std::string>>("critic.checkpoint.load_contents"),
            (std::vector<std::string>{"model"}));
  // An alias written as null (as a config saved by verl writes warmup_style) leaves its target.
  Config e = load({"critic.optim.clip_grad=null"},
                  "actor_rollout_ref:\n  actor:\n    optim:\n      warmup_style: null\n      "
                  "lr_scheduler_type: cosine\n");
  EXPECT_EQ(e.get<std::string>("actor_rollout_ref.actor.optim.lr_scheduler_type"), "cosine");
  EXPECT_DOUBLE_EQ(e.get<double>("critic.grad_clip"), 1.0);
}

// The defaults file itself, given as CONFIG, loads (every alias in it is null).
TEST(ConfigLoad, TheDefaultsFileLoadsAsAConfig) {
  Config c = load_config(std::string(VERL_SOURCE_DIR) + "/configs/ppo_trainer.yaml");
  EXPECT_EQ(c.get<int64_t>("trainer.save_freq"), -1);
  EXPECT_EQ(c.get<std::string>("actor_rollout_ref.actor.optim.lr_scheduler_type"), "constant");
}

TEST(ConfigLoad, HydraKeysAndTargetsIgnored) {
  Config c = load({}, R"(
defaults:
  - ppo_trainer
  - _self_
hydra:
  run:
    dir: outputs
algorithm:
  _target_: verl.trainer.config.AlgoConfig
  adv_estimator: rloo
)");
  EXPECT_EQ(c.get<std::string>("algorithm.adv_estimator"), "rloo");
  EXPECT_FALSE(c.has("hydra"));
  EXPECT_FALSE(c.has("defaults"));
}

TEST(ConfigLoad, VerlDumpedConfigForms) {
  // Forms found in configs that verl (Hydra) prints: _target_ keys, ??? for mandatory values,
  // relative oc.select with a null default, escaped quotes around a default, quoted keys.
  Config c = load({}, R"(
actor_rollout_ref:
  rollout:
    _target_: verl.workers.config.RolloutConfig
    name: ???
    'n': 4
critic:
  ppo_micro_batch_size: 64
  ppo_micro_batch_size_per_gpu: ${oc.select:.ppo_micro_batch_size,null}
  forward_micro_batch_size_per_gpu: ${oc.select:.no_such_sibling,null}
  model:
    tokenizer_path: ${oc.select:actor_rollout_ref.model.no_such_key,\"~/models/tok\"}
  rollout_n: ${oc.select:actor_rollout_ref.rollout.n,1}
global_profiler:
  save_path: /tmp/prof
)");
  EXPECT_EQ(c.get<std::string>("actor_rollout_ref.rollout.name"), "vllm");
  EXPECT_EQ(c.get<std::optional<int64_t>>("critic.ppo_micro_batch_size_per_gpu"), 64);
  EXPECT_TRUE(c.is_null("critic.forward_micro_batch_size_per_gpu"));
  EXPECT_EQ(c.get<std::string>("critic.model.tokenizer_path"), "~/models/tok");
  EXPECT_EQ(c.get<int64_t>("critic.rollout_n"), 4);
  EXPECT_EQ(c.get<std::string>("critic.profiler.save_path"),
            "/tmp/prof");  // follows global_profiler
}

TEST(ConfigOutput, YamlRoundTripAndJson) {
  Config c =
      load({"trainer.experiment_name='123'", "trainer.project_name=null_project",
            "data.val_batch_size=8", "actor_rollout_ref.actor.optim.lr=1e-6",
            "trainer.logger=[console,jsonl]",
            "+data.apply_chat_template_kwargs.enable_thinking=false", "data.prompt_key='yes'"});
  std::string y = c.to_yaml();
  EXPECT_HAS(y, "experiment_name: \"123\"");  // a string that looks like a number is quoted
  EXPECT_HAS(y, "lr: 1.0e-06");
  EXPECT_HAS(y, "logger: [console, jsonl]");
  Config back = load_config_string(y, "roundtrip.yaml");
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_EQ(back.get<std::string>("trainer.experiment_name"), "123");
  EXPECT_EQ(back.get<std::string>("data.prompt_key"), "yes");

  Json j = c.to_json();
  EXPECT_EQ(j["trainer"]["experiment_name"], "123");
  EXPECT_EQ(j["actor_rollout_ref"]["rollout"]["n"], 1);
  EXPECT_EQ(j["data"]["val_batch_size"], 8);
  EXPECT_TRUE(j["trainer"]["total_training_steps"].is_null());
  EXPECT_FALSE(j["trainer"].contains("save_steps"));
  // Sections come out in the defaults file's order.
  EXPECT_EQ(j.begin().key(), "data");
}

TEST(ConfigAccess, GetErrorsNameTheKey) {
  Config c = load({});
  EXPECT_HAS(test::expected_error_of([&] { c.get<int64_t>("trainer.total_epoch"); }),
             "unknown config key 'trainer.total_epoch'");
  EXPECT_HAS(test::expected_error_of([&] { c.get<int64_t>("trainer.total_epoch"); }),
             "Did you mean 'trainer.total_epochs'?");
  EXPECT_HAS(
      test::expected_error_of([&] { c.get<int64_t>("actor_rollout_ref.rollout.temperature"); }),
      "cannot be read as int");
  EXPECT_HAS(test::expected_error_of([&] { c.get<int64_t>("data.val_batch_size"); }),
             "'data.val_batch_size' is null");
  EXPECT_HAS(test::expected_error_of([&] { c.get<bool>("trainer"); }), "is a section");
  EXPECT_TRUE(c.has("trainer.lightweight_sync_config"));
  EXPECT_TRUE(c.has("trainer.save_steps"));
  EXPECT_FALSE(c.has("trainer.nope"));
  EXPECT_EQ(c.get<Json>("algorithm.kl_ctrl")["type"], "fixed");
  EXPECT_EQ(c.get<float>("actor_rollout_ref.actor.clip_ratio"), 0.2f);
  EXPECT_EQ(c.get<int>("data.max_prompt_length"), 512);

  c.set("actor_rollout_ref.actor.optim.total_training_steps", 420, "trainer");
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.actor.optim.total_training_steps"), 420);
  EXPECT_EQ(c.origin("actor_rollout_ref.actor.optim.total_training_steps"), "trainer");
  EXPECT_HAS(test::expected_error_of([&] { c.set("algorithm.adv_estimator", "ppo"); }),
             "not allowed");
}

TEST(ConfigSchema, DefaultsFileIsChecked) {
  auto m =
      test::expected_error_of([] { Schema::from_string("a:  # section\n  b: 1\n", "d.yaml"); });
  EXPECT_HAS(m, "d.yaml:2: a.b: every key needs a one-line description");
  m = test::expected_error_of(
      [] { Schema::from_string("a:  # section\n  b: null  # no type\n", "d.yaml"); });
  EXPECT_HAS(m, "d.yaml:2: a.b: cannot infer the type from the default null");
  m = test::expected_error_of(
      [] { Schema::from_string("a:  # section\n  b: 1  # x @choise: 1|2\n", "d.yaml"); });
  EXPECT_HAS(m, "unknown annotation @choise");
  m = test::expected_error_of(
      [] { Schema::from_string("a:  # section\n  b: 3  # x @choices: 1|2\n", "d.yaml"); });
  EXPECT_HAS(m, "a.b = 3 is not allowed");
  m = test::expected_error_of(
      [] { Schema::from_string("a:  # section\n  b: null  # x @alias: a.c\n", "d.yaml"); });
  EXPECT_HAS(m, "@alias names a.c");
  auto s = Schema::from_string("a:  # s @unsupported\n  b: ${a.c}  # x\n  c: 2.5  # y @ignored\n",
                               "d.yaml");
  EXPECT_EQ(s->at("a.b").type, Type::Float);
  EXPECT_DOUBLE_EQ(s->at("a.b").default_value.get<double>(), 2.5);
  EXPECT_EQ(s->at("a.b").support, Support::Unsupported);
  EXPECT_EQ(s->at("a.c").support, Support::Ignored);
  EXPECT_EQ(s->at("a.c").doc, "y");
}

TEST(ConfigDocs, InSyncWithDefaults) {
  std::ifstream f(kRoot + "/docs/config.md");
  std::stringstream ss;
  ss << f.rdbuf();
  std::string want = docs_markdown(*Schema::from_file(kRoot + "/configs/ppo_trainer.yaml"));
  EXPECT_TRUE(ss.str() == want)
      << "docs/config.md is out of date with configs/ppo_trainer.yaml; regenerate it:\n"
         "  build/bin/verl config --docs > docs/config.md";
  // The reference names every key.
  for (const auto& k : Schema::builtin()->keys())
    if (!k.is_section()) {
      EXPECT_HAS(want, "`" + k.path + "`");
    }
}

// verl's 2026-08 layout beside the January one: new names set the old keys, mechanics keys are
// accepted, features we lack are refused naming the key and the reason.
TEST(ConfigLoad, NewerVerlLayout) {
  Config c =
      load({"reward.reward_model.enable=true", "reward.reward_model.model_path=/m/rm",
            "critic.fsdp.param_offload=true",
            "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2",
            "+actor_rollout_ref.actor.policy_loss.tau_pos=1.5", "model_engine=dp",
            "+ray_kwargs.ray_init.num_gpus=8", "ray_kwargs.ray_init.runtime_env.env_vars.X=1",
            "+ray_kwargs.some_future_key=3"});
  EXPECT_TRUE(c.get<bool>("reward_model.enable"));
  EXPECT_EQ(c.get<std::string>("reward_model.model.path"), "/m/rm");
  EXPECT_TRUE(c.get<bool>("critic.model.fsdp_config.param_offload"));
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.actor.ulysses_sequence_parallel_size"), 2);
  EXPECT_EQ(c.get<int64_t>("actor_rollout_ref.ref.ulysses_sequence_parallel_size"),
            2);  // follows the actor
  EXPECT_DOUBLE_EQ(c.get<double>("actor_rollout_ref.actor.tau_pos"), 1.5);
  // The new spelling of the reward manager reaches the old key (dapo is implemented).
  Config d = load({"reward.reward_manager.name=dapo", "algorithm.filter_groups.enable=true"});
  EXPECT_EQ(d.get<std::string>("reward_model.reward_manager"), "dapo");
  EXPECT_TRUE(d.get<bool>("algorithm.filter_groups.enable"));
  std::string m = test::expected_error_of([] { load({"reward.reward_manager.name=prime"}); });
  EXPECT_HAS(
      m, "reward_model.reward_manager = prime is a verl option that verl.cpp does not support yet");
  m = test::expected_error_of([] { load({"model_engine=megatron"}); });
  EXPECT_HAS(m, "model_engine = megatron is a verl option");
  EXPECT_HAS(m, "use model_engine=dp");
  // An open section takes unknown keys; a closed one still refuses them.
  m = test::expected_error_of(
      [] { load({"actor_rollout_ref.rollout.checkpoint_engine.nonsense=1"}); });
  EXPECT_HAS(m, "unknown key 'actor_rollout_ref.rollout.checkpoint_engine.nonsense'");
}

TEST(ConfigLoad, NewerVerlSftLayout) {
  LoadOptions lo;
  lo.defaults_path =
      (std::filesystem::path(default_config_path()).parent_path() / "sft_trainer.yaml").string();
  Config c = load_config("",
                         {"model.path=/m/qwen", "data.messages_key=conv", "engine=fsdp",
                          "engine.ulysses_sequence_parallel_size=2",
                          "optim.lr_scheduler_type=constant", "trainer.logger=[console,wandb]"},
                         lo);
  EXPECT_EQ(c.get<std::string>("model.partial_pretrain"), "/m/qwen");
  EXPECT_EQ(c.get<std::string>("data.multiturn.messages_key"), "conv");
  EXPECT_EQ(c.get<std::string>("optim.lr_scheduler"), "constant");
  EXPECT_EQ(c.get<std::vector<std::string>>("trainer.logger"), std::vector<std::string>{"console"});
  std::string m = test::expected_error_of([&] {
    load_config("", {"engine=megatron", "model.hf_config_path=/m/other"}, lo);
  });
  EXPECT_HAS(m, "engine=megatron selects verl's megatron config group");
  EXPECT_HAS(m, "model.hf_config_path is a verl key that verl.cpp does not support yet (the model");
  // SFT with LoRA (issue 39): verl's run_qwen3_8b_fsdp keys load.
  Config lora = load_config(
      "", {"model.lora_rank=32", "model.lora_alpha=16", "model.target_modules=all-linear"}, lo);
  EXPECT_EQ(lora.get<int64_t>("model.lora_rank"), 32);
}

}  // namespace
}  // namespace verl::config
