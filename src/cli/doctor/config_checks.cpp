// `verl doctor --config`: a run's configuration against the pre-flight checklist (the device, the
// model, the data and the run's length, checkpoints and logging, loader threads, the kernels, the
// overlap switches, micro-batching, the reward model, and the GPU memory the run needs).
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/doctor/doctor.h"
#include "core/error.h"
#include "core/file.h"
#include "data/dynamic_batch.h"
#include "data/parquet.h"
#include "data/rl_dataset.h"
#include "model/config.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"
#include "trainer/memory_plan.h"
#include "trainer/ppo_config.h"
#include "trainer/run_plan.h"

namespace verl::cli::doctor {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kLongRun = 20;  // steps: past this, per-step checkpoints and tables cost

// Rows of one data file when counting them is cheap: JSON lines are counted, a Parquet footer
// says; a .json array would have to be parsed whole (nullopt). Throws naming a missing file.
std::optional<int64_t> count_rows(const std::string& given) {
  const std::string path = data::expand_user(given);
  std::error_code ec;
  VERL_CHECK(!fs::is_directory(path, ec),
             "{}: a directory, not a data file (list its .parquet / .jsonl / .json files)", path);
  VERL_CHECK(fs::is_regular_file(path, ec), "{}: no such file", path);
  if (path.ends_with(".parquet")) return data::ParquetFile::open(path).num_rows();
  if (!path.ends_with(".jsonl")) return std::nullopt;
  std::ifstream f(path);
  std::string line;
  int64_t rows = 0;
  while (std::getline(f, line)) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) ++rows;
  }
  return rows;
}

// The rows of a data.*_files list (`rows` unset when one file's count is not cheap); FAILs the
// check `key` when a file is missing or unreadable.
struct DataFiles {
  bool ok = false;
  std::optional<int64_t> rows;
};

DataFiles check_files(Report& r, const std::string& key, const std::vector<std::string>& files) {
  int64_t rows = 0;
  bool counted = true;
  try {
    for (const std::string& f : files) {
      const auto n = count_rows(f);
      if (n)
        rows += *n;
      else
        counted = false;
    }
  } catch (const std::exception& e) {
    r.fail(key, message_of(e),
           fmt::format("point {} at the data (.parquet, .jsonl or .json files)", key));
    return {};
  }
  const std::string what = files.size() == 1 ? files[0] : fmt::format("{} files", files.size());
  r.pass(key, counted ? fmt::format("{}: {} rows", what, rows)
                      : what + ": rows not counted (a .json array)");
  return {true, counted ? std::optional<int64_t>(rows) : std::nullopt};
}

struct RunLength {
  std::optional<int64_t> steps;  // nullopt: unknown
  std::string how;
};

RunLength check_run_length(Report& r, const config::Config& cfg, std::optional<int64_t> rows) {
  const auto cap = cfg.get<std::optional<int64_t>>("trainer.total_training_steps");
  const int64_t epochs = cfg.get<int64_t>("trainer.total_epochs");
  const int64_t batch = cfg.get<int64_t>("data.train_batch_size");
  const int64_t max_samples = cfg.get<int64_t>("data.train_max_samples");
  if (rows && max_samples >= 0) rows = std::min(*rows, max_samples);
  RunLength len;
  if (rows) {
    const int64_t per_epoch = *rows / batch;  // the train loader drops the last partial batch
    if (per_epoch == 0) {
      r.fail("run length",
             fmt::format("{} rows, fewer than data.train_batch_size={}: an epoch has no batch",
                         *rows, batch),
             fmt::format("consider data.train_batch_size={} or more data",
                         std::max<int64_t>(1, *rows)));
      return len;
    }
    const int64_t from_epochs = epochs * per_epoch;
    len.steps = cap ? std::min(*cap, from_epochs) : from_epochs;
    len.how =
        fmt::format("{} epochs x {} batches of data.train_batch_size={}", epochs, per_epoch, batch);
    if (cap && *cap < from_epochs)
      len.how = fmt::format("trainer.total_training_steps={}; {} = {}", *cap, len.how, from_epochs);
  } else if (cap) {
    len.steps = *cap;
    len.how = fmt::format("trainer.total_training_steps={} (rows not counted)", *cap);
  }
  if (len.steps)
    r.pass("run length", fmt::format("{} steps ({})", *len.steps, len.how));
  else
    r.pass("run length", "unknown: rows not counted and trainer.total_training_steps unset");
  return len;
}

