#include "trainer/checkpoint.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string_view>

#include "core/error.h"
#include "core/fault.h"
#include "core/file.h"
#include "core/json_depth.h"
#include "core/log.h"
#include "model/hf_files.h"
#include "model/safetensors.h"
#include "trainer/rank_files.h"

namespace verl::trainer {
namespace fs = std::filesystem;
namespace {

void write_text_atomic(const fs::path& path, const std::string& text) {
  fs::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    VERL_CHECK(f.good(), "cannot write {}: {}", tmp.string(), std::strerror(errno));
    f << text;
    f.flush();
    VERL_CHECK(f.good(), "error writing {}: {}", tmp.string(), std::strerror(errno));
  }
  fs::rename(tmp, path);
}

// Files each rank writes for itself: <stem>_world_size_<W>_rank_<r>.safetensors (optimizer shards
// "optim", LightweightSync carries "sync_carry").
std::string rank_file_name(std::string_view stem, int64_t world, int64_t rank) {
  return fmt::format("{}_world_size_{}_rank_{}.safetensors", stem, world, rank);
}
std::string shard_file_name(int64_t world, int64_t rank) {
  return rank_file_name("optim", world, rank);
}

// The metadata "format" of each file kind: written by the savers, checked by the loaders.
constexpr const char* kOptimFormat = "verl.cpp-adamw";
constexpr const char* kOptimShardFormat = "verl.cpp-adamw-shard";
constexpr const char* kCarryFormat = "verl.cpp-sync-carry";

// A step number as the trainer writes it (global_step_<N>, the tracker file): decimal digits, at
// most 18 of them so that any value fits int64; nullopt for anything else.
std::optional<int64_t> parse_step(std::string_view text) {
  const bool digits =
      !text.empty() && text.size() <= 18 &&
      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits) return std::nullopt;
  return std::stoll(std::string(text));
}

// The world size W of the <stem>_world_size_W_rank_R files in `dir` (-1: none); files of two world
// sizes are an error naming `what`.
int64_t saved_world_size(const fs::path& dir, std::string_view stem, std::string_view what) {
  const std::regex re(fmt::format("{}_world_size_([0-9]+)_rank_([0-9]+)\\.safetensors", stem));
  int64_t world = -1;
  if (!fs::exists(dir)) return world;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::smatch mt;
    const std::string name = e.path().filename().string();
    if (!std::regex_match(name, mt, re)) continue;
    const int64_t w = std::stoll(mt[1]);
    VERL_CHECK(world < 0 || world == w, "{}: {} of world sizes {} and {}; keep one set",
               dir.string(), what, world, w);
    world = w;
  }
  return world;
}

// Rank 0: the HF export, and the whole moments unless the state is sharded.
void save_model(const fs::path& dir, const ModelState& s, const std::string& tokenizer_dir) {
  if (s.lora) {  // the adapters and their moments only (the base is the run's model path)
    s.lora->save((dir / kLoraAdapterDir).string(), s.lora_base);
    if (!s.shard && s.optimizer) save_optimizer_state(dir.string(), *s.opt, s.lora->layout.total);
    return;
  }
  s.weights->save((dir / "huggingface").string());
  if (!tokenizer_dir.empty())
    model::copy_tokenizer_files(tokenizer_dir, (dir / "huggingface").string());
  if (s.shard || !s.optimizer) return;  // every rank writes its slice (save_shard), or none is kept
  save_optimizer_state(dir.string(), *s.opt, s.weights->layout.total);
}

// Every rank of a sharded state: its slice [begin, end) of the moments and where it lies.
void save_shard(const fs::path& dir, const ModelState& s, int64_t numel, int64_t world,
                int64_t rank) {
  const optim::ShardSpec& sh = *s.shard;
  const AdamWState& opt = *s.opt;
  VERL_CHECK(static_cast<int64_t>(opt.exp_avg.size()) == sh.size() &&
                 static_cast<int64_t>(opt.exp_avg_sq.size()) == sh.size(),
             "{}: rank {}'s optimizer moments of {} and {} floats for a shard of {}", dir.string(),
             rank, opt.exp_avg.size(), opt.exp_avg_sq.size(), sh.size());
  fs::create_directories(dir);
  model::write_safetensors((dir / shard_file_name(world, rank)).string(),
                           {{"exp_avg", DType::F32, {sh.size()}, opt.exp_avg.data()},
                            {"exp_avg_sq", DType::F32, {sh.size()}, opt.exp_avg_sq.data()}},
                           {{"format", kOptimShardFormat},
                            {"step", std::to_string(opt.step)},
                            {"begin", std::to_string(sh.begin)},
                            {"end", std::to_string(sh.end)},
                            {"numel", std::to_string(numel)}});
}

