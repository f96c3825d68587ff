// The rollout: requests from prompts, the engine over the actor's weights (the hybrid engine),
// completions streamed to the reward scorer and the token pipeline, then the step's rows.
#include "trainer/rollout_worker.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <optional>
#include <utility>

#include "core/error.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/rng.h"
#include "data/rl_dataset.h"
#include "rollout/engine.h"
#include "rollout/kv_sizing.h"

namespace verl::trainer {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64 finaliser: decorrelates derived seeds
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// rollout.length_dist (the synthetic long-tailed workload): each of a request's n samples gets a
// length from a lognormal of the configured mean, drawn from the request's seed and the sample's
// index (so a sample's length does not depend on the world size or the batch); empty when off.
std::vector<int32_t> synthetic_lengths(const LengthDistKeys& d, uint64_t seed, int32_t n,
                                       int32_t max_tokens) {
  if (d.type == "none") return {};
  const std::string k = "actor_rollout_ref.rollout.length_dist.";
  const int64_t cap = std::min<int64_t>(d.cap.value_or(max_tokens), max_tokens);
  VERL_CHECK(cap >= 1, "{}cap must be >= 1, got {}", k, cap);
  const double mu = std::log(d.mean) - 0.5 * d.sigma * d.sigma;
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    Rng rng(seed ^ 0x6c656e67746873ull, static_cast<uint64_t>(i));
    const double len = std::exp(mu + d.sigma * static_cast<double>(rng.normal()));
    out[static_cast<size_t>(i)] =
        static_cast<int32_t>(std::clamp<double>(std::round(len), 1.0, static_cast<double>(cap)));
  }
  return out;
}

// The prompts a generation group shares (tensor parallelism): every member's, in group rank
// order, with their global indices; `mine` is where this rank's first one lands.
struct GroupPrompts {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int64_t> index;
  int64_t mine = 0;
};

GroupPrompts gather_group_prompts(dist::Communicator& g, const std::vector<data::Sample>& samples,
                                  int64_t first_index) {
  const int R = g.world_size();
  const std::vector<int64_t> head = {first_index, static_cast<int64_t>(samples.size())};
  std::vector<int64_t> heads(static_cast<size_t>(2 * R));
  g.all_gather<int64_t>(head, heads);
  std::vector<int32_t> lens, flat;
  for (const data::Sample& s : samples) {
    lens.push_back(static_cast<int32_t>(s.prompt_ids.size()));
    flat.insert(flat.end(), s.prompt_ids.begin(), s.prompt_ids.end());
  }
  // The prompts' lengths, then their tokens, each rank contributing its own count.
  std::vector<size_t> counts(static_cast<size_t>(R)), displs(counts.size());
  size_t total = 0;
  for (int r = 0; r < R; ++r) {
    counts[r] = static_cast<size_t>(heads[2 * r + 1]);
    displs[r] = total;
    total += counts[r];
  }
  std::vector<int32_t> all_lens(total);
  g.all_gather_v(lens.data(), all_lens.data(), counts, displs, dist::DataType::I32);
  std::vector<size_t> tcounts(counts.size()), tdispls(counts.size());
  size_t ttotal = 0;
  for (int r = 0; r < R; ++r) {
    tcounts[r] = 0;
    for (size_t k = 0; k < counts[r]; ++k)
      tcounts[r] += static_cast<size_t>(all_lens[displs[r] + k]);
    tdispls[r] = ttotal;
    ttotal += tcounts[r];
  }
  std::vector<int32_t> tokens(ttotal);
  g.all_gather_v(flat.data(), tokens.data(), tcounts, tdispls, dist::DataType::I32);
  GroupPrompts out;
  out.mine = static_cast<int64_t>(displs[g.rank()]);
  size_t at = 0;
  for (int r = 0; r < R; ++r)
    for (size_t k = 0; k < counts[r]; ++k) {
      const size_t len = static_cast<size_t>(all_lens[displs[r] + k]);
      out.prompts.emplace_back(tokens.begin() + at, tokens.begin() + at + len);
      out.index.push_back(heads[2 * r] + static_cast<int64_t>(k));
      at += len;
    }
  return out;
}