void check_save_freq(Report& r, const config::Config& cfg, const RunLength& len) {
  const std::string key = "trainer.save_freq";
  const int64_t freq = cfg.get<int64_t>(key);
  const bool long_run = !len.steps || *len.steps > kLongRun;
  const std::string steps =
      len.steps ? fmt::format("{} steps", *len.steps) : "a run of unknown length";
  const int64_t suggest = std::max<int64_t>(10, len.steps.value_or(0) / 10);
  if (freq <= 0) {
    if (long_run) {
      r.warn(key,
             fmt::format("{}: no checkpoint in {}; a crash or a kill loses the whole run", freq,
                         steps),
             fmt::format("consider trainer.save_freq={}", suggest));
    } else {
      r.pass(key, fmt::format("{}: no checkpoint (a short run of {})", freq, steps));
    }
  } else if (freq < 5 && long_run) {
    r.warn(key,
           fmt::format(
               "checkpoints every {} over {}: each save writes the model and optimizer state while "
               "training waits",
               freq == 1 ? "step" : fmt::format("{} steps", freq), steps),
           fmt::format("consider trainer.save_freq={}", suggest));
  } else if (len.steps && freq >= *len.steps) {
    r.pass(key, fmt::format("{}: one checkpoint, after the last of {}", freq, steps));
  } else {
    r.pass(key, fmt::format("checkpoints every {} steps over {}, and after the last", freq, steps));
  }
}

void check_logging_steps(Report& r, const config::Config& cfg, const RunLength& len) {
  const std::string key = "trainer.logging_steps";
  const int64_t every = cfg.get<int64_t>(key);
  const std::string steps =
      len.steps ? fmt::format("{} steps", *len.steps) : "a run of unknown length";
  if (every == 1 && (!len.steps || *len.steps > kLongRun)) {
    r.warn(key,
           fmt::format("1: the console prints the full metrics table every step of {}, burying the "
                       "progress line "
                       "(jsonl and tensorboard get every step whatever this is)",
                       steps),
           "consider trainer.logging_steps=10");
  } else if (len.steps && every > *len.steps) {
    r.warn(
        key,
        fmt::format("{}: more than the run's {}: the console shows the table only after the last",
                    every, steps),
        fmt::format("consider trainer.logging_steps={}", std::max<int64_t>(1, *len.steps / 10)));
  } else {
    r.pass(key, fmt::format("the metrics table every {} steps of {}", every, steps));
  }
}

void check_loader_threads(Report& r, const config::Config& cfg, const Machine& m) {
  const std::string key = "data.dataloader_num_workers";
  const int64_t workers = cfg.get<int64_t>(key);
  const int ranks = std::max(1, m.local_ranks);
  const std::string where =
      fmt::format("{} cores, {} GPU(s){}", m.cores, m.gpus,
                  ranks > 1 ? fmt::format(", {} ranks on this node", ranks) : "");
  if (workers == 0) {
    r.warn(key,
           fmt::format("0: rows are read and tokenized on the training thread, between steps ({})",
                       where),
           "consider data.dataloader_num_workers=2 or more");
  } else if (m.cores > 0 && workers * ranks > 2 * static_cast<int64_t>(m.cores)) {
    // A few idle loader threads cost nothing (they wait on a full prefetch queue); many more
    // than cores compete with the trainer's math threads while they fill it.
    r.warn(key,
           fmt::format("{} loader threads per rank ({}): far more than the cores", workers, where),
           fmt::format("consider data.dataloader_num_workers={}",
                       std::max<int64_t>(1, m.cores / ranks)));
  } else {
    r.pass(key, fmt::format("{} loader thread{} read and tokenize ahead of the trainer ({})",
                            workers, workers == 1 ? "" : "s", where));
  }
}

