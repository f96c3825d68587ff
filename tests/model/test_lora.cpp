// LoRA adapters on the CPU model: PEFT's log-probs, entropies, adapter gradients and merged weights
// (tools/make_lora_fixtures.py), adapter gradients against finite differences, a fresh adapter
// leaving the base model bit for bit, PEFT files round-tripping, errors naming the file, and the
// rollout's step agreeing with the training forward.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../common/test_util.h"
#include "core/rng.h"
#include "model/lora.h"
#include "model/safetensors.h"
#include "model/transformer.h"

namespace verl::model {
namespace {

const std::string kGolden = std::string(VERL_SOURCE_DIR) + "/tests/fixtures/golden/";
const std::string kLora = std::string(VERL_SOURCE_DIR) + "/tests/fixtures/lora/";

std::vector<std::vector<int32_t>> golden_inputs(const std::string& name) {
  std::ifstream f(kGolden + name + "/inputs.json");
  nlohmann::json j = nlohmann::json::parse(f);
  std::vector<std::vector<int32_t>> seqs;
  for (auto& s : j["sequences"]) seqs.push_back(s.get<std::vector<int32_t>>());
  return seqs;
}

LoraConfig all_linear(int64_t r, double alpha, bool rslora = false) {
  LoraConfig c;
  c.r = r;
  c.alpha = alpha;
  c.use_rslora = rslora;
  c.target_modules = ModuleMatch::parse("all-linear", "target_modules", true);
  return c;
}

// An adapter with every A and B drawn from N(0, std^2) (nonzero B, unlike a fresh one).
LoraWeights random_adapter(const ModelConfig& base, const LoraConfig& cfg, uint64_t seed,
                           float std = 0.2f) {
  LoraWeights lw = LoraWeights::create(base, cfg);
  Rng rng(seed, 7);
  for (float& x : lw.data) x = std * rng.normal();
  return lw;
}

std::vector<float> read_f32(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo* t = f.find(name);
  EXPECT_NE(t, nullptr) << name;
  if (!t) return {};
  std::vector<float> out(static_cast<size_t>(t->numel()));
  convert_to_f32(out.data(), f.data(*t), t->dtype, out.size());
  return out;
}

// ---- config
// --------------------------------------------------------------------------------------

TEST(LoraConfig, ScaleTargetsAndErrorsNameTheKeys) {
  LoraConfig c = all_linear(16, 32);
  EXPECT_FLOAT_EQ(c.scale(), 2.0f);
  c.use_rslora = true;
  EXPECT_FLOAT_EQ(c.scale(), 8.0f);  // alpha / sqrt(r)
  for (int t = 0; t < kNumLoraTargets; ++t) EXPECT_TRUE(c.adapts(3, static_cast<LoraTarget>(t)));

  LoraConfig qv;
  qv.r = 4;
  qv.target_modules =
      ModuleMatch::parse(nlohmann::json{"q_proj", "v_proj", "down_proj"}, "target_modules", true);
  qv.exclude_modules =
      ModuleMatch::parse(nlohmann::json{"model.layers.1.mlp.down_proj"}, "exclude_modules", false);
  EXPECT_TRUE(qv.adapts(0, LoraTarget::Q));
  EXPECT_FALSE(qv.adapts(0, LoraTarget::K));
  EXPECT_TRUE(qv.adapts(0, LoraTarget::Down));
  EXPECT_FALSE(qv.adapts(1, LoraTarget::Down));
  // "layers.1.mlp.down_proj" must not match layer 11 (a suffix after a dot only).
  EXPECT_TRUE(qv.adapts(11, LoraTarget::Down));
  LoraConfig re;
  re.r = 2;
  re.target_modules = ModuleMatch::parse(".*\\.1\\.self_attn\\.(q|k)_proj", "target_modules", true);
  EXPECT_TRUE(re.adapts(1, LoraTarget::K));
  EXPECT_FALSE(re.adapts(0, LoraTarget::K));
  EXPECT_FALSE(re.adapts(1, LoraTarget::V));

  LoraConfig bad = all_linear(0, 16);
  EXPECT_NE(test::expected_error_of([&] { bad.check(); }).find("lora_rank"), std::string::npos);
  bad = all_linear(8, -1);
  EXPECT_NE(test::expected_error_of([&] { bad.check(); }).find("lora_alpha"), std::string::npos);
  bad = all_linear(8, 16);
  bad.target_modules = {};
  EXPECT_NE(test::expected_error_of([&] { bad.check(); }).find("target_modules"),
            std::string::npos);
  const std::string e = test::expected_error_of([] {
    ModuleMatch::parse(nlohmann::json{"q_proj", "lm_head"},
                       "actor_rollout_ref.model.target_modules", true);
  });
  EXPECT_NE(e.find("actor_rollout_ref.model.target_modules"), std::string::npos) << e;
  EXPECT_NE(e.find("lm_head"), std::string::npos) << e;

  // Layout: A [r, in] and B [out, r] per adapted module, named as PEFT.
  Weights w = Weights::load(kGolden + "qwen3");
  LoraWeights lw = LoraWeights::create(w.config, qv);
  ASSERT_EQ(lw.layout.params.size(), 2u * 5u);  // q, v, down on layer 0; q, v on layer 1
  const ParamInfo& a = lw.layout.params[static_cast<size_t>(lw.a[0][0])];
  EXPECT_EQ(a.name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{4, 64}));
  const ParamInfo& bv = lw.layout.params[static_cast<size_t>(lw.b[1][2])];
  EXPECT_EQ(bv.name, "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight");
  EXPECT_EQ(bv.shape, (std::vector<int64_t>{2 * 24, 4}));
  EXPECT_EQ(lw.layout.total, static_cast<int64_t>(lw.data.size()));
}

// ---- PEFT's numbers
// ------------------------------------------------------------------------------

class LoraGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(LoraGolden, LogprobsEntropiesGradientsAndMergeMatchPeft) {
  const std::string name = GetParam();
  const std::string dir = kLora + name;
  if (!std::filesystem::exists(dir + "/golden.safetensors")) {
    GTEST_SKIP() << dir << " not made yet (tools/make_lora_fixtures.py on the GPU machine)";
  }
  Weights w = Weights::load(kGolden + name);
  LoraWeights lw = LoraWeights::load(dir, w.config);
  auto g = SafetensorsFile::open(dir + "/golden.safetensors");
  const auto seqs = golden_inputs(name);
  PackedBatch batch = PackedBatch::from_sequences(seqs);

