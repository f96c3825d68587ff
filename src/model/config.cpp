// config.json parsing, the inverse writer, and RoPE inverse frequencies: the keys every family
// shares. A family's own keys (its layer recipe: biases, q/k norm, sliding-window checks) are read
// and written by its file in model/arch/, as transformers' configuration_*.py and modeling_*.py
// define them; RoPE scaling mirrors modeling_rope_utils.py.
#include "model/config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/file.h"
#include "core/json_depth.h"
#include "model/arch/arch.h"
#include "model/config_reader.h"

namespace verl::model {

using nlohmann::json;

namespace {

// Reads rope type/factors from an old-style `rope_scaling` or a transformers-5 `rope_parameters`
// object (both use the same field names; old files may say "type" instead of "rope_type").
RopeScaling parse_rope(const json& obj, const std::string& source, const std::string& key) {
  VERL_CHECK(obj.is_object(), "{}: key '{}' must be an object or null, got {} {}", source, key,
             obj.type_name(), obj.dump());
  ConfigReader r(obj, source, key + ".");
  std::string type = r.get_string("rope_type", r.get_string("type", "default"));
  RopeScaling rs;
  if (type == "default") {
    rs.type = RopeScaling::Type::None;
  } else if (type == "linear") {
    rs.type = RopeScaling::Type::Linear;
    rs.factor = r.get_double("factor");
  } else if (type == "llama3") {
    rs.type = RopeScaling::Type::Llama3;
    rs.factor = r.get_double("factor");
    rs.low_freq_factor = r.get_double("low_freq_factor");
    rs.high_freq_factor = r.get_double("high_freq_factor");
    rs.original_max_position_embeddings = r.get_int("original_max_position_embeddings");
    VERL_CHECK(rs.high_freq_factor > rs.low_freq_factor && rs.low_freq_factor > 0,
               "{}: {}: llama3 rope needs 0 < low_freq_factor < high_freq_factor, got {} and {}",
               source, key, rs.low_freq_factor, rs.high_freq_factor);
    VERL_CHECK(rs.original_max_position_embeddings > 0,
               "{}: {}.original_max_position_embeddings must be positive", source, key);
  } else {
    VERL_FAIL("{}: unsupported rope type '{}' in '{}' (supported: default, linear, llama3)", source,
              type, key);
  }
  VERL_CHECK(rs.factor > 0, "{}: {}.factor must be positive, got {}", source, key, rs.factor);
  return rs;
}

}  // namespace

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
  check_json_depth(json_text, source);
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    VERL_FAIL("{}: malformed JSON: {}", source, e.what());
  }
  VERL_CHECK(j.is_object(), "{}: config must be a JSON object, got {}", source, j.type_name());
  ConfigReader r(j, source);
  ModelConfig c;

  // Architecture decides family and head; transformers builds the model from it.
  VERL_CHECK(r.has("architectures") && j["architectures"].is_array() &&
                 !j["architectures"].empty() && j["architectures"][0].is_string(),
             "{}: 'architectures' must be a non-empty list of strings (supported: {})", source,
             arch::supported_architectures());
  c.architecture = j["architectures"][0].get<std::string>();
  const arch::FamilySpec* fam = arch::find_architecture(c.architecture, &c.head);
  VERL_CHECK(fam, "{}: unsupported architecture '{}' (supported: {})", source, c.architecture,
             arch::supported_architectures());
  c.family = fam->family;
  c.model_type = r.get_string("model_type", fam->model_type);
  VERL_CHECK(c.model_type == fam->model_type,
             "{}: model_type '{}' does not match architecture '{}' (expected '{}')", source,
             c.model_type, c.architecture, fam->model_type);

  c.vocab_size = r.get_positive_int("vocab_size");
  c.hidden_size = r.get_positive_int("hidden_size");
  c.intermediate_size = r.get_positive_int("intermediate_size");
  c.num_hidden_layers = r.get_positive_int("num_hidden_layers");
  c.num_attention_heads = r.get_positive_int("num_attention_heads");
  c.num_key_value_heads = r.has("num_key_value_heads") ? r.get_positive_int("num_key_value_heads")
                                                       : c.num_attention_heads;
  VERL_CHECK(c.num_attention_heads % c.num_key_value_heads == 0,
             "{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", source,
             c.num_attention_heads, c.num_key_value_heads);
  if (r.has("head_dim")) {
    c.head_dim = r.get_positive_int("head_dim");
  } else {
    VERL_CHECK(
        c.hidden_size % c.num_attention_heads == 0,
        "{}: no 'head_dim' and hidden_size ({}) is not divisible by num_attention_heads ({})",
        source, c.hidden_size, c.num_attention_heads);
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  VERL_CHECK(c.head_dim % 2 == 0, "{}: head_dim must be even for RoPE, got {}", source, c.head_dim);
  c.max_position_embeddings = r.get_positive_int("max_position_embeddings");
  c.rms_norm_eps = r.get_double("rms_norm_eps", 1e-6);
  VERL_CHECK(c.rms_norm_eps > 0, "{}: rms_norm_eps must be positive, got {}", source,
             c.rms_norm_eps);

  // RoPE: transformers 5 writes rope_parameters; older files rope_theta + rope_scaling.
  if (r.has("rope_parameters")) {
    const json& rp = j["rope_parameters"];
    c.rope_scaling = parse_rope(rp, source, "rope_parameters");
    c.rope_theta = ConfigReader(rp, source, "rope_parameters.")
                       .get_double("rope_theta", r.get_double("rope_theta", 10000.0));
  } else {
    c.rope_theta = r.get_double("rope_theta", 10000.0);
    if (r.has("rope_scaling"))
      c.rope_scaling = parse_rope(j["rope_scaling"], source, "rope_scaling");
  }
  VERL_CHECK(c.rope_theta > 0, "{}: rope_theta must be positive, got {}", source, c.rope_theta);

  c.tie_word_embeddings = r.get_bool("tie_word_embeddings", false);
  c.hidden_act = r.get_string("hidden_act", "silu");
  VERL_CHECK(c.hidden_act == "silu", "{}: hidden_act '{}' is not supported (only 'silu')", source,
             c.hidden_act);
  // transformers 5 renamed torch_dtype to dtype.
  c.torch_dtype = r.get_string("dtype", r.get_string("torch_dtype", "float32"));

  // The family's own keys: its layer recipe and checks (model/arch/<family>.cpp).
  fam->read_config(r, c);

  // Classification heads: num_labels is a property in transformers, saved as id2label.
  if (c.head != HeadKind::CausalLM) {
    int64_t from_map = -1;
    if (r.has("id2label")) {
      VERL_CHECK(j["id2label"].is_object(), "{}: key 'id2label' must be an object, got {}", source,
                 j["id2label"].type_name());
      from_map = static_cast<int64_t>(j["id2label"].size());
    }
    if (r.has("num_labels")) {
      c.num_labels = r.get_positive_int("num_labels");
      VERL_CHECK(from_map < 0 || from_map == c.num_labels,
                 "{}: num_labels ({}) disagrees with the {} entries of id2label", source,
                 c.num_labels, from_map);
    } else {
      c.num_labels = from_map > 0 ? from_map : 2;  // PretrainedConfig's default
    }
  }

  if (r.has("eos_token_id")) {
    const json& e = j["eos_token_id"];
    if (e.is_array()) {
      for (size_t i = 0; i < e.size(); ++i) {
        c.eos_token_ids.push_back(r.as_int(e[i], fmt::format("eos_token_id[{}]", i)));
      }
    } else {
      VERL_CHECK(e.is_number_integer(),
                 "{}: key 'eos_token_id' must be an integer, a list of integers or null, got {} {}",
                 source, e.type_name(), e.dump());
      c.eos_token_ids.push_back(r.as_int(e, "eos_token_id"));
    }
  }
  c.bos_token_id = r.get_int("bos_token_id", -1);
  c.pad_token_id = r.get_int("pad_token_id", -1);
  return c;
}

