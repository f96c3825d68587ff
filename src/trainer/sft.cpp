#include "trainer/sft.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "core/device.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/file.h"
#include "core/json_depth.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/run_lock.h"
#include "core/signals.h"
#include "core/timer.h"
#include "data/parquet.h"
#include "dist/communicator.h"
#include "metrics/logger.h"
#include "model/hf_files.h"
#include "optim/adamw.h"
#include "optim/train_state.h"
#include "trainer/checkpoint.h"
#include "trainer/policy_model.h"
#include "trainer/ppo_config.h"
#include "trainer/ranks.h"

extern "C" void openblas_set_num_threads(int);

namespace verl::trainer {
namespace fs = std::filesystem;

SftExample tokenize_chat(const nlohmann::ordered_json& messages, const tokenizer::Tokenizer& tok,
                         const std::string& where, const nlohmann::ordered_json& extra) {
  VERL_CHECK(messages.is_array() && !messages.empty(), "{}: messages must be a non-empty list",
             where);
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    VERL_CHECK(
        m.is_object() && m.contains("role") && m["role"].is_string() && m.contains("content"),
        "{}: message {} needs \"role\" and \"content\"", where, i);
  }
  // The template's own errors (a content it cannot concatenate, a raise_exception) name the row
  // too.
  auto render = [&](const nlohmann::ordered_json& msgs, bool generation_prompt) {
    try {
      return tok.encode(tok.apply_chat_template(msgs, generation_prompt, extra));
    } catch (const Error& e) {
      VERL_FAIL("{}: {}", where, e.what());
    }
  };
  SftExample ex;
  ex.tokens = render(messages, /*generation_prompt=*/false);
  ex.loss_mask.assign(ex.tokens.size(), 0);
  bool any = false;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i]["role"] != "assistant") continue;
    // The assistant turn spans from the end of the prompt rendered with a generation prompt to
    // the end of the conversation rendered up to and including this turn.
    nlohmann::ordered_json before(messages.begin(), messages.begin() + static_cast<long>(i));
    nlohmann::ordered_json upto(messages.begin(), messages.begin() + static_cast<long>(i) + 1);
    std::vector<int32_t> a = render(before, true);
    std::vector<int32_t> b = render(upto, false);
    VERL_CHECK(a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin()) &&
                   b.size() <= ex.tokens.size() &&
                   std::equal(b.begin(), b.end(), ex.tokens.begin()),
               "{}: the chat template does not render message {} as a prefix of the conversation; "
               "cannot tell which tokens are the assistant's",
               where, i);
    std::fill(ex.loss_mask.begin() + static_cast<long>(a.size()),
              ex.loss_mask.begin() + static_cast<long>(b.size()), 1);
    any = any || b.size() > a.size();
  }
  VERL_CHECK(any, "{}: no assistant message to learn from", where);
  return ex;
}

