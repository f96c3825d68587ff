// The HF config.json fields that change the math of a Llama / Qwen2 / Qwen3 model, parsed and
// validated. Anything missing, of the wrong type or unsupported is an error naming the file and
// key. The keys every family shares are read here; a family's own (its layer recipe: the bias and
// q/k-norm flags below) by its file in model/arch/.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace verl::model {

enum class Family { Llama, Qwen2, Qwen3 };
// What sits on top of the final norm: LM head (causal LM), one score per sequence (reward model,
// *ForSequenceClassification), or one score per token (critic, *ForTokenClassification).
enum class HeadKind { CausalLM, SequenceClassification, TokenClassification };

struct RopeScaling {
  enum class Type { None, Linear, Llama3 } type = Type::None;
  double factor = 1.0;
  // llama3 only
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string architecture;  // e.g. "Qwen2ForCausalLM", as in config.json "architectures"[0]
  std::string model_type;    // "llama", "qwen2", "qwen3"
  Family family = Family::Llama;
  HeadKind head = HeadKind::CausalLM;

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads when absent
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads when absent
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // bias on q/k/v projections (Qwen2: always true; Llama: key)
  bool o_proj_bias = false;     // Llama's attention_bias also puts a bias on o_proj
  bool mlp_bias = false;        // Llama's mlp_bias
  bool qk_norm = false;         // Qwen3: RMSNorm over head_dim on q and k before RoPE
  int64_t num_labels = 1;       // classification heads
  std::string hidden_act = "silu";
  std::string torch_dtype = "float32";  // as stored; informational

  std::vector<int64_t> eos_token_ids;  // config "eos_token_id" (int or list)
  int64_t bos_token_id = -1;
  int64_t pad_token_id = -1;

  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
};

// Parses config.json text; `source` names the file in errors.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);
// Reads DIR/config.json.
ModelConfig load_model_config(const std::string& model_dir);
// verl's model.override_config (`key` names it in errors): DIR/config.json with `overrides` (a JSON
// object) merged in, nested objects key by key, as transformers' from_pretrained(**kwargs) sets
// them, parsed again. Only fields that leave the weights as they are may change
// (max_position_embeddings, rope_theta, rope_scaling, rope_parameters, rms_norm_eps); dropout
// fields (attention_dropout, hidden_dropout, resid_pdrop, embd_pdrop) must be 0, as training here
// has no dropout; attn_implementation and use_cache change nothing here and are listed in
// `ignored`. Anything else is refused naming the field. `loaded` comes back with those fields
// replaced (its head and shapes kept); an empty object gives it back unchanged.
ModelConfig apply_config_overrides(const std::string& model_dir, const ModelConfig& loaded,
                                   const nlohmann::json& overrides, const std::string& key,
                                   std::vector<std::string>* ignored = nullptr);
// Writes a config.json that transformers loads back to the same ModelConfig.
std::string model_config_to_json(const ModelConfig& cfg);

// RoPE inverse frequencies (head_dim/2 entries) after rope_scaling, as HF's ROPE_INIT_FUNCTIONS.
std::vector<float> rope_inv_freq(const ModelConfig& cfg);

}  // namespace verl::model
