// LoRA adapters: which modules they sit on, their flat layout with PEFT's tensor names, PEFT's
// fresh init, loading and saving PEFT adapter directories, and merging into the base weights.
#include "model/lora.h"

#include <fmt/ranges.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "core/error.h"
#include "core/rng.h"
#include "model/arch/arch.h"
#include "model/config_reader.h"
#include "model/safetensors.h"

namespace verl::model {
namespace {

constexpr LoraTarget kTargets[kNumLoraTargets] = {LoraTarget::Q,   LoraTarget::K,    LoraTarget::V,
                                                  LoraTarget::O,   LoraTarget::Gate, LoraTarget::Up,
                                                  LoraTarget::Down};

std::string all_target_names() {
  std::string s;
  for (LoraTarget t : kTargets) s += std::string(s.empty() ? "" : ", ") + lora_target_name(t);
  return s;
}

std::string module_name(int64_t layer, LoraTarget t) {
  return fmt::format("model.layers.{}.{}", layer, lora_target_path(t));
}

bool is_target_name(const std::string& name) {
  const size_t dot = name.rfind('.');
  const std::string last = dot == std::string::npos ? name : name.substr(dot + 1);
  for (LoraTarget t : kTargets) {
    if (last == lora_target_name(t)) return true;
  }
  return false;
}

std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

}  // namespace

const char* lora_target_name(LoraTarget t) {
  static const char* names[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                "gate_proj", "up_proj", "down_proj"};
  return names[static_cast<int>(t)];
}

const char* lora_target_path(LoraTarget t) {
  static const char* paths[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                "mlp.down_proj"};
  return paths[static_cast<int>(t)];
}

std::string peft_tensor_name(int64_t layer, LoraTarget t, bool is_a) {
  return fmt::format("base_model.model.{}.lora_{}.weight", module_name(layer, t), is_a ? "A" : "B");
}

// ---- which modules ---------------------------------------------------------------------------

bool ModuleMatch::matches(const std::string& module) const {
  if (!regex.empty()) return std::regex_match(module, std::regex(regex));
  for (const std::string& n : names) {
    if (module == n) return true;
    if (module.size() > n.size() && module.ends_with(n) &&
        module[module.size() - n.size() - 1] == '.')
      return true;
  }
  return false;
}

ModuleMatch ModuleMatch::parse(const nlohmann::json& v, const std::string& key,
                               bool all_linear_ok) {
  ModuleMatch m;
  if (v.is_null()) return m;
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (all_linear_ok && s == "all-linear") {
      for (LoraTarget t : kTargets) m.names.push_back(lora_target_name(t));
      return m;
    }
    try {
      std::regex check(s);
    } catch (const std::regex_error& e) {
      VERL_FAIL("{}: '{}' is not a regular expression ({})", key, s, e.what());
    }
    m.regex = s;
    return m;
  }
  VERL_CHECK(v.is_array(), "{} must be a list of module names or a string, got {} {}", key,
             v.type_name(), v.dump());
  for (size_t i = 0; i < v.size(); ++i) {
    VERL_CHECK(v[i].is_string(), "{}[{}] must be a module name, got {}", key, i, v[i].dump());
    std::string n = v[i].get<std::string>();
    // Adapters sit on the seven linear projections of the decoder layers only (no embedding,
    // LM head or value head).
    VERL_CHECK(!all_linear_ok || is_target_name(n),
               "{}: '{}' is not a projection we can adapt ({}, or all-linear)", key, n,
               all_target_names());
    m.names.push_back(std::move(n));
  }
  return m;
}

nlohmann::json ModuleMatch::to_json() const {
  if (!regex.empty()) return regex;
  if (names.empty()) return nullptr;
  return names;
}

// ---- config ----------------------------------------------------------------------------------

float LoraConfig::scale() const {
  const double r_eff = use_rslora ? std::sqrt(static_cast<double>(r)) : static_cast<double>(r);
  return static_cast<float>(alpha / r_eff);
}

bool LoraConfig::adapts(int64_t layer, LoraTarget t) const {
  const std::string m = module_name(layer, t);
  return target_modules.matches(m) && !exclude_modules.matches(m);
}