  Transformer model(w, &lw);
  Activations acts;
  ForwardOptions opt;
  opt.lm_head_chunk = 7;
  model.forward(batch, acts, opt);
  Transformer base(w);
  Activations base_acts;
  base.forward(batch, base_acts, opt);
  double worst_lp = 0, worst_ent = 0, worst_base = 0, moved = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const std::vector<float> lp = read_f32(*g, fmt::format("logprob.{}", s));
    const std::vector<float> ent = read_f32(*g, fmt::format("entropy.{}", s));
    const std::vector<float> blp = read_f32(*g, fmt::format("base_logprob.{}", s));
    ASSERT_EQ(lp.size() + 1, seqs[s].size());
    for (size_t i = 0; i < lp.size(); ++i) {
      const int64_t t = batch.cu_seqlens[s] + static_cast<int64_t>(i);
      worst_lp = std::max(worst_lp, std::fabs(double(acts.logprob[t]) - lp[i]));
      worst_ent = std::max(worst_ent, std::fabs(double(acts.entropy[t]) - ent[i]));
      worst_base = std::max(worst_base, std::fabs(double(base_acts.logprob[t]) - blp[i]));
      moved = std::max(moved, std::fabs(double(lp[i]) - blp[i]));
    }
  }
  EXPECT_LE(worst_lp, 1e-4);
  EXPECT_LE(worst_ent, 1e-4);
  EXPECT_LE(worst_base, 1e-4);
  EXPECT_GT(moved, 1e-2) << "the adapter should change the log-probs";
  std::printf("%s: max |dlogprob| %.3g, |dentropy| %.3g, base %.3g\n", name.c_str(), worst_lp,
              worst_ent, worst_base);