std::string carry_file_name(int64_t world, int64_t rank) {
  return rank_file_name("sync_carry", world, rank);
}

void save_carry(const fs::path& dir, const ModelState& s, int64_t world, int64_t rank) {
  fs::create_directories(dir);
  model::write_safetensors(
      (dir / carry_file_name(world, rank)).string(),
      {{"carry", DType::F32, {static_cast<int64_t>(s.carry->size())}, s.carry->data()}},
      {{"format", kCarryFormat}, {"sync_calls", std::to_string(s.sync_calls)}});
}

int64_t metadata_int(const model::SafetensorsFile& f, const char* key) {
  auto it = f.metadata().find(key);
  VERL_CHECK(it != f.metadata().end(), "{}: no '{}' in the metadata", f.path(), key);
  try {
    return std::stoll(it->second);
  } catch (const std::exception&) {
    VERL_FAIL("{}: metadata '{}' is '{}', expected a number", f.path(), key, it->second);
  }
}

// The file is the kind the loader expects (its metadata "format", written by the savers above).
void check_format(const model::SafetensorsFile& f, const char* want) {
  auto it = f.metadata().find("format");
  VERL_CHECK(
      it != f.metadata().end() && it->second == want,
      "{}: metadata 'format' is {}, expected '{}'; the file is damaged or not this checkpoint's",
      f.path(), it == f.metadata().end() ? "missing" : "'" + it->second + "'", want);
}

// Copies elements [lo, hi) of tensor `name` (holding elements from `first`) into out[lo - base ..].
void copy_moments(const model::SafetensorsFile& f, int64_t first, int64_t count, int64_t lo,
                  int64_t hi, AdamWState& out, int64_t base) {
  for (auto [name, buf] :
       {std::pair{"exp_avg", &out.exp_avg}, std::pair{"exp_avg_sq", &out.exp_avg_sq}}) {
    const model::TensorInfo* t = f.find(name);
    VERL_CHECK(t && t->dtype == DType::F32 && t->numel() == count,
               "{}: tensor {} missing or of the wrong size (want {} f32)", f.path(), name, count);
    std::memcpy(buf->data() + (lo - base),
                reinterpret_cast<const float*>(f.data(*t)) + (lo - first),
                static_cast<size_t>(hi - lo) * sizeof(float));
  }
}

