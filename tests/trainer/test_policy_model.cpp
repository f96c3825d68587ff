// The device seam (trainer/policy_model.h) on the CPU: the CPU policy gives exactly the numbers of
// the model + AdamW it wraps (gradient accumulation over micro-batches included), a forward-only
// policy refuses to train, restore round-trips, trainer.device resolves (auto without a GPU is the
// CPU, with metrics identical to trainer.device=cpu) and a bad value names the key.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "../common/test_util.h"
#include "config/config.h"
#include "core/error.h"
#include "core/rng.h"
#include "dist/communicator.h"
#include "model/transformer.h"
#include "ops/cpu/ops.h"
#include "trainer/policy_model.h"
#include "trainer/ppo_trainer.h"

namespace verl::trainer {
namespace {

namespace fs = std::filesystem;
const std::string kRoot = VERL_SOURCE_DIR;

// Sequences of random tokens with the given lengths.
model::PackedBatch random_batch(const std::vector<int>& lens, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<std::vector<int32_t>> seqs;
  for (int n : lens) {
    seqs.emplace_back();
    for (int i = 0; i < n; ++i) seqs.back().push_back(static_cast<int32_t>(rng.below(vocab)));
  }
  return model::PackedBatch::from_sequences(seqs);
}

std::vector<float> random_vec(int64_t n, uint64_t seed, float scale) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& e : v) e = scale * rng.normal();
  return v;
}

TEST(PolicyModel, CpuPolicyIsTheModelAndAdamWItWraps) {
  const model::Weights w = model::Weights::load(kRoot + "/assets/demo/model");
  const int64_t V = w.config.vocab_size;
  const model::PackedBatch b1 = random_batch({9, 4, 13}, V, 1), b2 = random_batch({7, 11}, V, 2);
  const float temperature = 0.7f, lr = 1e-3f;
  AdamWConfig oc;
  oc.lr = lr;
  oc.weight_decay = 0.1f;
  oc.grad_clip = 0.5f;

  // Direct: the model, flat gradients accumulated over two micro-batches, AdamW.
  model::Weights ref = w;
  model::Transformer tf(ref);
  model::ForwardOptions fo;
  fo.temperature = temperature;
  model::Activations acts;
  std::vector<float> grads(ref.data.size(), 0.0f);
  std::vector<float> lp1;
  for (int k = 0; k < 2; ++k) {
    const model::PackedBatch& b = k == 0 ? b1 : b2;
    tf.forward(b, acts, fo);
    if (k == 0) lp1 = acts.logprob;
    const auto d_lp = random_vec(b.num_tokens(), 10 + k, 1.0f),
               d_ent = random_vec(b.num_tokens(), 20 + k, 0.1f);
    tf.backward(b, acts, d_lp.data(), d_ent.data(), nullptr, grads.data(), fo);
  }
  // torch's clip_grad_norm_ + AdamW by hand from the CPU ops (ops/cpu/ops.h).
  const int64_t n = ref.layout.total;
  const double want_norm = std::sqrt(ops::cpu::sum_squares(grads.data(), n));
  const float scale = static_cast<float>(std::min(1.0, oc.grad_clip / (want_norm + 1e-6)));
  std::vector<float> want_m(ref.data.size(), 0.0f), want_v(ref.data.size(), 0.0f);
  ops::cpu::adamw_step(ref.data.data(), grads.data(), want_m.data(), want_v.data(), n, lr, oc.beta1,
                       oc.beta2, oc.eps, oc.weight_decay, 1, scale);

  // Through the seam.
  PolicyOptions po;
  po.optim = oc;
  auto p = make_policy(Device::Cpu, w, po);
  EXPECT_EQ(p->device(), Device::Cpu);
  EXPECT_TRUE(p->trainable());
  p->zero_grad();
  std::vector<float> lp, ent;
  for (int k = 0; k < 2; ++k) {
    const model::PackedBatch& b = k == 0 ? b1 : b2;
    p->forward(b, temperature, lp, &ent);
    ASSERT_EQ(static_cast<int64_t>(lp.size()), b.num_tokens());
    ASSERT_EQ(static_cast<int64_t>(ent.size()), b.num_tokens());
    if (k == 0) {
      EXPECT_TRUE(lp == lp1) << "log-probs differ from the model's";
    }
    const auto d_lp = random_vec(b.num_tokens(), 10 + k, 1.0f),
               d_ent = random_vec(b.num_tokens(), 20 + k, 0.1f);
    p->backward(d_lp.data(), d_ent.data());
  }
  dist::SingleProcess comm;
  EXPECT_EQ(p->optimizer_step(lr, comm), want_norm);
  EXPECT_TRUE(p->weights().data == ref.data) << "updated weights differ from model + AdamW";
  EXPECT_EQ(p->optimizer_state().step, 1);
  EXPECT_TRUE(p->optimizer_state().exp_avg == want_m);
  EXPECT_TRUE(p->optimizer_state().exp_avg_sq == want_v);
  EXPECT_FALSE(p->weights().data == w.data);  // it did move
}

