// The step dataflow of verl's RayPPOTrainer.fit on our engine: one call per stage over the
// workers (actor_worker, critic_worker, rollout_worker, reward_manager) and the recipes beside it.
// Names of stages, metrics and config keys are verl's (verl/trainer/ppo/ray_trainer.py,
// metric_utils.py).
#include "trainer/ppo_trainer.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <map>
#include <span>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/run_lock.h"
#include "core/signals.h"
#include "core/timer.h"
#include "data/dynamic_batch.h"
#include "metrics/gpu_monitor.h"
#include "metrics/logger.h"
#include "model/generation_config.h"
#include "reward/score.h"
#include "tokenizer/tokenizer.h"
#include "trainer/checkpoint.h"
#include "trainer/ranks.h"

namespace verl::trainer {

// The ranks the launcher started (one process without a launcher: exactly as before). On GPUs
// each rank takes its local rank's device and the device collectives go through NCCL.
PpoTrainer::PpoTrainer(const config::Config& cfg)
    : device_(resolve_device(cfg.get<std::string>("trainer.device"))),
      comm_(start_ranks(cfg, device_, cfg.get<double>("actor_rollout_ref.nccl_timeout"))),
      cfg_(PpoConfig::read(cfg, comm_->world_size(), comm_->distributed())),
      plan_(RunPlan::from(cfg_)),
      memory_(device_) {
  model::Weights actor_weights = model::Weights::load(cfg_.model_path);
  VERL_CHECK(actor_weights.config.head == model::HeadKind::CausalLM,
             "actor_rollout_ref.model.path={}: the actor must be a causal LM, got {}",
             cfg_.model_path, actor_weights.config.architecture);
  actor_weights.config =
      apply_model_overrides(cfg_.model_path, actor_weights.config, cfg_.model_override_config,
                            "actor_rollout_ref.model.override_config");
  if (cfg_.lora)
    lora_meta_ = lora_checkpoint_meta(cfg_.lora->config.r, cfg_.model_path, actor_weights);
  tokenizer_dir_ = cfg_.data.tokenizer.value_or(cfg_.model_path);
  tok_ = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::load(tokenizer_dir_));
  if (cfg_.custom_chat_template)
    tok_->set_chat_template(*cfg_.custom_chat_template,
                            "actor_rollout_ref.model.custom_chat_template");
  std::vector<int32_t> eos_ids =
      model::generation_eos_ids(cfg_.model_path, actor_weights.config, tok_->eos_token_id());

  // Rows the built-in scorers would reject fail at load, naming file:line (a command scores its
  // own).
  const bool rule_rewards = !cfg_.reward.command;
  auto dataset_options = [&](bool validation) {
    data::DatasetOptions o = data::DatasetOptions::from_config(cfg_.raw, validation);
    // verl's dataset renders the prompts with the tools of data.tool_config_path.
    if (const auto& mt = cfg_.rollout.multi_turn; mt.enable && mt.prompt_tool_config_path)
      o.chat_template_kwargs["tools"] = agent::Toolbox::load(*mt.prompt_tool_config_path).schemas();
    if (rule_rewards)
      o.check_reward_inputs = [](const std::string& ds, const nlohmann::json& gt) {
        reward::check_reward_inputs(ds, gt);
      };
    return o;
  };
  train_set_ = std::make_unique<data::RLDataset>(
      data::RLDataset::load(cfg_.data.train_files, *tok_, dataset_options(false)));
  if (cfg_.data.val_files)
    val_set_ = std::make_unique<data::RLDataset>(
        data::RLDataset::load(*cfg_.data.val_files, *tok_, dataset_options(true)));
  train_loader_ = std::make_unique<data::DataLoader>(
      *train_set_, data::LoaderOptions::train_from_config(cfg_.raw));
  total_steps_ = train_loader_->total_batches();
  if (cfg_.trainer.total_training_steps)
    total_steps_ = std::min(total_steps_, *cfg_.trainer.total_training_steps);

