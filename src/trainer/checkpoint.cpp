#include "trainer/checkpoint.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>

#include "core/error.h"
#include "core/fault.h"
#include "core/log.h"
#include "model/hf_files.h"
#include "model/safetensors.h"

namespace verl::trainer {
namespace fs = std::filesystem;
namespace {

void write_text_atomic(const fs::path& path, const std::string& text) {
  fs::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    VERL_CHECK(f.good(), "cannot write {}", tmp.string());
    f << text;
    f.flush();
    VERL_CHECK(f.good(), "error writing {}", tmp.string());
  }
  fs::rename(tmp, path);
}

void save_model(const fs::path& dir, const ModelState& s, const std::string& tokenizer_dir) {
  s.weights->save((dir / "huggingface").string());
  if (!tokenizer_dir.empty()) model::copy_tokenizer_files(tokenizer_dir, (dir / "huggingface").string());
  // The moments share the parameters' flat layout: two 1-D tensors plus the step count.
  const int64_t n = s.weights->layout.total;
  const AdamWState& opt = *s.opt;
  VERL_CHECK(static_cast<int64_t>(opt.exp_avg.size()) == n && static_cast<int64_t>(opt.exp_avg_sq.size()) == n,
             "{}: optimizer moments of {} and {} floats for a model of {} parameters", dir.string(),
             opt.exp_avg.size(), opt.exp_avg_sq.size(), n);
  model::write_safetensors((dir / "optim.safetensors").string(),
                           {{"exp_avg", DType::F32, {n}, opt.exp_avg.data()},
                            {"exp_avg_sq", DType::F32, {n}, opt.exp_avg_sq.data()}},
                           {{"format", "verl.cpp-adamw"}, {"step", std::to_string(opt.step)}});
}

void load_model(const fs::path& dir, model::Weights& w, AdamWState& opt) {
  model::Weights loaded = dir.filename() == "critic" ? model::Weights::load_as_critic((dir / "huggingface").string())
                                                     : model::Weights::load((dir / "huggingface").string());
  const size_t n = static_cast<size_t>(w.layout.total);
  VERL_CHECK(loaded.data.size() == n,
             "{}: the checkpoint's model has {} parameters but the configured one has {}; resume with the same "
             "model, or set trainer.resume_mode=disable", dir.string(), loaded.data.size(), n);
  w.data = std::move(loaded.data);
  opt.exp_avg.resize(n);
  opt.exp_avg_sq.resize(n);
  auto st = model::SafetensorsFile::open((dir / "optim.safetensors").string());
  for (auto [name, buf] : {std::pair{"exp_avg", &opt.exp_avg}, std::pair{"exp_avg_sq", &opt.exp_avg_sq}}) {
    const model::TensorInfo* t = st->find(name);
    VERL_CHECK(t && t->dtype == DType::F32 && t->numel() == static_cast<int64_t>(buf->size()),
               "{}/optim.safetensors: tensor {} missing or of the wrong size", dir.string(), name);
    std::memcpy(buf->data(), st->data(*t), buf->size() * sizeof(float));
  }
  auto it = st->metadata().find("step");
  VERL_CHECK(it != st->metadata().end(), "{}/optim.safetensors: no optimizer step in the metadata", dir.string());
  opt.step = std::stoll(it->second);
}

std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> out;
  if (!fs::exists(root)) return out;
  static const std::regex re("global_step_([0-9]+)");
  for (const auto& e : fs::directory_iterator(root)) {
    std::smatch mt;
    std::string name = e.path().filename().string();
    if (e.is_directory() && std::regex_match(name, mt, re)) out.emplace_back(std::stoll(mt[1]), e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::string save_checkpoint(const std::string& root, int64_t step, const ModelState& actor,
                            const std::optional<ModelState>& critic, const nlohmann::json& trainer_state,
                            const std::string& tokenizer_dir, int64_t keep) {
  const fs::path final_dir = fs::path(root) / fmt::format("global_step_{}", step);
  const fs::path tmp = fs::path(root) / fmt::format(".tmp_global_step_{}", step);
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  save_model(tmp / "actor", actor, tokenizer_dir);
  if (critic) save_model(tmp / "critic", *critic, "");
  fault_point("save", step);  // tests kill the process here: half a checkpoint on disk
  nlohmann::json st = trainer_state;
  st["version"] = kCheckpointVersion;
  st["global_step"] = step;
  write_text_atomic(tmp / "trainer_state.json", st.dump(2));
  // Publish: a complete directory appears under its final name in one rename.
  fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);
  write_text_atomic(fs::path(root) / "latest_checkpointed_iteration.txt", std::to_string(step));
  if (keep > 0) {
    // The checkpoint just written always stays (the tracker names it), even when older runs left
    // higher steps here; of the others, the newest keep - 1 stay.
    auto all = list_checkpoints(root);
    std::erase_if(all, [&](const auto& c) { return c.first == step; });
    for (size_t i = 0; i + static_cast<size_t>(keep) - 1 < all.size(); ++i) fs::remove_all(all[i].second);
  }
  return final_dir.string();
}

std::string find_latest_checkpoint(const std::string& root) {
  const fs::path tracker = fs::path(root) / "latest_checkpointed_iteration.txt";
  if (!fs::exists(tracker)) return "";
  std::ifstream f(tracker);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  const bool is_step = !text.empty() && text.size() <= 18 &&
                       std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  VERL_CHECK(is_step, "{} should hold a step number but holds '{}'; fix or delete it (the checkpoints are the "
             "global_step_N directories beside it)", tracker.string(), text.substr(0, 40));
  const int64_t step = std::stoll(text);
  const fs::path dir = fs::path(root) / fmt::format("global_step_{}", step);
  VERL_CHECK(fs::exists(dir / "trainer_state.json"), "{} names step {} but {} is missing or incomplete",
             tracker.string(), step, dir.string());
  return dir.string();
}

void check_fresh_run_dir(const std::string& root) {
  const auto all = list_checkpoints(root);
  if (all.empty()) return;
  std::string steps;
  for (const auto& c : all) steps += (steps.empty() ? "" : ", ") + std::to_string(c.first);
  VERL_FAIL("trainer.resume_mode=disable starts a fresh run, but {} already holds checkpoints (steps {}): the new "
            "run's checkpoints would mix with them and the tracker would move between runs. Set "
            "trainer.resume_mode=auto to continue from step {}, or give trainer.default_local_dir a new directory",
            root, steps, all.back().first);
}

nlohmann::json load_checkpoint(const std::string& dir, model::Weights& actor, AdamWState& actor_opt,
                               model::Weights* critic, AdamWState* critic_opt) {
  const fs::path d(dir);
  std::ifstream f(d / "trainer_state.json");
  VERL_CHECK(f.good(), "{}: no trainer_state.json; not a verl.cpp checkpoint", dir);
  nlohmann::json st;
  try {
    st = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    VERL_FAIL("{}/trainer_state.json: not valid JSON: {}", dir, e.what());
  }
  VERL_CHECK(st.value("version", -1) == kCheckpointVersion,
             "{}/trainer_state.json: checkpoint version {} but this build reads version {}", dir,
             st.value("version", -1), kCheckpointVersion);
  load_model(d / "actor", actor, actor_opt);
  if (critic) {
    VERL_CHECK(fs::exists(d / "critic"), "{}: the run uses a critic but the checkpoint has none", dir);
    load_model(d / "critic", *critic, *critic_opt);
  }
  return st;
}

}  // namespace verl::trainer
