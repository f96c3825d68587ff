// config.json parsing: real configs of the supported families (fixtures copied from the HF hub
// files), the transformers-5 rope_parameters spelling, RoPE inverse frequencies checked against an
// independent double-precision computation, every rejection path, and to_json -> parse round trips.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "../common/test_util.h"
#include "core/error.h"
#include "model/config.h"

namespace verl::model {
namespace {

using nlohmann::json;

std::string fixture_path(const std::string& name) {
  return std::string(VERL_SOURCE_DIR) + "/tests/fixtures/configs/" + name;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

ModelConfig load_fixture(const std::string& name) {
  return parse_model_config(read_text(fixture_path(name)), name);
}

// The Qwen2.5 fixture with an edit applied, as JSON text.
std::string qwen2_with(const std::function<void(json&)>& edit) {
  json j = json::parse(read_text(fixture_path("qwen2.5-0.5b.json")));
  edit(j);
  return j.dump();
}

std::string error_of(const std::string& text, const std::string& source = "cfg/config.json") {
  try {
    parse_model_config(text, source);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected verl::Error for " << text;
  return "";
}

void expect_contains(const std::string& msg, const std::vector<const char*>& parts) {
  for (const char* p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

// Unscaled HF inverse frequencies, in double.
double base_inv(double theta, int i, int dim) {
  return 1.0 / std::pow(theta, 2.0 * i / dim);
}

void expect_rel_near(float got, double want, double rel, const std::string& what) {
  EXPECT_LE(std::fabs(got - want), rel * std::fabs(want))
      << what << ": got " << got << " want " << want;
}

TEST(ModelConfig, Qwen25HasTiedEmbeddingsAndQkvBias) {
  ModelConfig c = load_fixture("qwen2.5-0.5b.json");
  EXPECT_EQ(c.architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(c.model_type, "qwen2");
  EXPECT_EQ(c.family, Family::Qwen2);
  EXPECT_EQ(c.head, HeadKind::CausalLM);
  EXPECT_EQ(c.vocab_size, 151936);
  EXPECT_EQ(c.hidden_size, 896);
  EXPECT_EQ(c.intermediate_size, 4864);
  EXPECT_EQ(c.num_hidden_layers, 24);
  EXPECT_EQ(c.num_attention_heads, 14);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 64);  // derived: 896 / 14
  EXPECT_EQ(c.q_dim(), 896);
  EXPECT_EQ(c.kv_dim(), 128);
  EXPECT_EQ(c.max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::None);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{151643});
  EXPECT_EQ(c.bos_token_id, 151643);
  EXPECT_EQ(c.pad_token_id, -1);

  std::vector<float> inv = rope_inv_freq(c);
  ASSERT_EQ(inv.size(), 32u);
  EXPECT_EQ(inv[0], 1.0f);
  for (int i = 0; i < 32; ++i)
    expect_rel_near(inv[i], base_inv(1e6, i, 64), 1e-6, std::to_string(i));
}

TEST(ModelConfig, Llama32HasLlama3RopeAndEosList) {
  ModelConfig c = load_fixture("llama-3.2-1b-instruct.json");
  EXPECT_EQ(c.family, Family::Llama);
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(c.bos_token_id, 128000);
  ASSERT_EQ(c.rope_scaling.type, RopeScaling::Type::Llama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);

  // Independent double-precision llama3 scaling. With theta=5e5, D=64 the wavelength bands are:
  // i <= 14 shorter than 8192/4 (kept), 15..17 in between (smoothed), i >= 18 longer than 8192
  // (divided by 32).
  std::vector<float> inv = rope_inv_freq(c);
  ASSERT_EQ(inv.size(), 32u);
  int kept = 0, smoothed = 0, divided = 0;
  for (int i = 0; i < 32; ++i) {
    const double b = base_inv(500000.0, i, 64);
    const double wavelen = 2 * M_PI / b;
    double want;
    if (wavelen < 8192.0 / 4.0) {
      want = b;
      ++kept;
    } else if (wavelen > 8192.0 / 1.0) {
      want = b / 32.0;
      ++divided;
    } else {
      const double s = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      want = (1 - s) * b / 32.0 + s * b;
      ++smoothed;
    }
    expect_rel_near(inv[i], want, 1e-5, "inv_freq[" + std::to_string(i) + "]");
  }
  EXPECT_EQ(kept, 15);
  EXPECT_EQ(smoothed, 3);
  EXPECT_EQ(divided, 14);
  // Literal values (from the same formula in Python's float64), three per band.
  expect_rel_near(inv[1], 0.6636012376960885, 1e-6, "high 1");
  expect_rel_near(inv[5], 0.12868737343265052, 1e-6, "high 5");
  expect_rel_near(inv[14], 0.0032114459947525913, 1e-6, "high 14");
  expect_rel_near(inv[15], 0.001290547928209264, 1e-5, "mid 15");
  expect_rel_near(inv[16], 0.00042955679655936815, 1e-5, "mid 16");
  expect_rel_near(inv[17], 9.70828780262767e-05, 1e-5, "mid 17");
  expect_rel_near(inv[18], 1.9461638184831125e-05, 1e-6, "low 18");
  expect_rel_near(inv[25], 1.102883668639601e-06, 1e-6, "low 25");
  expect_rel_near(inv[31], 9.418306725434909e-08, 1e-6, "low 31");
}

TEST(ModelConfig, Qwen3HasExplicitHeadDimAndQkNorm) {
  ModelConfig c = load_fixture("qwen3-0.6b.json");
  EXPECT_EQ(c.family, Family::Qwen3);
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.head_dim, 128);  // not 1024 / 16
  EXPECT_EQ(c.q_dim(), 2048);
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_EQ(c.num_hidden_layers, 28);
  EXPECT_EQ(c.intermediate_size, 3072);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.o_proj_bias);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);                      // written as the integer 1000000
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::None);  // "rope_scaling": null
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{151645});
  EXPECT_EQ(rope_inv_freq(c).size(), 64u);
}