  if (plan_.critic)
    critic_ = std::make_unique<CriticWorker>(cfg_, plan_, device_, *comm_, total_steps_);
  actor_ = std::make_unique<ActorWorker>(cfg_, plan_, device_, std::move(actor_weights), *comm_,
                                         total_steps_);
  if (cfg_.lora) lora_meta_["rank"] = actor_->model().lora()->rank();  // lora_adapter_path's own
  // A reference policy inside the LoRA actor holds nothing of its own.
  memory_.set_models({&actor_->model(), actor_->ref_in_actor() ? nullptr : actor_->ref(),
                      critic_ ? &critic_->model() : nullptr});
  if (device_ == Device::Cuda) {
    log::info(
        "trainer.device={}: actor{} on cuda, micro-batches of at most {} tokens, {:.2f} GiB of "
        "device memory "
        "in use; the rollout runs on the GPU from the actor's bf16 weights",
        cfg_.trainer.device, actor_->ref() ? " and reference policy" : "",
        actor_->model().max_tokens(), static_cast<double>(device_memory_in_use()) / (1 << 30));
  }
  if (const auto& k = cfg_.algorithm.kl_ctrl; cfg_.algorithm.use_kl_in_reward)
    kl_ctrl_ = KlController::from_config(k.type, k.kl_coef, k.target_kl, k.horizon);
  reward_ = RewardManager::create(cfg_, device_, *tok_);
  // NVML sampling from the start on the GPU, so that a caller driving train_step itself (`verl
  // bench grpo-step`) gets perf/gpu_util_mean and perf/gpu_idle_share too.
  if (comm_->rank() == 0 && device_ == Device::Cuda)
    gpu_monitor_ = std::make_unique<metrics::GpuMonitor>();
  if (const auto db = data::DynamicBatchConfig::from_config(cfg_.raw); db.enable) {
    // The token budget follows the memory in use: the device's on cuda, the process's resident set
    // on cpu (where the CPU model's activations live); the fullest rank's, so all ranks agree.
    data::MemoryReading memory = [this] {
      const auto used = static_cast<int64_t>(
          device_ == Device::Cuda ? device_memory_in_use() : metrics::current_rss_bytes());
      return static_cast<double>(comm_->world_size() > 1 ? comm_->max(used) : used);
    };
    const int64_t planned = cfg_.data.max_prompt_length + cfg_.rollout.response_length;
    dyn_batch_ = std::make_unique<data::DynamicBatchSampler>(
        db, planned, cfg_.actor.ppo_max_token_len_per_gpu, std::move(memory));
    log::info(
        "data.dynamic_batch: samples of {}..{} tokens, micro-batches of {} tokens (floor {}), "
        "communication_sensitivity={}",
        db.min_sequence_length, db.max_sequence_length, dyn_batch_->ceiling(), dyn_batch_->floor(),
        db.communication_sensitivity);
  }
  rollout_ = std::make_unique<RolloutWorker>(cfg_, device_, *actor_, critic_.get(), *reward_,
                                             memory_, std::move(eos_ids), *comm_, tok_.get());
  if (cfg_.algorithm.filter_groups.enable)
    dynamic_sampling_ = std::make_unique<DynamicSampling>(cfg_, *rollout_);
  if (cfg_.trainer.one_step_off_policy)
    one_step_off_ =
        std::make_unique<OneStepOff>(*rollout_, actor_->model(), *train_loader_, *comm_);
  log::info("PPO trainer: {} ({} parameters), {} training prompts, {} steps, adv_estimator={}{}{}",
            cfg_.model_path, actor_->model().state().numel(), train_set_->size(), total_steps_,
            to_string(cfg_.algorithm.estimator), critic_ ? ", critic" : "",
            actor_->ref() ? ", reference model" : "");
}

PpoTrainer::~PpoTrainer() {
  one_step_off_.reset();  // waits for a rollout still running for a step that will not come
  if (logger_) logger_->close();
}

// ---- the step
// ---------------------------------------------------------------------------------------

metrics::Metrics PpoTrainer::train_step(const data::Batch& batch) {
  metrics::StageTimer timer;
  metrics::Metrics m;
  Experience exp;
  auto step_scope = timer.scope("step");
  // This rank's share of the prompts (a prompt's n samples stay on one rank); sampling seeds come
  // from the global prompt index, so the step's samples do not depend on the world size.
  const auto [local, first] = rank_share(batch.samples, *comm_);
  TokenPipeline pipe;
  int64_t staleness = 0;
  double exchange_bytes = 0;
  const std::unique_ptr<OneStepOff::Prefetch> ready =
      gen(batch, local, first, exp, pipe, timer, m, staleness);
  if (!reward(batch, exp, timer, m, exchange_bytes)) return m;  // out of data: fit() stops
  old_log_prob(exp, pipe, staleness, timer, m);
  ref(exp, pipe, timer, m);
  values(exp, pipe, timer, m);
  adv(exp, local, first, timer, m, exchange_bytes);
  update(exp, timer, m);
  step_scope.stop();
  ++global_step_;
  step_metrics(batch, exp, timer, ready.get(), m);
  return m;
}

