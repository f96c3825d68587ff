// The Qwen2-shaped model the CPU benchmarks run (and their PyTorch peers mirror): tied
// embeddings, q/k/v bias, GQA, rope theta 1e6.
#pragma once

#include "model/config.h"

namespace verl::bench {

inline model::ModelConfig qwen2_shape(int64_t vocab, int64_t hidden, int64_t layers, int64_t heads,
                                      int64_t kv_heads, int64_t intermediate) {
  model::ModelConfig c;
  c.architecture = "Qwen2ForCausalLM";
  c.model_type = "qwen2";
  c.family = model::Family::Qwen2;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.max_position_embeddings = 32768;
  c.rope_theta = 1000000.0;
  c.attention_bias = true;
  c.tie_word_embeddings = true;
  return c;
}

}  // namespace verl::bench