  // d(sum of all log-probs) / d(adapters), base frozen.
  std::vector<float> d_lp(static_cast<size_t>(batch.num_tokens()));
  for (int64_t t = 0; t < batch.num_tokens(); ++t) d_lp[t] = batch.targets[t] >= 0 ? 1.0f : 0.0f;
  std::vector<float> lg(lw.data.size(), 0.0f);
  model.backward(batch, acts, d_lp.data(), nullptr, nullptr, nullptr, opt, nullptr, nullptr,
                 {lg.data(), true});
  double worst_g = 0;
  for (const ParamInfo& p : lw.layout.params) {
    const std::vector<float> ref = read_f32(*g, "grad." + p.name);
    ASSERT_EQ(static_cast<int64_t>(ref.size()), p.numel) << p.name;
    double m = 0, e = 0;
    for (int64_t i = 0; i < p.numel; ++i) {
      m = std::max(m, std::fabs(double(ref[i])));
      e = std::max(e, std::fabs(double(lg[p.offset + i]) - ref[i]));
    }
    EXPECT_LE(e / m, 1e-4) << "gradient of " << p.name;
    worst_g = std::max(worst_g, e / m);
  }
  std::printf("%s: max relative adapter gradient error %.3g\n", name.c_str(), worst_g);

  // merge_and_unload's weights, for every projection the adapter touches.
  Weights merged = lw.merged(w);
  int compared = 0;
  for (const HfTensorMap& m : w.layout.hf) {
    if (!g->find("merged." + m.hf_name)) continue;
    const std::vector<float> ref = read_f32(*g, "merged." + m.hf_name);
    const float* ours = merged.param(m.param) + m.offset;
    double e = 0;
    for (size_t i = 0; i < ref.size(); ++i) e = std::max(e, std::fabs(double(ours[i]) - ref[i]));
    EXPECT_LE(e, 1e-5) << m.hf_name;
    compared += m.hf_name.ends_with(".weight");  // Qwen2's q/k/v biases are there too, unchanged
  }
  EXPECT_EQ(compared, 7 * w.config.num_hidden_layers);
}

INSTANTIATE_TEST_SUITE_P(Families, LoraGolden, ::testing::Values("qwen2", "llama3", "qwen3"));

// ---- gradients against finite differences
// --------------------------------------------------------

// L = sum_t a[t] logprob[t] + b[t] entropy[t], accumulated in fp64.
double weighted_loss(const Transformer& m, const PackedBatch& b, const std::vector<float>& wl,
                     const std::vector<float>& we) {
  Activations acts;
  m.forward(b, acts);
  double s = 0;
  for (int64_t t = 0; t < b.num_tokens(); ++t)
    s += double(wl[t]) * acts.logprob[t] + double(we[t]) * acts.entropy[t];
  return s;
}

class LoraFiniteDifference : public ::testing::TestWithParam<std::string> {};

