// Pins the CPU model to HF transformers: log-probs, entropies, values, scores and every parameter
// gradient of tiny random models of each family, against dumps made by tools/make_golden.py.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "model/safetensors.h"
#include "model/transformer.h"

namespace verl::model {
namespace {

const std::string kGolden = std::string(VERL_SOURCE_DIR) + "/tests/fixtures/golden/";

struct Golden {
  std::unique_ptr<SafetensorsFile> file;
  std::vector<std::vector<int32_t>> seqs;

  std::vector<float> get(const std::string& name) const {
    const TensorInfo* t = file->find(name);
    EXPECT_NE(t, nullptr) << "golden tensor " << name;
    if (!t) return {};
    std::vector<float> out(static_cast<size_t>(t->numel()));
    convert_to_f32(out.data(), file->data(*t), t->dtype, out.size());
    return out;
  }
};

Golden load_golden(const std::string& name) {
  Golden g;
  g.file = SafetensorsFile::open(kGolden + name + "/golden.safetensors");
  std::ifstream f(kGolden + name + "/inputs.json");
  nlohmann::json j = nlohmann::json::parse(f);
  for (auto& s : j["sequences"]) g.seqs.push_back(s.get<std::vector<int32_t>>());
  return g;
}

// max |a-b| over the tensor, relative to max |ref| (the acceptance's "relative to the tensor's
// max").
double rel_max_err(const float* a, const std::vector<float>& ref) {
  double m = 0, e = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    m = std::max(m, std::fabs(double(ref[i])));
    e = std::max(e, std::fabs(double(a[i]) - ref[i]));
  }
  return m > 0 ? e / m : e;
}

void expect_grads_match(const Weights& w, const std::vector<float>& grads, const Golden& g) {
  double worst = 0;
  for (const HfTensorMap& m : w.layout.hf) {
    std::vector<float> ref = g.get("grad." + m.hf_name);
    ASSERT_EQ(ref.size(), static_cast<size_t>(shape_numel(m.hf_shape))) << m.hf_name;
    const float* ours = grads.data() + w.layout.params[m.param].offset + m.offset;
    double err = rel_max_err(ours, ref);
    EXPECT_LE(err, 1e-4) << "gradient of " << m.hf_name;
    worst = std::max(worst, err);
  }
  std::printf("max relative gradient error over %zu tensors: %.3g\n", w.layout.hf.size(), worst);
}

class CausalGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(CausalGolden, LogprobsEntropyAndGradientsMatchTransformers) {
  const std::string name = GetParam();
  Weights w = Weights::load(kGolden + name);
  Golden g = load_golden(name);
  Transformer model(w);
  PackedBatch batch = PackedBatch::from_sequences(g.seqs);
  Activations acts;
  ForwardOptions opt;
  opt.lm_head_chunk = 7;  // several chunks, one ragged
  model.forward(batch, acts, opt);
  double worst_lp = 0, worst_ent = 0;
  for (size_t s = 0; s < g.seqs.size(); ++s) {
    std::vector<float> lp = g.get(fmt::format("logprob.{}", s));
    std::vector<float> ent = g.get(fmt::format("entropy.{}", s));
    ASSERT_EQ(lp.size() + 1, g.seqs[s].size());
    for (size_t i = 0; i < lp.size(); ++i) {
      int64_t t = batch.cu_seqlens[s] + static_cast<int64_t>(i);
      worst_lp = std::max(worst_lp, std::fabs(double(acts.logprob[t]) - lp[i]));
      worst_ent = std::max(worst_ent, std::fabs(double(acts.entropy[t]) - ent[i]));
    }
  }
  EXPECT_LE(worst_lp, 1e-4);
  EXPECT_LE(worst_ent, 1e-4);
  RecordProperty("max_abs_err_logprob", fmt::format("{:.3g}", worst_lp));
  std::printf("%s: max |dlogprob| %.3g, max |dentropy| %.3g\n", name.c_str(), worst_lp, worst_ent);

  // Gradient of the sum of all log-probs.
  std::vector<float> d_lp(batch.num_tokens(), 0.0f);
  for (int64_t t = 0; t < batch.num_tokens(); ++t) d_lp[t] = batch.targets[t] >= 0 ? 1.0f : 0.0f;
  std::vector<float> grads(w.data.size(), 0.0f);
  model.backward(batch, acts, d_lp.data(), nullptr, nullptr, grads.data(), opt);
  expect_grads_match(w, grads, g);