std::vector<SftExample> load_sft_examples(const std::string& path, const tokenizer::Tokenizer& tok,
                                          const SftDataOptions& opt) {
  std::vector<SftExample> out;
  int64_t truncated = 0;
  // One row (a JSONL line or a parquet row); `where` is "file:line" or "file:row".
  // The string at row[key][path...]; errors name the row, the field and the setting.
  auto text_at = [](const nlohmann::ordered_json& j, const std::string& key,
                    const std::vector<std::string>& path, const char* key_setting,
                    const char* path_setting, const std::string& where) {
    VERL_CHECK(j.is_object() && j.contains(key), "{}: missing \"{}\" ({})", where, key,
               key_setting);
    const nlohmann::ordered_json* v = &j[key];
    std::string name = key;
    for (const std::string& k : path) {
      VERL_CHECK(v->is_object() && v->contains(k), "{}: \"{}\" has no key \"{}\" ({})", where, name,
                 k, path_setting);
      v = &(*v)[k];
      name += "." + k;
    }
    VERL_CHECK(v->is_string(), "{}: \"{}\" should be a string, got {} ({}{})", where, name,
               v->type_name(), key_setting, path.empty() ? "" : fmt::format(", {}", path_setting));
    return v->get<std::string>();
  };
  auto add = [&](const nlohmann::ordered_json& j, const std::string& where) {
    nlohmann::ordered_json messages;
    nlohmann::ordered_json extra = opt.template_kwargs;
    if (opt.multiturn) {
      VERL_CHECK(j.contains(opt.messages_key), "{}: missing \"{}\" (data.multiturn.messages_key)",
                 where, opt.messages_key);
      messages = j[opt.messages_key];
      if (j.contains(opt.tools_key) && !j[opt.tools_key].is_null())
        extra["tools"] = j[opt.tools_key];
      if (j.contains(
              opt.enable_thinking_key)) {  // a null field: no flag (verl: None), not the default
        const nlohmann::ordered_json& t = j[opt.enable_thinking_key];
        VERL_CHECK(t.is_boolean() || t.is_null(),
                   "{}: \"{}\" (data.enable_thinking_key) should be true, false or "
                   "null, got {}",
                   where, opt.enable_thinking_key, t.dump().substr(0, 40));
        if (t.is_boolean()) extra["enable_thinking"] = t;
      } else if (opt.enable_thinking_default) {
        extra["enable_thinking"] = *opt.enable_thinking_default;
      }
    } else {
      const std::string prompt = text_at(j, opt.prompt_key, opt.prompt_dict_keys, "data.prompt_key",
                                         "data.prompt_dict_keys", where);
      const std::string response = text_at(j, opt.response_key, opt.response_dict_keys,
                                           "data.response_key", "data.response_dict_keys", where);
      messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", prompt}},
                                                {{"role", "assistant"}, {"content", response}}});
    }
    SftExample ex = tokenize_chat(messages, tok, where, extra);
    const int64_t n = static_cast<int64_t>(ex.tokens.size());
    if (n > opt.max_length) {
      VERL_CHECK(opt.truncation != "error",
                 "{}: {} tokens exceed data.max_length {} (set data.truncation to left or right)",
                 where, n, opt.max_length);
      long cut = static_cast<long>(n - opt.max_length);
      if (opt.truncation == "left") {
        ex.tokens.erase(ex.tokens.begin(), ex.tokens.begin() + cut);
        ex.loss_mask.erase(ex.loss_mask.begin(), ex.loss_mask.begin() + cut);
      } else {
        ex.tokens.resize(static_cast<size_t>(opt.max_length));
        ex.loss_mask.resize(static_cast<size_t>(opt.max_length));
      }
      ++truncated;
    }
    out.push_back(std::move(ex));
  };

  if (path.size() >= 8 && path.compare(path.size() - 8, 8, ".parquet") == 0) {
    // Rows are numbered from 1 over the whole file, like JSONL lines.
    const data::ParquetFile pf = data::ParquetFile::open(path);
    int64_t rowno = 0;
    for (int g = 0; g < pf.num_row_groups(); ++g)
      for (const nlohmann::ordered_json& row : pf.read_row_group(g))
        add(row, fmt::format("{}:{}", path, ++rowno));
  } else {
    std::ifstream f;
    open_for_reading(f, path, "SFT data file");
    std::string line;
    int64_t lineno = 0;
    while (std::getline(f, line)) {
      ++lineno;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = fmt::format("{}:{}", path, lineno);
      check_json_depth(line, where);
      nlohmann::ordered_json j;
      try {
        j = nlohmann::ordered_json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        VERL_FAIL("{}: not valid JSON: {}", where, e.what());
      }
      add(j, where);
    }
  }
  VERL_CHECK(!out.empty(), "SFT data file {} has no rows", path);
  if (truncated)
    log::warn("{}: truncated {} of {} rows to {} tokens", path, truncated, out.size(),
              opt.max_length);
  return out;
}

namespace {

// Greedy packing of consecutive sequences into micro-batches of at most `budget` tokens (or at most
// `max_seqs` sequences when budget <= 0).
std::vector<std::vector<size_t>> pack(const std::vector<const SftExample*>& batch, int64_t budget,
                                      int64_t max_seqs) {
  std::vector<std::vector<size_t>> micro;
  int64_t tokens = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int64_t n = static_cast<int64_t>(batch[i]->tokens.size());
    bool full =
        micro.empty() ||
        (budget > 0 ? tokens + n > budget : static_cast<int64_t>(micro.back().size()) >= max_seqs);
    if (full) {
      micro.emplace_back();
      tokens = 0;
    }
    micro.back().push_back(i);
    tokens += n;
  }
  return micro;
}

struct LossStats {
  double loss_sum = 0;  // sum of -log p over target tokens
  int64_t targets = 0, tokens = 0;
};