// trainer.token_level_pipeline's observer: finished rows gather into micro-batches of the passes'
// budget, each run as soon as it is full; what is left runs once generation ends.
class PipelineObserver final : public RowObserver {
 public:
  PipelineObserver(TokenPipeline& pipe, const Experience& exp, metrics::StageTimer& timer,
                   PolicyModel* actor, PolicyModel* ref, PolicyModel* critic, float temperature)
      : pipe_(pipe),
        exp_(exp),
        timer_(timer),
        actor_(actor),
        ref_(ref),
        critic_(critic),
        temperature_(temperature) {
    worker_.emplace(
        [this](int64_t b) {
          const int64_t t = exp_.tokens(b);
          const bool full =
              (pipe_.max_tokens > 0 && pending_tokens_ + t > pipe_.max_tokens) ||
              (pipe_.max_seqs > 0 && static_cast<int64_t>(pending_.size()) >= pipe_.max_seqs);
          if (full && !pending_.empty()) {
            run(std::exchange(pending_, {}));
            pending_tokens_ = 0;
          }
          pending_.push_back(b);
          pending_tokens_ += t;
        },
        [this] {
          if (!pending_.empty()) run(std::exchange(pending_, {}));
        });
  }
  void push(int64_t b) override { worker_->push(b); }
  void finish() override {
    worker_->finish();
    for (PolicyModel* p : {pipe_.old_log_prob ? actor_ : nullptr, pipe_.ref ? ref_ : nullptr,
                           pipe_.values ? critic_ : nullptr})
      if (p) p->release_activations();
    if (pipe_.ref) ref_->sleep();
  }

 private:
  // The pipeline's passes on rows `rows` (one micro-batch).
  void run(std::vector<int64_t> rows) {
    const PackedResponses mb(exp_, std::move(rows));
    std::vector<float> out;
    const auto pass = [&](const char* stage, PolicyModel& model,
                          std::vector<std::vector<float>>& into, bool values) {
      const double t0 = timer_.now_s();
      check_plan(model, mb.batch());
      if (values) {
        model.forward_values(mb.batch(), out);
      } else {
        model.forward(mb.batch(), temperature_, out, nullptr, /*for_backward=*/false);
      }
      for (size_t i = 0; i < mb.rows().size(); ++i)
        into[static_cast<size_t>(mb.rows()[i])] = mb.row(out, i);
      timer_.record(stage, t0, timer_.now_s());
    };
    if (pipe_.old_log_prob) pass("old_log_prob", *actor_, pipe_.old_rows, false);
    if (pipe_.ref) pass("ref", *ref_, pipe_.ref_rows, false);
    if (pipe_.values) pass("values", *critic_, pipe_.value_rows, true);
  }

  TokenPipeline& pipe_;
  const Experience& exp_;
  metrics::StageTimer& timer_;
  PolicyModel *actor_, *ref_, *critic_;
  float temperature_;
  std::vector<int64_t> pending_;
  int64_t pending_tokens_ = 0;
  std::optional<RowWorker> worker_;  // last: its flush uses the state above
};

}  // namespace

std::vector<float> TokenPipeline::matrix(const std::vector<std::vector<float>>& which, int64_t B,
                                         int64_t L) {
  std::vector<float> out(static_cast<size_t>(B * L), 0.0f);
  for (int64_t b = 0; b < B; ++b) std::copy(which[b].begin(), which[b].end(), out.begin() + b * L);
  return out;
}