ModelConfig load_model_config(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  return parse_model_config(read_file(path, "model config"), path);
}

namespace {
void merge_json(nlohmann::json& into, const nlohmann::json& from) {
  for (auto it = from.begin(); it != from.end(); ++it) {
    if (it.value().is_object() && into.contains(it.key()) && into[it.key()].is_object()) {
      merge_json(into[it.key()], it.value());
    } else {
      into[it.key()] = it.value();
    }
  }
}
}  // namespace

ModelConfig apply_config_overrides(const std::string& model_dir, const ModelConfig& loaded,
                                   const nlohmann::json& overrides, const std::string& key,
                                   std::vector<std::string>* ignored) {
  if (overrides.is_null() || (overrides.is_object() && overrides.empty())) return loaded;
  VERL_CHECK(overrides.is_object(), "{} must be a mapping of config.json fields, got {}", key,
             overrides.type_name());
  static const char* const kAllowed[] = {"max_position_embeddings", "rope_theta", "rope_scaling",
                                         "rope_parameters", "rms_norm_eps"};
  static const char* const kDropout[] = {"attention_dropout", "hidden_dropout", "resid_pdrop",
                                         "embd_pdrop"};
  static const char* const kIgnored[] = {"attn_implementation", "use_cache"};
  auto in = [](const std::string& k, const auto& list) {
    for (const char* n : list)
      if (k == n) return true;
    return false;
  };
  nlohmann::json keep = nlohmann::json::object();
  for (auto it = overrides.begin(); it != overrides.end(); ++it) {
    const std::string& k = it.key();
    if (in(k, kIgnored)) {
      if (ignored) ignored->push_back(k);
      continue;
    }
    if (in(k, kDropout)) {
      VERL_CHECK(it.value().is_number() && it.value().get<double>() == 0.0,
                 "{}.{}={}: training here has no dropout; only 0 is accepted", key, k,
                 it.value().dump());
      continue;
    }
    VERL_CHECK(in(k, kAllowed),
               "{}.{}: this field cannot be overridden here (it would change the weights or is not "
               "a field verl.cpp reads); overridable: max_position_embeddings, rope_theta, "
               "rope_scaling, rope_parameters, rms_norm_eps (and dropout fields set to 0)",
               key, k);
    keep[k] = it.value();
  }
  if (keep.empty()) return loaded;
  const std::string path = model_dir + "/config.json";
  nlohmann::json j = nlohmann::json::parse(read_file(path, "model config"));
  // A transformers-5 file keeps RoPE in rope_parameters, which the parser prefers: the older
  // spellings of an override go there too (transformers converts them the same way).
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    if (keep.contains("rope_theta")) j["rope_parameters"]["rope_theta"] = keep["rope_theta"];
    if (keep.contains("rope_scaling") && keep["rope_scaling"].is_object()) {
      nlohmann::json rs = keep["rope_scaling"];
      if (rs.contains("type") && !rs.contains("rope_type")) {
        rs["rope_type"] = rs["type"];
        rs.erase("type");
      }
      merge_json(j["rope_parameters"], rs);
      keep.erase("rope_scaling");
    }
  }
  merge_json(j, keep);
  const ModelConfig c = parse_model_config(j.dump(), path + " with " + key);
  // Only the overridable fields move over, so a model loaded as another head (a critic) keeps it.
  ModelConfig out = loaded;
  out.max_position_embeddings = c.max_position_embeddings;
  out.rope_theta = c.rope_theta;
  out.rope_scaling = c.rope_scaling;
  out.rms_norm_eps = c.rms_norm_eps;
  return out;
}

