// The PPO trainer's configuration, typed: verl's ppo_trainer.yaml keys read once from a
// config::Config when the trainer starts, with the cross-key checks (and their error texts) the
// trainer makes before its first step. The step path reads these fields, never a key.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "core/device.h"
#include "core/numerics.h"
#include "model/lora.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "optim/sparse_sync.h"
#include "optim/train_state.h"
#include "reward/command_reward.h"
#include "reward/python_reward.h"
#include "trainer/checkpoint.h"
#include "trainer/core_algos.h"
#include "trainer/rollout_corr.h"

namespace verl::trainer {

// `<prefix>lora_rank` > 0: LoRA on the trained model (model/lora.h): its rank, alpha and modules,
// and the PEFT adapter directory to start from (null: PEFT's fresh init).
struct LoraKeys {
  model::LoraConfig config;
  std::optional<std::string> adapter_path;
};
// <prefix>lora_rank / lora_alpha / target_modules / exclude_modules / lora_adapter_path (the
// actor's "actor_rollout_ref.model.", the SFT trainer's "model."); none when lora_rank is 0.
std::optional<LoraKeys> read_lora_keys(const config::Config& cfg, const std::string& prefix);
// The adapters the keys ask for: the PEFT directory adapter_path, or PEFT's fresh init (B = 0: the
// model starts as the base model) drawn from `seed`, the same on every rank.
std::shared_ptr<const model::LoraWeights> make_lora_adapters(const LoraKeys& k,
                                                             const model::ModelConfig& base,
                                                             uint64_t seed);

// A model's `<prefix>.optim.*` keys: AdamW's settings (with the model's grad_clip) and the
// learning-rate schedule, whose length is known once the loader is.
struct OptimKeys {
  optim::AdamWConfig adamw;
  std::string lr_scheduler_type;
  int64_t lr_warmup_steps = 0;
  double lr_warmup_steps_ratio = 0, min_lr_ratio = 0, num_cycles = 0;
  optim::LrSchedule schedule(int64_t total_steps) const;
};

// verl's `<fsdp_config>param_offload` / `optimizer_offload` (the latter where the section has it)
// and, for the actor, the seed's actor_offload_ratio.
struct OffloadKeys {
  std::string fsdp;  // the section's prefix, for messages
  bool param_offload = false;
  std::optional<bool> optimizer_offload;  // nullopt: the section has no such key
  double ratio = 0;
  const char* ratio_key = nullptr;
  // On the CPU a model lives in host memory already: nothing to offload, and a warning says so.
  optim::OffloadConfig resolve(Device device) const;
};

// How a forward-only pass (old_log_prob, ref, values) cuts the step's sequences, verl's keys:
// under `<prefix>log_prob_use_dynamic_bsz` (the critic: use_dynamic_bsz) token budgets of
// log_prob_max_token_len_per_gpu (forward_max_token_len_per_gpu); otherwise
// log_prob_micro_batch_size_per_gpu (forward_micro_batch_size_per_gpu) sequences, or the deprecated
// global size divided among the ranks. Neither size set: the token budget still cuts the batch.
struct ForwardBatching {
  bool dynamic = true;
  int64_t max_tokens = 0, max_seqs = 0;
};

// <prefix>quantization_* of a forward-only model (the reference policy, the reward model).
struct QuantizationKeys {
  int bits = 0;
  int64_t group_size = 0, calibration_samples = 0;
};

// A trained model's update keys (actor_rollout_ref.actor.*, critic.*).
struct UpdateKeys {
  std::string section;              // "actor_rollout_ref.actor" or "critic", for messages
  int64_t ppo_mini_batch_size = 0;  // prompts, as configured
  int64_t mini = 0;  // this rank's sequences a mini-batch: ppo_mini_batch_size x rollout.n / ranks
  int64_t ppo_epochs = 1;
  bool use_dynamic_bsz = false;
  int64_t ppo_max_token_len_per_gpu = 0;
  // Sequences per micro-batch without use_dynamic_bsz: ppo_micro_batch_size_per_gpu, else verl's
  // deprecated global ppo_micro_batch_size divided among the ranks; nullopt: the mini-batch.
  std::optional<int64_t> micro_seqs;
  int64_t micro(int64_t mini_seqs) const { return micro_seqs.value_or(mini_seqs); }
  bool shuffle = false;  // the actor's
  OptimKeys optim;
  std::string zero_stage_key;
  int64_t zero_stage = 0;
  bool gradient_checkpointing = false;
  OffloadKeys offload;
  CheckpointContents save, load;
};

// Sampling settings of a rollout (the training one's, or validation's val_kwargs).
struct SamplingKeys {
  int64_t n = 1;
  bool do_sample = true;
  double temperature = 1.0, top_p = 1.0;
  int64_t top_k = -1;
};

// rollout.length_dist: the synthetic long-tailed workload (type "none": off).
struct LengthDistKeys {
  std::string type = "none";
  double mean = 0, sigma = 0;
  std::optional<int64_t> cap;
};

// actor_rollout_ref.rollout.multi_turn.* and agent.* (the tool agent loop, docs/agent.md).
struct MultiTurnKeys {
  bool enable = false;
  std::optional<std::string> tool_config_path;         // user-expanded
  std::optional<std::string> prompt_tool_config_path;  // data.tool_config_path (the prompt's tools)
  int64_t max_assistant_turns = 0, max_user_turns = 0;  // 0: no limit (null)
  int64_t max_parallel_calls = 1, max_tool_response_length = 256;
  std::string tool_response_truncate_side = "middle", format = "hermes";
  int64_t num_workers = 8;
  bool default_tool_agent = false;  // agent.default_agent_loop == tool_agent
};

struct RolloutKeys {
  SamplingKeys train, val;
  MultiTurnKeys multi_turn;
  int64_t response_length = 0, prompt_length = 0;
  std::optional<int64_t> max_model_len;  // null: prompt_length + response_length
  bool ignore_eos = false;
  int64_t max_num_seqs = 0, max_num_batched_tokens = 0;
  double gpu_memory_utilization = 0.5;
  bool enforce_eager = false;
  int64_t reshard_bucket =
      0;  // ZeRO-3's reshard: floats a bucket (update_weights_bucket_megabytes)
  LengthDistKeys length_dist;
  Numerics numerics = Numerics::Fast;  // batch_invariant, match_trainer_numerics
  // tensor_model_parallel_size as the run uses it: the ranks of one generation group (1: each
  // rank generates its own prompts), and, when that is not the configured value, why.
  int64_t tensor_parallel = 1;
  std::string tensor_parallel_note;
};

// reward_model.* when it is enabled.
struct RewardModelKeys {
  std::string path;  // user-expanded
  std::string path_as_configured;
  QuantizationKeys quantization;
  int64_t max_length = 0;  // 0: none
  bool input_tokenizer = false;
  int64_t forward_max_token_len_per_gpu = 0;
  std::optional<int64_t> micro_batch_size_per_gpu;
  bool use_dynamic_bsz = false;
  OffloadKeys offload;
};

struct RewardKeys {
  std::string reward_manager;  // naive | dapo | ...
  struct OverlongBuffer {
    bool enable = false, log = false;
    int64_t len = 0;
    double penalty_factor = 0;
    int64_t max_resp_len = 0;  // reward_kwargs.max_resp_len, else data.max_response_length
  } overlong;
  // custom_reward_function.command, or the Python bridge's command for .path + .name (then
  // `python` is set too: the trainer checks that it imports before the first step)
  std::optional<reward::CommandRewardConfig> command;
  std::optional<reward::PythonRewardSpec> python;
  std::optional<RewardModelKeys> model;  // reward_model.enable
  bool actor_reward_parallel = true;     // trainer.actor_reward_parallel
};

struct AlgorithmKeys {
  AdvantageEstimator estimator = AdvantageEstimator::GRPO;
  double gamma = 1.0, lam = 1.0;
  bool norm_adv_by_std_in_grpo = true;
  // gdpo: the reward components by key (the reward function's returned numbers) and weights.
  std::vector<std::string> gdpo_reward_keys;
  std::vector<double> gdpo_reward_weights;
  bool use_kl_in_reward = false;
  KlType kl_penalty;
  struct KlCtrl {
    std::string type;
    double kl_coef = 0, target_kl = 0, horizon = 0;
  } kl_ctrl;  // read with use_kl_in_reward
  struct FilterGroups {
    bool enable = false;
    std::string metric;  // acc | score | seq_reward | seq_final_reward
    int64_t max_num_gen_batches = 0;
  } filter_groups;
  RolloutCorrectionConfig rollout_correction;
};

struct TrainerKeys {
  std::string device;           // as configured (cpu | cuda | auto)
  std::string experiment_name;  // the gdpo reward manager hands it to the reward function
  double nccl_timeout = 0;
  std::optional<int64_t> total_training_steps;
  int64_t critic_warmup = 0;
  bool balance_batch = false;  // read with several ranks only
  // The seed's overlap switches (docs/overlap.md), off where the run does not allow them.
  bool token_level_pipeline = false, critic_actor_overlap = false, one_step_off_policy = false;
  std::optional<std::string> rollout_data_dir, validation_data_dir;
  int64_t log_val_generations = 0;
  std::string resume_mode, default_local_dir;
  std::optional<std::string> resume_from_path;
  int64_t max_actor_ckpt_to_keep = 0, max_critic_ckpt_to_keep = 0;
  std::vector<std::string> logger;
  int64_t logging_steps = 1, test_freq = 0, save_freq = 0;
  bool val_before_train = true, val_only = false;
  std::optional<optim::LightweightConfig> lightweight_sync;  // gradient_sync_method=lightweight
};

struct DataKeys {
  std::vector<std::string> train_files;
  std::optional<std::vector<std::string>> val_files;
  std::optional<std::string> tokenizer;
  uint64_t seed = 1;
  int64_t train_batch_size = 0, gen_batch_size = 0, max_prompt_length = 0, max_response_length = 0;
  bool dynamic_batch = false;  // data.dynamic_batch.enable
};

struct PpoConfig {
  explicit PpoConfig(config::Config cfg) : raw(std::move(cfg)) {}
  config::Config raw;  // for the data module's own readers (datasets, loaders, dynamic batches)
  int world = 1;       // data-parallel ranks
  DataKeys data;
  RolloutKeys rollout;
  std::string model_path;
  std::optional<std::string> custom_chat_template;
  bool use_critic = false, use_ref = false;
  UpdateKeys actor, critic;  // critic: with use_critic
  ActorLossConfig actor_loss;
  double critic_cliprange_value = 0;
  LossAggMode critic_loss_agg_mode = LossAggMode::TokenMean;
  std::string critic_model_path;
  // actor_rollout_ref.model.override_config / critic.model.override_config (fields of config.json,
  // model::apply_config_overrides).
  nlohmann::json model_override_config, critic_override_config;
  ForwardBatching old_log_prob_batching, ref_batching, values_batching;
  OffloadKeys ref_offload;
  QuantizationKeys ref_quantization;
  std::optional<LoraKeys> lora;  // actor_rollout_ref.model.lora_rank > 0
  RewardKeys reward;
  AlgorithmKeys algorithm;
  TrainerKeys trainer;

  // Reads every key the PPO trainer uses and checks them together. `world`: the data-parallel
  // ranks; `distributed`: a communicator carries the collectives (several ranks, or one NCCL rank).
  static PpoConfig read(const config::Config& cfg, int world, bool distributed);
};

// model::apply_config_overrides for the trainer's models, the fields it ignores warned about by
// key.
model::ModelConfig apply_model_overrides(const std::string& model_dir,
                                         const model::ModelConfig& loaded,
                                         const nlohmann::json& overrides, const std::string& key);

}  // namespace verl::trainer