TEST_P(LoraFiniteDifference, AdapterGradientsMatchCentralDifferences) {
  Weights w = Weights::load(kGolden + GetParam());
  LoraWeights lw = random_adapter(w.config, all_linear(3, 6.0), 11, 0.1f);
  Transformer model(w, &lw);
  PackedBatch b = PackedBatch::from_sequences({{3, 17, 200, 5, 99, 31, 2}, {8, 64, 1, 250, 7}});
  const int64_t T = b.num_tokens();
  Rng rng(5);
  std::vector<float> wl(T), we(T);
  for (int64_t t = 0; t < T; ++t) {
    wl[t] = b.targets[t] >= 0 ? rng.normal() : 0.0f;
    we[t] = 0.5f * rng.normal();
  }
  Activations acts;
  model.forward(b, acts);
  std::vector<float> lg(lw.data.size(), 0.0f);
  model.backward(b, acts, wl.data(), we.data(), nullptr, nullptr, {}, nullptr, nullptr,
                 {lg.data(), true});
  // A few coordinates of every A and B.
  const float eps = 1e-2f;
  int checked = 0;
  double worst = 0;
  for (const ParamInfo& p : lw.layout.params) {
    for (int k = 0; k < 3; ++k) {
      const int64_t i = p.offset + static_cast<int64_t>(rng.below(static_cast<uint64_t>(p.numel)));
      const float keep = lw.data[i];
      lw.data[i] = keep + eps;
      const double up = weighted_loss(model, b, wl, we);
      lw.data[i] = keep - eps;
      const double down = weighted_loss(model, b, wl, we);
      lw.data[i] = keep;
      const double fd = (up - down) / (2.0 * eps);
      const double err = std::fabs(fd - lg[i]);
      EXPECT_LE(err, 2e-3 + 1e-2 * std::fabs(fd))
          << p.name << " element " << i - p.offset << ": analytic " << lg[i] << ", fd " << fd;
      worst = std::max(worst, err);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 3 * 2 * 7 * w.config.num_hidden_layers);
  std::printf("%s: worst |fd - analytic| %.3g over %d coordinates\n", GetParam().c_str(), worst,
              checked);
}

INSTANTIATE_TEST_SUITE_P(Families, LoraFiniteDifference, ::testing::Values("qwen2", "qwen3"));

// The input gradient carries the adapters' part: the base's gradients (not frozen) equal central
// differences of a base weight, which moves the loss through the adapters' inputs downstream.
TEST(LoraBackward, BaseGradientsWithAdaptersAndFrozenBaseWritesNone) {
  Weights w = Weights::load(kGolden + "llama3");
  LoraWeights lw = random_adapter(w.config, all_linear(2, 4.0), 3, 0.1f);
  Transformer model(w, &lw);
  PackedBatch b = PackedBatch::from_sequences({{10, 20, 30, 40, 50, 60}, {7, 8, 9}});
  const int64_t T = b.num_tokens();
  std::vector<float> wl(T, 0.0f), we(T, 0.0f);
  for (int64_t t = 0; t < T; ++t) wl[t] = b.targets[t] >= 0 ? 1.0f : 0.0f;
  Activations acts;
  model.forward(b, acts);
  std::vector<float> grads(w.data.size(), 0.0f), lg(lw.data.size(), 0.0f);
  model.backward(b, acts, wl.data(), nullptr, nullptr, grads.data(), {}, nullptr, nullptr,
                 {lg.data(), false});
  std::vector<float> lg_frozen(lw.data.size(), 0.0f);
  model.backward(b, acts, wl.data(), nullptr, nullptr, nullptr, {}, nullptr, nullptr,
                 {lg_frozen.data(), true});
  EXPECT_EQ(lg, lg_frozen);  // the adapters' gradients do not depend on the base's being written
  // Embedding row of token 10 and an attention norm weight of layer 0 (upstream of every adapter).
  const float eps = 1e-2f;
  for (int64_t i : {w.layout.params[w.layout.embed].offset + 10 * w.config.hidden_size + 3,
                    w.layout.params[w.layout.layers[0].attn_norm].offset + 5,
                    w.layout.params[w.layout.layers[1].wgu].offset + 77}) {
    const float keep = w.data[i];
    w.data[i] = keep + eps;
    const double up = weighted_loss(model, b, wl, we);
    w.data[i] = keep - eps;
    const double down = weighted_loss(model, b, wl, we);
    w.data[i] = keep;
    const double fd = (up - down) / (2.0 * eps);
    EXPECT_NEAR(grads[i], fd, 2e-3 + 1e-2 * std::fabs(fd)) << "element " << i;
  }
}

// ---- a fresh adapter is the base model
// -----------------------------------------------------------

TEST(LoraFresh, FreshAdapterGivesTheBaseModelBitwise) {
  for (const std::string name : {"qwen2", "llama3", "qwen3"}) {
    Weights w = Weights::load(kGolden + name);
    LoraWeights lw = LoraWeights::create(w.config, all_linear(8, 16.0));
    lw.init(42);
    // PEFT's init: A uniform in +-1/sqrt(in_features) (not all zero), B zero.
    const ParamInfo& a = lw.layout.params[static_cast<size_t>(lw.a[1][6])];  // down_proj: in = F
    float amax = 0;
    for (int64_t i = 0; i < a.numel; ++i) amax = std::max(amax, std::fabs(lw.data[a.offset + i]));
    EXPECT_LE(amax, 1.0f / std::sqrt(float(w.config.intermediate_size)));
    EXPECT_GT(amax, 0.8f / std::sqrt(float(w.config.intermediate_size)));
    const ParamInfo& bq = lw.layout.params[static_cast<size_t>(lw.b[0][0])];
    for (int64_t i = 0; i < bq.numel; ++i) ASSERT_EQ(lw.data[bq.offset + i], 0.0f);

    const auto seqs = golden_inputs(name);
    PackedBatch batch = PackedBatch::from_sequences(seqs);
    Transformer base(w), adapted(w, &lw);
    Activations ab, aa;
    base.forward(batch, ab);
    adapted.forward(batch, aa);
    for (int64_t t = 0; t < batch.num_tokens(); ++t) {
      ASSERT_EQ(aa.logprob[t], ab.logprob[t]) << name << " token " << t;
      ASSERT_EQ(aa.entropy[t], ab.entropy[t]) << name << " token " << t;
    }
    // The base's gradients too, and B's gradient is nonzero (training can move it).
    std::vector<float> ones(static_cast<size_t>(batch.num_tokens()), 1.0f);
    std::vector<float> gb(w.data.size(), 0.0f), ga(w.data.size(), 0.0f), lg(lw.data.size(), 0.0f);
    base.backward(batch, ab, ones.data(), nullptr, nullptr, gb.data());
    adapted.backward(batch, aa, ones.data(), nullptr, nullptr, ga.data(), {}, nullptr, nullptr,
                     {lg.data(), false});
    EXPECT_EQ(ga, gb) << name;
    double gbmax = 0;
    for (int64_t i = 0; i < bq.numel; ++i)
      gbmax = std::max(gbmax, std::fabs(double(lg[bq.offset + i])));
    EXPECT_GT(gbmax, 1e-4) << name;
  }
}

// ---- PEFT files
// ----------------------------------------------------------------------------------

TEST(LoraFiles, SaveLoadRoundTripIsBitwise) {
  Weights w = Weights::load(kGolden + "qwen2");
  LoraConfig cfg;
  cfg.r = 3;
  cfg.alpha = 5.0;
  cfg.use_rslora = true;
  cfg.target_modules =
      ModuleMatch::parse(nlohmann::json{"q_proj", "o_proj", "up_proj"}, "target_modules", true);
  cfg.exclude_modules =
      ModuleMatch::parse(nlohmann::json{"model.layers.0.mlp.up_proj"}, "exclude_modules", false);
  LoraWeights lw = random_adapter(w.config, cfg, 9);
  test::TempDir tmp("lora_roundtrip");
  lw.save(tmp.str(), "tests/fixtures/golden/qwen2");
  LoraWeights back = LoraWeights::load(tmp.str(), w.config);
  EXPECT_EQ(back.config.r, 3);
  EXPECT_EQ(back.config.alpha, 5.0);
  EXPECT_TRUE(back.config.use_rslora);
  EXPECT_EQ(back.a, lw.a);
  EXPECT_EQ(back.b, lw.b);
  ASSERT_EQ(back.layout.params.size(), lw.layout.params.size());
  for (size_t i = 0; i < lw.layout.params.size(); ++i)
    EXPECT_EQ(back.layout.params[i].name, lw.layout.params[i].name);
  EXPECT_EQ(back.data, lw.data);
  EXPECT_FALSE(back.config.adapts(0, LoraTarget::Up));
  EXPECT_TRUE(back.config.adapts(1, LoraTarget::Up));
  // PEFT reads these keys.
  std::ifstream f(tmp / "adapter_config.json");
  nlohmann::json j = nlohmann::json::parse(f);
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["task_type"], "CAUSAL_LM");
  EXPECT_EQ(j["bias"], "none");
  EXPECT_EQ(j["r"], 3);
  EXPECT_EQ(j["target_modules"], (nlohmann::json{"q_proj", "o_proj", "up_proj"}));
}