TEST(ModelConfig, Transformers5RopeParameters) {
  ModelConfig c = load_fixture("llama-3.1-8b-tf5.json");
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  ASSERT_EQ(c.rope_scaling.type, RopeScaling::Type::Llama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.torch_dtype, "bfloat16");  // "dtype", the transformers-5 name
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.pad_token_id, -1);  // null
  EXPECT_EQ(c.head_dim, 128);
  std::vector<float> inv = rope_inv_freq(c);
  // Longest wavelength: divided by factor 8; shortest kept.
  expect_rel_near(inv[63], base_inv(500000.0, 63, 128) / 8.0, 1e-6, "inv[63]");
  EXPECT_EQ(inv[0], 1.0f);

  // Default rope in transformers-5 spelling, plus the per-layer attention list.
  ModelConfig q = parse_model_config(
      qwen2_with([](json& j) {
        j.erase("rope_theta");
        j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 250000.0}};
        j["layer_types"] = json::array();
        for (int i = 0; i < 24; ++i) j["layer_types"].push_back("full_attention");
      }),
      "tf5-qwen2");
  EXPECT_DOUBLE_EQ(q.rope_theta, 250000.0);
  EXPECT_EQ(q.rope_scaling.type, RopeScaling::Type::None);
}

TEST(ModelConfig, LinearRopeAndOldTypeKey) {
  ModelConfig c = parse_model_config(qwen2_with([](json& j) {
                                       j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
                                     }),
                                     "lin");
  ASSERT_EQ(c.rope_scaling.type, RopeScaling::Type::Linear);
  std::vector<float> inv = rope_inv_freq(c);
  for (int i : {0, 7, 31})
    expect_rel_near(inv[i], base_inv(1e6, i, 64) / 4.0, 1e-6, std::to_string(i));
}