std::unique_ptr<OneStepOff::Prefetch> PpoTrainer::gen(const data::Batch& batch,
                                                      const std::vector<data::Sample>& local,
                                                      int64_t first, Experience& exp,
                                                      TokenPipeline& pipe,
                                                      metrics::StageTimer& timer,
                                                      metrics::Metrics& m, int64_t& staleness) {
  comm_->set_stage("gen");
  (void)take_tracked_device_peak();  // each phase's device peak counts from its start
  pipe = rollout_->pipeline_plan(
      needs_old_log_prob(static_cast<int64_t>(local.size()) * cfg_.rollout.train.n, 0));
  // trainer.one_step_off_policy: the rollout the last step started from its weights (kept alive:
  // the experience's samples point into it), else this step's own.
  std::unique_ptr<OneStepOff::Prefetch> ready =
      one_step_off_ ? one_step_off_->take(batch) : nullptr;
  staleness = ready ? global_step_ - ready->weights_step : 0;
  if (ready) {
    exp = std::move(ready->exp);
    pipe = TokenPipeline{};  // the passes need this step's weights: they run below
  } else {
    rollout_->generate(local, first, exp, timer, {.pipe = &pipe, .step = global_step_ + 1});
  }
  memory_.record(m, "gen");
  if (one_step_off_) {
    m.set("rollout/staleness", static_cast<double>(staleness));
    m.set("rollout/weights_step", static_cast<double>(global_step_ - staleness));
    if (global_step_ + 1 < total_steps_)
      one_step_off_->start(global_step_);  // the next step's rollout, beside this one
  }
  return ready;
}

bool PpoTrainer::reward(const data::Batch& batch, Experience& exp, metrics::StageTimer& timer,
                        metrics::Metrics& m, double& exchange_bytes) {
  if (dynamic_sampling_ && !dynamic_sampling_->run(batch, exp, timer, m, global_step_ + 1,
                                                   [this] { return next_batch(); })) {
    out_of_data_ = true;
    return false;
  }
  const std::vector<data::Sample>& step_samples =
      dynamic_sampling_ ? dynamic_sampling_->kept_samples() : batch.samples;
  if (cfg_.trainer.rollout_data_dir)
    dump_generations(*cfg_.trainer.rollout_data_dir, "trainer.rollout_data_dir", global_step_ + 1,
                     generation_rows(*tok_, exp), *comm_);
  add_rollout_metrics(exp, tok_->vocab_size(), *comm_, m);
  rollout_->add_layout_metrics(m);
  rollout_->add_agent_metrics(m);
  // verl's _balance_batch: the ranks swap rows so each holds a similar workload for the passes
  // and updates that follow (one rank has nothing to balance).
  if (comm_->world_size() > 1 && cfg_.trainer.balance_batch) {
    auto s = timer.scope("balance");
    comm_->set_stage("balance_batch");
    BalanceResult br = balance_across_ranks(exp, step_samples, *comm_);
    for (const auto& [k, v] : br.metrics) m.set(k, v);
    exchange_bytes += static_cast<double>(br.bytes_sent);
  }
  // data.dynamic_batch's length bounds, before every pass: no loss, KL term or rollout correction
  // sees a dropped sample's tokens, while its score stays in its group's baseline.
  if (dyn_batch_) drop_by_length(exp, m);
  return true;
}

void PpoTrainer::old_log_prob(Experience& exp, const TokenPipeline& pipe, int64_t staleness,
                              metrics::StageTimer& timer, metrics::Metrics& m) {
  if (cfg_.algorithm.rollout_correction.bypass_mode) {
    // verl's apply_bypass_mode: the rollout's log-probs are the old policy's (no recomputation).
    exp.old_log_prob = exp.rollout_log_prob;
    return;
  }
  if (!needs_old_log_prob(exp.B, staleness)) return;
  auto s = timer.scope("old_log_prob");
  comm_->set_stage("old_log_prob");
  (void)take_tracked_device_peak();
  if (pipe.old_log_prob) {
    exp.old_log_prob = TokenPipeline::matrix(pipe.old_rows, exp.B, exp.L);
  } else {
    actor_->compute_old_log_prob(exp, pass_context(), exp.old_log_prob);
  }
  memory_.record(m, "old_log_prob");
  ProbsDiff diff;
  diff.add(exp.rollout_log_prob, exp.old_log_prob, exp.mask);
  diff.reduce(*comm_);
  diff.report(m);
  apply_rollout_correction(exp, m);
}