// A sink that records the ranges a backward hands out (each with a buffer of its own, starting
// from zero like ZeRO-2's) and adds them into one whole-layout buffer when they are ready.
class RecordingSink final : public model::GradSink {
 public:
  explicit RecordingSink(int64_t n) : whole(static_cast<size_t>(n), 0.0f) {}
  float* open(int64_t begin, int64_t end) override {
    for (auto& r : open_)
      if (r.begin == begin && r.end == end) return r.buf.data();
    open_.push_back({begin, end, std::vector<float>(static_cast<size_t>(end - begin), 0.0f)});
    return open_.back().buf.data();
  }
  void ready(int64_t begin, int64_t end) override {
    for (size_t i = 0; i < open_.size(); ++i) {
      if (open_[i].begin != begin || open_[i].end != end) continue;
      for (int64_t k = begin; k < end; ++k) whole[k] += open_[i].buf[k - begin];
      order.emplace_back(begin, end);
      open_.erase(open_.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
    ADD_FAILURE() << "ready(" << begin << ", " << end << ") of a range never opened";
  }
  std::vector<float> whole;
  std::vector<std::pair<int64_t, int64_t>> order;  // ranges in the order they became ready
  size_t still_open() const { return open_.size(); }

 private:
  struct Range {
    int64_t begin, end;
    std::vector<float> buf;
  };
  std::deque<Range> open_;
};

// The backward's ranges (data parallelism's gradient buckets): with a sink the gradients equal the
// whole-buffer backward's bit for bit, the ranges are disjoint, cover every parameter, close once
// each, and come in backward order (the head and the last layer first, the embedding last), for
// an untied LM head and for a tied one.
TEST(PolicyModel, BackwardHandsOutEachParameterRangeOnceInBackwardOrder) {
  for (bool tied : {false, true}) {
    model::ModelConfig c = model::Weights::load(kRoot + "/assets/demo/model").config;
    c.tie_word_embeddings = tied;
    model::Weights w = model::Weights::from_config(c);
    w.init_random(7);
    const model::PackedBatch b = random_batch({9, 4, 13}, w.config.vocab_size, 3);
    model::Transformer tf(w);
    model::Activations acts;
    tf.forward(b, acts);
    const auto d_lp = random_vec(b.num_tokens(), 4, 1.0f),
               d_ent = random_vec(b.num_tokens(), 5, 0.1f);
    std::vector<float> grads(static_cast<size_t>(w.layout.total), 0.0f);
    tf.backward(b, acts, d_lp.data(), d_ent.data(), nullptr, grads.data());
    RecordingSink sink(w.layout.total);
    tf.forward(b, acts);
    tf.backward(b, acts, d_lp.data(), d_ent.data(), nullptr, nullptr, {}, &sink);
    EXPECT_EQ(sink.still_open(), 0u) << "tied=" << tied;
    EXPECT_TRUE(sink.whole == grads) << "gradients through the sink differ, tied=" << tied;
    // One range per layer, the final norm, the embedding, and an untied head.
    const size_t want = static_cast<size_t>(w.config.num_hidden_layers) + 2 + (tied ? 0 : 1);
    ASSERT_EQ(sink.order.size(), want) << "tied=" << tied;
    std::vector<std::pair<int64_t, int64_t>> sorted = sink.order;
    std::sort(sorted.begin(), sorted.end());
    int64_t covered = 0;
    for (size_t i = 0; i < sorted.size(); ++i) {
      if (i > 0) EXPECT_LE(sorted[i - 1].second, sorted[i].first) << "ranges overlap";
      covered += sorted[i].second - sorted[i].first;
    }
    int64_t params = 0;
    for (const auto& p : w.layout.params) params += p.numel;
    EXPECT_EQ(covered, params) << "tied=" << tied;
    // Backward order: every range after the first starts below the one before it.
    for (size_t i = 1; i < sink.order.size(); ++i)
      EXPECT_LT(sink.order[i].first, sink.order[i - 1].first) << "range " << i << ", tied=" << tied;
    EXPECT_EQ(sink.order.back().first, 0) << "the embedding comes last";
  }
}

TEST(PolicyModel, ForwardOnlyPolicyScoresButDoesNotTrain) {
  const model::Weights w = model::Weights::load(kRoot + "/assets/demo/model");
  const model::PackedBatch b = random_batch({5, 8}, w.config.vocab_size, 3);
  PolicyOptions train_opts, ref_opts;
  ref_opts.trainable = false;
  auto actor = make_policy(Device::Cpu, w, train_opts);
  auto ref = make_policy(Device::Cpu, w, ref_opts);
  EXPECT_FALSE(ref->trainable());
  std::vector<float> a, r;
  actor->forward(b, 1.0f, a, nullptr);
  ref->forward(b, 1.0f, r, nullptr);
  EXPECT_TRUE(a == r);
  const std::vector<float> d(b.num_tokens(), 1.0f);
  EXPECT_NE(test::error_of([&] { ref->backward(d.data(), nullptr); }).find("forward-only"),
            std::string::npos);
  dist::SingleProcess comm;
  EXPECT_NE(test::error_of([&] { ref->optimizer_step(1e-3f, comm); }).find("forward-only"),
            std::string::npos);
}

TEST(PolicyModel, RestoreReplacesWeightsAndOptimizerState) {
  const model::Weights w = model::Weights::load(kRoot + "/assets/demo/model");
  auto p = make_policy(Device::Cpu, w, PolicyOptions{});
  const int64_t n = w.layout.total;
  AdamWState st{random_vec(n, 4, 1e-3f), random_vec(n, 5, 1e-6f), 17};
  for (auto& e : st.exp_avg_sq) e = std::fabs(e);
  const std::vector<float> nw = random_vec(n, 6, 0.02f);
  p->restore(nw, st);
  EXPECT_TRUE(p->weights().data == nw);
  EXPECT_EQ(p->optimizer_state().step, 17);
  EXPECT_TRUE(p->optimizer_state().exp_avg == st.exp_avg);
  // The model reads the restored weights: its log-probs change.
  const model::PackedBatch b = random_batch({6}, w.config.vocab_size, 7);
  std::vector<float> before, after;
  make_policy(Device::Cpu, w, PolicyOptions{})->forward(b, 1.0f, before, nullptr);
  p->forward(b, 1.0f, after, nullptr);
  EXPECT_FALSE(before == after);
  EXPECT_NE(test::error_of([&] { p->restore(std::vector<float>(3), st); }).find("restore"),
            std::string::npos);
}

TEST(PolicyModel, DeviceResolution) {
  EXPECT_EQ(resolve_device("cpu"), Device::Cpu);
  EXPECT_EQ(resolve_device("auto"), cuda_available() ? Device::Cuda : Device::Cpu);
  EXPECT_NE(test::error_of([] { resolve_device("tpu"); }).find("trainer.device"),
            std::string::npos);
  // The config schema rejects it first, naming the key and the choices.
  const std::string e = test::error_of([] { config::load_config("", {"trainer.device=tpu"}); });
  EXPECT_NE(e.find("trainer.device"), std::string::npos) << e;
  EXPECT_NE(e.find("auto"), std::string::npos) << e;
  if (!cuda_available()) {
    const std::string c = test::error_of([] { resolve_device("cuda"); });
    EXPECT_NE(c.find("trainer.device=cuda"), std::string::npos) << c;
    EXPECT_NE(c.find("trainer.device=cpu or auto"), std::string::npos) << c;
    EXPECT_EQ(device_memory_in_use(), 0u);
  }
}

config::Config demo_config(const std::string& out, const std::string& device) {
  return test::demo_config(
      {"actor_rollout_ref.model.path=" + kRoot + "/assets/demo/model",
       "data.train_files=[" + kRoot + "/assets/demo/train.jsonl]", "data.val_files=null",
       "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
       "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.use_kl_loss=true",
       "trainer.total_training_steps=2", "trainer.logger=[jsonl]", "trainer.save_freq=-1",
       "trainer.device=" + device, "trainer.default_local_dir=" + out});
}

// Without a GPU, auto is the CPU: the same run, bit for bit, and no device-memory metrics.
TEST(PolicyModel, AutoWithoutGpuRunsExactlyAsCpu) {
  if (cuda_available())
    GTEST_SKIP() << "a GPU is visible: auto picks cuda (tests/cuda/test_trainer_cuda.cpp)";
  std::vector<nlohmann::json> lines[2];
  std::vector<float> weights[2];
  for (int i = 0; i < 2; ++i) {
    const test::TempDir scratch(i ? "test_dev_auto" : "test_dev_cpu");
    const std::string out = scratch.str();
    PpoTrainer t(demo_config(out, i ? "auto" : "cpu"));
    EXPECT_EQ(t.device(), Device::Cpu);
    t.fit();
    weights[i] = t.actor().data;
    std::ifstream f(out + "/metrics.jsonl");
    std::string line;
    while (std::getline(f, line)) lines[i].push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(lines[0].size(), 2u);
  ASSERT_EQ(lines[1].size(), 2u);
  for (size_t s = 0; s < 2; ++s) {
    for (auto& [k, v] : lines[0][s].items()) {
      EXPECT_EQ(k.rfind("perf/device_memory_gib", 0), std::string::npos) << k;
      if (k.rfind("timing_s/", 0) == 0 || k.rfind("perf/", 0) == 0 || !v.is_number()) continue;
      ASSERT_TRUE(lines[1][s].contains(k)) << k;
      EXPECT_EQ(v.get<double>(), lines[1][s][k].get<double>()) << k << " at step " << s + 1;
    }
  }
  EXPECT_TRUE(weights[0] == weights[1]);
}

}  // namespace
}  // namespace verl::trainer
