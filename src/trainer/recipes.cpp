// DAPO's dynamic sampling, ReMax's greedy baseline and the one-step-off rollout, beside the driver.
#include "trainer/recipes.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <utility>

#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"

namespace verl::trainer {

bool DynamicSampling::run(const data::Batch& batch, Experience& exp, metrics::StageTimer& timer,
                          metrics::Metrics& m, int64_t step, const NextBatch& next_batch) {
  const std::string& metric = cfg_.algorithm.filter_groups.metric;
  const int64_t max_gen = cfg_.algorithm.filter_groups.max_num_gen_batches;
  const int64_t want = cfg_.data.train_batch_size;
  const int64_t n = cfg_.rollout.train.n;
  // The generation batches of this step and, per batch, the first row of each kept group
  // (a group is a prompt's n consecutive rows). Samples of later batches live in `extra`.
  std::deque<Experience> gens;
  std::deque<std::vector<data::Sample>> extra;
  std::vector<std::pair<const Experience*, int64_t>> kept;
  int64_t num_gen = 0, first_index = 0;
  gens.push_back(std::move(exp));
  for (;;) {
    const Experience& g = gens.back();
    ++num_gen;
    // recipe/dapo/dapo_ray_trainer.py: a group stays when its metric's std is > 0 or it has one
    // sample. Equal values (max == min) stand for std == 0.
    for (int64_t b0 = 0; b0 < g.B; b0 += n) {
      double lo = std::numeric_limits<double>::infinity(), hi = -lo;
      for (int64_t b = b0; b < b0 + n; ++b) {
        const double v = metric == "acc"     ? g.acc[b]
                         : metric == "score" ? g.raw_score[b]
                                             : g.scores[b];
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      if (hi > lo || n == 1) kept.emplace_back(&g, b0);
    }
    if (static_cast<int64_t>(kept.size()) >= want) break;
    VERL_CHECK(max_gen <= 0 || num_gen < max_gen,
               "algorithm.filter_groups: {} generation batches kept {} of the {} prompts of "
               "data.train_batch_size "
               "(algorithm.filter_groups.max_num_gen_batches={}); the data may be too hard or too "
               "easy for "
               "metric={}; raise max_num_gen_batches (0: no limit)",
               num_gen, kept.size(), want, max_gen, metric);
    std::optional<data::Batch> next = next_batch();
    if (!next) {
      log::warn(
          "algorithm.filter_groups: the training data ran out with {} of {} prompts kept; training "
          "stops",
          kept.size(), want);
      return false;
    }
    extra.push_back(std::move(next->samples));
    // Distinct sampling seeds (and prompt indices) for each generation batch of the step.
    first_index += static_cast<int64_t>(batch.samples.size());
    Experience more;
    rollout_.generate(extra.back(), first_index, more, timer, {.step = step});
    gens.push_back(std::move(more));
  }
  kept.resize(static_cast<size_t>(want));  // verl aligns the batch to train_batch_size x n rows
  m.set("train/num_gen_batches", static_cast<double>(num_gen));

  // The step's experience: the kept groups in order, prompt indices 0 .. want - 1.
  kept_samples_.clear();
  kept_samples_.reserve(kept.size());
  for (const auto& [g, b0] : kept) kept_samples_.push_back(*g->sample[b0]);
  Experience out;
  out.B = want * n;
  out.L = 1;
  for (const auto& [g, b0] : kept)
    for (int64_t b = b0; b < b0 + n; ++b)
      out.L = std::max<int64_t>(out.L, static_cast<int64_t>(g->response[b].size()));
  const int64_t L = out.L;
  out.mask.assign(out.B * L, 0.0f);
  out.rollout_log_prob.assign(out.B * L, 0.0f);
  out.token_level_scores.assign(out.B * L, 0.0f);
  for (size_t k = 0; k < kept.size(); ++k) {
    const auto& [g, b0] = kept[k];
    for (int64_t b = b0; b < b0 + n; ++b) {
      const int64_t row = static_cast<int64_t>(out.group.size());
      out.group.push_back(static_cast<int64_t>(k));
      out.sample.push_back(&kept_samples_[k]);
      out.response.push_back(g->response[b]);
      out.finish_reason.push_back(g->finish_reason[b]);
      out.scores.push_back(g->scores[b]);
      out.acc.push_back(g->acc[b]);
      out.raw_score.push_back(g->raw_score[b]);
      out.overlong_reward.push_back(g->overlong_reward[b]);
      for (const auto& [key, col] : g->reward_extra) {
        std::vector<float>& o = out.reward_extra[key];
        o.resize(static_cast<size_t>(row), std::nanf(""));
        o.push_back(col[b]);
      }
      const int64_t len = static_cast<int64_t>(g->response[b].size());
      std::copy_n(g->mask.begin() + b * g->L, len, out.mask.begin() + row * L);
      std::copy_n(g->rollout_log_prob.begin() + b * g->L, len,
                  out.rollout_log_prob.begin() + row * L);
      std::copy_n(g->token_level_scores.begin() + b * g->L, len,
                  out.token_level_scores.begin() + row * L);
    }
  }
  for (auto& [key, col] : out.reward_extra) col.resize(static_cast<size_t>(out.B), std::nanf(""));
  out.token_level_rewards = out.token_level_scores;
  exp = std::move(out);
  return true;
}

std::vector<std::vector<float>> gdpo_components(const Experience& exp,
                                                const std::vector<std::string>& keys,
                                                GlobalRows& g) {
  std::vector<std::vector<float>> out;
  for (const std::string& key : keys) {
    auto it = exp.reward_extra.find(key);
    if (it == exp.reward_extra.end()) {
      std::string have;
      for (const auto& [k, col] : exp.reward_extra) have += (have.empty() ? "" : ", ") + k;
      VERL_FAIL(
          "algorithm.gdpo_reward_keys: '{}' is not among the numbers the reward function "
          "returned ({}); return a dict with it from custom_reward_function",
          key, have.empty() ? std::string("none: it returned a plain score") : have);
    }
    std::vector<float> col = it->second;
    for (float& x : col)
      if (std::isnan(x)) x = 0.0f;
    out.push_back(g.gather_per_row(col));
  }
  return out;
}

std::vector<float> remax_baselines(RolloutWorker& rollout, const std::vector<data::Sample>& local,
                                   int64_t first, const Experience& exp, GlobalRows& g,
                                   metrics::StageTimer& timer, int64_t step) {
  Experience greedy;
  rollout.generate(local, first, greedy, timer, {.greedy = true, .step = step});
  const std::vector<float> greedy_scores = g.gather_per_row(greedy.scores);
  std::vector<float> baselines;
  for (int64_t b = 0; b < exp.B; ++b) baselines.push_back(greedy_scores[exp.group[b]]);
  return g.gather_per_row(baselines);
}

std::optional<data::Batch> OneStepOff::next_batch() {
  if (prefetch_ && !prefetch_->handed_out) {
    prefetch_->handed_out = true;
    return prefetch_->batch;
  }
  return loader_.next();
}

void OneStepOff::start(int64_t done_steps) {
  auto p = std::make_unique<Prefetch>();
  p->loader_state = loader_.state();
  std::optional<data::Batch> next = loader_.next();
  if (!next) return;
  p->batch = std::move(*next);
  auto [local, first] = rank_share(p->batch.samples, comm_);
  p->local = std::move(local);
  p->first = first;
  // A copy: this step's update changes the actor's weights in place while the rollout reads these
  // (on the GPU a device copy with a stream of its own, so generation and the update share the
  // device; on the CPU a host copy).
  p->snapshot = actor_.rollout_snapshot();
  if (!p->snapshot)  // LoRA: the adapters merged into the snapshot
    p->weights = actor_.lora() ? actor_.lora()->merged(actor_.weights()) : actor_.weights();
  p->weights_step = done_steps;
  const int64_t step = done_steps + 2;  // the step these samples are for
  Prefetch* raw = p.get();
  raw->timer.reset();
  raw->thread = std::thread([this, raw, step] {
    try {
      rollout_.generate(raw->local, raw->first, raw->exp, raw->timer,
                        {.weights = raw->snapshot ? nullptr : &raw->weights,
                         .snapshot = raw->snapshot.get(),
                         .step = step});
    } catch (...) {
      raw->error = std::current_exception();
    }
  });
  prefetch_ = std::move(p);
}

std::unique_ptr<OneStepOff::Prefetch> OneStepOff::take(const data::Batch& batch) {
  std::unique_ptr<Prefetch> p = std::move(prefetch_);
  if (!p) return nullptr;
  Timer t;
  if (p->thread.joinable()) p->thread.join();
  p->waited_s = t.seconds();
  if (p->error) std::rethrow_exception(p->error);
  // A caller that fed another batch (not the one next_batch() handed out) gets a fresh rollout.
  const bool same =
      p->handed_out && p->batch.samples.size() == batch.samples.size() &&
      std::equal(p->batch.samples.begin(), p->batch.samples.end(), batch.samples.begin(),
                 [](const data::Sample& a, const data::Sample& b) {
                   return a.prompt_ids == b.prompt_ids;
                 });
  return same ? std::move(p) : nullptr;
}

nlohmann::json OneStepOff::loader_state() const {
  // A rollout started for the next step is not saved: the resumed run generates that batch anew.
  return prefetch_ && !prefetch_->handed_out ? prefetch_->loader_state : loader_.state();
}

void OneStepOff::add_timing_metrics(const Prefetch& ready, metrics::Metrics& m) {
  m.set("timing_s/gen", ready.timer.seconds("gen"));
  m.set("timing_s/gen_setup", ready.timer.seconds("gen_setup"));
  m.set("timing_s/reward", ready.timer.seconds("reward"));
  m.set("timing_s/reward_overlap_gen", ready.timer.overlap("gen", "reward"));
  m.set("timing_s/gen_wait", ready.waited_s);
}

}  // namespace verl::trainer