void PpoTrainer::ref(Experience& exp, const TokenPipeline& pipe, metrics::StageTimer& timer,
                     metrics::Metrics& m) {
  PolicyModel* ref = actor_->ref();
  if (!ref) return;
  auto s = timer.scope("ref");
  comm_->set_stage("ref");
  (void)take_tracked_device_peak();
  if (pipe.ref) {
    exp.ref_log_prob = TokenPipeline::matrix(pipe.ref_rows, exp.B, exp.L);
    return;
  }
  ref->wake();
  actor_->compute_ref_log_prob(exp, pass_context(), exp.ref_log_prob);
  memory_.record(m, "ref");
  ref->sleep();
}

void PpoTrainer::values(Experience& exp, const TokenPipeline& pipe, metrics::StageTimer& timer,
                        metrics::Metrics& m) {
  if (!critic_) return;
  auto s = timer.scope("values");
  comm_->set_stage("values");
  (void)take_tracked_device_peak();
  if (pipe.values) {
    exp.values = TokenPipeline::matrix(pipe.value_rows, exp.B, exp.L);
    return;
  }
  critic_->compute_values(exp, pass_context(), exp.values);
  memory_.record(m, "values");
}

void PpoTrainer::adv(Experience& exp, const std::vector<data::Sample>& local, int64_t first,
                     metrics::StageTimer& timer, metrics::Metrics& m, double& exchange_bytes) {
  auto s = timer.scope("adv");
  comm_->set_stage("adv");
  const AlgorithmKeys& alg = cfg_.algorithm;
  // The advantages are computed over the global batch, as verl's driver does: GAE's and
  // REINFORCE++'s whitening and the adaptive KL controller take batch-wide statistics. With
  // several ranks each gathers the per-token [B, L] rows it needs (rewards, log-probs, values,
  // masks: no hidden-size or vocabulary-size tensor) and keeps its own rows of the result.
  GlobalRows g(*comm_, exp);
  const std::vector<float> scores = g.gather(exp.token_level_scores), mask = g.gather(exp.mask);
  std::vector<float> rewards = scores;
  if (kl_ctrl_) {
    KlInRewardOutput k =
        apply_kl_penalty(g.shape(), scores, g.gather(exp.old_log_prob), g.gather(exp.ref_log_prob),
                         mask, *kl_ctrl_, alg.kl_penalty);
    rewards = std::move(k.token_level_rewards);
    m.set("actor/reward_kl_penalty", k.current_kl);
    m.set("actor/reward_kl_penalty_coeff", k.beta);
  }
  const std::vector<float> values = g.gather(exp.values);
  const std::vector<int64_t> index = g.gather_index(exp.group);
  AdvantageInputs in;
  in.shape = g.shape();
  in.token_level_rewards = rewards;
  in.response_mask = mask;
  in.values = values;
  in.index = index;
  in.gamma = alg.gamma;
  in.lam = alg.lam;
  in.norm_adv_by_std_in_grpo = alg.norm_adv_by_std_in_grpo;
  std::vector<float> baselines;
  if (alg.estimator == AdvantageEstimator::ReMax) {
    baselines = remax_baselines(*rollout_, local, first, exp, g, timer, global_step_ + 1);
    in.reward_baselines = baselines;
  }
  std::vector<std::vector<float>> components;
  if (alg.estimator == AdvantageEstimator::GDPO)
    components = gdpo_components(exp, alg.gdpo_reward_keys, g);
  in.reward_components = components;
  in.reward_weights = alg.gdpo_reward_weights;
  AdvantageOutput a = compute_advantage(alg.estimator, in);
  exp.token_level_rewards = g.mine(rewards);
  exp.advantages = g.mine(a.advantages);
  exp.returns = g.mine(a.returns);
  exchange_bytes += static_cast<double>(g.bytes_sent());
  m.set("perf/exchange_bytes", exchange_bytes);
}

