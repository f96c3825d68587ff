// Llama 2 / 3 (transformers' LlamaForCausalLM and its classification variants).
// Recipe: attention_bias puts a bias on q/k/v and on o_proj; mlp_bias on gate/up/down; no q/k norm.
// RoPE scaling (linear, llama3) and tied embeddings are read by the generic parser.
#include "model/arch/arch.h"

namespace verl::model::arch {
namespace {

void read_config(const ConfigReader& r, ModelConfig& c) {
  c.attention_bias = r.get_bool("attention_bias", false);
  c.o_proj_bias = c.attention_bias;
  c.mlp_bias = r.get_bool("mlp_bias", false);
}

void write_config(const ModelConfig& c, nlohmann::ordered_json& j) {
  VERL_CHECK(c.o_proj_bias == c.attention_bias && !c.qk_norm,
             "model_config_to_json: Llama has o_proj bias iff attention_bias and no q/k norm");
  j["attention_bias"] = c.attention_bias;
  j["mlp_bias"] = c.mlp_bias;
}

void add_layer(LayoutBuilder& b, const ModelConfig& c, int64_t i, LayerParams& lp) {
  const LayerNames n(i);
  add_attn_norm(b, c, n, lp);
  add_qkv(b, c, n, lp);
  add_o_proj(b, c, n, lp);
  add_dense_mlp(b, c, n, lp);
}

}  // namespace

const FamilySpec& llama() {
  static const FamilySpec spec{Family::Llama, "Llama",      "llama",
                               read_config,   write_config, add_layer};
  return spec;
}

}  // namespace verl::model::arch