TEST(ModelConfig, BiasRulesPerFamily) {
  json llama = json::parse(read_text(fixture_path("llama-3.2-1b-instruct.json")));
  llama["attention_bias"] = true;
  llama["mlp_bias"] = true;
  ModelConfig l = parse_model_config(llama.dump(), "llama");
  EXPECT_TRUE(l.attention_bias);
  EXPECT_TRUE(l.o_proj_bias);
  EXPECT_TRUE(l.mlp_bias);

  json qwen3 = json::parse(read_text(fixture_path("qwen3-0.6b.json")));
  qwen3["attention_bias"] = true;
  ModelConfig q3 = parse_model_config(qwen3.dump(), "qwen3");
  EXPECT_TRUE(q3.attention_bias);
  EXPECT_TRUE(q3.o_proj_bias);
  EXPECT_FALSE(q3.mlp_bias);

  // Qwen2 ignores attention_bias: its q/k/v bias is hard-coded.
  ModelConfig q2 =
      parse_model_config(qwen2_with([](json& j) { j["attention_bias"] = false; }), "q2");
  EXPECT_TRUE(q2.attention_bias);
  EXPECT_FALSE(q2.o_proj_bias);
}

TEST(ModelConfig, ClassificationHeads) {
  ModelConfig t = parse_model_config(qwen2_with([](json& j) {
                                       j["architectures"] = {"Qwen2ForTokenClassification"};
                                       j["id2label"] = {{"0", "LABEL_0"}};
                                     }),
                                     "critic");
  EXPECT_EQ(t.head, HeadKind::TokenClassification);
  EXPECT_EQ(t.num_labels, 1);

  ModelConfig s = parse_model_config(qwen2_with([](json& j) {
                                       j["architectures"] = {"Qwen2ForSequenceClassification"};
                                       j["num_labels"] = 3;
                                     }),
                                     "rm");
  EXPECT_EQ(s.head, HeadKind::SequenceClassification);
  EXPECT_EQ(s.num_labels, 3);

  // Neither given: transformers' PretrainedConfig default of 2.
  ModelConfig d = parse_model_config(
      qwen2_with([](json& j) { j["architectures"] = {"Qwen2ForSequenceClassification"}; }), "rm2");
  EXPECT_EQ(d.num_labels, 2);

  std::string msg = error_of(qwen2_with([](json& j) {
    j["architectures"] = {"Qwen2ForSequenceClassification"};
    j["num_labels"] = 1;
    j["id2label"] = {{"0", "A"}, {"1", "B"}};
  }));
  expect_contains(msg, {"cfg/config.json", "num_labels", "id2label"});
}

