// The family registry (model/arch/arch.h) and the layer tables of the family files: every
// supported architecture name finds its family and head and back; each family's layer has its
// recipe's pieces in the flat-buffer order checkpoints depend on, with its HF tensor names; a
// hand-built config whose recipe flags its family does not have is refused.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "model/arch/arch.h"
#include "model/weights.h"

namespace verl::model {
namespace {

TEST(Arch, EveryArchitectureNameFindsItsFamilyAndHead) {
  const std::vector<std::pair<std::string, Family>> families = {
      {"Llama", Family::Llama}, {"Qwen2", Family::Qwen2}, {"Qwen3", Family::Qwen3}};
  const std::vector<std::pair<std::string, HeadKind>> heads = {
      {"ForCausalLM", HeadKind::CausalLM},
      {"ForSequenceClassification", HeadKind::SequenceClassification},
      {"ForTokenClassification", HeadKind::TokenClassification}};
  std::string listed;
  for (const auto& [prefix, fam] : families) {
    for (const auto& [suffix, head] : heads) {
      const std::string name = prefix + suffix;
      HeadKind got = HeadKind::CausalLM;
      const arch::FamilySpec* f = arch::find_architecture(name, &got);
      ASSERT_NE(f, nullptr) << name;
      EXPECT_EQ(f->family, fam) << name;
      EXPECT_EQ(got, head) << name;
      EXPECT_EQ(arch::architecture_name(arch::family(fam), head), name);
      listed += (listed.empty() ? "" : ", ") + name;
    }
  }
  EXPECT_EQ(arch::supported_architectures(), listed);
  EXPECT_EQ(arch::find_architecture("MistralForCausalLM", nullptr), nullptr);
  EXPECT_EQ(arch::find_architecture("Qwen2", nullptr), nullptr);
}

ModelConfig tiny(const std::string& architecture, Family family) {
  ModelConfig c;
  c.architecture = architecture;
  c.family = family;
  c.vocab_size = 11;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 6;
  c.max_position_embeddings = 32;
  return c;
}

std::vector<std::string> layer1_params(const ParamLayout& l) {
  std::vector<std::string> names;
  for (const ParamInfo& p : l.params)
    if (p.name.rfind("layers.1.", 0) == 0) names.push_back(p.name.substr(9));
  return names;
}

std::vector<std::string> layer1_hf(const ParamLayout& l) {
  std::vector<std::string> names;
  for (const HfTensorMap& m : l.hf)
    if (m.hf_name.rfind("model.layers.1.", 0) == 0) names.push_back(m.hf_name.substr(15));
  return names;
}

TEST(Arch, Qwen3LayerHasQkNormAndItsBiasesInOrder) {
  ModelConfig c = tiny("Qwen3ForCausalLM", Family::Qwen3);
  c.qk_norm = true;
  c.attention_bias = c.o_proj_bias = true;
  const ParamLayout l = ParamLayout::build(c);
  EXPECT_EQ(layer1_params(l),
            (std::vector<std::string>{"attn_norm", "wqkv", "bqkv", "q_norm", "k_norm", "wo", "bo",
                                      "mlp_norm", "wgu", "wdown"}));
  EXPECT_EQ(
      layer1_hf(l),
      (std::vector<std::string>{
          "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
          "self_attn.v_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.bias",
          "self_attn.v_proj.bias", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
          "self_attn.o_proj.weight", "self_attn.o_proj.bias", "post_attention_layernorm.weight",
          "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"}));
  // k_proj's rows start after q_proj's (H*D = 12) inside wqkv [12 + 2*6, 8].
  const int wqkv = l.find("layers.1.wqkv");
  for (const HfTensorMap& m : l.hf) {
    if (m.hf_name == "model.layers.1.self_attn.k_proj.weight") {
      EXPECT_EQ(m.param, wqkv);
      EXPECT_EQ(m.offset, 12 * 8);
    }
  }
}

TEST(Arch, LlamaLayerWithMlpBiasAndQwen2WithQkvBias) {
  ModelConfig ll = tiny("LlamaForCausalLM", Family::Llama);
  ll.mlp_bias = true;
  EXPECT_EQ(layer1_params(ParamLayout::build(ll)),
            (std::vector<std::string>{"attn_norm", "wqkv", "wo", "mlp_norm", "wgu", "bgu", "wdown",
                                      "bdown"}));
  ModelConfig q2 = tiny("Qwen2ForTokenClassification", Family::Qwen2);
  q2.head = HeadKind::TokenClassification;
  q2.attention_bias = true;
  const ParamLayout l = ParamLayout::build(q2);
  EXPECT_EQ(layer1_params(l), (std::vector<std::string>{"attn_norm", "wqkv", "bqkv", "wo",
                                                        "mlp_norm", "wgu", "wdown"}));
  // The generic parts around the family's layers.
  EXPECT_EQ(l.params.front().name, "embed");
  EXPECT_EQ(l.params[l.params.size() - 3].name, "final_norm");
  EXPECT_EQ(l.params.back().name, "score_bias");
}

TEST(Arch, RecipeFlagsTheFamilyDoesNotHaveAreRefused) {
  ModelConfig ll = tiny("LlamaForCausalLM", Family::Llama);
  ll.qk_norm = true;  // Llama has no q/k norm: the weights would lack what the decoder reads
  try {
    ParamLayout::build(ll);
    ADD_FAILURE() << "expected verl::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("LlamaForCausalLM"), std::string::npos) << msg;
    EXPECT_NE(msg.find("qk_norm true"), std::string::npos) << msg;
    EXPECT_NE(msg.find("not a Llama layer"), std::string::npos) << msg;
  }
  ModelConfig q3 = tiny("Qwen3ForCausalLM", Family::Qwen3);  // qk_norm left false
  EXPECT_THROW(ParamLayout::build(q3), Error);
}

}  // namespace
}  // namespace verl::model