// The moments of elements [want.begin, want.end) from the whole file or from the shards of any
// world size (resharding on load).
void load_moments(const fs::path& dir, int64_t n, const optim::ShardSpec& want, AdamWState& opt) {
  opt.exp_avg.assign(static_cast<size_t>(want.size()), 0.0f);
  opt.exp_avg_sq.assign(static_cast<size_t>(want.size()), 0.0f);
  if (fs::exists(dir / "optim.safetensors")) {
    auto st = model::SafetensorsFile::open((dir / "optim.safetensors").string());
    check_format(*st, kOptimFormat);
    copy_moments(*st, 0, n, want.begin, want.end, opt, want.begin);
    opt.step = metadata_int(*st, "step");
    return;
  }
  // Shards: optim_world_size_<W>_rank_<r>.safetensors for r = 0 .. W-1, together covering [0, n).
  const int64_t world = saved_world_size(dir, "optim", "optimizer shards");
  VERL_CHECK(
      world > 0,
      "{}: neither optim.safetensors nor optimizer shards (optim_world_size_W_rank_R.safetensors): "
      "saved without \"optimizer\" in checkpoint.save_contents, or incomplete. Leave optimizer out "
      "of "
      "checkpoint.load_contents to resume with fresh AdamW moments, resume from another "
      "checkpoint, or set "
      "trainer.resume_mode=disable",
      dir.string());
  int64_t covered = 0, step = -1;
  for (int64_t r = 0; r < world; ++r) {
    const fs::path path = dir / shard_file_name(world, r);
    VERL_CHECK(fs::exists(path), "{}: shard {} of {} is missing; the checkpoint is incomplete",
               path.string(), r, world);
    auto st = model::SafetensorsFile::open(path.string());
    check_format(*st, kOptimShardFormat);
    const int64_t b = metadata_int(*st, "begin"), e = metadata_int(*st, "end"),
                  total = metadata_int(*st, "numel");
    VERL_CHECK(total == n && 0 <= b && b <= e && e <= n,
               "{}: a shard [{}, {}) of {} elements for a model of {}", path.string(), b, e, total,
               n);
    const int64_t s = metadata_int(*st, "step");
    VERL_CHECK(step < 0 || step == s, "{}: optimizer step {} but the other shards have {}",
               path.string(), s, step);
    step = s;
    covered += e - b;
    const int64_t lo = std::max(b, want.begin), hi = std::min(e, want.end);
    if (lo < hi) copy_moments(*st, b, e - b, lo, hi, opt, want.begin);
  }
  VERL_CHECK(covered == n, "{}: the {} optimizer shards hold {} of {} elements", dir.string(),
             world, covered, n);
  opt.step = step;
}

// A LoRA checkpoint's adapters (PEFT names) in the order of `w`'s adapter layout.
void load_adapters(const fs::path& dir, model::Weights& w) {
  const fs::path st_path = dir / kLoraAdapterDir / "adapter_model.safetensors";
  std::unique_ptr<model::SafetensorsFile> st = model::SafetensorsFile::open(st_path.string());
  w.data.assign(static_cast<size_t>(w.layout.total), 0.0f);
  for (const model::ParamInfo& p : w.layout.params) {
    const model::TensorInfo* t = st->find(p.name);
    VERL_CHECK(t != nullptr && t->shape == p.shape,
               "{}: {} tensor '{}' of the configured adapters; resume with the LoRA settings the "
               "run was saved with",
               st_path.string(), t ? "a differently shaped" : "no", p.name);
    convert_to_f32(w.data.data() + p.offset, st->data(*t), t->dtype, static_cast<size_t>(p.numel));
  }
}

void load_model(const fs::path& dir, model::Weights& w, AdamWState& opt,
                const optim::ShardSpec* shard, bool load_optimizer) {
  // A LoRA run's layout is its adapters' (no config); the checkpoint must hold adapters and only
  // then.
  const bool want_lora = w.config.hidden_size == 0,
             has_lora = fs::exists(dir / kLoraAdapterDir / "adapter_config.json");
  VERL_CHECK(want_lora == has_lora,
             "{}: the checkpoint holds {} but the run trains {}; resume with the same "
             "actor_rollout_ref.model.lora_rank, or set trainer.resume_mode=disable",
             dir.string(), has_lora ? "LoRA adapters" : "the whole model",
             want_lora ? "LoRA adapters" : "the whole model");
  if (want_lora) {
    load_adapters(dir, w);
    const optim::ShardSpec want = shard ? *shard : optim::ShardSpec{0, w.layout.total};
    if (load_optimizer)
      load_moments(dir, w.layout.total, want, opt);
    else
      opt = fresh_optimizer_state(want.size());
    return;
  }
  model::Weights loaded = dir.filename() == "critic"
                              ? model::Weights::load_as_critic((dir / "huggingface").string())
                              : model::Weights::load((dir / "huggingface").string());
  const int64_t n = w.layout.total;
  VERL_CHECK(static_cast<int64_t>(loaded.data.size()) == n,
             "{}: the checkpoint's model has {} parameters but the configured one has {}; resume "
             "with the same "
             "model, or set trainer.resume_mode=disable",
             dir.string(), loaded.data.size(), n);
  w.data = std::move(loaded.data);
  const optim::ShardSpec want = shard ? *shard : optim::ShardSpec{0, n};
  if (load_optimizer)
    load_moments(dir, n, want, opt);
  else
    opt = fresh_optimizer_state(want.size());
}