void PpoTrainer::update(Experience& exp, metrics::StageTimer& timer, metrics::Metrics& m) {
  // verl counts steps from 1 here: the actor updates once critic_warmup <= the step number.
  const bool actor = global_step_ + 1 >= cfg_.trainer.critic_warmup;
  const PassContext ctx = pass_context();
  const auto critic_update = [&](metrics::Metrics& into) {
    auto s = timer.scope("update_critic");
    (void)take_tracked_device_peak();
    critic_->update(exp, into, global_step_, ctx);
    memory_.record(into, "update_critic");
  };
  const auto actor_update = [&] {
    auto s = timer.scope("update_actor");
    comm_->set_stage("update_actor");
    (void)take_tracked_device_peak();
    data::DynamicBatchStats before;
    if (dyn_batch_)
      before = dyn_batch_->take_stats();  // the forward passes' and the critic's packings
    actor_->update(exp, m, global_step_, ctx,
                   memory_);  // records update_actor's and the optimizer's memory
    if (dyn_batch_)
      add_dynamic_batch_metrics(before, dyn_batch_->take_stats(), *comm_, dyn_batch_->budget(), m);
  };
  if (critic_ && actor && cfg_.trainer.critic_actor_overlap) {
    // The two updates read the step's experience and write nothing of it; each has its own model,
    // state and (on the GPU) stream. Their memory peaks share one counter, so each phase's peak
    // is the two together.
    metrics::Metrics cm;
    std::exception_ptr critic_error;
    std::thread t([&] {
      try {
        critic_update(cm);
      } catch (...) {
        critic_error = std::current_exception();
      }
    });
    try {
      actor_update();
    } catch (...) {
      t.join();
      throw;
    }
    t.join();
    if (critic_error) std::rethrow_exception(critic_error);
    for (const auto& [k, v] : cm) m.set(k, v);
    return;
  }
  if (critic_) {
    comm_->set_stage("update_critic");
    critic_update(m);
  }
  if (actor) actor_update();
}

void PpoTrainer::step_metrics(const data::Batch& batch, const Experience& exp,
                              const metrics::StageTimer& timer, const OneStepOff::Prefetch* ready,
                              metrics::Metrics& m) {
  if (comm_->distributed())
    add_sync_metrics({&actor_->model(), critic_ ? &critic_->model() : nullptr}, m);
  add_data_metrics(exp, *comm_, cfg_.rollout.response_length, cfg_.data.max_prompt_length, m);
  reward_->add_extra_metrics(exp, m);
  add_timing_metrics(timer, cfg_.trainer.token_level_pipeline,
                     cfg_.trainer.critic_actor_overlap && critic_, m);
  // The rollout ran during the last step: its own times, and how long this one waited.
  if (ready) OneStepOff::add_timing_metrics(*ready, m);
  int64_t total_tokens = 0;
  for (int64_t b = 0; b < exp.B; ++b) total_tokens += exp.tokens(b);
  // verl's perf/throughput: tokens of the global batch / (step time x world size).
  metrics::add_throughput(m, comm_->sum(total_tokens), timer.seconds("step"), comm_->world_size());
  m.set("training/global_step", static_cast<double>(global_step_));
  m.set("training/epoch", static_cast<double>(batch.epoch));
  // Memory (the seed's per-phase figures start here) and, where NVML sees a GPU, its utilisation.
  metrics::add_cpu_memory_metrics(m);
  if (gpu_monitor_ && gpu_monitor_->available())
    metrics::add_gpu_metrics(m, gpu_monitor_->snapshot());
}

bool PpoTrainer::needs_old_log_prob(int64_t rows, int64_t staleness) const {
  if (cfg_.algorithm.rollout_correction.bypass_mode)
    return false;  // the rollout's log-probs serve as the old ones
  // A rollout from older weights (one-step-off) is never on-policy.
  const bool on_policy = staleness == 0 && cfg_.actor.ppo_epochs == 1 && cfg_.actor.mini >= rows;
  return !on_policy || kl_ctrl_.has_value() || cfg_.algorithm.rollout_correction.corrects();
}

void PpoTrainer::apply_rollout_correction(Experience& exp, metrics::Metrics& m) {
  const RolloutCorrectionConfig& rc = cfg_.algorithm.rollout_correction;
  // verl computes it on the driver over the whole batch: gather the three [B, L] matrices.
  GlobalRows g(*comm_, exp);
  const std::vector<float> old = g.gather(exp.old_log_prob),
                           rollout = g.gather(exp.rollout_log_prob), mask = g.gather(exp.mask);
  if (std::all_of(mask.begin(), mask.end(), [](float v) { return v == 0.0f; })) return;  // no token
  RolloutCorrectionOutput out = compute_rollout_correction(g.shape(), old, rollout, mask, rc);
  for (const auto& [k, v] : out.metrics) m.set(k, v);
  if (!rc.rollout_rs.empty()) exp.mask = g.mine(out.response_mask);
  if (rc.rollout_is) exp.rollout_is_weights = g.mine(out.rollout_is_weights);
}