// Parameters of the policy model, from its config.json; FAILs the check when it cannot be read.
std::optional<model::ModelConfig> check_model(Report& r, const config::Config& cfg,
                                              int64_t* params) {
  const std::string key = "actor_rollout_ref.model.path";
  const std::string path = data::expand_user(cfg.get<std::string>(key));
  try {
    model::ModelConfig mc = model::load_model_config(path);
    *params = model::ParamLayout::build(mc).total;
    const std::string count = *params >= 1'000'000'000 ? fmt::format("{:.2f} B", *params / 1e9)
                                                       : fmt::format("{:.1f} M", *params / 1e6);
    r.pass(key, fmt::format("{}: {}, {} parameters, {} layers", path, mc.architecture, count,
                            mc.num_hidden_layers));
    return mc;
  } catch (const std::exception& e) {
    r.fail(
        key, message_of(e),
        "point actor_rollout_ref.model.path at an HF model directory (config.json + safetensors)");
    return std::nullopt;
  }
}

// The policy's tokenizer (data.tokenizer, else the model's directory) against the model's
// vocab_size: an id past the embedding rows fails mid-run as an out-of-range token.
void check_tokenizer(Report& r, const config::Config& cfg,
                     const std::optional<model::ModelConfig>& mc) {
  if (!mc) return;
  const std::string key = "data.tokenizer";
  const auto set = cfg.get<std::optional<std::string>>(key);
  const std::string dir =
      data::expand_user(set ? *set : cfg.get<std::string>("actor_rollout_ref.model.path"));
  try {
    const int64_t ids = tokenizer::Tokenizer::load(dir).vocab_size();
    const std::string found =
        fmt::format("{}: {} token ids; the model's vocab_size is {}", dir, ids, mc->vocab_size);
    if (ids > mc->vocab_size) {
      r.fail(key, found + ": ids past it have no embedding row",
             "use the tokenizer the model was trained with (data.tokenizer), or a model whose "
             "config.json vocab_size covers it");
    } else {
      r.pass(key, found);
    }
  } catch (const std::exception& e) {
    r.fail(key, message_of(e), "point data.tokenizer (or the model directory) at tokenizer.json");
  }
}

// data.max_prompt_length + data.max_response_length against the model's max_position_embeddings:
// past it the rollout generates on at positions the model never saw, without a word.
void check_sequence_length(Report& r, const config::Config& cfg,
                           const std::optional<model::ModelConfig>& mc) {
  if (!mc || mc->max_position_embeddings <= 0) return;
  const std::string key = "data.max_response_length";
  const int64_t prompt = cfg.get<int64_t>("data.max_prompt_length"),
                response = cfg.get<int64_t>(key), total = prompt + response;
  const std::string found = fmt::format(
      "data.max_prompt_length {} + {} {} = {} tokens; the model's "
      "max_position_embeddings is {}",
      prompt, key, response, total, mc->max_position_embeddings);
  if (total > mc->max_position_embeddings) {
    r.warn(key, found + ": positions past it are outside what the model was trained on",
           fmt::format("keep the two at most {} tokens together, or use a model with a longer "
                       "context",
                       mc->max_position_embeddings));
  } else {
    r.pass(key, found);
  }
}

// Whether the run trains on the GPU: trainer.device, resolved as core/device.h does.
bool check_device(Report& r, const config::Config& cfg, const Machine& m) {
  const std::string key = "trainer.device";
  const std::string dev = cfg.get<std::string>(key);
  if (dev == "cuda" && m.gpus == 0) {
    r.fail(key, "cuda, but no CUDA device is visible here (see the gpus line)",
           "set trainer.device=cpu or auto");
    return false;
  }
  if (dev == "cpu" && m.gpus > 0) {
    r.warn(key, fmt::format("cpu on a machine with {} GPU(s)", m.gpus),
           "consider trainer.device=auto");
    return false;
  }
  const bool cuda = dev == "cuda" || (dev == "auto" && m.gpus > 0);
  r.pass(key, dev == "auto" ? fmt::format("auto: {} here", cuda ? "cuda" : "cpu") : dev);
  return cuda;
}

void check_attention(Report& r, const config::Config& cfg, bool on_cuda) {
  const std::string name = "fused attention";
  const std::string impl = cfg.get<std::string>("actor_rollout_ref.model.attn_implementation");
  const std::string ignored =
      impl == "flash_attention_2"
          ? ""
          : fmt::format(" (actor_rollout_ref.model.attn_implementation={} has no effect)", impl);
  if (!on_cuda) {
    r.pass(name,
           "trainer.device=cpu: the CPU reference attention (fused kernels run on "
           "trainer.device=cuda)" +
               ignored);
  } else if (cfg.get<bool>("actor_rollout_ref.rollout.batch_invariant")) {
    r.warn(name,
           "actor_rollout_ref.rollout.batch_invariant=true: batch-invariant kernels, bit-equal "
           "log-probs, slower" +
               ignored,
           "unless bit equality is needed consider actor_rollout_ref.rollout.batch_invariant=false "
           "(match_trainer_numerics "
           "keeps rollout log-probs within ~1e-6)");
  } else {
    r.pass(name, "fused attention kernels on the GPU, in the actor and the rollout" + ignored);
  }
}

