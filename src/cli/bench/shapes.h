// The model shapes the benchmarks run with random weights: the real HF configs of Qwen2.5-0.5B /
// 1.5B / 7B (`verl bench train --shape`, mirrored by tools/bench_train_hf.py) and `tiny`, the
// 12.6M-parameter shape of the CPU benchmarks (bench/*.cpp and their PyTorch peers).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "model/config.h"
#include "model/weights.h"

namespace verl::cli {

// A Qwen2 causal LM: q/k/v bias, GQA, SwiGLU, RMSNorm eps 1e-6, RoPE theta 1e6 without scaling.
inline model::ModelConfig qwen2_shape(int64_t vocab, int64_t hidden, int64_t layers, int64_t heads,
                                      int64_t kv_heads, int64_t intermediate, bool tied = true) {
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
  c.max_position_embeddings = 32768;  // does not change the math (no rope scaling)
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1000000.0;
  c.attention_bias = true;
  c.tie_word_embeddings = tied;
  return c;
}

struct BenchShape {
  const char* name;
  int64_t vocab, hidden, layers, heads, kv_heads, intermediate;
  bool tied;
  bool llama = false;  // a Llama causal LM (no q/k/v bias, eps 1e-5) with this RoPE theta
  double rope_theta = 1000000.0;
};

// The Qwen2 shapes are kept in step with SHAPES in tools/bench_train_hf.py.
inline constexpr BenchShape kBenchShapes[] = {
    {"tiny", 8192, 384, 6, 6, 2, 1024, true},
    {"qwen2.5-0.5b", 151936, 896, 24, 14, 2, 4864, true},
    {"qwen2.5-1.5b", 151936, 1536, 28, 12, 2, 8960, true},
    {"qwen2.5-7b", 152064, 3584, 28, 28, 4, 18944, false},
    // The seed's scaling runs (docs/scaling.md): Meta's Llama-3-8B and Llama-2-13B configs.
    {"llama3-8b", 128256, 4096, 32, 32, 8, 14336, false, true, 500000.0},
    {"llama2-13b", 32000, 5120, 40, 40, 40, 13824, false, true, 10000.0},
};

// nullptr when `name` is not a known shape.
inline const BenchShape* find_bench_shape(std::string_view name) {
  for (const BenchShape& s : kBenchShapes)
    if (name == s.name) return &s;
  return nullptr;
}

// "tiny, qwen2.5-0.5b, ...": for error messages and --help.
inline std::string bench_shape_names() {
  std::string out;
  for (const BenchShape& s : kBenchShapes) {
    if (!out.empty()) out += ", ";
    out += s.name;
  }
  return out;
}

// `layers` > 0 replaces the shape's layer count (per-layer timings: docs/scaling.md).
inline model::ModelConfig bench_shape_config(const BenchShape& s, int64_t layers = 0) {
  model::ModelConfig c = qwen2_shape(s.vocab, s.hidden, layers > 0 ? layers : s.layers, s.heads,
                                     s.kv_heads, s.intermediate, s.tied);
  if (s.llama) {
    c.architecture = "LlamaForCausalLM";
    c.model_type = "llama";
    c.family = model::Family::Llama;
    c.attention_bias = false;
    c.rms_norm_eps = 1e-5;
    c.max_position_embeddings = 8192;
  }
  c.rope_theta = s.rope_theta;
  return c;
}

// Random weights for a benchmark model: matrices N(0, 0.02) from Philox (independent of the thread
// count, fast at 7B), norms one, biases zero. Defined in cmd_bench.cpp (the `verl` program), shared
// by `bench train`, `bench grpo-step` and `bench-rollout` so they time the same model.
model::Weights bench_random_weights(const model::ModelConfig& c, uint64_t seed);

}  // namespace verl::cli