void PpoTrainer::drop_by_length(Experience& exp, metrics::Metrics& m) const {
  int64_t dropped = 0;
  for (int64_t b = 0; b < exp.B; ++b) {
    if (dyn_batch_->keeps(exp.tokens(b))) continue;
    std::fill_n(exp.mask.begin() + b * exp.L, exp.L, 0.0f);
    ++dropped;
  }
  m.set("dynamic_batch/dropped_samples", static_cast<double>(comm_->sum(dropped)));
}

std::optional<data::Batch> PpoTrainer::next_batch() {
  return one_step_off_ ? one_step_off_->next_batch() : train_loader_->next();
}

// ---- validation, checkpoints, the loop
// ------------------------------------------------------------

metrics::Metrics PpoTrainer::validate() {
  metrics::Metrics m;
  if (!val_set_) return m;
  Timer t;
  data::DataLoader loader(*val_set_,
                          data::LoaderOptions::val_from_config(cfg_.raw, val_set_->size()));
  std::map<std::string, std::pair<double, int64_t>> per_source;
  const int64_t n = cfg_.rollout.val.n;
  const auto& dump_dir = cfg_.trainer.validation_data_dir;
  const int64_t to_log = cfg_.trainer.log_val_generations;
  std::vector<GenerationRow> generations;  // this rank's, for the dump and the log
  comm_->set_stage("testing");
  while (auto batch = loader.next()) {
    metrics::StageTimer timer;
    Experience exp;
    // Every rank sees the whole batch and generates its share; the sums per data source are then
    // reduced over the sources of the whole batch, which every rank knows.
    for (const data::Sample& s : batch->samples) per_source.try_emplace(s.data_source, 0.0, 0);
    const int64_t world = comm_->world_size(), n = static_cast<int64_t>(batch->samples.size());
    const int64_t begin = n * comm_->rank() / world, end = n * (comm_->rank() + 1) / world;
    const std::vector<data::Sample> local(batch->samples.begin() + begin,
                                          batch->samples.begin() + end);
    rollout_->generate(local, begin, exp, timer, {.validation = true, .step = global_step_ + 1});
    if (dump_dir || to_log > 0) {
      std::vector<GenerationRow> g = generation_rows(*tok_, exp);
      generations.insert(generations.end(), std::make_move_iterator(g.begin()),
                         std::make_move_iterator(g.end()));
    }
    for (int64_t b = 0; b < exp.B; ++b) {
      auto& acc = per_source[exp.sample[b]->data_source];
      acc.first += exp.scores[b];
      acc.second += 1;
    }
  }
  if (comm_->world_size() > 1) {
    std::vector<double> sums;
    for (const auto& [src, acc] : per_source) {
      sums.push_back(acc.first);
      sums.push_back(static_cast<double>(acc.second));
    }
    comm_->all_reduce(std::span<double>(sums), dist::ReduceOp::Sum);
    size_t i = 0;
    for (auto& [src, acc] : per_source) {
      acc.first = sums[i++];
      acc.second = static_cast<int64_t>(sums[i++]);
    }
  }
  for (const auto& [src, acc] : per_source) {
    m.set(fmt::format("val-core/{}/reward/mean@{}", src, n),
          acc.first / std::max<int64_t>(1, acc.second));
  }
  if (dump_dir)
    dump_generations(*dump_dir, "trainer.validation_data_dir", global_step_, generations, *comm_);
  if (comm_->rank() == 0) log_val_generations(std::move(generations), to_log, global_step_);
  m.set("timing_s/testing", t.seconds());
  return m;
}