void check_hybrid_engine(Report& r, const config::Config& cfg) {
  const std::string key = "actor_rollout_ref.hybrid_engine";
  if (cfg.get<bool>(key)) {
    r.pass(key,
           "true: the rollout decodes from the actor's weights in place (no copy or resharding "
           "between phases)");
  } else {
    r.warn(key, "false: verl.cpp always runs the hybrid engine",
           "set actor_rollout_ref.hybrid_engine=true");
  }
}

void check_overlap(Report& r, const config::Config& cfg) {
  const std::string key = "trainer.actor_reward_parallel";
  if (cfg.get<bool>(key)) {
    r.pass(key, "true: rewards are scored as sequences finish, while generation runs");
  } else {
    r.warn(key, "false: rewards are scored after generation ends",
           "consider trainer.actor_reward_parallel=true");
  }
  // The seed's two further overlap switches (docs/overlap.md).
  const std::string pipe = "trainer.token_level_pipeline";
  if (cfg.get<bool>(pipe)) {
    r.pass(pipe,
           "true: the log-prob and value passes run on finished samples while generation runs");
  } else {
    r.warn(pipe, "false: the log-prob and value passes wait for the longest response",
           "consider trainer.token_level_pipeline=true (long-tailed response lengths gain most)");
  }
  const bool critic = cfg.get<std::string>("algorithm.adv_estimator") == "gae" ||
                      cfg.get<std::optional<bool>>("critic.enable").value_or(false);
  const std::string ca = "trainer.critic_actor_overlap";
  if (!critic) {
    r.pass(ca, "no critic in this run: nothing to overlap");
  } else if (cfg.get<bool>(ca)) {
    r.pass(ca,
           "true: the critic's update runs beside the actor's (one process; with several ranks "
           "they take turns)");
  } else {
    r.warn(ca, "false: the critic's update and the actor's run one after the other",
           "consider trainer.critic_actor_overlap=true on one process");
  }
}

void check_dynamic_batching(Report& r, const config::Config& cfg) {
  const std::string key = "actor_rollout_ref.actor.use_dynamic_bsz";
  const int64_t seq =
      cfg.get<int64_t>("data.max_prompt_length") + cfg.get<int64_t>("data.max_response_length");
  const int64_t budget = cfg.get<int64_t>("actor_rollout_ref.actor.ppo_max_token_len_per_gpu");
  if (cfg.get<bool>("data.dynamic_batch.enable")) {
    // data.dynamic_batch replaces use_dynamic_bsz's fixed budget (data/dynamic_batch.h).
    const std::string dkey = "data.dynamic_batch.enable";
    data::DynamicBatchConfig db;
    try {
      db = data::DynamicBatchConfig::from_config(cfg);
    } catch (const std::exception& e) {
      r.fail(dkey, message_of(e), "fix the data.dynamic_batch key it names");
      return;
    }
    const int64_t planned = std::min(
        db.max_sequence_length, cfg.get<int64_t>("data.max_prompt_length") +
                                    cfg.get<int64_t>("actor_rollout_ref.rollout.response_length"));
    if (budget < planned) {
      r.warn(
          dkey,
          fmt::format(
              "true, but ppo_max_token_len_per_gpu={} is under one planned sequence of {} tokens: "
              "longer kept samples cannot be packed",
              budget, planned),
          fmt::format("consider actor_rollout_ref.actor.ppo_max_token_len_per_gpu={} or a lower "
                      "data.dynamic_batch.max_sequence_length",
                      planned));
      return;
    }
    r.pass(dkey,
           fmt::format(
               "true: micro-batches of up to {} tokens (base_batch_size {} x {} planned tokens, at "
               "most ppo_max_token_len_per_gpu {}), halved above {} GiB in use; samples outside "
               "[{}, {}] tokens dropped",
               std::min(budget, db.base_batch_size * planned), db.base_batch_size, planned, budget,
               db.memory_threshold_gb, db.min_sequence_length, db.max_sequence_length));
    return;
  }
  if (!cfg.get<bool>(key)) {
    r.warn(key,
           "false: micro-batches by sample count: short responses leave them underfilled, long "
           "ones risk running out of memory",
           fmt::format("consider actor_rollout_ref.actor.use_dynamic_bsz=true with "
                       "ppo_max_token_len_per_gpu >= {}, or data.dynamic_batch.enable=true",
                       seq));
  } else if (budget < seq) {
    r.warn(key,
           fmt::format("true, but ppo_max_token_len_per_gpu={} is under one full-length sequence "
                       "(max_prompt_length + "
                       "max_response_length = {})",
                       budget, seq),
           fmt::format("consider actor_rollout_ref.actor.ppo_max_token_len_per_gpu={}", seq));
  } else {
    r.pass(key,
           fmt::format("true: micro-batches of up to {} tokens ({} full-length sequences of {})",
                       budget, budget / seq, seq));
  }
}