std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> out;
  if (!fs::exists(root)) return out;
  static const std::regex re("global_step_([0-9]+)");
  for (const auto& e : fs::directory_iterator(root)) {
    std::smatch mt;
    std::string name = e.path().filename().string();
    // A step past int64 (a stray directory name) is not a checkpoint of this run: named, not a
    // crash.
    if (e.is_directory() && std::regex_match(name, mt, re)) {
      const std::optional<int64_t> step = parse_step(mt[1].str());
      VERL_CHECK(step.has_value(),
                 "{}: not a checkpoint step this trainer writes (too large); rename or "
                 "remove it",
                 e.path().string());
      out.emplace_back(*step, e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The files save_shard and save_carry write for `rank`, relative to the checkpoint directory.
std::vector<std::string> rank_files(const ModelState& actor,
                                    const std::optional<ModelState>& critic, int64_t world,
                                    int64_t rank) {
  std::vector<std::string> out;
  if (actor.shard && actor.optimizer) out.push_back("actor/" + shard_file_name(world, rank));
  if (critic && critic->shard && critic->optimizer)
    out.push_back("critic/" + shard_file_name(world, rank));
  if (actor.carry) out.push_back("actor/" + carry_file_name(world, rank));
  if (critic && critic->carry) out.push_back("critic/" + carry_file_name(world, rank));
  return out;
}

std::string write_checkpoint(const std::string& root, int64_t step, const fs::path& tmp,
                             const ModelState& actor, const std::optional<ModelState>& critic,
                             const nlohmann::json& trainer_state, const std::string& tokenizer_dir,
                             int64_t keep, dist::Communicator& c, int64_t keep_critic) {
  const bool lead = c.rank() == 0;
  if (lead) {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  }
  // The shards go into the directory rank 0 made; every rank writes its own at once.
  const bool sharded =
      actor.shard || (critic && critic->shard) || actor.carry || (critic && critic->carry);
  if (sharded) c.barrier();
  if (actor.shard && actor.optimizer)
    save_shard(tmp / "actor", actor, actor.shard_numel, c.world_size(), c.rank());
  if (critic && critic->shard && critic->optimizer)
    save_shard(tmp / "critic", *critic, critic->shard_numel, c.world_size(), c.rank());
  if (actor.carry) save_carry(tmp / "actor", actor, c.world_size(), c.rank());
  if (critic && critic->carry) save_carry(tmp / "critic", *critic, c.world_size(), c.rank());
  if (lead) {
    save_model(tmp / "actor", actor, tokenizer_dir);
    if (critic) save_model(tmp / "critic", *critic, "");
  }
  // Every shard is on disk, and in the directory rank 0 renames, before rank 0 publishes.
  if (sharded) verify_rank_files(c, tmp, step, rank_files(actor, critic, c.world_size(), c.rank()));
  if (!lead) return "";
  fault_point("save", step);  // tests kill the process here: half a checkpoint on disk
  std::string dir = publish_checkpoint(root, step, tmp.string(), trainer_state, keep);
  if (keep_critic > 0) {
    auto all = list_checkpoints(root);
    std::erase_if(all, [&](const auto& c) { return c.first == step; });
    for (size_t i = 0; i + static_cast<size_t>(keep_critic) - 1 < all.size(); ++i)
      fs::remove_all(all[i].second / "critic");
  }
  return dir;
}

}  // namespace

std::string save_checkpoint(const std::string& root, int64_t step, const ModelState& actor,
                            const std::optional<ModelState>& critic,
                            const nlohmann::json& trainer_state, const std::string& tokenizer_dir,
                            int64_t keep, dist::Communicator* comm, int64_t keep_critic) {
  dist::SingleProcess alone;
  dist::Communicator& c = comm ? *comm : alone;
  const fs::path tmp = fs::path(root) / fmt::format(".tmp_global_step_{}", step);
  try {
    return write_checkpoint(root, step, tmp, actor, critic, trainer_state, tokenizer_dir, keep, c,
                            keep_critic);
  } catch (const std::exception& e) {
    fail_checkpoint_save(root, step, tmp.string(), e.what(), "trainer.max_actor_ckpt_to_keep",
                         c.rank());
  }
}

void save_optimizer_state(const std::string& dir, const AdamWState& opt, int64_t numel) {
  // The moments share the parameters' flat layout: two 1-D tensors plus the step count.
  VERL_CHECK(static_cast<int64_t>(opt.exp_avg.size()) == numel &&
                 static_cast<int64_t>(opt.exp_avg_sq.size()) == numel,
             "{}: optimizer moments of {} and {} floats for a model of {} parameters", dir,
             opt.exp_avg.size(), opt.exp_avg_sq.size(), numel);
  model::write_safetensors((fs::path(dir) / "optim.safetensors").string(),
                           {{"exp_avg", DType::F32, {numel}, opt.exp_avg.data()},
                            {"exp_avg_sq", DType::F32, {numel}, opt.exp_avg_sq.data()}},
                           {{"format", kOptimFormat}, {"step", std::to_string(opt.step)}});
}

AdamWState load_optimizer_state(const std::string& dir, int64_t numel) {
  AdamWState opt;
  load_moments(dir, numel, optim::ShardSpec{0, numel}, opt);
  return opt;
}

AdamWState fresh_optimizer_state(int64_t numel) {
  AdamWState opt;
  opt.exp_avg.assign(static_cast<size_t>(numel), 0.0f);
  opt.exp_avg_sq.assign(static_cast<size_t>(numel), 0.0f);
  return opt;
}

CheckpointContents parse_checkpoint_contents(const std::vector<std::string>& list,
                                             const std::string& key) {
  CheckpointContents c;
  c.optimizer = false;
  bool model = false;
  for (const std::string& part : list) {
    VERL_CHECK(part == "model" || part == "optimizer" || part == "extra" || part == "hf_model",
               "{}: unknown part '{}' (model, optimizer, extra, hf_model)", key, part);
    model = model || part == "model" || part == "hf_model";
    c.optimizer = c.optimizer || part == "optimizer";
  }
  VERL_CHECK(model,
             "{}: a verl.cpp checkpoint is its model (an HF directory); include model or hf_model",
             key);
  return c;
}

std::string publish_checkpoint(const std::string& root, int64_t step, const std::string& tmp,
                               const nlohmann::json& trainer_state, int64_t keep) {
  const fs::path final_dir = fs::path(root) / fmt::format("global_step_{}", step);
  nlohmann::json st = trainer_state;
  st["version"] = kCheckpointVersion;
  st["global_step"] = step;
  write_text_atomic(fs::path(tmp) / "trainer_state.json", st.dump(2));
  // Publish: a complete directory appears under its final name in one rename.
  fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);
  write_text_atomic(fs::path(root) / "latest_checkpointed_iteration.txt", std::to_string(step));
  if (keep > 0) {
    // The checkpoint just written always stays (the tracker names it), even when older runs left
    // higher steps here; of the others, the newest keep - 1 stay.
    auto all = list_checkpoints(root);
    std::erase_if(all, [&](const auto& c) { return c.first == step; });
    for (size_t i = 0; i + static_cast<size_t>(keep) - 1 < all.size(); ++i)
      fs::remove_all(all[i].second);
  }
  return final_dir.string();
}

void fail_checkpoint_save(const std::string& root, int64_t step, const std::string& tmp,
                          const std::string& cause, std::string_view keep_key, int rank) {
  // A full disk or a vanished directory: the partial files go (they would only hold the space a
  // retry needs), and the message says what is still there to resume from. A rank other than 0
  // only reports: rank 0 owns the directory.
  std::string latest;
  const bool lead = rank == 0;
  if (lead) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    try {
      latest = find_latest_checkpoint(root);
    } catch (const std::exception&) {
    }
  }
  const bool full = cause.find(std::strerror(ENOSPC)) != std::string::npos;
  VERL_FAIL("the checkpoint of step {} was not written: {}\n  {}{}", step, cause,
            !lead ? fmt::format("rank {} failed; rank 0 removes the partial files", rank)
            : latest.empty()
                ? std::string("its partial files are removed; no earlier checkpoint is complete")
                : fmt::format("its partial files are removed; the last complete checkpoint is {} "
                              "(trainer.resume_mode=auto continues from it)",
                              latest),
            full ? fmt::format("; free space in {}, or keep fewer ({})", root, keep_key) : "");
}

