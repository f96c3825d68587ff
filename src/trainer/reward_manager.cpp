// The reward managers (naive, dapo) over the run's scorer: rule scorers by data_source, a
// reward command, or the reward model; streaming beside generation or over the whole batch.
#include "trainer/reward_manager.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "reward/command_reward.h"
#include "reward/python_reward.h"
#include "reward/score.h"
#include "tokenizer/tokenizer.h"
#include "trainer/actor_worker.h"

namespace verl::trainer {
namespace {

// verl's DAPORewardManager: acc per sample in reward_extra/acc and, with
// reward_model.overlong_buffer.enable, the overlong penalty on the score.
class DapoRewardManager final : public RewardManager {
 public:
  using RewardManager::RewardManager;

  float reward(Experience& exp, int64_t b, double score, double acc) const override {
    RewardManager::reward(exp, b, score, acc);
    const auto& ob = cfg_.reward.overlong;
    if (!ob.enable) return static_cast<float>(score);
    // The penalty grows linearly over the last `len` tokens before max_resp_len, reaching
    // -penalty_factor there; shorter responses get 0.
    const double expected = static_cast<double>(ob.max_resp_len - ob.len);
    const double exceed = static_cast<double>(exp.response[b].size()) - expected;
    const double penalty = std::min(-exceed / static_cast<double>(ob.len) * ob.penalty_factor, 0.0);
    exp.overlong_reward[b] = static_cast<float>(penalty);
    return static_cast<float>(score + penalty);
  }

  void add_extra_metrics(const Experience& exp, metrics::Metrics& m) const override {
    RewardManager::add_extra_metrics(exp, m);
    std::vector<double> acc(exp.acc.begin(), exp.acc.end());
    if (!exp.reward_extra.contains("acc")) m.add_stats("reward_extra/acc", acc);
    if (cfg_.reward.overlong.enable && cfg_.reward.overlong.log) {
      std::vector<double> pen(exp.overlong_reward.begin(), exp.overlong_reward.end()), over;
      for (double p : pen) over.push_back(p < 0 ? 1.0 : 0.0);
      m.add_stats("reward_extra/overlong_reward", pen);
      m.add_stats("reward_extra/overlong", over);
    }
  }
};

// verl's GDPORewardManager: the naive manager, whose reward function also finds the run's
// experiment_name in extra_info.
class GdpoRewardManager final : public RewardManager {
 public:
  using RewardManager::RewardManager;

  nlohmann::json extra_info(const data::Sample& s) const override {
    nlohmann::json e = s.extra_info.is_object() ? s.extra_info : nlohmann::json::object();
    e["experiment_name"] = cfg_.trainer.experiment_name;
    return e;
  }
};

std::map<std::string, RewardManager::Factory>& registry() {
  static std::map<std::string, RewardManager::Factory> r = {
      {"naive",
       [](const PpoConfig& c, Device d, const tokenizer::Tokenizer& t) {
         return std::make_unique<RewardManager>(c, d, t);
       }},
      {"dapo",
       [](const PpoConfig& c, Device d,
          const tokenizer::Tokenizer& t) -> std::unique_ptr<RewardManager> {
         return std::make_unique<DapoRewardManager>(c, d, t);
       }},
      {"gdpo",
       [](const PpoConfig& c, Device d,
          const tokenizer::Tokenizer& t) -> std::unique_ptr<RewardManager> {
         return std::make_unique<GdpoRewardManager>(c, d, t);
       }},
  };
  return r;
}

}  // namespace

// Rows scored as generation finishes them (trainer.actor_reward_parallel): rule scores row by
// row; a reward model's in forwards of its token budget, each run as soon as finished rows fill
// it, the rest once generation ends.
class StreamingScorer final : public RowObserver {
 public:
  StreamingScorer(RewardManager& mgr, Experience& exp, metrics::StageTimer& timer)
      : mgr_(mgr), exp_(exp), timer_(timer) {
    if (mgr_.reward_model_) {
      worker_.emplace(
          [this](int64_t b) {
            const int64_t t = exp_.tokens(b);
            if (rm_tokens_ + t > mgr_.reward_model_->max_tokens()) score_rm_rows();
            rm_rows_.push_back(b);
            rm_tokens_ += t;
          },
          [this] { score_rm_rows(); });
    } else {
      worker_.emplace([this](int64_t b) {
        const double t0 = timer_.now_s();
        exp_.scores[b] = mgr_.rule_score(exp_, b);
        if (reward_start_ < 0) reward_start_ = t0;
        reward_end_ = timer_.now_s();
      });
    }
  }
  void push(int64_t b) override { worker_->push(b); }
  void finish() override {
    worker_->finish();
    if (reward_start_ >= 0) timer_.record("reward", reward_start_, reward_end_);
  }

