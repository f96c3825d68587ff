// Qwen2 / Qwen2.5 (transformers' Qwen2ForCausalLM and its classification variants).
// Recipe: the Llama layer with a bias on q/k/v always (Qwen2Attention hard-codes it; the config's
// attention_bias is ignored), none on o_proj or the MLP; no q/k norm; full attention only.
#include "model/arch/arch.h"

namespace verl::model::arch {
namespace {

void read_config(const ConfigReader& r, ModelConfig& c) {
  c.attention_bias = true;
  c.o_proj_bias = false;
  check_full_attention(r);
}

void write_config(const ModelConfig& c, nlohmann::ordered_json& j) {
  VERL_CHECK(c.attention_bias && !c.o_proj_bias && !c.mlp_bias && !c.qk_norm,
             "model_config_to_json: Qwen2 has q/k/v bias only and no q/k norm");
  j["use_sliding_window"] = false;
}

void add_layer(LayoutBuilder& b, const ModelConfig& c, int64_t i, LayerParams& lp) {
  const LayerNames n(i);
  add_attn_norm(b, c, n, lp);
  add_qkv(b, c, n, lp);
  add_o_proj(b, c, n, lp);
  add_dense_mlp(b, c, n, lp);
}

}  // namespace

const FamilySpec& qwen2() {
  static const FamilySpec spec{Family::Qwen2, "Qwen2",      "qwen2",
                               read_config,   write_config, add_layer};
  return spec;
}

}  // namespace verl::model::arch