std::string model_config_to_json(const ModelConfig& c) {
  HeadKind head = HeadKind::CausalLM;
  const arch::FamilySpec* fam = arch::find_architecture(c.architecture, &head);
  VERL_CHECK(fam && fam->family == c.family && head == c.head,
             "model_config_to_json: architecture '{}' does not match the config's family/head",
             c.architecture);

  nlohmann::ordered_json j;
  j["architectures"] = {c.architecture};
  j["model_type"] = fam->model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  switch (c.rope_scaling.type) {
    case RopeScaling::Type::None:
      j["rope_scaling"] = nullptr;
      break;
    case RopeScaling::Type::Linear:
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope_scaling.factor}};
      break;
    case RopeScaling::Type::Llama3:
      j["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", c.rope_scaling.factor},
          {"low_freq_factor", c.rope_scaling.low_freq_factor},
          {"high_freq_factor", c.rope_scaling.high_freq_factor},
          {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
      break;
  }
  j["hidden_act"] = c.hidden_act;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  // The family's keys; it refuses a recipe its transformers class cannot express rather than
  // write a config that loads into a different model.
  fam->write_config(c, j);
  j["torch_dtype"] = c.torch_dtype;
  if (c.head != HeadKind::CausalLM) {
    j["num_labels"] = c.num_labels;
    nlohmann::ordered_json id2label, label2id;
    for (int64_t i = 0; i < c.num_labels; ++i) {
      const std::string label = fmt::format("LABEL_{}", i);
      id2label[std::to_string(i)] = label;
      label2id[label] = i;
    }
    j["id2label"] = id2label;
    j["label2id"] = label2id;
  }
  if (c.eos_token_ids.empty()) {
    j["eos_token_id"] = nullptr;
  } else if (c.eos_token_ids.size() == 1) {
    j["eos_token_id"] = c.eos_token_ids[0];
  } else {
    j["eos_token_id"] = c.eos_token_ids;
  }
  j["bos_token_id"] = c.bos_token_id >= 0 ? nlohmann::ordered_json(c.bos_token_id) : nullptr;
  j["pad_token_id"] = c.pad_token_id >= 0 ? nlohmann::ordered_json(c.pad_token_id) : nullptr;
  return j.dump(2) + "\n";
}