// Forward (and, when `train`, backward with the token-mean scale 1/norm) over one batch.
LossStats run_batch(PolicyModel& policy, const std::vector<const SftExample*>& batch,
                    int64_t budget, int64_t max_seqs, double norm, bool train) {
  LossStats st;
  std::vector<float> logprob;
  for (const auto& idx : pack(batch, budget, max_seqs)) {
    std::vector<std::vector<int32_t>> seqs;
    for (size_t i : idx) seqs.push_back(batch[i]->tokens);
    model::PackedBatch pb = model::PackedBatch::from_sequences(seqs);
    policy.forward(pb, /*temperature=*/1.0f, logprob, nullptr, /*for_backward=*/train);
    std::vector<float> d_lp(static_cast<size_t>(pb.num_tokens()), 0.0f);
    for (size_t s = 0; s < idx.size(); ++s) {
      const SftExample& ex = *batch[idx[s]];
      const int64_t base = pb.cu_seqlens[s];
      for (size_t t = 0; t + 1 < ex.tokens.size(); ++t) {
        if (!ex.loss_mask[t + 1]) continue;  // logprob[t] scores token t+1
        st.loss_sum -= logprob[static_cast<size_t>(base) + t];
        st.targets += 1;
        d_lp[static_cast<size_t>(base) + t] = static_cast<float>(-1.0 / norm);
      }
    }
    st.tokens += pb.num_tokens();
    if (train) policy.backward(d_lp.data(), nullptr);
  }
  return st;
}

// verl's SFT config has no collective timeout key: a rank that stops answering ends the job after
// this long (verl.cpp's default actor_rollout_ref.nccl_timeout).
constexpr double kSftCollectiveTimeoutS = 600;

// Rank `rank`'s contiguous share of `rows` (sizes differ by at most one).
std::vector<const SftExample*> rank_share(const std::vector<const SftExample*>& rows, int rank,
                                          int world) {
  const size_t n = rows.size(), w = static_cast<size_t>(world), r = static_cast<size_t>(rank);
  return {rows.begin() + static_cast<long>(n * r / w),
          rows.begin() + static_cast<long>(n * (r + 1) / w)};
}

// The ranks' sums (every rank gets them).
void sum_over_ranks(LossStats& st, dist::Communicator& comm) {
  if (comm.world_size() == 1) return;
  std::vector<double> v = {st.loss_sum, static_cast<double>(st.targets),
                           static_cast<double>(st.tokens)};
  comm.all_reduce(std::span<double>(v), dist::ReduceOp::Sum);
  st.loss_sum = v[0];
  st.targets = static_cast<int64_t>(v[1]);
  st.tokens = static_cast<int64_t>(v[2]);
}

int64_t count_targets(const std::vector<const SftExample*>& batch) {
  int64_t n = 0;
  for (const SftExample* ex : batch)
    for (size_t t = 1; t < ex->tokens.size(); ++t) n += ex->loss_mask[t];
  return n;
}