void LoraConfig::check() const {
  VERL_CHECK(r > 0, "actor_rollout_ref.model.lora_rank must be positive for LoRA, got {}", r);
  VERL_CHECK(std::isfinite(alpha) && alpha > 0,
             "actor_rollout_ref.model.lora_alpha must be positive, got {}", alpha);
  VERL_CHECK(!target_modules.empty(),
             "actor_rollout_ref.model.target_modules is empty: name the projections ({}) or "
             "all-linear",
             all_target_names());
}

// ---- layout ----------------------------------------------------------------------------------

int64_t LoraWeights::in_features(LoraTarget t) const {
  switch (t) {
    case LoraTarget::O:
      return base.q_dim();
    case LoraTarget::Down:
      return base.intermediate_size;
    default:
      return base.hidden_size;
  }
}

int64_t LoraWeights::out_features(LoraTarget t) const {
  switch (t) {
    case LoraTarget::Q:
      return base.q_dim();
    case LoraTarget::K:
    case LoraTarget::V:
      return base.kv_dim();
    case LoraTarget::Gate:
    case LoraTarget::Up:
      return base.intermediate_size;
    default:
      return base.hidden_size;
  }
}

int LoraWeights::base_param(const LayerParams& lp, LoraTarget t) {
  switch (t) {
    case LoraTarget::Q:
    case LoraTarget::K:
    case LoraTarget::V:
      return lp.wqkv;
    case LoraTarget::O:
      return lp.wo;
    case LoraTarget::Gate:
    case LoraTarget::Up:
      return lp.wgu;
    case LoraTarget::Down:
      return lp.wdown;
  }
  return -1;
}

int64_t LoraWeights::base_row0(LoraTarget t) const {
  switch (t) {
    case LoraTarget::K:
      return base.q_dim();
    case LoraTarget::V:
      return base.q_dim() + base.kv_dim();
    case LoraTarget::Up:
      return base.intermediate_size;
    default:
      return 0;
  }
}

LoraWeights LoraWeights::create(const ModelConfig& base, const LoraConfig& cfg) {
  cfg.check();
  LoraWeights lw;
  lw.config = cfg;
  lw.base = base;
  arch::LayoutBuilder b(lw.layout);
  const int64_t r = cfg.r;
  for (int64_t l = 0; l < base.num_hidden_layers; ++l) {
    std::array<int, kNumLoraTargets> a{}, bb{};
    a.fill(-1);
    bb.fill(-1);
    for (LoraTarget t : kTargets) {
      if (!cfg.adapts(l, t)) continue;
      const int i = static_cast<int>(t);
      const std::string na = peft_tensor_name(l, t, true), nb = peft_tensor_name(l, t, false);
      a[i] = b.add_mapped(na, na, {r, lw.in_features(t)});
      bb[i] = b.add_mapped(nb, nb, {lw.out_features(t), r});
    }
    lw.a.push_back(a);
    lw.b.push_back(bb);
  }
  VERL_CHECK(
      !lw.layout.params.empty(),
      "actor_rollout_ref.model.target_modules {} (exclude_modules {}) picks no projection of "
      "the model's {} layers",
      cfg.target_modules.to_json().dump(), cfg.exclude_modules.to_json().dump(),
      base.num_hidden_layers);
  lw.data.assign(static_cast<size_t>(lw.layout.total), 0.0f);
  return lw;
}

void LoraWeights::init(uint64_t seed) {
  for (size_t l = 0; l < a.size(); ++l) {
    for (LoraTarget t : kTargets) {
      const int ia = a[l][static_cast<int>(t)], ib = b[l][static_cast<int>(t)];
      if (ia < 0) continue;
      // torch.nn.init.kaiming_uniform_(a=sqrt(5)): gain sqrt(2 / (1 + 5)), bound
      // gain * sqrt(3 / fan_in) = 1 / sqrt(fan_in).
      const float bound = 1.0f / std::sqrt(static_cast<float>(in_features(t)));
      const ParamInfo& pa = layout.params[ia];
      Rng rng(seed, static_cast<uint64_t>(ia));
      float* x = data.data() + pa.offset;
      for (int64_t j = 0; j < pa.numel; ++j) x[j] = (2.0f * rng.uniform() - 1.0f) * bound;
      const ParamInfo& pb = layout.params[ib];
      std::fill(data.data() + pb.offset, data.data() + pb.offset + pb.numel, 0.0f);
    }
  }
}