// The reward model's weights (reward_model.model.path): bf16 on the GPU, fp32 on the CPU, at
// load. Quantised on the GPU the linear layers keep their codes instead (ops/cuda/quant_linear.h):
// int8 1 byte a weight, int4 half a byte plus a 4-byte scale and a zero-point byte a group; the
// CPU keeps fp32 whatever the bits. The gpu memory check counts them with the rest
// (trainer/memory_plan.h).
void check_reward_model(Report& r, const config::Config& cfg, const Machine& m, bool on_cuda) {
  const std::string key = "reward_model.quantization_bits";
  if (!cfg.get<bool>("reward_model.enable")) {
    r.pass(key,
           "reward_model.enable=false: rule-based or command rewards, no reward model to quantise");
    return;
  }
  const std::string path = data::expand_user(cfg.get<std::string>("reward_model.model.path"));
  model::ParamLayout layout;
  try {
    layout = model::ParamLayout::build(model::load_model_config(path));
  } catch (const std::exception& e) {
    r.fail(key, fmt::format("reward_model.model.path: {}", message_of(e)),
           "point reward_model.model.path at an HF ...ForSequenceClassification directory");
    return;
  }
  const int64_t params = layout.total;
  int64_t linear = 0;  // the quantisable weights: each layer's q|k|v, o, gate|up, down
  for (const model::LayerParams& lp : layout.layers)
    for (int i : {lp.wqkv, lp.wo, lp.wgu, lp.wdown})
      if (i >= 0) linear += layout.params[static_cast<size_t>(i)].numel;
  const int64_t bits = cfg.get<int64_t>(key);
  const auto group = static_cast<double>(cfg.get<int64_t>("reward_model.quantization_group_size"));
  const double per_linear = bits == 8 ? 1.0 : bits == 4 ? 0.5 + 5.0 / group : 2.0;
  const double bytes = on_cuda ? 2.0 * static_cast<double>(params - linear) +
                                     per_linear * static_cast<double>(linear)
                               : 4.0 * static_cast<double>(params);
  const std::string where =
      on_cuda ? fmt::format("{:.0f}% of the GPU", 100.0 * bytes / m.gpu_memory) : "host memory";
  if (bits != 16) {
    r.pass(key, fmt::format("{}: int{} weight-only reward model of {:.2f} B parameters, {} ({}; "
                            "scores can shift a little: compare with 16 on a validation batch)",
                            bits, bits, params / 1e9, size_of(bytes), where));
  } else if (on_cuda && bytes > 0.1 * m.gpu_memory) {
    r.warn(
        key,
        fmt::format("16: the reward model's bf16 weights take {} ({}) beside the training state",
                    size_of(bytes), where),
        "if GPU memory is tight, reward_model.quantization_bits=8 (about half of it) or 4 (about "
        "a quarter), or a smaller reward model");
  } else {
    r.pass(key, fmt::format("16: the reward model's weights take {} ({})", size_of(bytes), where));
  }
}