  // Temperature 0.7 divides the logits before the log-softmax.
  opt.temperature = 0.7f;
  model.forward(batch, acts, opt);
  double worst_t = 0;
  for (size_t s = 0; s < g.seqs.size(); ++s) {
    std::vector<float> lp = g.get(fmt::format("logprob_t07.{}", s));
    for (size_t i = 0; i < lp.size(); ++i) {
      worst_t = std::max(worst_t, std::fabs(double(acts.logprob[batch.cu_seqlens[s] + i]) - lp[i]));
    }
  }
  EXPECT_LE(worst_t, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Families, CausalGolden, ::testing::Values("qwen2", "llama3", "qwen3"));

TEST(HeadGolden, CriticValuesAndGradients) {
  Weights w = Weights::load(kGolden + "qwen2_critic");
  ASSERT_EQ(w.config.head, HeadKind::TokenClassification);
  Golden g = load_golden("qwen2_critic");
  Transformer model(w);
  PackedBatch batch = PackedBatch::from_sequences(g.seqs);
  Activations acts;
  model.forward(batch, acts);
  for (size_t s = 0; s < g.seqs.size(); ++s) {
    std::vector<float> v = g.get(fmt::format("values.{}", s));
    ASSERT_EQ(v.size(), g.seqs[s].size());
    for (size_t i = 0; i < v.size(); ++i) {
      EXPECT_NEAR(acts.values[batch.cu_seqlens[s] + i], v[i], 1e-4) << s << "," << i;
    }
  }
  std::vector<float> ones(batch.num_tokens(), 1.0f), grads(w.data.size(), 0.0f);
  model.backward(batch, acts, nullptr, nullptr, ones.data(), grads.data());
  expect_grads_match(w, grads, g);
}

TEST(HeadGolden, RewardModelScoresAndGradients) {
  Weights w = Weights::load(kGolden + "llama_rm");
  ASSERT_EQ(w.config.head, HeadKind::SequenceClassification);
  Golden g = load_golden("llama_rm");
  Transformer model(w);
  PackedBatch batch = PackedBatch::from_sequences(g.seqs);
  Activations acts;
  model.forward(batch, acts);
  for (size_t s = 0; s < g.seqs.size(); ++s) {
    EXPECT_NEAR(acts.scores[s], g.get(fmt::format("score.{}", s))[0], 1e-4) << s;
  }
  std::vector<float> ones(batch.num_seqs(), 1.0f), grads(w.data.size(), 0.0f);
  model.backward(batch, acts, nullptr, nullptr, ones.data(), grads.data());
  expect_grads_match(w, grads, g);
}

// A sequence's outputs do not depend on what else is packed with it.
TEST(Packing, PackedBatchEqualsEachSequenceAlone) {
  Weights w = Weights::load(kGolden + "qwen3");
  Golden g = load_golden("qwen3");
  Transformer model(w);
  PackedBatch all = PackedBatch::from_sequences(g.seqs);
  Activations acts_all;
  model.forward(all, acts_all);
  std::vector<float> grads_all(w.data.size(), 0.0f);
  std::vector<float> ones(all.num_tokens(), 1.0f);
  model.backward(all, acts_all, ones.data(), ones.data(), nullptr, grads_all.data());
  std::vector<float> grads_sum(w.data.size(), 0.0f);
  for (size_t s = 0; s < g.seqs.size(); ++s) {
    PackedBatch one = PackedBatch::from_sequences({g.seqs[s]});
    Activations a;
    model.forward(one, a);
    for (int64_t i = 0; i < one.num_tokens(); ++i) {
      EXPECT_NEAR(a.logprob[i], acts_all.logprob[all.cu_seqlens[s] + i], 1e-5);
      EXPECT_NEAR(a.entropy[i], acts_all.entropy[all.cu_seqlens[s] + i], 1e-5);
    }
    std::vector<float> o(one.num_tokens(), 1.0f);
    model.backward(one, a, o.data(), o.data(), nullptr, grads_sum.data());
  }
  double m = 0, e = 0;
  for (size_t i = 0; i < grads_all.size(); ++i) {
    m = std::max(m, std::fabs(double(grads_all[i])));
    e = std::max(e, std::fabs(double(grads_all[i]) - grads_sum[i]));
  }
  EXPECT_LE(e / m, 1e-5);
}

}  // namespace
}  // namespace verl::model