// ---- PEFT files ------------------------------------------------------------------------------

LoraWeights LoraWeights::load(const std::string& dir, const ModelConfig& base) {
  const std::string cfg_path = dir + "/adapter_config.json";
  std::ifstream f(cfg_path);
  VERL_CHECK(f.good(), "{}: cannot open (a PEFT adapter directory holds adapter_config.json)",
             cfg_path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    VERL_FAIL("{}: not valid JSON ({})", cfg_path, e.what());
  }
  VERL_CHECK(j.is_object(), "{}: expected a JSON object", cfg_path);
  const ConfigReader rd(j, cfg_path);
  const std::string peft_type = rd.get_string("peft_type", "");
  VERL_CHECK(peft_type == "LORA", "{}: peft_type is '{}'; only LORA adapters are supported",
             cfg_path, peft_type);
  const std::string bias = rd.get_string("bias", "none");
  VERL_CHECK(bias == "none", "{}: bias is '{}'; only \"none\" is supported", cfg_path, bias);
  VERL_CHECK(!rd.get_bool("fan_in_fan_out", false),
             "{}: fan_in_fan_out is true; only false (nn.Linear weights) is supported", cfg_path);
  VERL_CHECK(!rd.get_bool("use_dora", false), "{}: use_dora is true; DoRA is not supported",
             cfg_path);
  VERL_CHECK(!rd.get_bool("lora_bias", false), "{}: lora_bias is true; not supported", cfg_path);
  VERL_CHECK(!rd.get_bool("use_qalora", false), "{}: use_qalora is true; not supported", cfg_path);
  // Keys that would change which tensors exist or how they scale: only their "off" values.
  for (const char* key : {"modules_to_save", "layers_to_transform", "layers_pattern",
                          "layer_replication", "target_parameters", "rank_pattern", "alpha_pattern",
                          "trainable_token_indices", "alora_invocation_tokens"}) {
    const bool off = !rd.has(key) || (j[key].is_array() && j[key].empty()) ||
                     (j[key].is_object() && j[key].empty());
    VERL_CHECK(off, "{}: {} is {}; only null is supported", cfg_path, key, j[key].dump());
  }
  LoraConfig cfg;
  cfg.r = rd.get_positive_int("r");
  cfg.alpha = rd.get_double("lora_alpha", 8.0);
  VERL_CHECK(std::isfinite(cfg.alpha) && cfg.alpha > 0, "{}: lora_alpha must be positive, got {}",
             cfg_path, cfg.alpha);
  cfg.use_rslora = rd.get_bool("use_rslora", false);
  VERL_CHECK(rd.has("target_modules"), "{}: missing key 'target_modules'", cfg_path);
  cfg.target_modules = ModuleMatch::parse(j["target_modules"], cfg_path + ": target_modules", true);
  if (rd.has("exclude_modules")) {
    cfg.exclude_modules =
        ModuleMatch::parse(j["exclude_modules"], cfg_path + ": exclude_modules", false);
  }
  LoraWeights lw;
  try {
    lw = create(base, cfg);
  } catch (const Error& e) {
    VERL_FAIL("{}: {}", cfg_path, e.what());
  }

  const std::string st_path = dir + "/adapter_model.safetensors";
  VERL_CHECK(std::filesystem::exists(st_path), "{}: missing (the adapter's tensors)", st_path);
  std::unique_ptr<SafetensorsFile> st = SafetensorsFile::open(st_path);
  std::set<std::string> used;
  for (const ParamInfo& p : lw.layout.params) {
    const TensorInfo* t = st->find(p.name);
    VERL_CHECK(t != nullptr, "{}: missing tensor '{}' (adapter_config.json targets it)", st_path,
               p.name);
    VERL_CHECK(t->shape == p.shape,
               "{}: tensor '{}' has shape {}, expected {} for r = {} on the base model "
               "(hidden_size {}, intermediate_size {}); the adapter was made for another model",
               st_path, p.name, shape_str(t->shape), shape_str(p.shape), cfg.r, base.hidden_size,
               base.intermediate_size);
    convert_to_f32(lw.data.data() + p.offset, st->data(*t), t->dtype, static_cast<size_t>(p.numel));
    used.insert(p.name);
  }
  for (const TensorInfo& t : st->tensors()) {
    VERL_CHECK(used.count(t.name), "{}: unexpected tensor '{}' (not an adapter that {} asks for)",
               st_path, t.name, cfg_path);
  }
  return lw;
}