std::vector<float> rope_inv_freq(const ModelConfig& cfg) {
  const int64_t dim = cfg.head_dim;
  VERL_CHECK(dim > 0 && dim % 2 == 0, "rope_inv_freq: head_dim must be positive and even, got {}",
             dim);
  // HF: 1 / base ** (arange(0, dim, 2).float() / dim), all in float32.
  const float base = static_cast<float>(cfg.rope_theta);
  std::vector<float> inv(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) {
    float expo = static_cast<float>(2 * i) / static_cast<float>(dim);
    float p = static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(expo)));
    inv[i] = 1.0f / p;
  }
  const RopeScaling& rs = cfg.rope_scaling;
  const float factor = static_cast<float>(rs.factor);
  switch (rs.type) {
    case RopeScaling::Type::None:
      break;
    case RopeScaling::Type::Linear:
      for (float& f : inv) f /= factor;
      break;
    case RopeScaling::Type::Llama3: {
      // transformers `_compute_llama3_parameters` (Llama 3.1): long wavelengths are slowed by
      // `factor`, short ones kept, and the band between is interpolated linearly in 1/wavelen.
      const float old_ctx = static_cast<float>(rs.original_max_position_embeddings);
      const float low = static_cast<float>(rs.low_freq_factor);
      const float high = static_cast<float>(rs.high_freq_factor);
      const float low_freq_wavelen = old_ctx / low;
      const float high_freq_wavelen = old_ctx / high;
      const float two_pi = static_cast<float>(2.0 * M_PI);
      for (float& f : inv) {
        const float wavelen = two_pi / f;
        if (wavelen > low_freq_wavelen) {
          f = f / factor;
        } else if (!(wavelen < high_freq_wavelen)) {
          const float smooth = (old_ctx / wavelen - low) / (high - low);
          f = (1.0f - smooth) * f / factor + smooth * f;
        }
      }
      break;
    }
  }
  return inv;
}

}  // namespace verl::model
