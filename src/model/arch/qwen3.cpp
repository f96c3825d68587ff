// Qwen3 (transformers' Qwen3ForCausalLM and its classification variants).
// Recipe: RMSNorm over head_dim on q and k before RoPE (q_norm, k_norm); attention_bias puts a
// bias on q/k/v and o_proj; no MLP bias; head_dim may differ from hidden_size / heads; full
// attention only.
#include "model/arch/arch.h"

namespace verl::model::arch {
namespace {

void read_config(const ConfigReader& r, ModelConfig& c) {
  c.attention_bias = r.get_bool("attention_bias", false);
  c.o_proj_bias = c.attention_bias;
  c.qk_norm = true;
  check_full_attention(r);
}

void write_config(const ModelConfig& c, nlohmann::ordered_json& j) {
  VERL_CHECK(c.o_proj_bias == c.attention_bias && !c.mlp_bias && c.qk_norm,
             "model_config_to_json: Qwen3 has o_proj bias iff attention_bias, no MLP bias, "
             "and q/k norm");
  j["attention_bias"] = c.attention_bias;
  j["use_sliding_window"] = false;
}

void add_layer(LayoutBuilder& b, const ModelConfig& c, int64_t i, LayerParams& lp) {
  const LayerNames n(i);
  const int64_t D = c.head_dim;
  add_attn_norm(b, c, n, lp);
  add_qkv(b, c, n, lp);
  lp.q_norm = b.add_mapped(n.ours + "q_norm", n.hf + "self_attn.q_norm.weight", {D}, true);
  lp.k_norm = b.add_mapped(n.ours + "k_norm", n.hf + "self_attn.k_norm.weight", {D}, true);
  add_o_proj(b, c, n, lp);
  add_dense_mlp(b, c, n, lp);
}

}  // namespace

const FamilySpec& qwen3() {
  static const FamilySpec spec{Family::Qwen3, "Qwen3",      "qwen3",
                               read_config,   write_config, add_layer};
  return spec;
}

}  // namespace verl::model::arch