RolloutWorker::RolloutWorker(const PpoConfig& cfg, Device device, ActorWorker& actor,
                             CriticWorker* critic, RewardManager& reward, MemoryRecorder& memory,
                             std::vector<int32_t> eos_ids, dist::Communicator& comm,
                             const tokenizer::Tokenizer* tok)
    : cfg_(cfg),
      device_(device),
      actor_(actor),
      critic_(critic),
      reward_(reward),
      memory_(memory),
      eos_ids_(std::move(eos_ids)),
      tp_(cfg.rollout.tensor_parallel),
      comm_(&comm) {
  std::string note = cfg.rollout.tensor_parallel_note;
  if (tp_ > 1 && device_ == Device::Cuda) {
    note = fmt::format(
        "actor_rollout_ref.rollout.tensor_model_parallel_size={}: the GPU rollout has no tensor "
        "parallelism yet, tensor parallel size 1",
        tp_);
    tp_ = 1;
  }
  dp_ = comm.world_size() / tp_;
  // A model that does not split fails here, before any step, naming the key and its heads.
  if (tp_ > 1) model::check_tp_split(actor_.model().weights().config, static_cast<int>(tp_));
  // Groups of tp_ consecutive ranks (Megatron's and vLLM's order): color rank / tp_.
  if (tp_ > 1) tp_comm_ = comm.split(comm.rank() / static_cast<int>(tp_), comm.rank());
  if (comm.rank() == 0)
    log::info("rollout layout: tensor parallel {} x data parallel {} over {} rank(s){}", tp_, dp_,
              comm.world_size(), note.empty() ? "" : " (" + note + ")");
  if (const MultiTurnKeys& mt = cfg.rollout.multi_turn; mt.enable) {
    const std::string k = "actor_rollout_ref.rollout.multi_turn.";
    VERL_CHECK(tok != nullptr, "{}enable: the rollout needs the tokenizer to read tool calls", k);
    VERL_CHECK(tp_ == 1,
               "{}enable with rollout.tensor_model_parallel_size={}: multi-turn rollouts run "
               "with tensor parallel size 1",
               k, tp_);
    agent::check_tool_format(mt.format);
    tools_ = std::make_unique<agent::Toolbox>(
        mt.tool_config_path ? agent::Toolbox::load(*mt.tool_config_path) : agent::Toolbox());
    agent::MultiTurnConfig ac;
    ac.max_assistant_turns = mt.max_assistant_turns;
    ac.max_user_turns = mt.max_user_turns;
    ac.max_parallel_calls = mt.max_parallel_calls;
    ac.max_tool_response_length = mt.max_tool_response_length;
    ac.tool_response_truncate_side = mt.tool_response_truncate_side;
    ac.num_workers = mt.num_workers;
    agent_ = std::make_unique<agent::ToolAgentLoop>(
        *tools_, *tok, ac, data::DatasetOptions::from_config(cfg.raw).chat_template_kwargs);
    if (comm.rank() == 0)
      log::info("multi-turn rollouts: {} tool(s) ({}), rows without agent_name run {}",
                tools_->tools().size(), fmt::join(tools_->names(), ", "),
                mt.default_tool_agent ? "tool_agent" : "single_turn_agent");
  }
}

RolloutWorker::~RolloutWorker() = default;

void RolloutWorker::add_agent_metrics(metrics::Metrics& m) {
  if (!agent_) return;
  dist::Communicator& c = *comm_;
  const AgentTotals& t = agent_totals_;
  // Every collective runs on every rank, in this order (a rank may have no trajectories).
  const int64_t n = c.sum(t.trajectories);
  const int64_t lo = -c.max(t.trajectories ? -t.turns_min : INT64_MIN + 1);
  const int64_t hi = c.max(t.trajectories ? t.turns_max : 0);
  const double turns = static_cast<double>(c.sum(t.turns_sum));
  const double reward = c.sum(t.tool_reward);
  const double per = n > 0 ? 1.0 / static_cast<double>(n) : 0.0;
  m.set("num_turns/min", n > 0 ? static_cast<double>(lo) : 0.0);
  m.set("num_turns/max", static_cast<double>(hi));
  m.set("num_turns/mean", turns * per);
  m.set("rollout/appended_tokens", static_cast<double>(c.sum(t.appended)));
  m.set("rollout/prefill_tokens_saved", static_cast<double>(c.sum(t.kv_reused)));
  m.set("tool_calls/reward_mean", reward * per);
  // Every rank reports the same names (the tools, then calls that named none of them).
  std::vector<std::string> names = tools_->names();
  names.push_back("<invalid>");
  int64_t calls = 0, errors = 0;
  for (const std::string& name : names) {
    const auto it = t.tools.find(name);
    const agent::ToolStats s = it == t.tools.end() ? agent::ToolStats{} : it->second;
    const int64_t nc = c.sum(s.calls), ne = c.sum(s.errors);
    const double secs = c.sum(s.seconds);
    const std::string key = name == "<invalid>" ? "tool_calls/invalid" : "tool_calls/" + name;
    const int64_t max_us = c.max(static_cast<int64_t>(s.max_seconds * 1e6));
    m.set(key + "/count", static_cast<double>(nc));
    m.set(key + "/errors", static_cast<double>(ne));
    if (name != "<invalid>") {
      m.set(key + "/latency_mean_s", nc ? secs / static_cast<double>(nc) : 0.0);
      m.set(key + "/latency_max_s", static_cast<double>(max_us) * 1e-6);
    }
    calls += nc;
    errors += ne;
  }
  m.set("tool_calls/count", static_cast<double>(calls));
  m.set("tool_calls/errors", static_cast<double>(errors));
  m.set("tool_calls/per_trajectory", static_cast<double>(calls) * per);
  agent_totals_ = AgentTotals{};
}