nlohmann::json read_trainer_state(const std::string& dir) {
  const fs::path path = fs::path(dir) / "trainer_state.json";
  VERL_CHECK(fs::exists(path), "{}: no trainer_state.json; not a verl.cpp checkpoint", dir);
  const std::string text = read_file(path.string(), "trainer state");
  check_json_depth(text, path.string());
  nlohmann::json st;
  try {
    st = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    VERL_FAIL("{}: not valid JSON: {}", path.string(), e.what());
  }
  VERL_CHECK(st.is_object(), "{}: expected a JSON object", path.string());
  VERL_CHECK(st.value("version", -1) == kCheckpointVersion,
             "{}: checkpoint version {} but this build reads version {}", path.string(),
             st.value("version", -1), kCheckpointVersion);
  return st;
}

std::string find_latest_checkpoint(const std::string& root) {
  const fs::path tracker = fs::path(root) / "latest_checkpointed_iteration.txt";
  if (!fs::exists(tracker)) return "";
  std::ifstream f(tracker);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  const std::optional<int64_t> parsed = parse_step(text);
  VERL_CHECK(parsed.has_value(),
             "{} should hold a step number but holds '{}'; fix or delete it (the checkpoints "
             "are the global_step_N directories beside it)",
             tracker.string(), text.substr(0, 40));
  const int64_t step = *parsed;
  const fs::path dir = fs::path(root) / fmt::format("global_step_{}", step);
  VERL_CHECK(fs::exists(dir / "trainer_state.json"),
             "{} names step {} but {} is missing or incomplete", tracker.string(), step,
             dir.string());
  return dir.string();
}

