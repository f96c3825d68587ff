// LoRA adapters as PEFT defines them (Hu et al. 2021; PEFT's LoraLayer): a projection y = x W^T
// gains scale * (x A^T) B^T with A [r, in], B [out, r], scale = alpha / r (rsLoRA: alpha /
// sqrt(r)). The adapters live in their own flat fp32 buffer with a ParamLayout named as PEFT's
// adapter_model.safetensors names them; PEFT adapter directories load and save here.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace verl::model {

// The seven projections of a decoder layer an adapter can sit on, in HF's module names.
enum class LoraTarget { Q, K, V, O, Gate, Up, Down };
constexpr int kNumLoraTargets = 7;
// "q_proj", ..., "down_proj".
const char* lora_target_name(LoraTarget t);
// The module path inside a layer: "self_attn.q_proj", "mlp.down_proj".
const char* lora_target_path(LoraTarget t);

// Which modules a list or a regex picks, as PEFT matches target_modules / exclude_modules: a
// list entry matches a module whose full name ("model.layers.3.self_attn.q_proj") equals it or
// ends in "." + entry; a string is a regular expression over the whole name.
struct ModuleMatch {
  std::vector<std::string> names;
  std::string regex;  // used when non-empty
  bool empty() const { return names.empty() && regex.empty(); }
  bool matches(const std::string& module) const;
  // From a JSON list of names or a string ("all-linear" when `all_linear_ok`: the seven
  // projections); null gives an empty match. Errors name `key`.
  static ModuleMatch parse(const nlohmann::json& v, const std::string& key, bool all_linear_ok);
  nlohmann::json to_json() const;
};

// The adapter's hyper-parameters (verl's actor_rollout_ref.model.lora_rank / lora_alpha /
// target_modules / exclude_modules; PEFT's r / lora_alpha / target_modules / exclude_modules /
// use_rslora).
struct LoraConfig {
  int64_t r = 0;
  double alpha = 16.0;
  bool use_rslora = false;
  ModuleMatch target_modules;
  ModuleMatch exclude_modules;

  // alpha / r, or alpha / sqrt(r) with use_rslora (Kalajdzievski 2023).
  float scale() const;
  // Whether layer `layer`'s projection `t` carries an adapter.
  bool adapts(int64_t layer, LoraTarget t) const;
  // Range and consistency checks; errors name verl's keys.
  void check() const;
};

// An adapter over one base model: per (layer, target) a lora_A [r, in] and a lora_B [out, r] in one
// flat fp32 buffer. layout.params are named by PEFT's tensor names, e.g.
// "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", and layout.hf maps each
// tensor to itself, so the training state can run AdamW over exactly this layout.
struct LoraWeights {
  LoraConfig config;
  ModelConfig base;  // the base model's config the shapes follow
  ParamLayout layout;
  // Parameter index of A and B of each layer's targets (-1: not adapted).
  std::vector<std::array<int, kNumLoraTargets>> a, b;
  std::vector<float> data;

  // Zero-filled adapters on the modules `cfg` picks (at least one).
  static LoraWeights create(const ModelConfig& base, const LoraConfig& cfg);
  // PEFT's fresh init: A Kaiming-uniform with a = sqrt(5) (bound 1 / sqrt(in_features)), B zero,
  // so the adapted model starts as the base model. Each A draws from its own stream of `seed`.
  void init(uint64_t seed);
  // A PEFT adapter directory (adapter_config.json, adapter_model.safetensors) for a base model of
  // config `base`; what PEFT can express but we do not run is refused naming the key.
  static LoraWeights load(const std::string& dir, const ModelConfig& base);
  // Writes adapter_config.json and adapter_model.safetensors (fp32) that PEFT loads.
  void save(const std::string& dir, const std::string& base_model_name_or_path = "") const;
  // The base weights with every adapter merged in: W' = W + scale * B A (PEFT's merge_and_unload).
  Weights merged(const Weights& w) const;

  float scale() const { return config.scale(); }
  int64_t rank() const { return config.r; }
  // Input and output features of target `t` in the base model.
  int64_t in_features(LoraTarget t) const;
  int64_t out_features(LoraTarget t) const;
  // Where target t's output rows sit inside our (possibly fused) base parameter: the parameter
  // index in `lp` and the first row (q|k|v in wqkv, gate|up in wgu).
  static int base_param(const LayerParams& lp, LoraTarget t);
  int64_t base_row0(LoraTarget t) const;
};

// PEFT's name of a layer's adapter tensor:
// "base_model.model.model.layers.{l}.{path}.lora_{A|B}.weight".
std::string peft_tensor_name(int64_t layer, LoraTarget t, bool is_a);

}  // namespace verl::model