void RolloutWorker::add_layout_metrics(metrics::Metrics& m) const {
  m.set("parallel/rollout_tp", static_cast<double>(tp_));
  m.set("parallel/dp", static_cast<double>(dp_));
}

TokenPipeline RolloutWorker::pipeline_plan(bool old_log_prob) const {
  TokenPipeline p;
  if (!cfg_.trainer.token_level_pipeline) return p;
  // The actor's pass shares its stream with the GPU rollout (which captures graphs on it), and a
  // ZeRO-3 model gathers its weights with collectives: those passes run after generation.
  PolicyModel& actor = actor_.model();
  p.old_log_prob =
      old_log_prob && device_ == Device::Cpu && actor.strategy().weight_source() == nullptr;
  p.ref = actor_.ref() != nullptr;
  p.values = critic_ != nullptr && critic_->model().strategy().weight_source() == nullptr;
  // One micro-batch fits every pass: the smallest of their token budgets and sequence counts.
  const auto take = [&](bool on, const ForwardBatching& fb, const PolicyModel& model) {
    if (!on) return;
    const auto tighten = [](int64_t& x, int64_t v) {
      if (v > 0) x = x > 0 ? std::min(x, v) : v;
    };
    tighten(p.max_tokens, fb.dynamic ? fb.max_tokens : 0);
    tighten(p.max_seqs, fb.dynamic ? 0 : fb.max_seqs);
    tighten(p.max_tokens, model.max_tokens());  // the CUDA model's plan (0 on the CPU)
    tighten(p.max_seqs, model.max_seqs());
  };
  take(p.old_log_prob, cfg_.old_log_prob_batching, actor);
  take(p.ref, cfg_.ref_batching, p.ref ? *actor_.ref() : actor);
  take(p.values, cfg_.values_batching, p.values ? critic_->model() : actor);
  return p;
}

