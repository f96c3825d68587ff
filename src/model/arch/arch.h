// The model families, one file each in model/arch/ (llama.cpp, qwen2.cpp, qwen3.cpp): the
// config.json keys a family reads (its layer recipe: q/k/v, o and MLP biases, q/k norm) with its
// defaults and checks, the keys it writes back, and the HF tensor-name table of its decoder layer.
// A registry finds a family by HF architecture name; config.cpp and weights.cpp keep the generic
// parts. docs/adding_a_model_family.md says what a new family takes.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"
#include "model/config_reader.h"
#include "model/weights.h"

namespace verl::model::arch {

// Appends parameters to a ParamLayout and maps HF tensors onto row ranges of them. The order of
// add() calls is the flat buffer's order (checkpoints depend on it); the order of map() calls is
// the HF save order.
class LayoutBuilder {
 public:
  explicit LayoutBuilder(ParamLayout& l) : l_(l) {}

  int add(const std::string& name, std::vector<int64_t> shape, bool no_decay = false);
  // Maps an HF tensor of shape hf_shape at row `row0` of parameter `param`.
  void map(const std::string& hf_name, std::vector<int64_t> hf_shape, int param, int64_t row0);
  // A parameter that is exactly one HF tensor.
  int add_mapped(const std::string& name, const std::string& hf_name, std::vector<int64_t> shape,
                 bool no_decay = false);

 private:
  ParamLayout& l_;
};

// Parameter name prefixes of decoder layer i: ours "layers.{i}." and HF "model.layers.{i}.".
struct LayerNames {
  explicit LayerNames(int64_t i);
  std::string ours, hf;
};

// The pieces of the HF Llama-style decoder layer that the families share (llama.cpp's shared
// builders). Each adds its parameters and maps the HF tensors into them, reading the recipe
// flags of `c`:
//   attn_norm  <- input_layernorm.weight
//   wqkv       <- self_attn.{q,k,v}_proj.weight rows, bqkv <- .bias  (c.attention_bias)
//   wo         <- self_attn.o_proj.weight, bo <- .bias                (c.o_proj_bias)
//   mlp_norm   <- post_attention_layernorm.weight
//   wgu        <- mlp.{gate,up}_proj.weight rows, bgu <- .bias        (c.mlp_bias)
//   wdown      <- mlp.down_proj.weight, bdown <- .bias                (c.mlp_bias)
void add_attn_norm(LayoutBuilder& b, const ModelConfig& c, const LayerNames& n, LayerParams& lp);
void add_qkv(LayoutBuilder& b, const ModelConfig& c, const LayerNames& n, LayerParams& lp);
void add_o_proj(LayoutBuilder& b, const ModelConfig& c, const LayerNames& n, LayerParams& lp);
// The feed-forward block: post-attention norm and the dense SwiGLU MLP.
void add_dense_mlp(LayoutBuilder& b, const ModelConfig& c, const LayerNames& n, LayerParams& lp);

// Qwen2 / Qwen3 configs may ask for sliding-window attention (use_sliding_window, layer_types);
// we run full attention only, so either is an error naming the key.
void check_full_attention(const ConfigReader& r);

// What one family's file tells the generic code.
struct FamilySpec {
  Family family;
  const char* name;        // "Qwen2": its architectures are Qwen2ForCausalLM, ...
  const char* model_type;  // config.json "model_type"
  // Reads the family's own keys into `c` (the layer recipe) with their defaults and checks.
  void (*read_config)(const ConfigReader& r, ModelConfig& c);
  // Refuses a recipe the family's transformers class cannot express, then writes its own keys.
  void (*write_config)(const ModelConfig& c, nlohmann::ordered_json& j);
  // Decoder layer i's HF tensor-name table: adds its parameters in flat-buffer order.
  void (*add_layer)(LayoutBuilder& b, const ModelConfig& c, int64_t i, LayerParams& lp);
};

const FamilySpec& llama();
const FamilySpec& qwen2();
const FamilySpec& qwen3();

// The family of `f`.
const FamilySpec& family(Family f);
// The family and head of an HF architecture name ("Qwen2ForTokenClassification"); null when
// unsupported.
const FamilySpec* find_architecture(std::string_view name, HeadKind* head);
// "<family>For<head>", the name transformers builds the model from.
std::string architecture_name(const FamilySpec& f, HeadKind head);
// Every supported architecture name, comma-separated (for errors).
std::string supported_architectures();

}  // namespace verl::model::arch