TEST(ModelConfig, Rejections) {
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    std::vector<const char*> expect;
  };
  std::vector<Case> cases = {
      {"mistral",
       [](json& j) { j["architectures"] = {"MistralForCausalLM"}; },
       {"MistralForCausalLM", "unsupported architecture", "Qwen3ForTokenClassification"}},
      {"gpt2", [](json& j) { j["architectures"] = {"GPT2LMHeadModel"}; }, {"GPT2LMHeadModel"}},
      {"no architectures",
       [](json& j) { j.erase("architectures"); },
       {"architectures", "LlamaForCausalLM"}},
      {"string int",
       [](json& j) { j["hidden_size"] = "896"; },
       {"'hidden_size'", "integer", "string"}},
      {"float int",
       [](json& j) { j["num_hidden_layers"] = 24.5; },
       {"'num_hidden_layers'", "integer"}},
      {"string double", [](json& j) { j["rms_norm_eps"] = "1e-6"; }, {"'rms_norm_eps'", "number"}},
      {"string bool",
       [](json& j) { j["tie_word_embeddings"] = "true"; },
       {"'tie_word_embeddings'", "boolean"}},
      {"bad eos", [](json& j) { j["eos_token_id"] = "</s>"; }, {"'eos_token_id'"}},
      {"bad eos entry",
       [](json& j) {
         j["eos_token_id"] = {1, "x"};
       },
       {"eos_token_id[1]"}},
      {"missing vocab", [](json& j) { j.erase("vocab_size"); }, {"'vocab_size'", "missing"}},
      {"zero head_dim", [](json& j) { j["head_dim"] = 0; }, {"'head_dim'", "positive"}},
      {"kv heads",
       [](json& j) { j["num_key_value_heads"] = 4; },
       {"num_attention_heads (14)", "num_key_value_heads (4)"}},
      {"head_dim not derivable", [](json& j) { j["hidden_size"] = 900; }, {"head_dim", "900"}},
      {"sliding window",
       [](json& j) { j["use_sliding_window"] = true; },
       {"sliding window attention is not supported"}},
      {"sliding layer type",
       [](json& j) {
         j["layer_types"] = {"full_attention", "sliding_attention"};
       },
       {"sliding window attention is not supported", "layer_types[1]"}},
      {"yarn",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
       },
       {"'yarn'", "rope_scaling"}},
      {"dynamic tf5",
       [](json& j) {
         j["rope_parameters"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
       },
       {"'dynamic'", "rope_parameters"}},
      {"llama3 missing key",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
       },
       {"rope_scaling.low_freq_factor"}},
      {"linear string factor",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", "2"}};
       },
       {"rope_scaling.factor", "number"}},
      {"gelu", [](json& j) { j["hidden_act"] = "gelu"; }, {"'gelu'", "silu"}},
      {"model_type mismatch",
       [](json& j) { j["model_type"] = "llama"; },
       {"model_type", "'qwen2'"}},
  };
  for (const Case& c : cases) {
    std::string msg = error_of(qwen2_with(c.edit));
    SCOPED_TRACE(c.what);
    expect_contains(msg, {"cfg/config.json"});
    expect_contains(msg, c.expect);
  }
  expect_contains(error_of("{\"architectures\": [\"LlamaForCausalLM\",]}"),
                  {"cfg/config.json", "malformed JSON", "line 1"});
  expect_contains(error_of("[]"), {"cfg/config.json", "object"});
}

void expect_same(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.architecture, b.architecture);
  EXPECT_EQ(a.model_type, b.model_type);
  EXPECT_EQ(a.family, b.family);
  EXPECT_EQ(a.head, b.head);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);  // exact: JSON numbers round-trip doubles
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_EQ(a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor);
  EXPECT_EQ(a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor);
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings,
            b.rope_scaling.original_max_position_embeddings);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
  EXPECT_EQ(a.o_proj_bias, b.o_proj_bias);
  EXPECT_EQ(a.mlp_bias, b.mlp_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.num_labels, b.num_labels);
  EXPECT_EQ(a.hidden_act, b.hidden_act);
  EXPECT_EQ(a.torch_dtype, b.torch_dtype);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.pad_token_id, b.pad_token_id);
}

TEST(ModelConfig, ToJsonRoundTrip) {
  std::vector<ModelConfig> cfgs;
  for (const char* f : {"qwen2.5-0.5b.json", "llama-3.2-1b-instruct.json", "qwen3-0.6b.json",
                        "llama-3.1-8b-tf5.json"}) {
    cfgs.push_back(load_fixture(f));
  }
  cfgs.push_back(parse_model_config(qwen2_with([](json& j) {
                                      j["architectures"] = {"Qwen2ForTokenClassification"};
                                      j["num_labels"] = 1;
                                      j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.5}};
                                      j["eos_token_id"] = nullptr;
                                      j["pad_token_id"] = 7;
                                    }),
                                    "critic"));
  json llama = json::parse(read_text(fixture_path("llama-3.2-1b-instruct.json")));
  llama["architectures"] = {"LlamaForSequenceClassification"};
  llama["attention_bias"] = true;
  llama["mlp_bias"] = true;
  llama["rms_norm_eps"] = 1.234567890123e-5;
  cfgs.push_back(parse_model_config(llama.dump(), "rm"));

  for (const ModelConfig& c : cfgs) {
    SCOPED_TRACE(c.architecture);
    std::string text = model_config_to_json(c);
    ModelConfig back = parse_model_config(text, "roundtrip");
    expect_same(c, back);
    json j = json::parse(text);
    // Keys transformers needs to rebuild the same model.
    EXPECT_EQ(j["architectures"][0], c.architecture);
    EXPECT_EQ(j["head_dim"], c.head_dim);
    if (c.head != HeadKind::CausalLM) {
      EXPECT_EQ(j["id2label"].size(), static_cast<size_t>(c.num_labels));
      EXPECT_EQ(j["label2id"]["LABEL_0"], 0);
    }
  }

  // A combination transformers cannot express is refused, not silently changed.
  ModelConfig bad = cfgs[0];
  bad.o_proj_bias = true;
  EXPECT_THROW(model_config_to_json(bad), Error);
}