// PEFT's own adapter, saved again by us: the same tensor names, shapes and values, and the config
// keys that matter.
TEST(LoraFiles, PeftAdapterSavedAgainKeepsItsTensors) {
  const std::string dir = kLora + "llama3";
  if (!std::filesystem::exists(dir + "/adapter_config.json")) GTEST_SKIP() << dir << " not made";
  Weights w = Weights::load(kGolden + "llama3");
  LoraWeights lw = LoraWeights::load(dir, w.config);
  EXPECT_EQ(lw.config.r, 8);
  EXPECT_TRUE(lw.config.use_rslora);
  EXPECT_FLOAT_EQ(lw.scale(), 16.0f / std::sqrt(8.0f));
  test::TempDir tmp("lora_resave");
  lw.save(tmp.str(), "tests/fixtures/golden/llama3");
  auto theirs = SafetensorsFile::open(dir + "/adapter_model.safetensors");
  auto ours = SafetensorsFile::open((tmp / "adapter_model.safetensors").string());
  ASSERT_EQ(ours->tensors().size(), theirs->tensors().size());
  for (const TensorInfo& t : theirs->tensors()) {
    const TensorInfo* o = ours->find(t.name);
    ASSERT_NE(o, nullptr) << t.name;
    EXPECT_EQ(o->shape, t.shape) << t.name;
    EXPECT_EQ(read_f32(*ours, t.name), read_f32(*theirs, t.name)) << t.name;
  }
  LoraWeights back = LoraWeights::load(tmp.str(), w.config);
  EXPECT_EQ(back.data, lw.data);
  EXPECT_EQ(back.scale(), lw.scale());
}