void RolloutWorker::generate(const std::vector<data::Sample>& samples, int64_t first_index,
                             Experience& exp, metrics::StageTimer& timer, const GenOptions& opts) {
  const bool validation = opts.validation, greedy = opts.greedy;
  TokenPipeline* pipe = opts.pipe;
  const int64_t step = opts.step;
  const RolloutKeys& rk = cfg_.rollout;
  const SamplingKeys& sk = validation ? rk.val : rk.train;
  const int64_t n = greedy ? 1 : sk.n;
  rollout::SamplingParams sp;
  const bool do_sample = !greedy && sk.do_sample;
  sp.temperature = do_sample ? static_cast<float>(sk.temperature) : 0.0f;
  sp.top_k = static_cast<int32_t>(sk.top_k);
  sp.top_p = static_cast<float>(sk.top_p);
  // verl's rollout.response_length (by default data.max_response_length) bounds every response,
  // validation's too; rollout.max_model_len (null: prompt_length + response_length) bounds prompt
  // plus response, as vLLM's does.
  sp.max_tokens = static_cast<int32_t>(rk.response_length);
  const int64_t prompt_limit = rk.prompt_length;
  const int64_t model_len = rk.max_model_len.value_or(prompt_limit + sp.max_tokens);
  sp.ignore_eos = rk.ignore_eos;
  sp.stop_token_ids = eos_ids_;
  // The prompts to generate: this rank's, or with tensor parallelism its group's (the group runs
  // them together and each rank keeps its own rows). Seeds come from the global index.
  std::optional<GroupPrompts> group;
  if (tp_comm_) group = gather_group_prompts(*tp_comm_, samples, first_index);
  const size_t P = group ? group->prompts.size() : samples.size();
  const int64_t mine = group ? group->mine : 0;
  auto prompt_of = [&](size_t i) -> const std::vector<int32_t>& {
    return group ? group->prompts[i] : samples[i].prompt_ids;
  };
  auto index_of = [&](size_t i) {
    return group ? group->index[i] : first_index + static_cast<int64_t>(i);
  };
  std::vector<rollout::Request> reqs;
  int64_t longest = 0;
  for (size_t i = 0; i < P; ++i) {
    const int64_t plen = static_cast<int64_t>(prompt_of(i).size());
    VERL_CHECK(plen <= prompt_limit && plen < model_len,
               "a prompt of {} tokens is longer than actor_rollout_ref.rollout.prompt_length={} "
               "allows (or does not "
               "fit rollout.max_model_len={}); raise them or lower data.max_prompt_length",
               plen, prompt_limit, model_len);
    rollout::Request r;
    r.prompt = prompt_of(i);
    r.params = sp;
    r.params.seed =
        mix(cfg_.data.seed ^ mix(static_cast<uint64_t>(step - 1) * 2 + (validation ? 1 : 0)) ^
            mix(static_cast<uint64_t>(index_of(i)) + 0x51ed));
    r.n = static_cast<int32_t>(n);
    if (!validation && !greedy)
      r.eos_at = synthetic_lengths(rk.length_dist, r.params.seed, r.n, sp.max_tokens);
    longest = std::max<int64_t>(longest, static_cast<int64_t>(r.prompt.size()));
    reqs.push_back(std::move(r));
  }
  // The rollout phase's KV cache is sized for every sequence at once and freed when the engine
  // goes out of scope, before training starts (phased memory).
  rollout::EngineConfig ec;
  ec.scheduler.block_size = 16;
  ec.scheduler.max_model_len =
      static_cast<int32_t>(std::min<int64_t>(longest + sp.max_tokens, model_len));
  ec.scheduler.max_num_seqs = static_cast<int32_t>(rk.max_num_seqs);
  ec.scheduler.max_num_batched_tokens = static_cast<int32_t>(rk.max_num_batched_tokens);
  ec.scheduler.num_blocks = static_cast<int32_t>(
      std::min<int64_t>(rollout::kv_blocks_to_hold(reqs, ec.scheduler.block_size), INT32_MAX));
  // On cuda the rollout runs on the GPU from the actor's own bf16 weights; its KV cache lives as
  // long as `runner` and is freed before the next phase. On cpu it reads the host weights.
  RolloutRunnerOptions ro;
  ro.gpu_memory_utilization = rk.gpu_memory_utilization;
  ro.enforce_eager = rk.enforce_eager;
  PolicyModel& actor = actor_.model();
  // Tensor parallelism: this rank's slice of the whole weights (gathered first under ZeRO-3),
  // its group's collectives and its runner, whose KV cache holds the rank's kv heads.
  std::optional<CommTpGroup> tp_group;
  std::optional<model::TpSlice> slice;
  std::optional<model::TpContext> tp_ctx;
  // timing_s/gen_setup: the runner's KV cache, its plan and the engine, before the first step.
  std::optional<metrics::StageTimer::Scope> setup;
  setup.emplace(timer, "gen_setup");
  std::unique_ptr<rollout::StepRunner> runner =
      opts.snapshot  ? opts.snapshot->make_rollout_runner(ec.scheduler, ro)
      : opts.weights ? nullptr
                     : actor.make_rollout_runner(ec.scheduler, ro);
  std::optional<FullWeights> full;  // ZeRO-3: the rollout reads whole weights, gathered here
  if (!runner && !opts.weights && !opts.snapshot && !actor.state().has_full_weights()) {
    setup.reset();  // the gather is timing_s/reshard's
    {
      auto s = timer.scope("reshard");
      full.emplace(actor, rk.reshard_bucket);
    }
    setup.emplace(timer, "gen_setup");
  }
  std::optional<rollout::Engine> engine_holder;
  // LoRA on the CPU: the rollout's decoder runs the actor's adapters unmerged, as the trainer's
  // forward does, so the rollout's log-probs are the trainer's (one-step-off's snapshot is merged
  // already). A tensor-parallel slice cuts the merged weights.
  const model::LoraWeights* lora = runner || opts.weights ? nullptr : actor.lora();
  std::optional<model::Weights> merged;
  if (!runner && tp_comm_) {
    tp_group.emplace(*tp_comm_);
    if (lora) merged = lora->merged(actor.weights());
    slice.emplace(model::tp_slice(opts.weights ? *opts.weights
                                  : merged     ? *merged
                                               : actor.weights(),
                                  tp_group->rank(), tp_group->size()));
    merged.reset();
    tp_ctx = model::tp_context(*slice, *tp_group);
    runner = std::make_unique<rollout::CpuStepRunner>(slice->weights, ec.scheduler.num_blocks,
                                                      ec.scheduler.block_size, &*tp_ctx);
  }
  if (runner) {
    engine_holder.emplace(*runner, ec);
  } else {
    // On cuda downloaded if a step changed them; one-step-off's snapshot when given.
    engine_holder.emplace(opts.weights ? *opts.weights : actor.weights(), ec, lora);
  }
  rollout::Engine& engine = *engine_holder;
  setup.reset();

  const int64_t B = static_cast<int64_t>(samples.size()) * n;
  exp = Experience{};
  exp.B = B;
  exp.group.resize(B);
  exp.sample.resize(B);
  exp.response.resize(B);
  exp.finish_reason.resize(B);
  exp.scores.assign(B, 0.0f);
  exp.acc.assign(B, 0.0f);
  exp.raw_score.assign(B, 0.0f);
  exp.overlong_reward.assign(B, 0.0f);
  std::vector<Trajectory> traj(B);

  // Rewards are scored by an observer while generation goes on (trainer.actor_reward_parallel);
  // else the whole batch afterwards. The token pipeline's passes observe the rows too.
  std::unique_ptr<RowObserver> scorer = reward_.stream(exp, timer), piper;
  if (pipe != nullptr && pipe->any()) {
    for (auto* rows : {&pipe->old_rows, &pipe->ref_rows, &pipe->value_rows}) rows->assign(B, {});
    if (pipe->ref) actor_.ref()->wake();
    piper = std::make_unique<PipelineObserver>(*pipe, exp, timer, &actor, actor_.ref(),
                                               critic_ ? &critic_->model() : nullptr,
                                               actor_.temperature());
  }
  rollout::GenerateHooks hooks;
  if (agent_) {
    // Each prompt's agent loop (its agent_name, else agent.default_agent_loop) and tool kwargs.
    std::vector<agent::AgentPrompt> prompts(samples.size());
    for (size_t i = 0; i < samples.size(); ++i) {
      const data::Sample& s = samples[i];
      const std::string& name = s.agent_name;
      VERL_CHECK(name.empty() || name == "tool_agent" || name == "single_turn_agent",
                 "{}:{}: agent_name '{}' is not an agent loop verl.cpp runs (tool_agent, "
                 "single_turn_agent)",
                 s.file, s.line, name);
      prompts[i].tool_agent =
          name.empty() ? rk.multi_turn.default_tool_agent : name == "tool_agent";
      if (s.extra_info.is_object() && s.extra_info.contains("tools_kwargs"))
        prompts[i].tools_kwargs = s.extra_info["tools_kwargs"];
    }
    agent_->begin(std::move(prompts), static_cast<int32_t>(n));
    hooks.turns = agent_.get();
  }
  hooks.on_finish = [&](const rollout::Completion& c) {
    fault_point("gen", step);  // tests make generation fail while rewards are scored
    const int64_t i = c.request - mine;
    if (i < 0 || i >= static_cast<int64_t>(samples.size())) return;  // another member's prompt
    const int64_t b = i * n + c.sample;
    exp.group[b] = first_index + i;  // global: balance_batch may move the row
    exp.sample[b] = &samples[i];
    exp.response[b] = c.tokens;
    exp.finish_reason[b] = std::string(rollout::to_string(c.finish_reason));
    const int64_t len = static_cast<int64_t>(c.tokens.size());
    traj[b].logprobs = c.logprobs;
    if (c.generated.empty()) {
      traj[b].loss_mask.assign(static_cast<size_t>(len), 1.0f);  // every token is the model's own
      traj[b].segments = {Segment{0, len, true}};
    } else {
      agent_->trajectory_done(c.request, c.sample, len);
      // Multi-turn: tool turns are context, not trained on (loss mask 0), one segment a turn.
      traj[b].loss_mask.assign(c.generated.begin(), c.generated.end());
      traj[b].segments.clear();
      for (int64_t j = 0; j < len; ++j) {
        const bool g = c.generated[static_cast<size_t>(j)] != 0;
        if (traj[b].segments.empty() || traj[b].segments.back().generated != g)
          traj[b].segments.push_back(Segment{j, j, g});
        traj[b].segments.back().end = j + 1;
      }
    }
    if (scorer)
      scorer->push(b);  // the observers read the row after this, through their queues' locks
    if (piper) piper->push(b);
  };
  {
    auto gen = timer.scope("gen");
    engine.generate(reqs, hooks);
  }
  exp.runner_stats = engine.runner_stats();
  // The step's totals add up over its generate() calls (DAPO's dynamic sampling makes several)
  // until add_agent_metrics reports them; validation's are not the step's.
  if (agent_ && !validation) {
    AgentTotals& t = agent_totals_;
    for (size_t i = 0; i < samples.size(); ++i)
      for (int32_t j = 0; j < static_cast<int32_t>(n); ++j) {
        const agent::TrajectoryInfo& info = agent_->info(static_cast<int64_t>(i), j);
        const int64_t turns = info.num_turns();
        t.turns_min = t.trajectories ? std::min(t.turns_min, turns) : turns;
        t.turns_max = std::max(t.turns_max, turns);
        t.turns_sum += turns;
        t.tool_reward += info.tool_reward;
        ++t.trajectories;
      }
    for (const auto& [name, st] : agent_->tool_stats()) {
      agent::ToolStats& into = t.tools[name];
      into.calls += st.calls;
      into.errors += st.errors;
      into.seconds += st.seconds;
      into.max_seconds = std::max(into.max_seconds, st.max_seconds);
    }
    t.appended += engine.stats().appended_tokens;
    t.kv_reused += engine.stats().kv_reused_tokens;
  }
  // Device memory with the rollout's KV cache still held (the gen phase's peak), then the cache is
  // given back before the log-prob and update phases.
  memory_.end_of_gen();
  engine_holder.reset();
  runner.reset();
  slice.reset();
  full.reset();  // ZeRO-3: back to the shards
  if (piper) piper->finish();
  if (scorer) {
    scorer->finish();
  } else {
    reward_.score(exp, timer, step);
  }
  // Per-token matrices.
  int64_t L = 1;
  for (const auto& r : exp.response) L = std::max<int64_t>(L, static_cast<int64_t>(r.size()));
  exp.L = L;
  exp.mask.assign(B * L, 0.0f);
  exp.rollout_log_prob.assign(B * L, 0.0f);
  exp.token_level_scores.assign(B * L, 0.0f);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = static_cast<int64_t>(exp.response[b].size());
    for (int64_t j = 0; j < len; ++j) {
      exp.mask[b * L + j] = traj[b].loss_mask[j];
      exp.rollout_log_prob[b * L + j] = traj[b].logprobs[j];
    }
    if (len > 0)
      exp.token_level_scores[b * L + len - 1] = exp.scores[b];  // the score sits on the last token
  }
  exp.token_level_rewards = exp.token_level_scores;
}

}  // namespace verl::trainer