void PpoTrainer::resume() {
  const std::string dir =
      resume_checkpoint_dir(cfg_.trainer.resume_mode, cfg_.trainer.default_local_dir,
                            cfg_.trainer.resume_from_path, /*warn=*/comm_->rank() == 0);
  if (dir.empty()) return;
  // The checkpoint's files do not depend on the device: load on the host, then hand the actor's
  // weights and AdamW state to its model (on cuda: uploaded).
  const model::Weights& current = actor_->model().weights();
  model::Weights actor_weights{current.config, current.layout, {}};
  check_lora_resume(dir, lora_meta_);
  if (cfg_.lora)  // the adapters' layout and no config: load_checkpoint reads actor/lora_adapter
    actor_weights = model::Weights{{}, actor_->model().state().layout(), {}};
  AdamWState actor_opt;
  std::optional<model::Weights> critic_weights;
  AdamWState critic_opt;
  if (critic_) {
    const model::Weights& cw = critic_->model().weights();
    critic_weights = model::Weights{cw.config, cw.layout, {}};
  }
  // A sharded state loads only its slice of the moments, from whichever files the checkpoint has
  // (whole, or shards of any world size).
  auto slice = [](PolicyModel& p) -> std::optional<optim::ShardSpec> {
    if (p.state().whole()) return std::nullopt;
    return p.state().shard();
  };
  const std::optional<optim::ShardSpec> actor_shard = slice(actor_->model());
  const std::optional<optim::ShardSpec> critic_shard =
      critic_ ? slice(critic_->model()) : std::nullopt;
  // checkpoint.load_contents: without optimizer, the moments start fresh.
  const CheckpointContents& actor_load = cfg_.actor.load;
  const CheckpointContents critic_load = critic_ ? cfg_.critic.load : CheckpointContents{};
  nlohmann::json st =
      load_checkpoint(dir, actor_weights, actor_opt, critic_ ? &*critic_weights : nullptr,
                      critic_ ? &critic_opt : nullptr, actor_shard ? &*actor_shard : nullptr,
                      critic_shard ? &*critic_shard : nullptr, actor_load, critic_load);
  if (comm_->rank() == 0)
    for (const auto& [load, section] :
         {std::pair{actor_load, "actor_rollout_ref.actor"}, std::pair{critic_load, "critic"}})
      if (!load.optimizer)
        log::warn(
            "{}: {}.checkpoint.load_contents leaves out the optimizer: AdamW's moments start fresh",
            dir, section);
  actor_->model().restore(std::move(actor_weights.data), std::move(actor_opt));
  if (critic_) critic_->model().restore(std::move(critic_weights->data), std::move(critic_opt));
  // LightweightSync: each rank's carry (the gradient it still owes) and the interval's phase.
  auto restore_carry = [&](PolicyModel& p, const char* part) {
    optim::Strategy& st = p.strategy();
    if (!st.lightweight() || !st.lightweight()->needs_carry()) return;
    const std::string from = (std::filesystem::path(dir) / part).string();
    std::optional<SyncCarry> c =
        load_sync_carry(from, p.state().numel(), comm_->world_size(), comm_->rank());
    if (!c) {
      if (comm_->rank() == 0)
        log::warn(
            "{}: no LightweightSync carry (saved without gradient_sync_method=lightweight): "
            "starting from an "
            "empty one",
            from);
      st.upload_carry({}, 0);
      return;
    }
    st.upload_carry(c->carry, c->sync_calls);
  };
  restore_carry(actor_->model(), "actor");
  if (critic_) restore_carry(critic_->model(), "critic");
  global_step_ = st.at("global_step").get<int64_t>();
  train_loader_->load_state(st.at("dataloader"));
  if (kl_ctrl_ && st.contains("kl_coef")) {
    kl_ctrl_ = kl_ctrl_->is_adaptive() ? KlController::adaptive(st["kl_coef"].get<double>(),
                                                                cfg_.algorithm.kl_ctrl.target_kl,
                                                                cfg_.algorithm.kl_ctrl.horizon)
                                       : KlController::fixed(st["kl_coef"].get<double>());
  }
  log::info("resumed from {} at step {}", dir, global_step_);
}