// Writes a PEFT directory from `lw` with `edit` applied to its adapter_config.json.
template <class F>
void write_edited(const LoraWeights& lw, const std::string& dir, F edit) {
  lw.save(dir);
  std::ifstream in(dir + "/adapter_config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  in.close();
  edit(j);
  std::ofstream(dir + "/adapter_config.json") << j.dump();
}

TEST(LoraFiles, BadConfigsAndTensorsNameTheFile) {
  Weights w = Weights::load(kGolden + "qwen3");
  LoraWeights lw = random_adapter(w.config, all_linear(2, 4.0), 1);
  test::TempDir tmp("lora_bad");
  const std::string dir = tmp.str();
  auto err = [&](auto edit, const std::string& what) {
    write_edited(lw, dir, edit);
    const std::string e = test::expected_error_of([&] { LoraWeights::load(dir, w.config); });
    EXPECT_NE(e.find("adapter_config.json"), std::string::npos) << e;
    EXPECT_NE(e.find(what), std::string::npos) << e;
  };
  err([](nlohmann::json& j) { j["peft_type"] = "PREFIX_TUNING"; }, "peft_type");
  err([](nlohmann::json& j) { j["bias"] = "all"; }, "bias");
  err([](nlohmann::json& j) { j["fan_in_fan_out"] = true; }, "fan_in_fan_out");
  err([](nlohmann::json& j) { j["modules_to_save"] = {"score"}; }, "modules_to_save");
  err([](nlohmann::json& j) { j["use_dora"] = true; }, "use_dora");
  err([](nlohmann::json& j) { j["rank_pattern"] = {{"q_proj", 4}}; }, "rank_pattern");
  err([](nlohmann::json& j) { j["r"] = 0; }, "'r'");
  err([](nlohmann::json& j) { j["target_modules"] = {"embed_tokens"}; }, "embed_tokens");
  err([](nlohmann::json& j) { j.erase("target_modules"); }, "target_modules");

  // Tensors: shapes of another rank, a missing and an unexpected tensor name the safetensors file.
  auto tensor_err = [&](const std::string& what) {
    const std::string e = test::expected_error_of([&] { LoraWeights::load(dir, w.config); });
    EXPECT_NE(e.find("adapter_model.safetensors"), std::string::npos) << e;
    EXPECT_NE(e.find(what), std::string::npos) << e;
  };
  write_edited(lw, dir, [](nlohmann::json& j) { j["r"] = 3; });
  tensor_err("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  write_edited(lw, dir, [](nlohmann::json& j) { j["target_modules"] = {"q_proj"}; });
  tensor_err("unexpected tensor");
  LoraConfig only_q;
  only_q.r = 2;
  only_q.target_modules = ModuleMatch::parse(nlohmann::json{"q_proj"}, "target_modules", true);
  write_edited(LoraWeights::create(w.config, only_q), dir, [](nlohmann::json& j) {
    j["target_modules"] = {"q_proj", "k_proj"};
  });
  tensor_err("missing tensor 'base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight'");
  // An adapter for another model: qwen3's head_dim 24 makes q_proj 96 wide, llama3's 64.
  lw.save(dir);
  Weights llama = Weights::load(kGolden + "llama3");
  const std::string e = test::expected_error_of([&] { LoraWeights::load(dir, llama.config); });
  EXPECT_NE(e.find("adapter_model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("self_attn.q_proj.lora_B.weight' has shape [96, 2], expected [64, 2]"),
            std::string::npos)
      << e;
  // No directory at all.
  EXPECT_NE(test::expected_error_of([&] {
              LoraWeights::load(dir + "/nope", w.config);
            }).find("nope/adapter_config.json"),
            std::string::npos);
}

// ---- merge
// ---------------------------------------------------------------------------------------

// W + scale B A runs the same model as the unmerged adapters (up to rounding).
TEST(LoraMerge, MergedWeightsEqualTheAdaptedModel) {
  for (const std::string name : {"qwen2", "qwen3"}) {
    Weights w = Weights::load(kGolden + name);
    LoraWeights lw = random_adapter(w.config, all_linear(4, 8.0, name == "qwen3"), 2);
    Weights merged = lw.merged(w);
    // Only the adapted projections change; and q_proj of layer 0 by exactly scale * B A.
    const LayerParams& lp = w.layout.layers[0];
    EXPECT_EQ(merged.param(lp.attn_norm)[0], w.param(lp.attn_norm)[0]);
    const float* A = lw.data.data() + lw.layout.params[lw.a[0][1]].offset;  // k_proj
    const float* B = lw.data.data() + lw.layout.params[lw.b[0][1]].offset;
    const int64_t C = w.config.hidden_size, row = w.config.q_dim() + 5, col = 7;
    double d = 0;
    for (int k = 0; k < 4; ++k) d += double(B[5 * 4 + k]) * A[k * C + col];
    EXPECT_NEAR(merged.param(lp.wqkv)[row * C + col] - w.param(lp.wqkv)[row * C + col],
                d * lw.scale(), 1e-5);
    const auto seqs = golden_inputs(name);
    PackedBatch batch = PackedBatch::from_sequences(seqs);
    Transformer m1(merged), m2(w, &lw);
    Activations a1, a2;
    m1.forward(batch, a1);
    m2.forward(batch, a2);
    double worst = 0, moved = 0;
    Transformer base(w);
    Activations a0;
    base.forward(batch, a0);
    for (int64_t t = 0; t < batch.num_tokens(); ++t) {
      worst = std::max(worst, std::fabs(double(a1.logprob[t]) - a2.logprob[t]));
      moved = std::max(moved, std::fabs(double(a0.logprob[t]) - a2.logprob[t]));
    }
    EXPECT_LE(worst, 1e-4) << name;
    EXPECT_GT(moved, 1e-2) << name;
  }
}

// ---- the rollout's step
// --------------------------------------------------------------------------

// Runs `seqs` through the rollout's forward_step over a fresh paged cache (block size 4): step 0
// prefills `prompt` tokens of each, then each step feeds one token of each. Returns, per sequence,
// the logits [V] of each step's last token.
std::vector<std::vector<std::vector<float>>> rollout_steps(
    const Transformer& model, const std::vector<std::vector<int32_t>>& seqs, int64_t prompt,
    int64_t end) {
  const ModelConfig& c = model.weights().config;
  const int64_t bs = 4, per_seq = 4, B = std::ssize(seqs), kvd = c.kv_dim(), V = c.vocab_size;
  const int64_t stride = B * per_seq * bs * kvd;
  std::vector<float> kc(static_cast<size_t>(c.num_hidden_layers * stride), 0.0f), vc = kc;
  std::vector<int32_t> tables(static_cast<size_t>(B * per_seq));
  for (int64_t i = 0; i < B * per_seq; ++i) tables[i] = static_cast<int32_t>(i);
  cpu::StepWorkspace ws;
  std::vector<std::vector<std::vector<float>>> out(static_cast<size_t>(B));
  for (int64_t pos = 0; pos < end;) {
    const int64_t n = pos == 0 ? prompt : 1;
    std::vector<int32_t> ids, positions, cu = {0}, slots, rows;
    for (int64_t s = 0; s < B; ++s) {
      for (int64_t i = pos; i < pos + n; ++i) {
        ids.push_back(seqs[s][i]);
        positions.push_back(static_cast<int32_t>(i));
        slots.push_back(static_cast<int32_t>(s * per_seq * bs + i));
      }
      cu.push_back(static_cast<int32_t>(ids.size()));
      rows.push_back(cu.back() - 1);
    }
    cpu::Tokens t{std::ssize(ids), B, ids.data(), positions.data(), cu.data()};
    cpu::PagedKv kv{kc.data(), vc.data(), stride, bs, slots.data(), tables.data(), per_seq};
    std::vector<float> logits(static_cast<size_t>(B * V));
    model.forward_step(t, kv, rows, logits.data(), ws);
    for (int64_t s = 0; s < B; ++s)
      out[s].emplace_back(logits.begin() + s * V, logits.begin() + (s + 1) * V);
    pos += n;
  }
  return out;
}

// The rollout's forward_step with the adapters: each step's log-prob equals the training
// forward's, and a sequence's logits are bit for bit the same alone as beside another.
TEST(LoraRollout, StepLogprobsEqualTrainingForwardAndStayBatchInvariant) {
  Weights w = Weights::load(kGolden + "qwen2");
  LoraWeights lw = random_adapter(w.config, all_linear(4, 8.0), 21);
  Transformer model(w, &lw), base(w);
  const std::vector<std::vector<int32_t>> seqs = {{5, 9, 200, 31, 7, 88, 14, 3, 61},
                                                  {250, 2, 19, 44, 100, 6, 71}};
  PackedBatch full = PackedBatch::from_sequences(seqs);
  Activations acts, base_acts;
  model.forward(full, acts);
  base.forward(full, base_acts);
  const int64_t prompt = 4, end = 6, V = w.config.vocab_size;
  const auto steps = rollout_steps(model, seqs, prompt, end);
  double worst = 0, moved = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    ASSERT_EQ(steps[s].size(), 3u);
    for (size_t k = 0; k < steps[s].size(); ++k) {
      // Step k's last token is at position prompt - 1 + k; it predicts the next one.
      const int64_t pos = prompt + static_cast<int64_t>(k);
      const std::vector<float>& z = steps[s][k];
      double m = z[0], sum = 0;
      for (int64_t v = 1; v < V; ++v) m = std::max(m, double(z[v]));
      for (int64_t v = 0; v < V; ++v) sum += std::exp(double(z[v]) - m);
      const double lp = double(z[seqs[s][pos]]) - m - std::log(sum);
      const int64_t row = full.cu_seqlens[s] + pos - 1;
      worst = std::max(worst, std::fabs(lp - acts.logprob[row]));
      moved = std::max(moved, std::fabs(lp - base_acts.logprob[row]));
    }
  }
  EXPECT_LE(worst, 1e-5);
  EXPECT_GT(moved, 1e-2);
  const auto alone = rollout_steps(model, {seqs[0]}, prompt, end);
  EXPECT_EQ(alone[0], steps[0]);  // bitwise
}

}  // namespace
}  // namespace verl::model