// reward_model.model.input_tokenizer: set (verl's default, the policy's path) and the reward
// model's directory holding a tokenizer.json, the trainer decodes every response and renders and
// encodes it again with the reward model's template (docs/reward_model.md). Worth it when the two
// tokenizers or templates differ; with the policy's own it only adds the template's end of the
// assistant's turn, for a decode and an encode of every response.
void check_reward_input(Report& r, const config::Config& cfg) {
  const std::string key = "reward_model.model.input_tokenizer";
  if (!cfg.get<bool>("reward_model.enable")) return;
  const auto input = cfg.get<std::optional<std::string>>(key);
  if (!input) {
    r.pass(key, "null: the policy's prompt and response tokens are scored as they are");
    return;
  }
  const std::filesystem::path rm =
      data::expand_user(cfg.get<std::string>("reward_model.model.path"));
  const std::filesystem::path policy = data::expand_user(*input);
  if (!std::filesystem::exists(rm / "tokenizer.json")) {
    r.pass(key, fmt::format("{}/tokenizer.json absent: the policy's tokens are scored as they are",
                            rm.string()));
    return;
  }
  try {
    // A token id past the reward model's embedding rows fails only after the first rollout.
    const int64_t ids = tokenizer::Tokenizer::load(rm.string()).vocab_size();
    const int64_t rows = model::load_model_config(rm.string()).vocab_size;
    if (ids > rows) {
      r.fail(key,
             fmt::format("{}/tokenizer.json has {} token ids, but the reward model's config.json "
                         "vocab_size is {}: ids past it have no embedding row",
                         rm.string(), ids, rows),
             "give the reward model the tokenizer it was trained with, or a config.json whose "
             "vocab_size covers the tokenizer");
      return;
    }
    const bool same_vocab = read_file((rm / "tokenizer.json").string(), "reward model tokenizer") ==
                            read_file((policy / "tokenizer.json").string(), "policy tokenizer");
    const auto template_of = [](const std::filesystem::path& dir) {
      return tokenizer::load_tokenizer_config(dir.string())
          .value("chat_template", nlohmann::json());
    };
    if (same_vocab && template_of(rm) == template_of(policy)) {
      r.warn(
          key,
          fmt::format("{}: the reward model ({}) has the policy's tokenizer and chat template, yet "
                      "every response is decoded, rendered and encoded again",
                      *input, rm.string()),
          fmt::format("{}=null scores the policy's tokens as they are (without the template's end "
                      "of the assistant's turn)",
                      key));
    } else {
      r.pass(key,
             fmt::format("{}: responses re-rendered with {}'s {} (verl's switch of chat template)",
                         *input, rm.string(),
                         same_vocab ? "chat template" : "tokenizer and chat template"));
    }
  } catch (const std::exception& e) {
    r.warn(key, fmt::format("{}: {}", *input, message_of(e)),
           fmt::format("point {} at the policy's model directory, or null", key));
  }
}

// One change of the config and what it gives the plan.
struct Remedy {
  std::string setting;
  trainer::MemoryPlanInputs inputs;
};

// Single changes that lower the resident memory, cheapest first: recomputation, the reference's
// weights on the host between its passes, then the actor's offload ratio in steps of 0.1.
std::vector<Remedy> memory_remedies(const trainer::MemoryPlanInputs& in) {
  std::vector<Remedy> out;
  if (!in.actor.recompute) {
    Remedy r{"actor_rollout_ref.model.enable_gradient_checkpointing=true", in};
    r.inputs.actor.recompute = true;
    out.push_back(r);
  }
  if (in.reference && in.reference->offload_params == 0) {
    Remedy r{"actor_rollout_ref.ref.fsdp_config.param_offload=true", in};
    r.inputs.reference->offload_params = 1;
    out.push_back(r);
  }
  const double ratio = std::min(in.actor.offload_params, in.actor.offload_optimizer);
  for (int tenth = static_cast<int>(std::floor(ratio * 10)) + 1; tenth <= 10; ++tenth) {
    Remedy r{fmt::format("actor_rollout_ref.actor_offload_ratio={}", tenth / 10.0), in};
    r.inputs.actor.offload_params = std::max(in.actor.offload_params, tenth / 10.0);
    r.inputs.actor.offload_optimizer = std::max(in.actor.offload_optimizer, tenth / 10.0);
    out.push_back(r);
  }
  return out;
}

// The share of the GPU that holds what is resident, the runner and every sequence's KV cache,
// rounded up to 0.05.
double share_for_all(const trainer::MemoryPlan& p, double gpu) {
  const double need =
      p.resident + p.runner_scratch + static_cast<double>(p.kv_blocks_wanted) * p.kv_block_bytes;
  return std::ceil(need / gpu * 20.0) / 20.0;
}