TEST(ModelConfig, LoadFromDirectory) {
  namespace fs = std::filesystem;
  const test::TempDir scratch("model_io_cfg");
  const fs::path& dir = scratch.path();
  std::ofstream(dir / "config.json") << read_text(fixture_path("qwen3-0.6b.json"));
  ModelConfig c = load_model_config(dir.string());
  EXPECT_EQ(c.head_dim, 128);
  fs::remove_all(dir);  // now without its config.json
  try {
    load_model_config(dir.string());
    ADD_FAILURE() << "expected an error for a missing config.json";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "config.json").string()), std::string::npos)
        << e.what();
  }
}

// verl's model.override_config: config.json's fields replaced before parsing, only those that
// leave the weights alone; the rest refused by field.
TEST(ConfigOverrides, FieldsThatKeepTheWeights) {
  test::TempDir dir("overrides");
  std::filesystem::copy_file(fixture_path("qwen2.5-0.5b.json"), dir / "config.json");
  const ModelConfig base = load_model_config(dir.str());
  EXPECT_EQ(apply_config_overrides(dir.str(), base, json::object(), "k").max_position_embeddings,
            base.max_position_embeddings);
  std::vector<std::string> ignored;
  const ModelConfig c =
      apply_config_overrides(dir.str(), base,
                             json{{"max_position_embeddings", 65536},
                                  {"rope_scaling", {{"type", "linear"}, {"factor", 2.0}}},
                                  {"rms_norm_eps", 1e-5},
                                  {"attention_dropout", 0.0},
                                  {"attn_implementation", "flash_attention_2"}},
                             "actor_rollout_ref.model.override_config", &ignored);
  EXPECT_EQ(c.max_position_embeddings, 65536);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::Linear);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 2.0);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, base.rope_theta);
  EXPECT_EQ(c.hidden_size, base.hidden_size);
  EXPECT_EQ(ignored, std::vector<std::string>{"attn_implementation"});
  // A head the model was loaded as (a critic) is kept.
  ModelConfig critic = base;
  critic.head = HeadKind::TokenClassification;
  EXPECT_EQ(
      apply_config_overrides(dir.str(), critic, json{{"max_position_embeddings", 4096}}, "k").head,
      HeadKind::TokenClassification);

  // transformers 5 keeps RoPE in rope_parameters: rope_theta goes there too.
  test::TempDir tf5("overrides_tf5");
  std::filesystem::copy_file(fixture_path("llama-3.1-8b-tf5.json"), tf5 / "config.json");
  const ModelConfig l = load_model_config(tf5.str());
  EXPECT_DOUBLE_EQ(l.rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(
      apply_config_overrides(tf5.str(), l, json{{"rope_theta", 1000000.0}}, "k").rope_theta,
      1000000.0);

  auto error = [&](const json& o) {
    try {
      apply_config_overrides(dir.str(), base, o, "actor_rollout_ref.model.override_config");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error(json{{"hidden_size", 1024}})
                .find("actor_rollout_ref.model.override_config.hidden_size: this field cannot be "
                      "overridden"),
            std::string::npos);
  EXPECT_NE(error(json{{"attention_dropout", 0.1}}).find("only 0 is accepted"), std::string::npos);
  EXPECT_NE(error(json{{"max_position_embeddings", -1}}).find("max_position_embeddings"),
            std::string::npos);
  EXPECT_NE(error(json::array({1})).find("must be a mapping"), std::string::npos);
}

}  // namespace
}  // namespace verl::model