// trainer.resume_mode: restores the model, the AdamW state and the step from the latest
// checkpoint under `out_root` (auto), from trainer.resume_from_path (resume_path), or from none
// (disable: `out_root` must not hold checkpoints). Returns the step to continue after (0: a fresh
// run); `dir` becomes the checkpoint's directory.
int64_t resume_sft(const config::Config& cfg, const std::string& out_root, PolicyModel& policy,
                   const nlohmann::json& data_order, const CheckpointContents& load, bool lead,
                   std::string& dir) {
  dir = resume_checkpoint_dir(cfg.get<std::string>("trainer.resume_mode"), out_root,
                              cfg.get<std::optional<std::string>>("trainer.resume_from_path"),
                              /*warn=*/lead);
  if (dir.empty()) return 0;
  const nlohmann::json st = read_trainer_state(dir);
  VERL_CHECK(st.value("trainer", "") == "sft",
             "{}: not a `verl sft` checkpoint (a `verl train` one resumes with `verl train`); to "
             "fine-tune its model, "
             "set model.partial_pretrain to its actor/huggingface and trainer.resume_mode=disable",
             dir);
  VERL_CHECK(st.contains("global_step") && st["global_step"].is_number_integer() &&
                 st["global_step"].get<int64_t>() >= 0,
             "{}/trainer_state.json: global_step should be a step number", dir);
  const int64_t step = st["global_step"].get<int64_t>();
  if (const model::LoraWeights* lora = policy.lora()) {
    // model.lora_rank > 0: the adapters and their moments (the base is model.partial_pretrain).
    VERL_CHECK(st.contains("lora"),
               "{}: a full fine-tuning checkpoint, but this run trains LoRA adapters "
               "(model.lora_rank={}); resume with model.lora_rank=0 or set "
               "trainer.resume_mode=disable",
               dir, lora->rank());
    const int64_t saved_rank = st["lora"].value("rank", int64_t{0});
    VERL_CHECK(saved_rank == lora->rank(),
               "{}: the checkpoint's LoRA adapters have rank {}, this run's model.lora_rank is {}; "
               "resume with the same rank or set trainer.resume_mode=disable",
               dir, saved_rank, lora->rank());
    model::LoraWeights saved =
        model::LoraWeights::load(dir + "/" + kLoraAdapterDir, policy.config());
    optim::AdamWState opt = load.optimizer ? load_optimizer_state(dir, policy.state().numel())
                                           : fresh_optimizer_state(policy.state().numel());
    policy.restore(std::move(saved.data), std::move(opt));
    if (lead) log::info("resuming the LoRA adapters from {} (step {})", dir, step);
    return step;
  }
  VERL_CHECK(!st.contains("lora"),
             "{}: a LoRA checkpoint (rank {}); resume with model.lora_rank={} or set "
             "trainer.resume_mode=disable",
             dir, st["lora"].value("rank", int64_t{0}), st["lora"].value("rank", int64_t{0}));
  model::Weights saved = model::Weights::load(dir);
  // The configured model's layout from its config (on cuda, policy.weights() would download it).
  const model::ParamLayout now = model::ParamLayout::build(policy.config());
  bool same = saved.layout.params.size() == now.params.size();
  for (size_t i = 0; same && i < now.params.size(); ++i)
    same = saved.layout.params[i].shape == now.params[i].shape;
  VERL_CHECK(
      same,
      "{}: the checkpoint's model ({}, {} parameters) is not the shape of model.partial_pretrain "
      "({}, {} "
      "parameters); resume with the model the run started from, or set trainer.resume_mode=disable",
      dir, saved.config.architecture, saved.layout.total, policy.config().architecture, now.total);
  optim::AdamWState opt = load.optimizer ? load_optimizer_state(dir, policy.state().numel())
                                         : fresh_optimizer_state(policy.state().numel());
  policy.restore(std::move(saved.data), std::move(opt));
  if (lead && !load.optimizer)
    log::warn("{}: checkpoint.load_contents leaves out the optimizer: AdamW's moments start fresh",
              dir);
  if (!lead) return step;  // every rank restores; rank 0 says so
  for (const auto& [key, value] : data_order.items())
    if (st.contains(key) && st[key] != value)
      log::warn(
          "{} was saved with {} = {}, this run has {}: the steps after it see another data order "
          "than the "
          "saved run would have",
          dir, key, st[key].dump(), value.dump());
  log::info("resuming from {} (step {})", dir, step);
  return step;
}

}  // namespace