// What to set so that the step fits and its KV cache holds every sequence: a larger
// gpu_memory_utilization (up to 0.95) where that is enough, else the first single remedy that
// fits (with the utilization it then needs).
std::string memory_advice(const trainer::MemoryPlanInputs& in, const trainer::MemoryPlan& plan,
                          double gpu) {
  constexpr double kMaxShare = 0.95;
  const std::string util_key = "actor_rollout_ref.rollout.gpu_memory_utilization";
  const double want = share_for_all(plan, gpu);
  if (plan.peak().bytes <= gpu && want <= kMaxShare)
    return fmt::format("consider {}={:.2f}", util_key,
                       std::max(want, in.rollout.gpu_memory_utilization));
  for (Remedy remedy : memory_remedies(in)) {
    const double share = std::max(in.rollout.gpu_memory_utilization,
                                  share_for_all(trainer::plan_memory(remedy.inputs), gpu));
    if (share > kMaxShare) continue;
    remedy.inputs.rollout.gpu_memory_utilization = share;
    const trainer::MemoryPlan p = trainer::plan_memory(remedy.inputs);
    if (p.peak().bytes > gpu) continue;
    const std::string util = share > in.rollout.gpu_memory_utilization
                                 ? fmt::format(" and {}={:.2f}", util_key, share)
                                 : "";
    return fmt::format("consider {}{} (estimated peak {}; docs/memory.md)", remedy.setting, util,
                       size_of(p.peak().bytes));
  }
  return "a smaller model, fewer sequences a step (data.gen_batch_size x rollout.n) or smaller "
         "micro-batches (ppo_max_token_len_per_gpu): it does not fit even with "
         "actor_rollout_ref.actor_offload_ratio=1 (docs/memory.md)";
}