std::string resume_checkpoint_dir(const std::string& mode, const std::string& root,
                                  const std::optional<std::string>& from, bool warn) {
  if (from && mode != "resume_path" && warn)
    log::warn(
        "trainer.resume_from_path is set but trainer.resume_mode is {}: the path is used with "
        "resume_path only",
        mode);
  if (mode == "auto") return find_latest_checkpoint(root);
  if (mode == "resume_path") {
    VERL_CHECK(from.has_value() && !from->empty(),
               "trainer.resume_mode=resume_path needs trainer.resume_from_path");
    return *from;
  }
  VERL_CHECK(mode == "disable",
             "trainer.resume_mode must be auto, disable or resume_path, got '{}'", mode);
  check_fresh_run_dir(root);
  return "";
}

void check_fresh_run_dir(const std::string& root) {
  const auto all = list_checkpoints(root);
  if (all.empty()) return;
  std::string steps;
  for (const auto& c : all) steps += (steps.empty() ? "" : ", ") + std::to_string(c.first);
  VERL_FAIL(
      "trainer.resume_mode=disable starts a fresh run, but {} already holds checkpoints (steps "
      "{}): the new "
      "run's checkpoints would mix with them and the tracker would move between runs. Set "
      "trainer.resume_mode=auto to continue from step {}, or give trainer.default_local_dir a new "
      "directory",
      root, steps, all.back().first);
}