void LoraWeights::save(const std::string& dir, const std::string& base_model_name_or_path) const {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  nlohmann::ordered_json j;
  j["alpha_pattern"] = nlohmann::json::object();
  j["base_model_name_or_path"] = base_model_name_or_path;
  j["bias"] = "none";
  j["exclude_modules"] = config.exclude_modules.to_json();
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["layers_pattern"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["lora_alpha"] = config.alpha;
  j["lora_dropout"] = 0.0;
  j["modules_to_save"] = nullptr;
  j["peft_type"] = "LORA";
  j["r"] = config.r;
  j["rank_pattern"] = nlohmann::json::object();
  j["target_modules"] = config.target_modules.to_json();
  j["task_type"] = base.head == HeadKind::CausalLM ? nlohmann::json("CAUSAL_LM") : nullptr;
  j["use_dora"] = false;
  j["use_rslora"] = config.use_rslora;
  const std::string tmp = dir + "/adapter_config.json.tmp";
  {
    std::ofstream f(tmp);
    VERL_CHECK(f.good(), "cannot write {}", tmp);
    f << j.dump(2) << '\n';
    f.close();
    VERL_CHECK(f.good(), "error writing {}", tmp);
  }
  fs::rename(tmp, dir + "/adapter_config.json");
  std::vector<TensorToWrite> out;
  for (const ParamInfo& p : layout.params) {
    out.push_back({p.name, DType::F32, p.shape, data.data() + p.offset});
  }
  write_safetensors(dir + "/adapter_model.safetensors", out);
}

// ---- merge -----------------------------------------------------------------------------------

Weights LoraWeights::merged(const Weights& w) const {
  const ModelConfig& c = w.config;
  VERL_CHECK(c.hidden_size == base.hidden_size && c.intermediate_size == base.intermediate_size &&
                 c.num_hidden_layers == base.num_hidden_layers && c.q_dim() == base.q_dim() &&
                 c.kv_dim() == base.kv_dim(),
             "LoRA merge: the adapter was made for another model shape ({} layers, hidden {}) "
             "than the weights ({} layers, hidden {})",
             base.num_hidden_layers, base.hidden_size, c.num_hidden_layers, c.hidden_size);
  Weights out = w;
  const int64_t r = config.r;
  const float s = scale();
  std::vector<float> delta;
  for (size_t l = 0; l < a.size(); ++l) {
    for (LoraTarget t : kTargets) {
      const int ia = a[l][static_cast<int>(t)];
      if (ia < 0) continue;
      const float* A = data.data() + layout.params[ia].offset;
      const float* B = data.data() + layout.params[b[l][static_cast<int>(t)]].offset;
      const int64_t K = in_features(t), N = out_features(t);
      float* W = out.param(base_param(w.layout.layers[l], t)) + base_row0(t) * K;
      // PEFT: delta = (B @ A) * scaling, then W += delta.
      delta.assign(static_cast<size_t>(K), 0.0f);
      for (int64_t i = 0; i < N; ++i) {
        std::fill(delta.begin(), delta.end(), 0.0f);
        for (int64_t k = 0; k < r; ++k) {
          const float bik = B[i * r + k];
          const float* arow = A + k * K;
          for (int64_t jj = 0; jj < K; ++jj) delta[jj] += bik * arow[jj];
        }
        for (int64_t jj = 0; jj < K; ++jj) W[i * K + jj] += delta[jj] * s;
      }
    }
  }
  return out;
}

}  // namespace verl::model