std::string run_sft(const config::Config& cfg) {
  if (int64_t th = cfg.get<int64_t>("trainer.threads"); th > 0) {
    omp_set_num_threads(static_cast<int>(th));
    openblas_set_num_threads(static_cast<int>(th));
  }
  const std::string model_dir = cfg.get<std::string>("model.partial_pretrain");
  model::Weights w = model::Weights::load(model_dir);
  VERL_CHECK(w.config.head == model::HeadKind::CausalLM, "{}: SFT needs a causal LM, got {}",
             model_dir, w.config.architecture);
  w.config = apply_model_overrides(
      model_dir, w.config,
      nlohmann::json::parse(cfg.get<config::Json>("model.override_config").dump()),
      "model.override_config");
  // model.tokenizer_path: a tokenizer other than the one beside the model (copied into every
  // checkpoint, so that each loads on its own).
  const std::string tokenizer_dir =
      cfg.get<std::optional<std::string>>("model.tokenizer_path").value_or(model_dir);
  tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(tokenizer_dir);
  if (auto tpl = cfg.get<std::optional<std::string>>("model.custom_chat_template"))
    tok.set_chat_template(*tpl, "model.custom_chat_template");

  SftDataOptions dopt;
  dopt.multiturn = cfg.get<bool>("data.multiturn.enable");
  dopt.messages_key = cfg.get<std::string>("data.multiturn.messages_key");
  dopt.prompt_key = cfg.get<std::string>("data.prompt_key");
  dopt.response_key = cfg.get<std::string>("data.response_key");
  dopt.max_length = cfg.get<int64_t>("data.max_length");
  dopt.truncation = cfg.get<std::string>("data.truncation");
  dopt.prompt_dict_keys = cfg.get<std::optional<std::vector<std::string>>>("data.prompt_dict_keys")
                              .value_or(std::vector<std::string>{});
  dopt.response_dict_keys =
      cfg.get<std::optional<std::vector<std::string>>>("data.response_dict_keys")
          .value_or(std::vector<std::string>{});
  if (const config::Json kw = cfg.get<config::Json>("data.apply_chat_template_kwargs");
      kw.is_object())
    dopt.template_kwargs = kw;
  dopt.tools_key = cfg.get<std::string>("data.tools_key");
  dopt.enable_thinking_key = cfg.get<std::string>("data.enable_thinking_key");
  dopt.enable_thinking_default = cfg.get<std::optional<bool>>("data.enable_thinking_default");
  std::vector<SftExample> train;
  for (const auto& f : cfg.get<std::vector<std::string>>("data.train_files")) {
    auto part = load_sft_examples(f, tok, dopt);
    train.insert(train.end(), std::make_move_iterator(part.begin()),
                 std::make_move_iterator(part.end()));
  }
  std::vector<SftExample> val;
  if (auto vf = cfg.get<std::optional<std::vector<std::string>>>("data.val_files")) {
    for (const auto& f : *vf) {
      auto part = load_sft_examples(f, tok, dopt);
      val.insert(val.end(), std::make_move_iterator(part.begin()),
                 std::make_move_iterator(part.end()));
    }
  }
  // verl's train_max_samples / val_max_samples: the first rows of the files (-1: all).
  if (int64_t m = cfg.get<int64_t>("data.train_max_samples");
      m >= 0 && static_cast<int64_t>(train.size()) > m)
    train.resize(static_cast<size_t>(m));
  if (int64_t m = cfg.get<int64_t>("data.val_max_samples");
      m >= 0 && static_cast<int64_t>(val.size()) > m)
    val.resize(static_cast<size_t>(m));
  const int64_t batch_size = cfg.get<int64_t>("data.train_batch_size");
  VERL_CHECK(static_cast<int64_t>(train.size()) >= batch_size,
             "data.train_batch_size {} is larger than the training set ({} rows)", batch_size,
             train.size());
  const int64_t steps_per_epoch = static_cast<int64_t>(train.size()) / batch_size;  // drop_last
  const int64_t epochs = cfg.get<int64_t>("trainer.total_epochs");
  int64_t total = steps_per_epoch * epochs;
  if (auto t = cfg.get<std::optional<int64_t>>("trainer.total_training_steps"))
    total = std::min(total, *t);
  const int64_t budget =
      cfg.get<bool>("data.use_dynamic_bsz") ? cfg.get<int64_t>("data.max_token_len_per_batch") : 0;
  const int64_t micro_seqs = cfg.get<int64_t>("data.micro_batch_size_per_gpu");

  optim::AdamWConfig ocfg;
  ocfg.lr = static_cast<float>(cfg.get<double>("optim.lr"));
  auto betas = cfg.get<std::vector<double>>("optim.betas");
  VERL_CHECK(betas.size() == 2, "optim.betas must hold two numbers, got {}", betas.size());
  ocfg.beta1 = static_cast<float>(betas[0]);
  ocfg.beta2 = static_cast<float>(betas[1]);
  ocfg.weight_decay = static_cast<float>(cfg.get<double>("optim.weight_decay"));
  ocfg.grad_clip = static_cast<float>(cfg.get<double>("optim.clip_grad"));
  optim::LrSchedule sched;
  sched.type = cfg.get<std::string>("optim.lr_scheduler");
  sched.total_steps = total;
  sched.warmup_steps =
      optim::LrSchedule::resolve_warmup(cfg.get<int64_t>("optim.lr_warmup_steps"),
                                        cfg.get<double>("optim.warmup_steps_ratio"), total);
  sched.min_lr_ratio = cfg.get<double>("optim.min_lr_ratio");
  sched.num_cycles = cfg.get<double>("optim.num_cycles");
  const optim::AdamW opt(ocfg, sched);  // the schedule's learning rate per step
  // Data parallel (mpirun / torchrun ranks, docs/distributed.md): every rank holds the same model
  // and reads the same step's rows; each trains on its contiguous share of them, the loss scaled by
  // the whole batch's target count, so the optimizer's all-reduced gradient is the one-process
  // step's. Rank 0 logs and saves.
  const Device device = resolve_device(cfg.get<std::string>("trainer.device"));
  const std::unique_ptr<dist::Communicator> comm = start_ranks(cfg, device, kSftCollectiveTimeoutS);
  const int world = comm->world_size(), rank = comm->rank();
  const bool lead = rank == 0;
  VERL_CHECK(batch_size % world == 0,
             "data.train_batch_size={} must be a multiple of the {} data-parallel ranks (each "
             "takes an equal share)",
             batch_size, world);
  // The model on trainer.device, planned (CUDA) for the largest micro-batch `pack` makes: the
  // token budget, or one sequence of up to data.max_length beyond it.
  PolicyOptions popt;
  popt.optim = ocfg;
  popt.max_tokens = budget > 0 ? std::max(budget, dopt.max_length) : micro_seqs * dopt.max_length;
  popt.max_seqs =
      budget > 0 ? std::min(std::max(batch_size, static_cast<int64_t>(val.size())), popt.max_tokens)
                 : micro_seqs;
  popt.recompute = cfg.get<bool>("model.enable_gradient_checkpointing");
  // model.lora_rank > 0: the adapters train, the base stays frozen.
  if (const std::optional<LoraKeys> lk = read_lora_keys(cfg, "model."))
    popt.lora =
        make_lora_adapters(*lk, w.config, static_cast<uint64_t>(cfg.get<int64_t>("trainer.seed")));
  std::unique_ptr<PolicyModel> policy = make_policy(device, std::move(w), popt);

  const std::string out_root = cfg.get<std::string>("trainer.default_local_dir");
  const int64_t save_freq = cfg.get<int64_t>("trainer.save_freq");
  const int64_t test_freq = cfg.get<int64_t>("trainer.test_freq");
  const uint64_t seed = static_cast<uint64_t>(cfg.get<int64_t>("trainer.seed"));
  const bool shuffle = cfg.get<bool>("data.shuffle");

  const int64_t keep = cfg.get<std::optional<int64_t>>("trainer.max_ckpt_to_keep").value_or(0);
  const CheckpointContents save_parts = parse_checkpoint_contents(
      cfg.get<std::vector<std::string>>("checkpoint.save_contents"), "checkpoint.save_contents");
  const CheckpointContents load_parts = parse_checkpoint_contents(
      cfg.get<std::vector<std::string>>("checkpoint.load_contents"), "checkpoint.load_contents");
  // What a checkpoint records of the data order, to warn when a resumed run's order differs.
  const nlohmann::json data_order = {{"training rows", train.size()},
                                     {"data.train_batch_size", batch_size},
                                     {"trainer.seed", seed},
                                     {"data.shuffle", shuffle}};
  // A checkpoint is the HF model directory (a later run's model.partial_pretrain) plus the AdamW
  // moments and trainer_state.json: written beside its final name, then renamed whole, so a save
  // that fails (a full disk) leaves nothing behind and names the step.
  auto save = [&](int64_t step) {
    const std::string tmp = fmt::format("{}/.tmp_global_step_{}", out_root, step);
    try {
      fs::remove_all(tmp);
      nlohmann::json st = data_order;
      if (const model::LoraWeights* lora = policy->lora()) {
        // LoRA: the merged model keeps the directory a model path; lora_adapter/ (PEFT) and the
        // adapters' moments are what a resume reads.
        lora->merged(policy->weights()).save(tmp);
        lora->save(tmp + "/" + kLoraAdapterDir,
                   std::filesystem::absolute(model_dir).lexically_normal().string());
        st["lora"] = {{"rank", lora->rank()}};
      } else {
        policy->weights().save(tmp);
      }
      model::copy_tokenizer_files(tokenizer_dir, tmp);
      if (save_parts.optimizer)
        save_optimizer_state(tmp, policy->optimizer_state(), policy->state().numel());
      st["trainer"] = "sft";
      fault_point("save", step);  // tests kill the process here: half a checkpoint on disk
      const std::string dir = publish_checkpoint(out_root, step, tmp, st, keep);
      log::info("saved {}", dir);
      return dir;
    } catch (const std::exception& e) {
      fail_checkpoint_save(out_root, step, tmp, e.what(), "trainer.max_ckpt_to_keep");
    }
  };
  auto validate = [&](metrics::Metrics& m) {
    if (val.empty()) return;
    std::vector<const SftExample*> all;
    for (const auto& ex : val) all.push_back(&ex);
    LossStats st =
        run_batch(*policy, rank_share(all, rank, world), budget, micro_seqs, 1.0, /*train=*/false);
    sum_over_ranks(st, *comm);
    m.set("val/loss", st.loss_sum / std::max<int64_t>(1, st.targets));
  };

  if (lead)
    log::info("SFT on {}{}: {} rows, {} steps of {} sequences, {} parameters", to_string(device),
              world > 1 ? fmt::format(" x {} ranks", world) : "", train.size(), total, batch_size,
              policy->state().numel());
  std::optional<RunLock> run_lock;  // one run per directory, held by rank 0
  if (lead) run_lock.emplace(out_root);
  std::string last_dir;
  const int64_t start = resume_sft(cfg, out_root, *policy, data_order, load_parts, lead, last_dir);
  if (start >= total) {
    if (lead) log::info("{} is at step {} of {}: nothing left to train", last_dir, start, total);
    return lead ? last_dir : "";
  }
  metrics::LoggerOptions lo;
  lo.experiment_dir = out_root;
  lo.resume_step = start;  // metrics.jsonl lines after the checkpoint's step go
  lo.total_steps = total;
  lo.logging_steps = cfg.get<int64_t>("trainer.logging_steps");
  std::optional<metrics::MultiLogger> logger;
  if (lead) logger.emplace(cfg.get<std::vector<std::string>>("trainer.logger"), lo);
  std::vector<size_t> order(train.size());
  int64_t step = start;
  note_step(step, /*in_progress=*/false);  // for the line a signal prints
  // A resumed run continues inside the epoch where the checkpoint was: each epoch's order depends
  // on (seed, epoch) only.
  for (int64_t epoch = start / steps_per_epoch; epoch < epochs && step < total; ++epoch) {
    std::iota(order.begin(), order.end(), 0);
    if (shuffle) {  // Fisher-Yates from (seed, epoch): the same order on every run
      Rng rng(seed, static_cast<uint64_t>(epoch));
      for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
    }
    for (int64_t b = step - epoch * steps_per_epoch; b < steps_per_epoch && step < total; ++b) {
      Timer timer;
      note_step(step + 1, /*in_progress=*/true);
      std::vector<const SftExample*> batch;
      for (int64_t i = 0; i < batch_size; ++i) batch.push_back(&train[order[b * batch_size + i]]);
      policy->zero_grad();
      const int64_t n_targets = count_targets(batch);
      // The optimizer takes the ranks' mean gradient (optim/adamw.cpp): each rank's loss carries
      // world / the whole batch's target count, so the mean is the one-process gradient.
      LossStats st =
          run_batch(*policy, rank_share(batch, rank, world), budget, micro_seqs,
                    static_cast<double>(std::max<int64_t>(1, n_targets)) / world, /*train=*/true);
      fault_point("train", step + 1);  // tests kill the process in the middle of a step
      const float lr = opt.lr_at(step);
      const double gnorm = policy->optimizer_step(lr, *comm);
      sum_over_ranks(st, *comm);
      ++step;
      const double secs = timer.seconds();
      metrics::Metrics m;
      m.set("train/loss", st.loss_sum / std::max<int64_t>(1, st.targets));
      m.set("train/lr", lr);
      m.set("train/grad_norm", gnorm);
      m.set("training/epoch", double(epoch));
      m.set("perf/throughput", st.tokens / secs);
      m.set("perf/time_per_step", secs);
      // Validated every test_freq steps and saved every save_freq, both at the last step too; the
      // step is logged before its save, so a save that fails loses no metrics.
      if ((test_freq > 0 && step % test_freq == 0) || step == total) validate(m);
      if (logger) logger->log(step, m);
      if (lead && ((save_freq > 0 && step % save_freq == 0) || step == total))
        last_dir = save(step);
      note_step(step, /*in_progress=*/false);
    }
  }
  if (logger) logger->close();
  return last_dir;
}

}  // namespace verl::trainer