std::optional<SyncCarry> load_sync_carry(const std::string& model_dir, int64_t numel, int world,
                                         int rank) {
  const fs::path dir(model_dir);
  const int64_t saved = saved_world_size(dir, "sync_carry", "LightweightSync carries");
  if (saved < 0) return std::nullopt;
  auto read = [&](int64_t r, SyncCarry& out, bool add) {
    const fs::path path = dir / carry_file_name(saved, r);
    VERL_CHECK(fs::exists(path), "{}: carry {} of {} is missing; the checkpoint is incomplete",
               path.string(), r, saved);
    auto st = model::SafetensorsFile::open(path.string());
    check_format(*st, kCarryFormat);
    const model::TensorInfo* t = st->find("carry");
    VERL_CHECK(
        t && t->dtype == DType::F32 && t->numel() == numel,
        "{}: tensor carry missing or of the wrong size (want {} f32 for the model's parameters)",
        path.string(), numel);
    const auto* src = reinterpret_cast<const float*>(st->data(*t));
    if (!add)
      out.carry.assign(src, src + numel);
    else
      for (int64_t i = 0; i < numel; ++i) out.carry[i] += src[i];
    out.sync_calls = metadata_int(*st, "sync_calls");
  };
  SyncCarry out;
  if (saved == world) {
    read(rank, out, false);
    return out;
  }
  for (int64_t r = 0; r < saved; ++r) read(r, out, r > 0);
  for (float& x : out.carry) x /= static_cast<float>(saved);
  return out;
}

nlohmann::json lora_checkpoint_meta(int64_t rank, const std::string& base_path,
                                    const model::Weights& base) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the sampled values' bits
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(static_cast<uint64_t>(base.data.size()));
  for (size_t i = 0; i < base.data.size(); i += 4099) {
    uint32_t bits;
    std::memcpy(&bits, &base.data[i], sizeof bits);
    mix(bits);
  }
  return {{"rank", rank}, {"base_model", base_path}, {"base_digest", fmt::format("{:016x}", h)}};
}

void check_lora_resume(const std::string& dir, const nlohmann::json& meta) {
  const nlohmann::json st = read_trainer_state(dir);
  const int64_t saved_rank = st.contains("lora") ? st["lora"].value("rank", int64_t{0}) : 0;
  if (meta.is_null()) {
    VERL_CHECK(saved_rank == 0,
               "{}: a LoRA checkpoint (rank {}); resume with actor_rollout_ref.model.lora_rank={} "
               "or set trainer.resume_mode=disable",
               dir, saved_rank, saved_rank);
    return;
  }
  const int64_t rank = meta["rank"].get<int64_t>();
  VERL_CHECK(saved_rank > 0,
             "{}: a full fine-tuning checkpoint, but this run trains LoRA adapters "
             "(actor_rollout_ref.model.lora_rank={}); resume with lora_rank=0 or set "
             "trainer.resume_mode=disable",
             dir, rank);
  VERL_CHECK(saved_rank == rank,
             "{}: the checkpoint's LoRA adapters have rank {}, this run's "
             "actor_rollout_ref.model.lora_rank is {}; resume with the same rank or set "
             "trainer.resume_mode=disable",
             dir, saved_rank, rank);
  const nlohmann::json& saved = st["lora"];
  VERL_CHECK(saved.value("base_digest", "") == meta["base_digest"].get<std::string>(),
             "{}: the checkpoint's LoRA adapters were trained on the base model {} (weights digest "
             "{}), this run's actor_rollout_ref.model.path is {} (digest {}); resume on the same "
             "base model or set trainer.resume_mode=disable",
             dir, saved.value("base_model", "?"), saved.value("base_digest", "?"),
             meta["base_model"].get<std::string>(), meta["base_digest"].get<std::string>());
}

nlohmann::json load_checkpoint(const std::string& dir, model::Weights& actor, AdamWState& actor_opt,
                               model::Weights* critic, AdamWState* critic_opt,
                               const optim::ShardSpec* actor_shard,
                               const optim::ShardSpec* critic_shard, CheckpointContents actor_load,
                               CheckpointContents critic_load) {
  const fs::path d(dir);
  nlohmann::json st = read_trainer_state(dir);
  VERL_CHECK(st.value("trainer", "") != "sft",
             "{}: a `verl sft` checkpoint; `verl train` resumes from its own checkpoints (start "
             "from the SFT model "
             "with actor_rollout_ref.model.path={})",
             dir, dir);
  load_model(d / "actor", actor, actor_opt, actor_shard, actor_load.optimizer);
  if (critic) {
    VERL_CHECK(fs::exists(d / "critic"), "{}: the run uses a critic but the checkpoint has none",
               dir);
    load_model(d / "critic", *critic, *critic_opt, critic_shard, critic_load.optimizer);
  }
  return st;
}

}  // namespace verl::trainer
