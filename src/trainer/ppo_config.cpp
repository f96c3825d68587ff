// PpoConfig::read: every key the PPO trainer uses, read once, and the checks across keys that
// the trainer makes before its first step (their texts name the keys; tests assert them).
#include "trainer/ppo_config.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/log.h"
#include "data/rl_dataset.h"

namespace verl::trainer {
namespace {

OptimKeys read_optim(const config::Config& cfg, const std::string& prefix, double grad_clip) {
  OptimKeys o;
  o.adamw.lr = static_cast<float>(cfg.get<double>(prefix + ".optim.lr"));
  auto betas = cfg.get<std::vector<double>>(prefix + ".optim.betas");
  VERL_CHECK(betas.size() == 2, "{}.optim.betas must hold two numbers", prefix);
  o.adamw.beta1 = static_cast<float>(betas[0]);
  o.adamw.beta2 = static_cast<float>(betas[1]);
  o.adamw.weight_decay = static_cast<float>(cfg.get<double>(prefix + ".optim.weight_decay"));
  o.adamw.grad_clip = static_cast<float>(grad_clip);
  o.lr_scheduler_type = cfg.get<std::string>(prefix + ".optim.lr_scheduler_type");
  o.lr_warmup_steps = cfg.get<int64_t>(prefix + ".optim.lr_warmup_steps");
  o.lr_warmup_steps_ratio = cfg.get<double>(prefix + ".optim.lr_warmup_steps_ratio");
  o.min_lr_ratio = cfg.get<std::optional<double>>(prefix + ".optim.min_lr_ratio").value_or(0.0);
  o.num_cycles = cfg.get<double>(prefix + ".optim.num_cycles");
  return o;
}

OffloadKeys read_offload(const config::Config& cfg, const std::string& fsdp, double ratio,
                         const char* ratio_key) {
  OffloadKeys o;
  o.fsdp = fsdp;
  o.param_offload = cfg.get<bool>(fsdp + "param_offload");
  if (cfg.has(fsdp + "optimizer_offload"))
    o.optimizer_offload = cfg.get<bool>(fsdp + "optimizer_offload");
  o.ratio = ratio;
  o.ratio_key = ratio_key;
  return o;
}

ForwardBatching read_forward_batching(const config::Config& cfg, const std::string& prefix,
                                      int world) {
  const bool critic = prefix == "critic.";
  const std::string dyn = critic ? "use_dynamic_bsz" : "log_prob_use_dynamic_bsz";
  const std::string tokens =
      critic ? "forward_max_token_len_per_gpu" : "log_prob_max_token_len_per_gpu";
  const std::string micro = critic ? "forward_micro_batch_size" : "log_prob_micro_batch_size";
  ForwardBatching f;
  f.max_tokens = cfg.get<int64_t>(prefix + tokens);
  if (cfg.get<bool>(prefix + dyn)) return f;
  auto per_gpu = cfg.get<std::optional<int64_t>>(prefix + micro + "_per_gpu");
  if (auto global = cfg.get<std::optional<int64_t>>(prefix + micro); global && !per_gpu)
    per_gpu = std::max<int64_t>(1, *global / world);
  if (!per_gpu) return f;
  f.dynamic = false;
  f.max_seqs = *per_gpu;
  return f;
}

QuantizationKeys read_quantization(const config::Config& cfg, const std::string& prefix) {
  QuantizationKeys q;
  q.bits = static_cast<int>(cfg.get<int64_t>(prefix + "quantization_bits"));
  q.group_size = cfg.get<int64_t>(prefix + "quantization_group_size");
  q.calibration_samples = cfg.get<int64_t>(prefix + "quantization_calibration_samples");
  return q;
}

// `section`: actor_rollout_ref.actor or critic (the fsdp_config under the model for the critic).
UpdateKeys read_update(const config::Config& cfg, const std::string& section, int64_t n,
                       int world) {
  const std::string a = section + ".";
  UpdateKeys u;
  u.section = section;
  u.ppo_mini_batch_size = cfg.get<int64_t>(a + "ppo_mini_batch_size");
  // verl scales it by rollout.n and divides it among the data-parallel ranks.
  u.mini = u.ppo_mini_batch_size * n / world;
  u.ppo_epochs = cfg.get<int64_t>(a + "ppo_epochs");
  u.use_dynamic_bsz = cfg.get<bool>(a + "use_dynamic_bsz");
  u.ppo_max_token_len_per_gpu = cfg.get<int64_t>(a + "ppo_max_token_len_per_gpu");
  const auto per_gpu = cfg.get<std::optional<int64_t>>(a + "ppo_micro_batch_size_per_gpu");
  const auto global = cfg.get<std::optional<int64_t>>(a + "ppo_micro_batch_size");
  if (per_gpu) {
    u.micro_seqs = per_gpu;
  } else if (global) {
    u.micro_seqs = std::max<int64_t>(1, *global / world);
  }
  u.zero_stage_key = a + "zero_stage";
  u.zero_stage = cfg.get<int64_t>(u.zero_stage_key);
  return u;
}

SamplingKeys read_sampling(const config::Config& cfg, const std::string& rk, int64_t n) {
  SamplingKeys s;
  s.n = n;
  s.do_sample = cfg.get<bool>(rk + "do_sample");
  s.temperature = cfg.get<double>(rk + "temperature");
  s.top_k = cfg.get<int64_t>(rk + "top_k");
  s.top_p = cfg.get<double>(rk + "top_p");
  return s;
}

// target_modules / exclude_modules as PEFT reads them: a list of module names, "all-linear", or one
// string that is a regular expression. The config types them list[string] (a scalar becomes a
// one-element list), so one element that is neither a projection nor all-linear is the regex.
nlohmann::json module_match_json(const std::vector<std::string>& v) {
  static const std::vector<std::string> names = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  if (v.size() == 1) {
    const std::string& s = v[0];
    const bool projection = std::any_of(names.begin(), names.end(), [&](const std::string& n) {
      return s == n || s.ends_with("." + n);
    });
    if (!projection) return s;
  }
  return v;
}

}  // namespace

std::optional<LoraKeys> read_lora_keys(const config::Config& cfg, const std::string& prefix) {
  // Every key is read whatever the rank (they are the run's settings either way).
  const int64_t rank = cfg.get<int64_t>(prefix + "lora_rank");
  const double alpha = cfg.get<double>(prefix + "lora_alpha");
  const auto targets = cfg.get<std::vector<std::string>>(prefix + "target_modules");
  const auto excluded =
      cfg.get<std::optional<std::vector<std::string>>>(prefix + "exclude_modules");
  const auto adapter_path = cfg.get<std::optional<std::string>>(prefix + "lora_adapter_path");
  VERL_CHECK(rank >= 0, "{}lora_rank={}: 0 (off) or a positive rank", prefix, rank);
  if (rank == 0) return std::nullopt;
  LoraKeys k;
  k.config.r = rank;
  k.config.alpha = alpha;
  VERL_CHECK(std::isfinite(alpha) && alpha > 0, "{}lora_alpha={}: must be positive", prefix, alpha);
  k.config.target_modules =
      model::ModuleMatch::parse(module_match_json(targets), prefix + "target_modules", true);
  if (excluded)
    k.config.exclude_modules =
        model::ModuleMatch::parse(module_match_json(*excluded), prefix + "exclude_modules", false);
  k.adapter_path = adapter_path;
  return k;
}

std::shared_ptr<const model::LoraWeights> make_lora_adapters(const LoraKeys& k,
                                                             const model::ModelConfig& base,
                                                             uint64_t seed) {
  if (k.adapter_path) {
    model::LoraWeights lw = model::LoraWeights::load(*k.adapter_path, base);
    log::info("LoRA: adapters from {} (rank {}, alpha {}, {} tensors, {} parameters)",
              *k.adapter_path, lw.rank(), lw.config.alpha, lw.layout.params.size(),
              lw.layout.total);
    return std::make_shared<const model::LoraWeights>(std::move(lw));
  }
  model::LoraWeights lw = model::LoraWeights::create(base, k.config);
  lw.init(seed);
  log::info("LoRA: rank {}, alpha {} (scale {}), {} adapted projections, {} trainable parameters",
            lw.rank(), lw.config.alpha, lw.scale(), lw.layout.params.size() / 2, lw.layout.total);
  return std::make_shared<const model::LoraWeights>(std::move(lw));
}

optim::LrSchedule OptimKeys::schedule(int64_t total_steps) const {
  optim::LrSchedule s;
  s.type = lr_scheduler_type;
  s.total_steps = total_steps;
  s.warmup_steps =
      optim::LrSchedule::resolve_warmup(lr_warmup_steps, lr_warmup_steps_ratio, total_steps);
  s.min_lr_ratio = min_lr_ratio;
  s.num_cycles = num_cycles;
  return s;
}

optim::OffloadConfig OffloadKeys::resolve(Device device) const {
  optim::OffloadConfig o;
  o.params = param_offload ? 1.0 : ratio;
  o.optimizer = optimizer_offload.value_or(false) ? 1.0 : ratio;
  if (device != Device::Cuda && o.any()) {
    log::warn(
        "{}{}param_offload{}: trainer.device=cpu keeps the model in host memory already; nothing "
        "to offload",
        ratio_key ? fmt::format("{} / ", ratio_key) : "", fsdp,
        optimizer_offload ? fmt::format(" / {}optimizer_offload", fsdp) : "");
    return {};
  }
  return o;
}

PpoConfig PpoConfig::read(const config::Config& cfg, int world, bool distributed) {
  PpoConfig c(cfg);
  c.world = world;
  TrainerKeys& t = c.trainer;
  t.device = cfg.get<std::string>("trainer.device");
  t.nccl_timeout = cfg.get<double>("actor_rollout_ref.nccl_timeout");
  t.experiment_name = cfg.get<std::string>("trainer.experiment_name");
  // What checkpoints hold, checked before the first step rather than at the first save.
  auto contents = [&](const std::string& key) {
    return parse_checkpoint_contents(cfg.get<std::vector<std::string>>(key), key);
  };
  const CheckpointContents actor_save =
      contents("actor_rollout_ref.actor.checkpoint.save_contents");
  const CheckpointContents actor_load =
      contents("actor_rollout_ref.actor.checkpoint.load_contents");
  const CheckpointContents critic_save = contents("critic.checkpoint.save_contents");
  const CheckpointContents critic_load = contents("critic.checkpoint.load_contents");
  DataKeys& d = c.data;
  d.train_batch_size = cfg.get<int64_t>("data.train_batch_size");
  d.gen_batch_size = cfg.get<int64_t>("data.gen_batch_size");
  if (world > 1) {
    const int64_t mini = cfg.get<int64_t>("actor_rollout_ref.actor.ppo_mini_batch_size");
    for (const auto& [key, v] : {std::pair{"data.train_batch_size", d.train_batch_size},
                                 std::pair{"data.gen_batch_size", d.gen_batch_size},
                                 std::pair{"actor_rollout_ref.actor.ppo_mini_batch_size", mini}}) {
      VERL_CHECK(
          v % world == 0,
          "{}={} must be a multiple of the {} data-parallel ranks (each takes an equal share)", key,
          v, world);
    }
  }
  c.model_path = cfg.get<std::string>("actor_rollout_ref.model.path");
  c.model_override_config = nlohmann::json::parse(
      cfg.get<config::Json>("actor_rollout_ref.model.override_config").dump());
  d.tokenizer = cfg.get<std::optional<std::string>>("data.tokenizer");
  c.custom_chat_template =
      cfg.get<std::optional<std::string>>("actor_rollout_ref.model.custom_chat_template");
  const std::string rol = "actor_rollout_ref.rollout.";
  RolloutKeys& r = c.rollout;
  const int64_t n = cfg.get<int64_t>(rol + "n");
  {
    // A rank holds every sequence of its share of a step at once (prompt, tokens, log-probs): more
    // than 2^20 (a typo in n, say) would take turns in the KV cache for hours before failing.
    constexpr int64_t kMaxRankSequences = int64_t{1} << 20;
    VERL_CHECK(d.gen_batch_size / world <= kMaxRankSequences / n,
               "data.gen_batch_size {} x actor_rollout_ref.rollout.n {} = {} sequences a step over "
               "{} rank(s), "
               "more than the {} a rank holds; lower one of them",
               d.gen_batch_size, n, d.gen_batch_size * n, world, kMaxRankSequences);
  }
  r.reshard_bucket = cfg.get<int64_t>(rol + "update_weights_bucket_megabytes") * (1 << 20) /
                     static_cast<int64_t>(sizeof(float));
  r.train = read_sampling(cfg, rol, n);
  d.seed = static_cast<uint64_t>(cfg.get<std::optional<int64_t>>("data.seed").value_or(1));
  r.val = read_sampling(cfg, rol + "val_kwargs.", cfg.get<int64_t>(rol + "val_kwargs.n"));
  r.response_length = cfg.get<int64_t>(rol + "response_length");
  r.prompt_length = cfg.get<int64_t>(rol + "prompt_length");
  r.max_model_len = cfg.get<std::optional<int64_t>>(rol + "max_model_len");
  r.ignore_eos = cfg.get<bool>(rol + "ignore_eos");
  r.max_num_seqs = cfg.get<int64_t>(rol + "max_num_seqs");
  r.max_num_batched_tokens = cfg.get<int64_t>(rol + "max_num_batched_tokens");
  r.gpu_memory_utilization = cfg.get<double>(rol + "gpu_memory_utilization");
  r.enforce_eager = cfg.get<bool>(rol + "enforce_eager");
  {
    const std::string k = rol + "length_dist.";
    r.length_dist.type = cfg.get<std::string>(k + "type");
    if (r.length_dist.type != "none") {  // its keys are read only when it is on
      r.length_dist.mean = cfg.get<double>(k + "mean");
      r.length_dist.sigma = cfg.get<double>(k + "sigma");
      r.length_dist.cap = cfg.get<std::optional<int64_t>>(k + "cap");
    }
  }
  {
    MultiTurnKeys& m = r.multi_turn;
    const std::string k = rol + "multi_turn.";
    m.enable = cfg.get<bool>(k + "enable");
    const auto path = [](std::optional<std::string> p) {
      return p ? std::optional<std::string>(data::expand_user(*p)) : std::nullopt;
    };
    m.tool_config_path = path(cfg.get<std::optional<std::string>>(k + "tool_config_path"));
    m.prompt_tool_config_path = path(cfg.get<std::optional<std::string>>("data.tool_config_path"));
    m.max_assistant_turns = cfg.get<std::optional<int64_t>>(k + "max_assistant_turns").value_or(0);
    m.max_user_turns = cfg.get<std::optional<int64_t>>(k + "max_user_turns").value_or(0);
    m.max_parallel_calls = cfg.get<int64_t>(k + "max_parallel_calls");
    m.max_tool_response_length = cfg.get<int64_t>(k + "max_tool_response_length");
    m.tool_response_truncate_side = cfg.get<std::string>(k + "tool_response_truncate_side");
    m.format = cfg.get<std::string>(k + "format");
    m.num_workers = cfg.get<int64_t>(rol + "agent.num_workers");
    // Left at its default, rows naming no agent loop run the tool agent when multi-turn is on
    // with tools (what verl's multi-turn GSM8K example meant: its rows name none).
    const std::string dal = rol + "agent.default_agent_loop";
    m.default_tool_agent = cfg.get<std::string>(dal) == "tool_agent" ||
                           (cfg.origin(dal) == "defaults" && m.enable && m.tool_config_path);
    VERL_CHECK(!m.enable || m.tool_config_path || !m.default_tool_agent,
               "{}enable with agent.default_agent_loop=tool_agent needs {}tool_config_path (the "
               "tools to offer)",
               k, k);
  }
  r.numerics = numerics_from_flags(cfg.get<bool>(rol + "batch_invariant"),
                                   cfg.get<bool>(rol + "match_trainer_numerics"));
  {
    // Groups of T consecutive ranks generate together. verl's default (2) splits nothing unless
    // set, so a data-parallel run stays as it was; with fewer ranks than asked for, the group is
    // every rank when they divide T, else one rank.
    const std::string k = rol + "tensor_model_parallel_size";
    const int64_t want = cfg.get<int64_t>(k);
    if (cfg.origin(k) == "defaults") {
      r.tensor_parallel = 1;
      if (want > 1)
        r.tensor_parallel_note = fmt::format(
            "{} left at verl's default {}: each rank generates its own prompts", k, want);
    } else if (world < want) {
      r.tensor_parallel = want % world == 0 ? world : 1;
      r.tensor_parallel_note = fmt::format("{}={} with {} rank(s): tensor parallel size {} instead",
                                           k, want, world, r.tensor_parallel);
    } else {
      VERL_CHECK(world % want == 0,
                 "{}={} must divide the {} ranks into whole generation groups (trainer.nnodes x "
                 "trainer.n_gpus_per_node)",
                 k, want, world);
      r.tensor_parallel = want;
    }
  }
  d.train_files = cfg.get<std::vector<std::string>>("data.train_files");
  d.val_files = cfg.get<std::optional<std::vector<std::string>>>("data.val_files");
  d.max_prompt_length = cfg.get<int64_t>("data.max_prompt_length");
  d.max_response_length = cfg.get<int64_t>("data.max_response_length");
  t.total_training_steps = cfg.get<std::optional<int64_t>>("trainer.total_training_steps");

  AlgorithmKeys& alg = c.algorithm;
  alg.estimator = parse_adv_estimator(cfg.get<std::string>("algorithm.adv_estimator"));
  c.use_critic = alg.estimator == AdvantageEstimator::GAE ||
                 cfg.get<std::optional<bool>>("critic.enable").value_or(false);
  // The actor's update keys; its forward-only pass (old_log_prob) is cut by rollout.log_prob_*.
  c.actor = read_update(cfg, "actor_rollout_ref.actor", n, world);
  c.actor.save = actor_save;
  c.actor.load = actor_load;
  c.critic.save = critic_save;
  c.critic.load = critic_load;
  c.old_log_prob_batching = read_forward_batching(cfg, rol, world);
  if (c.use_critic) {
    VERL_CHECK(cfg.get<int64_t>("critic.ppo_mini_batch_size") % world == 0,
               "critic.ppo_mini_batch_size={} must be a multiple of the {} data-parallel ranks",
               cfg.get<int64_t>("critic.ppo_mini_batch_size"), world);
    c.critic = read_update(cfg, "critic", n, world);
    c.critic.save = critic_save;
    c.critic.load = critic_load;
    c.critic.optim = read_optim(cfg, "critic", cfg.get<double>("critic.grad_clip"));
    c.critic.gradient_checkpointing = cfg.get<bool>("critic.model.enable_gradient_checkpointing");
    c.critic.offload = read_offload(cfg, "critic.model.fsdp_config.", 0.0, nullptr);
    c.critic_model_path = cfg.get<std::string>("critic.model.path");
    c.critic_override_config =
        nlohmann::json::parse(cfg.get<config::Json>("critic.model.override_config").dump());
    c.critic_cliprange_value = cfg.get<double>("critic.cliprange_value");
    c.critic_loss_agg_mode = parse_loss_agg_mode(cfg.get<std::string>("critic.loss_agg_mode"));
    c.values_batching = read_forward_batching(cfg, "critic.", world);
  }
  alg.use_kl_in_reward = cfg.get<bool>("algorithm.use_kl_in_reward");
  {
    const std::string a = "actor_rollout_ref.actor.";
    PolicyLossConfig& p = c.actor_loss.policy;
    p.clip_ratio = cfg.get<double>(a + "clip_ratio");
    p.clip_ratio_low = cfg.get<std::optional<double>>(a + "clip_ratio_low");
    p.clip_ratio_high = cfg.get<std::optional<double>>(a + "clip_ratio_high");
    p.clip_ratio_c = cfg.get<double>(a + "clip_ratio_c");
    // actor.policy_loss.* and SAPO's temperatures (verl's PolicyLossConfig / ActorConfig)
    const std::string pl = a + "policy_loss.";
    p.loss_mode = parse_policy_loss_mode(cfg.get<std::string>(pl + "loss_mode"));
    p.clip_cov_ratio = cfg.get<double>(pl + "clip_cov_ratio");
    p.clip_cov_lb = cfg.get<double>(pl + "clip_cov_lb");
    p.clip_cov_ub = cfg.get<double>(pl + "clip_cov_ub");
    p.kl_cov_ratio = cfg.get<double>(pl + "kl_cov_ratio");
    p.ppo_kl_coef = cfg.get<double>(pl + "ppo_kl_coef");
    p.tau_pos = cfg.get<double>(a + "tau_pos");
    p.tau_neg = cfg.get<double>(a + "tau_neg");
    p.loss_agg_mode = parse_loss_agg_mode(cfg.get<std::string>(a + "loss_agg_mode"));
    c.actor_loss.entropy_coeff = cfg.get<double>(a + "entropy_coeff");
    c.actor_loss.use_kl_loss = cfg.get<bool>(a + "use_kl_loss");
    c.actor_loss.kl_loss_coef = cfg.get<double>(a + "kl_loss_coef");
    c.actor_loss.kl_loss_type = parse_kl_type(cfg.get<std::string>(a + "kl_loss_type"));
    c.actor.shuffle = cfg.get<bool>(a + "shuffle");
  }
  c.actor.gradient_checkpointing =
      cfg.get<bool>("actor_rollout_ref.model.enable_gradient_checkpointing");
  c.use_ref = c.actor_loss.use_kl_loss || alg.use_kl_in_reward;
  c.lora = read_lora_keys(cfg, "actor_rollout_ref.model.");
  if (c.use_ref) {
    c.ref_batching = read_forward_batching(cfg, "actor_rollout_ref.ref.", world);
    c.ref_offload = read_offload(cfg, "actor_rollout_ref.ref.fsdp_config.", 0.0, nullptr);
    c.ref_quantization = read_quantization(cfg, "actor_rollout_ref.ref.");
  }
  c.actor.optim = read_optim(cfg, "actor_rollout_ref.actor",
                             cfg.get<double>("actor_rollout_ref.actor.grad_clip"));
  c.actor.offload = read_offload(cfg, "actor_rollout_ref.actor.fsdp_config.",
                                 cfg.get<double>("actor_rollout_ref.actor_offload_ratio"),
                                 "actor_rollout_ref.actor_offload_ratio");
  {  // trainer.gradient_sync_method and trainer.lightweight_sync_config
    const std::string method = cfg.get<std::string>("trainer.gradient_sync_method");
    const std::string k = "trainer.lightweight_sync_config.";
    optim::LightweightConfig lw;
    lw.top_k = cfg.get<double>(k + "top_k");
    lw.values = optim::sync_values_named(cfg.get<std::string>(k + "compression_dtype"),
                                         "trainer.lightweight_sync_config.compression_dtype");
    lw.interval = cfg.get<int64_t>(k + "sync_interval_steps");
    lw.error_feedback = cfg.get<bool>(k + "error_feedback");
    if (method == "lightweight") t.lightweight_sync = lw;
  }
  if (alg.use_kl_in_reward) {
    alg.kl_ctrl.type = cfg.get<std::string>("algorithm.kl_ctrl.type");
    alg.kl_ctrl.kl_coef = cfg.get<double>("algorithm.kl_ctrl.kl_coef");
    alg.kl_ctrl.target_kl = cfg.get<double>("algorithm.kl_ctrl.target_kl");
    alg.kl_ctrl.horizon = cfg.get<double>("algorithm.kl_ctrl.horizon");
  }
  alg.kl_penalty = parse_kl_type(cfg.get<std::string>("algorithm.kl_penalty"));
  alg.gamma = cfg.get<double>("algorithm.gamma");
  alg.lam = cfg.get<double>("algorithm.lam");
  alg.norm_adv_by_std_in_grpo = cfg.get<bool>("algorithm.norm_adv_by_std_in_grpo");
  if (alg.estimator == AdvantageEstimator::GDPO) {
    alg.gdpo_reward_keys =
        cfg.get<std::optional<std::vector<std::string>>>("algorithm.gdpo_reward_keys")
            .value_or(std::vector<std::string>{});
    VERL_CHECK(!alg.gdpo_reward_keys.empty(),
               "algorithm.adv_estimator=gdpo needs algorithm.gdpo_reward_keys: the reward "
               "components' keys in what the reward function returns (e.g. "
               "[format_reward,accuracy_reward])");
    alg.gdpo_reward_weights =
        cfg.get<std::optional<std::vector<double>>>("algorithm.gdpo_reward_weights")
            .value_or(std::vector<double>{});
    VERL_CHECK(alg.gdpo_reward_weights.empty() ||
                   alg.gdpo_reward_weights.size() == alg.gdpo_reward_keys.size(),
               "algorithm.gdpo_reward_weights has {} entries for {} gdpo_reward_keys",
               alg.gdpo_reward_weights.size(), alg.gdpo_reward_keys.size());
  }

  RewardKeys& rw = c.reward;
  rw.reward_manager = cfg.get<std::string>("reward_model.reward_manager");
  rw.actor_reward_parallel = cfg.get<bool>("trainer.actor_reward_parallel");
  {
    const auto cmd = cfg.get<std::optional<std::string>>("custom_reward_function.command");
    const auto py = cfg.get<std::optional<std::string>>("custom_reward_function.path");
    VERL_CHECK(!(cmd && py),
               "custom_reward_function.command and custom_reward_function.path are both set "
               "('{}' and '{}'): set one (a program, or a Python file with the scoring function)",
               cmd.value_or(""), py.value_or(""));
    if (cmd || py) {
      reward::CommandRewardConfig rc;
      rc.timeout_s = cfg.get<double>("custom_reward_function.timeout_s");
      rc.on_error = reward::parse_on_error(cfg.get<std::string>("custom_reward_function.on_error"));
      if (py) {
        reward::PythonRewardSpec spec;
        spec.path = data::expand_user(*py);
        spec.name = cfg.get<std::optional<std::string>>("custom_reward_function.name")
                        .value_or("compute_score");
        spec.python = cfg.get<std::string>("custom_reward_function.python");
        const config::Json kw = cfg.get<config::Json>("custom_reward_function.reward_kwargs");
        spec.kwargs = kw.is_null() ? nlohmann::json::object() : nlohmann::json::parse(kw.dump());
        VERL_CHECK(spec.kwargs.is_object(),
                   "custom_reward_function.reward_kwargs: expected a mapping of keyword arguments, "
                   "got {}",
                   spec.kwargs.dump());
        rc.command = reward::python_reward_command(spec);
        rw.python = spec;
      } else {
        rc.command = *cmd;
      }
      rw.command = rc;
    }
  }
  VERL_CHECK(alg.estimator != AdvantageEstimator::GDPO || rw.command,
             "algorithm.adv_estimator=gdpo reads its reward components ({}) from what a "
             "custom_reward_function returns: set custom_reward_function.path (a Python "
             "compute_score returning a dict) or custom_reward_function.command",
             fmt::join(alg.gdpo_reward_keys, ", "));
  if (cfg.get<bool>("reward_model.enable")) {
    RewardModelKeys m;
    m.path_as_configured = cfg.get<std::string>("reward_model.model.path");
    m.path = data::expand_user(m.path_as_configured);
    m.quantization = read_quantization(cfg, "reward_model.");
    m.max_length = cfg.get<std::optional<int64_t>>("reward_model.max_length").value_or(0);
    m.input_tokenizer =
        cfg.get<std::optional<std::string>>("reward_model.model.input_tokenizer").has_value();
    m.forward_max_token_len_per_gpu =
        cfg.get<int64_t>("reward_model.forward_max_token_len_per_gpu");
    m.micro_batch_size_per_gpu =
        cfg.get<std::optional<int64_t>>("reward_model.micro_batch_size_per_gpu");
    m.use_dynamic_bsz = cfg.get<bool>("reward_model.use_dynamic_bsz");
    m.offload = read_offload(cfg, "reward_model.model.fsdp_config.", 0.0, nullptr);
    rw.model = std::move(m);
  }
  {  // reward_model.reward_manager, algorithm.filter_groups, algorithm.rollout_correction
    const std::string ob = "reward_model.overlong_buffer.";
    rw.overlong.enable = cfg.get<bool>(ob + "enable");
    rw.overlong.log = cfg.get<bool>(ob + "log");
    rw.overlong.len = cfg.get<int64_t>(ob + "len");
    rw.overlong.penalty_factor = cfg.get<double>(ob + "penalty_factor");
    rw.overlong.max_resp_len =
        cfg.get<std::optional<int64_t>>("reward_model.reward_kwargs.max_resp_len")
            .value_or(d.max_response_length);
    if (rw.overlong.enable) {
      // verl's DAPORewardManager asserts the same (and divides by len).
      VERL_CHECK(rw.reward_manager == "dapo",
                 "{}enable=true needs reward_model.reward_manager=dapo", ob);
      VERL_CHECK(rw.overlong.len >= 1 && rw.overlong.len <= rw.overlong.max_resp_len,
                 "{}len={} must be within 1..{} (the response length the penalty counts from: "
                 "reward_model.reward_kwargs.max_resp_len, else data.max_response_length)",
                 ob, rw.overlong.len, rw.overlong.max_resp_len);
    }
    auto& fg = alg.filter_groups;
    fg.enable = cfg.get<bool>("algorithm.filter_groups.enable");
    const auto metric = cfg.get<std::optional<std::string>>("algorithm.filter_groups.metric");
    fg.max_num_gen_batches = cfg.get<int64_t>("algorithm.filter_groups.max_num_gen_batches");
    if (!fg.enable) {
      // Settings of a switched-off filter change nothing: say so rather than ignore them.
      if (metric || fg.max_num_gen_batches > 0)
        log::warn(
            "algorithm.filter_groups.metric / max_num_gen_batches are set but "
            "algorithm.filter_groups.enable "
            "is false: every group is kept");
    } else {
      VERL_CHECK(metric.has_value(),
                 "algorithm.filter_groups.enable=true needs algorithm.filter_groups.metric "
                 "(acc, score, seq_reward or seq_final_reward)");
      VERL_CHECK(world == 1,
                 "algorithm.filter_groups.enable=true runs on one rank for now ({} were started): "
                 "the kept groups "
                 "would have to be redistributed over the ranks",
                 world);
      VERL_CHECK(alg.estimator != AdvantageEstimator::ReMax,
                 "algorithm.filter_groups.enable=true with algorithm.adv_estimator=remax is not "
                 "supported (ReMax's "
                 "greedy baselines are generated per prompt batch)");
      VERL_CHECK(!(*metric == "seq_final_reward" && alg.use_kl_in_reward),
                 "algorithm.filter_groups.metric=seq_final_reward with "
                 "algorithm.use_kl_in_reward=true is not "
                 "supported (the KL penalty is applied after filtering here); use seq_reward");
      fg.metric = *metric;
    }
    const std::string rc = "algorithm.rollout_correction.";
    alg.rollout_correction = parse_rollout_correction(
        cfg.get<std::optional<std::string>>(rc + "rollout_is"),
        cfg.get<double>(rc + "rollout_is_threshold"),
        cfg.get<bool>(rc + "rollout_is_batch_normalize"),
        cfg.get<std::optional<std::string>>(rc + "rollout_rs"),
        cfg.get<std::optional<std::string>>(rc + "rollout_rs_threshold"),
        cfg.get<bool>(rc + "bypass_mode"), cfg.get<std::string>(rc + "loss_type"),
        cfg.get<std::optional<double>>(rc + "rollout_rs_threshold_lower"),
        cfg.get<std::optional<double>>(rc + "rollout_token_veto_threshold"));
    VERL_CHECK(alg.rollout_correction.bypass_mode || alg.rollout_correction.loss_type == "ppo_clip",
               "{}loss_type={} applies to bypass mode only; set {}bypass_mode=true", rc,
               alg.rollout_correction.loss_type, rc);
  }
  if (rw.model && (rw.command || rw.reward_manager == "dapo"))
    log::warn(
        "reward_model.enable=true: the reward model's scores are the reward (as verl's reward "
        "managers "
        "return rm_scores); {} is not used",
        rw.command ? "custom_reward_function" : "the dapo overlong buffer");
  d.dynamic_batch = cfg.get<bool>("data.dynamic_batch.enable");
  // The seed's overlap switches (docs/overlap.md), where the run allows them.
  t.token_level_pipeline = cfg.get<bool>("trainer.token_level_pipeline");
  if (t.token_level_pipeline && alg.filter_groups.enable) {
    log::warn(
        "trainer.token_level_pipeline with algorithm.filter_groups: dynamic sampling drops and "
        "regenerates "
        "groups after generation, so the log-prob passes run after it (no pipeline)");
    t.token_level_pipeline = false;
  }
  if (world > 1)
    t.balance_batch = cfg.get<bool>("trainer.balance_batch");  // one rank has nothing to balance
  if (t.token_level_pipeline && world > 1 && t.balance_batch) {
    log::warn(
        "trainer.token_level_pipeline with trainer.balance_batch on {} ranks: balancing moves rows "
        "between "
        "ranks after generation, so the log-prob passes run after it; set "
        "trainer.balance_batch=false to "
        "pipeline them",
        world);
    t.token_level_pipeline = false;
  }
  t.critic_actor_overlap = cfg.get<bool>("trainer.critic_actor_overlap");
  if (t.critic_actor_overlap && d.dynamic_batch) {
    log::warn(
        "trainer.critic_actor_overlap with data.dynamic_batch.enable: both updates would adapt the "
        "one "
        "token budget at once; they run one after the other");
    t.critic_actor_overlap = false;
  }
  if (t.critic_actor_overlap && distributed) {
    log::warn(
        "trainer.critic_actor_overlap with a communicator ({} ranks): the two updates' gradient "
        "collectives "
        "would interleave in different orders on different ranks; they run one after the other",
        world);
    t.critic_actor_overlap = false;
  }
  t.one_step_off_policy = cfg.get<bool>("trainer.one_step_off_policy");
  if (t.one_step_off_policy) {
    const std::string k = "trainer.one_step_off_policy";
    VERL_CHECK(!alg.filter_groups.enable,
               "{}=true with algorithm.filter_groups: dynamic "
               "sampling takes further batches from the loader inside a step, which the next "
               "step's rollout has "
               "already taken; turn one of them off",
               k);
    VERL_CHECK(c.actor.zero_stage < 3,
               "{}=true with "
               "actor_rollout_ref.actor.zero_stage=3: the rollout's whole weights are gathered "
               "with collectives, "
               "which a rollout beside training must not start; use zero_stage 0-2",
               k);
    VERL_CHECK(r.tensor_parallel == 1,
               "{}=true with {}tensor_model_parallel_size={}: a tensor-parallel rollout runs "
               "collectives, which a rollout beside training must not start; set one of them off",
               k, rol, r.tensor_parallel);
  }
  t.critic_warmup = cfg.get<int64_t>("trainer.critic_warmup");
  t.rollout_data_dir = cfg.get<std::optional<std::string>>("trainer.rollout_data_dir");
  t.validation_data_dir = cfg.get<std::optional<std::string>>("trainer.validation_data_dir");
  t.log_val_generations = cfg.get<int64_t>("trainer.log_val_generations");
  t.resume_mode = cfg.get<std::string>("trainer.resume_mode");
  t.default_local_dir = cfg.get<std::string>("trainer.default_local_dir");
  t.resume_from_path = cfg.get<std::optional<std::string>>("trainer.resume_from_path");
  t.max_actor_ckpt_to_keep =
      cfg.get<std::optional<int64_t>>("trainer.max_actor_ckpt_to_keep").value_or(0);
  t.max_critic_ckpt_to_keep =
      cfg.get<std::optional<int64_t>>("trainer.max_critic_ckpt_to_keep").value_or(0);
  t.logger = cfg.get<std::vector<std::string>>("trainer.logger");
  t.logging_steps = cfg.get<int64_t>("trainer.logging_steps");
  t.test_freq = cfg.get<int64_t>("trainer.test_freq");
  t.save_freq = cfg.get<int64_t>("trainer.save_freq");
  t.val_before_train = cfg.get<bool>("trainer.val_before_train");
  t.val_only = cfg.get<bool>("trainer.val_only");
  return c;
}

model::ModelConfig apply_model_overrides(const std::string& model_dir,
                                         const model::ModelConfig& loaded,
                                         const nlohmann::json& overrides, const std::string& key) {
  std::vector<std::string> ignored;
  model::ModelConfig c = model::apply_config_overrides(model_dir, loaded, overrides, key, &ignored);
  for (const std::string& f : ignored)
    log::warn(
        "{}.{} has no effect in verl.cpp (its own attention kernels, no KV cache in "
        "training); ignored",
        key, f);
  return c;
}

}  // namespace verl::trainer