 private:
  void score_rm_rows() {
    if (rm_rows_.empty()) return;
    const double t0 = timer_.now_s();
    mgr_.score_with_reward_model(exp_, std::exchange(rm_rows_, {}));
    rm_tokens_ = 0;
    if (reward_start_ < 0) reward_start_ = t0;
    reward_end_ = timer_.now_s();
  }

  RewardManager& mgr_;
  Experience& exp_;
  metrics::StageTimer& timer_;
  double reward_start_ = -1, reward_end_ = -1;  // the worker's alone
  std::vector<int64_t> rm_rows_;  // finished rows waiting for the reward model's next forward
  int64_t rm_tokens_ = 0;
  // Last: its destructor (an error in generation) still runs its flush, which must find the
  // state above alive.
  std::optional<RowWorker> worker_;
};

void RewardManager::register_manager(const std::string& name, Factory factory) {
  registry()[name] = std::move(factory);
}

std::unique_ptr<RewardManager> RewardManager::create(const PpoConfig& cfg, Device device,
                                                     const tokenizer::Tokenizer& tok) {
  auto& r = registry();
  const auto it = r.find(cfg.reward.reward_manager);
  if (it == r.end()) {
    std::string names;
    for (const auto& [k, f] : r) names += (names.empty() ? "" : ", ") + k;
    VERL_FAIL("reward_model.reward_manager={}: not a reward manager here (registered: {})",
              cfg.reward.reward_manager, names);
  }
  return it->second(cfg, device, tok);
}

RewardManager::RewardManager(const PpoConfig& cfg, Device device, const tokenizer::Tokenizer& tok)
    : cfg_(cfg), tok_(tok) {
  if (const auto& rm = cfg.reward.model) {
    model::Weights rm_weights = model::Weights::load(rm->path);
    require_reward_model(rm_weights.config, rm->path);
    std::vector<model::QuantizedLayer> rm_q = quantize_as_configured(
        rm->quantization, "reward_model.", rm_weights, "reward model", device == Device::Cuda);
    const int64_t seq_len = cfg.data.max_prompt_length + cfg.data.max_response_length;
    if (rm->input_tokenizer && std::filesystem::exists(rm->path + "/tokenizer.json"))
      rm_tok_ = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::load(rm->path));
    // A re-rendered input can outgrow the actor's tokens (another template): the budget allows
    // for reward_model.max_length, or twice the actor's longest sequence.
    const int64_t longest = rm->max_length > 0 ? rm->max_length : (rm_tok_ ? 2 * seq_len : seq_len);
    int64_t max_tokens = rm->forward_max_token_len_per_gpu, max_seqs = 0;
    if (rm->use_dynamic_bsz) {
      VERL_CHECK(
          max_tokens >= longest,
          "reward_model.forward_max_token_len_per_gpu={} is below the longest reward-model input "
          "({} tokens: {}); raise it",
          max_tokens, longest,
          rm->max_length > 0 ? "reward_model.max_length"
                             : "data.max_prompt_length + data.max_response_length");
      max_seqs = std::max<int64_t>(1, max_tokens / 8);
    } else {
      max_seqs = rm->micro_batch_size_per_gpu.value_or(16);
      max_tokens = max_seqs * longest;
    }
    const bool rm_offload = rm->offload.resolve(device).params > 0;
    reward_model_ = std::make_unique<RewardModel>(
        device, std::move(rm_weights), rm->path, max_tokens, max_seqs, rm_offload, std::move(rm_q));
    log::info("reward model: {} ({}, {} parameters) on {}, {} tokens / {} sequences a forward{}",
              rm->path, reward_model_->config().architecture, reward_model_->parameter_count(),
              to_string(device), max_tokens, max_seqs,
              rm_tok_ ? ", inputs re-rendered with its chat template" : "");
  }
  if (cfg.reward.python) {
    reward::check_python_reward(*cfg.reward.python);
    log::info("reward: {}'s {}() through {} (one process; timeout_s {} a batch)",
              cfg.reward.python->path, cfg.reward.python->name, cfg.reward.python->python,
              cfg.reward.command->timeout_s);
  }
  if (cfg.reward.command) command_ = std::make_unique<reward::CommandRewardFn>(*cfg.reward.command);
}

RewardManager::~RewardManager() = default;

float RewardManager::reward(Experience& exp, int64_t b, double score, double acc) const {
  exp.raw_score[b] = static_cast<float>(score);
  exp.acc[b] = static_cast<float>(acc);
  return static_cast<float>(score);
}

void RewardManager::add_extra_metrics(const Experience& exp, metrics::Metrics& m) const {
  if (command_) m.set("reward/failed_rows", static_cast<double>(failed_rows_));
  // A key's rows that lack it (NaN) are left out of its statistics.
  for (const auto& [key, col] : exp.reward_extra) {
    std::vector<double> v;
    for (float x : col)
      if (!std::isnan(x)) v.push_back(x);
    if (!v.empty()) m.add_stats("reward_extra/" + key, v);
  }
}