// The GPU memory of each phase of a step (trainer/memory_plan.h, docs/memory.md) against the
// smallest GPU: the training states as their offload keys split them, each model's activation
// arena for its largest micro-batch, and in gen the rollout's scratch and KV cache, which gets
// gpu_memory_utilization x the GPU minus what is in use when it is built (vLLM's rule).
// Recomputation shrinks the update's arena, which is held through every phase.
void check_gpu_memory(Report& r, const config::Config& cfg, const Machine& m, bool on_cuda,
                      const std::optional<model::ModelConfig>& mc) {
  const std::string name = "gpu memory";
  const bool recompute = cfg.get<bool>("actor_rollout_ref.model.enable_gradient_checkpointing");
  const double util = cfg.get<double>("actor_rollout_ref.rollout.gpu_memory_utilization");
  if (!on_cuda) {
    r.pass(name,
           "trainer.device=cpu: enable_gradient_checkpointing and rollout.gpu_memory_utilization "
           "have no effect");
    return;
  }
  if (!mc) {
    r.warn(name, "not sized: the model config is unreadable",
           "fix actor_rollout_ref.model.path first");
    return;
  }
  // The critic's and the reward model's config.json when the run has them (a bad path is named
  // by its own check; the critic then counts as the actor's shape).
  auto config_at = [&](const std::string& key) -> std::optional<model::ModelConfig> {
    try {
      return model::load_model_config(data::expand_user(cfg.get<std::string>(key)));
    } catch (const std::exception&) {
      return std::nullopt;
    }
  };
  const int world = m.launch_ok ? std::max(1, m.launch.world_size) : 1;
  const double gpu = m.gpu_memory;
  trainer::MemoryPlanInputs in;
  trainer::MemoryPlan plan;
  try {
    // The trainer's own plan: its typed config, roles and micro-batch plans (trainer/run_plan.h).
    const trainer::PpoConfig pc = trainer::PpoConfig::read(cfg, world, world > 1);
    trainer::RunPlan run = trainer::RunPlan::from(pc);
    const std::optional<model::ModelConfig> critic_cfg =
        run.critic ? config_at("critic.model.path") : std::nullopt;
    const std::optional<model::ModelConfig> rm_cfg =
        run.reward_model ? config_at("reward_model.model.path") : std::nullopt;
    plan = run.estimate_memory(pc, *mc, critic_cfg, rm_cfg, gpu);
    in = *run.memory_inputs;
  } catch (const std::exception& e) {
    r.fail(name, message_of(e), "fix the key it names");
    return;
  }
  // "peak 28.5 GiB in gen of 140.4 GiB: gen 28.5 GiB (KV cache 1.6 GiB), ref 26.1 GiB, the
  // other phases 26.1 GiB (actor 22.4 GiB with activations of 12.4 GiB, reference 4.8 GiB)"
  const trainer::PhaseMemory& peak = plan.peak();
  std::string phases =
      fmt::format("gen {} (KV cache {})", size_of(plan.phases[0].bytes), size_of(plan.kv_cache));
  for (const trainer::PhaseMemory& p : plan.phases)
    if (p.phase != "gen" && p.bytes != plan.resident)
      phases += fmt::format(", {} {}", p.phase, size_of(p.bytes));
  std::string models;
  for (const trainer::ModelMemory& mm : plan.models)
    models += fmt::format("{}{} {} with activations of {}", models.empty() ? "" : ", ", mm.role,
                          size_of(mm.resident()), size_of(mm.arena));
  phases += fmt::format(", the other phases {} ({})", size_of(plan.resident), models);
  if (plan.host_pinned() > 0)
    phases += fmt::format("; {} in pinned host memory", size_of(plan.host_pinned()));
  const std::string rc =
      recompute ? "recompute on (one more forward per layer in backward, for less update memory)"
                : "recompute off (every layer's activations kept through backward)";
  // Data parallel: the figures are one rank's, with the actor's ZeRO shard (RunPlan's layout).
  std::string layout;
  if (in.actor.dp > 1) {
    layout =
        fmt::format(" per rank (dp {}, actor_rollout_ref.actor.zero_stage={}{})", in.actor.dp,
                    in.actor.zero_stage,
                    in.actor.zero_stage >= 3 ? ", planned as 2: ZeRO-3 is refused on the GPU" : "");
  }
  const std::string found = fmt::format("estimated peak{} {} in {} of {}: {}; {}", layout,
                                        size_of(peak.bytes), peak.phase, size_of(gpu), phases, rc);

  const int64_t sequences = in.rollout.sequences;
  if (peak.bytes > gpu) {
    r.fail(name, found + ": more than the GPU", memory_advice(in, plan, gpu));
    return;
  }
  if (!plan.kv_budget || *plan.kv_budget < plan.kv_block_bytes) {
    r.fail(
        name,
        fmt::format(
            "{}: gpu_memory_utilization={} x {} is under the {} in use when the KV cache is built: "
            "generation cannot start",
            found, util, size_of(gpu), size_of(plan.resident + plan.runner_scratch)),
        memory_advice(in, plan, gpu));
    return;
  }
  if (plan.sequences_at_once < sequences) {
    r.warn(
        name,
        fmt::format("{}: the KV cache holds {} of the {} sequences of a step ({} tokens each), so "
                    "generation runs in waves",
                    found, plan.sequences_at_once, sequences, in.rollout.sequence_tokens),
        memory_advice(in, plan, gpu));
    return;
  }
  r.pass(name, fmt::format("{}: the KV cache holds all {} sequences of a step", found, sequences));
}

}  // namespace

void check_config(Report& r, const config::Config& cfg, const std::string& source,
                  const Machine& m) {
  r.pass("config", source);
  const bool on_cuda = check_device(r, cfg, m);
  int64_t params = 0;
  const auto mc = check_model(r, cfg, &params);
  check_tokenizer(r, cfg, mc);
  check_sequence_length(r, cfg, mc);
  const DataFiles train =
      check_files(r, "data.train_files", cfg.get<std::vector<std::string>>("data.train_files"));
  if (auto val = cfg.get<std::optional<std::vector<std::string>>>("data.val_files"))
    check_files(r, "data.val_files", *val);
  const RunLength len = train.ok ? check_run_length(r, cfg, train.rows) : RunLength{};
  check_save_freq(r, cfg, len);
  check_logging_steps(r, cfg, len);
  check_loader_threads(r, cfg, m);
  check_attention(r, cfg, on_cuda);
  check_hybrid_engine(r, cfg);
  check_overlap(r, cfg);
  check_dynamic_batching(r, cfg);
  check_reward_model(r, cfg, m, on_cuda);
  check_reward_input(r, cfg);
  check_gpu_memory(r, cfg, m, on_cuda, mc);
}

}  // namespace verl::cli::doctor