std::string PpoTrainer::save() {
  // Every rank calls this. A ZeRO-sharded optimizer state is written by every rank, its own slice,
  // in parallel; otherwise rank 0 holds everything and writes alone (checkpoint.h).
  comm_->set_stage("save");
  const bool lead = comm_->rank() == 0;
  struct Part {
    AdamWState opt;
    std::vector<float> carry;
    ModelState ms;
  };
  // ZeRO-3: rank 0 writes the whole weights, gathered from the shards for the save.
  std::optional<FullWeights> actor_full, critic_full;
  actor_full.emplace(actor_->model(), cfg_.rollout.reshard_bucket);
  if (critic_) critic_full.emplace(critic_->model(), cfg_.rollout.reshard_bucket);
  // checkpoint.save_contents: the optimizer state is written unless the list leaves it out.
  auto part = [&](PolicyModel& p, const CheckpointContents& contents) {
    Part out;
    optim::TrainState& st = p.state();
    out.carry = p.strategy().download_carry();  // LightweightSync: every rank's own (checkpoint.h)
    out.ms.sync_calls = p.strategy().sync_calls();
    out.ms.optimizer = contents.optimizer;
    if (!st.whole()) {
      if (out.ms.optimizer) out.opt = st.download_optimizer_state();  // this rank's shard
      out.ms.shard = st.shard();
      out.ms.shard_numel = st.numel();
    } else if (lead && out.ms.optimizer) {
      out.opt = p.optimizer_state();  // host copies: on cuda downloaded here
    }
    if (lead) out.ms.weights = &p.weights();  // on cuda downloaded if stale
    if (lead && p.lora()) {                   // LoRA: the adapters instead of the frozen base
      out.ms.lora = p.lora();
      // Absolute: `verl export` of the adapters may run from anywhere.
      out.ms.lora_base = std::filesystem::absolute(cfg_.model_path).lexically_normal().string();
    }
    return out;
  };
  Part actor = part(actor_->model(), cfg_.actor.save);
  actor.ms.opt = &actor.opt;
  if (!actor.carry.empty()) actor.ms.carry = &actor.carry;
  std::optional<Part> critic_part;
  std::optional<ModelState> critic;
  if (critic_) {
    critic_part = part(critic_->model(), cfg_.critic.save);
    critic_part->ms.opt = &critic_part->opt;
    if (!critic_part->carry.empty()) critic_part->ms.carry = &critic_part->carry;
    critic = critic_part->ms;
  }
  // A rollout started for the next step is not saved: the resumed run generates that batch anew.
  nlohmann::json st = {
      {"dataloader", one_step_off_ ? one_step_off_->loader_state() : train_loader_->state()}};
  if (kl_ctrl_) st["kl_coef"] = kl_ctrl_->value();
  if (cfg_.lora) st["lora"] = lora_meta_;
  return save_checkpoint(cfg_.trainer.default_local_dir, global_step_, actor.ms, critic, st,
                         tokenizer_dir_, cfg_.trainer.max_actor_ckpt_to_keep, comm_.get(),
                         critic ? cfg_.trainer.max_critic_ckpt_to_keep : 0);
}

void PpoTrainer::fit() {
  // One run per directory; rank 0 (the one that logs and saves) holds the lock.
  std::optional<RunLock> run_lock;
  if (comm_->rank() == 0) run_lock.emplace(cfg_.trainer.default_local_dir);
  resume();
  metrics::LoggerOptions lo;
  lo.experiment_dir = cfg_.trainer.default_local_dir;
  std::filesystem::create_directories(lo.experiment_dir);
  lo.total_steps = total_steps_;
  lo.logging_steps = cfg_.trainer.logging_steps;
  lo.resume_step = global_step_;
  // Rank 0 logs and saves (every rank holds the same weights: their gradients are all-reduced).
  const bool lead = comm_->rank() == 0;
  if (lead) {
    logger_ = std::make_unique<metrics::MultiLogger>(cfg_.trainer.logger, lo);
    if (!gpu_monitor_) gpu_monitor_ = std::make_unique<metrics::GpuMonitor>();
  }
  auto log_metrics = [&](const metrics::Metrics& m) {
    if (logger_) logger_->log(global_step_, m);
  };
  const int64_t test_freq = cfg_.trainer.test_freq, save_freq = cfg_.trainer.save_freq;
  if (val_set_ && cfg_.trainer.val_before_train && global_step_ == 0) {
    metrics::Metrics v = validate();
    log_metrics(v);
    if (cfg_.trainer.val_only) return;
  }
  note_step(global_step_, /*in_progress=*/false);  // 0, or the step resumed from
  while (global_step_ < total_steps_) {
    std::optional<data::Batch> batch = next_batch();
    if (!batch) break;
    note_step(global_step_ + 1, /*in_progress=*/true);  // for the line a signal prints
    metrics::Metrics m = train_step(*batch);
    if (out_of_data_) break;  // filter_groups could not fill a step (verl's loop ends there too)
    m.set("timing_s/data", train_loader_->last_wait_seconds());
    const bool last = global_step_ == total_steps_;
    if (val_set_ && test_freq > 0 && (global_step_ % test_freq == 0 || last)) m.merge(validate());
    if (save_freq > 0 && (global_step_ % save_freq == 0 || last)) {
      Timer t;
      std::string dir;
      try {
        dir = save();  // every rank (each writes its shard of a sharded state)
      } catch (const std::exception&) {
        // The step trained: its metrics go to the logs before the save's error ends the run.
        try {
          log_metrics(m);
          if (logger_) logger_->flush();
        } catch (const std::exception&) {  // the save's error is the one to report (a full disk
                                           // fails both)
        }
        throw;
      }
      if (lead) last_checkpoint_ = dir;
      m.set("timing_s/save", t.seconds());
    }
    log_metrics(m);
    note_step(global_step_, /*in_progress=*/false);
  }
  if (logger_) logger_->flush();
}

}  // namespace verl::trainer