bool RewardManager::streams() const {
  return cfg_.reward.actor_reward_parallel && !command_ &&
         (!reward_model_ || !reward_model_->offloaded());
}

std::unique_ptr<RowObserver> RewardManager::stream(Experience& exp, metrics::StageTimer& timer) {
  if (!streams()) return nullptr;
  return std::make_unique<StreamingScorer>(*this, exp, timer);
}

void RewardManager::score(Experience& exp, metrics::StageTimer& timer, int64_t step) {
  auto rs = timer.scope("reward");
  if (reward_model_) {
    std::vector<int64_t> rows(static_cast<size_t>(exp.B));
    for (int64_t b = 0; b < exp.B; ++b) rows[static_cast<size_t>(b)] = b;
    score_with_reward_model(exp, rows);
  } else {
    score_all(exp, step);
  }
}

float RewardManager::rule_score(Experience& exp, int64_t b) const {
  const data::Sample& s = *exp.sample[b];
  // The response alone is scored (verl's reward managers pass solution_str = the response).
  const std::string text = tok_.decode(exp.response[b], /*skip_special_tokens=*/true);
  const reward::ScoreResult r =
      reward::default_compute_score(s.data_source, text, s.ground_truth_json, s.extra_info);
  return reward(exp, b, r.score, r.is_dict ? (r.acc ? 1.0 : 0.0) : r.score);
}

void RewardManager::score_all(Experience& exp, int64_t step) {
  if (!command_) {
    for (int64_t b = 0; b < exp.B; ++b) exp.scores[b] = rule_score(exp, b);
    return;
  }
  std::vector<reward::RewardRow> rows(exp.B);
  for (int64_t b = 0; b < exp.B; ++b) {
    const data::Sample& s = *exp.sample[b];
    rows[b] = {s.data_source, tok_.decode(exp.response[b], true), s.ground_truth_json,
               extra_info(s)};
  }
  reward::CommandBatchResult r = command_->score(rows);
  failed_rows_ = static_cast<int64_t>(r.errors.size());
  // The first few failed rows by index, then a count: a broken program would otherwise print one
  // line per row of every batch.
  constexpr size_t kShown = 3;
  for (size_t i = 0; i < r.errors.size() && i < kShown; ++i) {
    log::warn("custom reward, step {}, row {}: {}", step, r.errors[i].index, r.errors[i].message);
  }
  if (r.errors.size() > kShown) {
    log::warn("custom reward, step {}: {} more rows failed", step, r.errors.size() - kShown);
  }
  // A command's score is its acc too (verl's managers report a float score as acc), unless the
  // answers name an acc of their own.
  exp.reward_extra.clear();
  for (const auto& [key, col] : r.extras) exp.reward_extra[key].assign(col.begin(), col.end());
  const auto acc = r.extras.find("acc");
  for (int64_t b = 0; b < exp.B; ++b) {
    const double a =
        acc != r.extras.end() && !std::isnan(acc->second[b]) ? acc->second[b] : r.scores[b];
    exp.scores[b] = reward(exp, b, r.scores[b], a);
  }
}

void RewardManager::score_with_reward_model(Experience& exp, const std::vector<int64_t>& rows) {
  std::vector<std::vector<int32_t>> inputs(rows.size());
  const int64_t max_length = cfg_.reward.model->max_length;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t b = rows[i];
    const data::Sample& s = *exp.sample[b];
    std::vector<int32_t>& in = inputs[i];
    if (rm_tok_) {
      // verl's switch of chat template: the row's messages plus the decoded response as the
      // assistant's turn, rendered and tokenized by the reward model's tokenizer.
      nlohmann::ordered_json chat = s.messages;
      chat.push_back({{"role", "assistant"}, {"content", tok_.decode(exp.response[b], true)}});
      try {
        in = rm_tok_->encode(rm_tok_->apply_chat_template(chat, /*add_generation_prompt=*/false));
      } catch (const Error& e) {
        VERL_FAIL("reward model: rendering {}:{} with {}'s chat template: {}", s.file, s.line,
                  cfg_.reward.model->path_as_configured, e.what());
      }
    } else {
      in = s.prompt_ids;
      in.insert(in.end(), exp.response[b].begin(), exp.response[b].end());
    }
    if (max_length > 0 && static_cast<int64_t>(in.size()) > max_length) in.resize(max_length);
  }
  const std::vector<float> scores = reward_model_->score(inputs);
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t b = rows[i];
    exp.scores[b] = scores[i];
    exp.raw_score[b] = scores[i];
    exp.acc[b] = scores[i];
  }
}

}  // namespace verl::trainer
