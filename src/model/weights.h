// Model parameters in one flat fp32 buffer with a descriptor table of named views, and the one
// table that maps HF tensor names onto them. Projections that run as one GEMM are stored fused:
// q|k|v rows in `wqkv`, gate|up rows in `wgu`; each HF tensor is a contiguous row range of ours.
// Gradients and optimizer state use the same layout, so views and offsets are shared.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/config.h"

namespace verl::model {

// One parameter: a named view (offset, shape) into the flat buffer.
struct ParamInfo {
  std::string name;  // ours, e.g. "layers.3.wqkv"
  std::vector<int64_t> shape;
  int64_t offset = 0;  // in elements
  int64_t numel = 0;
  bool no_weight_decay =
      false;  // norms and biases (informational; AdamW applies decay uniformly as verl)
};

// One HF tensor and where it lives inside one of our parameters.
struct HfTensorMap {
  std::string hf_name;  // e.g. "model.layers.3.self_attn.k_proj.weight"
  std::vector<int64_t> hf_shape;
  int param = 0;       // index into ParamLayout::params
  int64_t offset = 0;  // element offset inside that parameter
};

// Per-layer parameter indices (-1 when the config has no such parameter).
struct LayerParams {
  int attn_norm = -1, wqkv = -1, bqkv = -1, q_norm = -1, k_norm = -1, wo = -1, bo = -1;
  int mlp_norm = -1, wgu = -1, bgu = -1, wdown = -1, bdown = -1;
};

struct ParamLayout {
  std::vector<ParamInfo> params;
  std::vector<HfTensorMap> hf;  // every tensor of the HF checkpoint, in save order
  std::vector<LayerParams> layers;
  int embed = -1, final_norm = -1, lm_head = -1, score = -1, score_bias = -1;
  int64_t total = 0;  // elements

  static ParamLayout build(const ModelConfig& cfg);
  int find(const std::string& name) const;  // -1 when absent
};

// The weights of one model: config + layout + flat fp32 parameters.
struct Weights {
  ModelConfig config;
  ParamLayout layout;
  std::vector<float> data;

  static Weights from_config(const ModelConfig& cfg);  // zero-filled
  // Loads config.json and the safetensors of an HF model directory. Every tensor the layout needs
  // must be present with the expected shape; tensors we do not use are an error unless harmless
  // (rotary caches), so a wrong architecture never loads silently.
  static Weights load(const std::string& model_dir);
  // Loads a causal LM checkpoint as a critic (token classification, one label), the way verl
  // builds its critic from the actor's checkpoint: the LM head is dropped and the value head
  // `score` starts from N(0, 0.02) with seed `seed`, bias zero. A checkpoint that already is a
  // token-classification model loads as it is.
  static Weights load_as_critic(const std::string& model_dir, uint64_t seed = 0);
  // Writes config.json and safetensors (dtype F32/BF16/F16) that transformers loads.
  void save(const std::string& model_dir, verl::DType dtype = verl::DType::F32) const;
  // Deterministic init: N(0, std) for matrices, ones for norms, zeros for biases.
  void init_random(uint64_t seed, float std = 0.02f);

  float* param(int i) { return data.data() + layout.params[i].offset; }
  const float* param(int i) const { return data.data() + layout.params[i].offset; }
  // Pointer to the LM head matrix [V, C] (the embedding when tied).
  const float* lm_head() const;
  int lm_head_param() const;
};

}  // namespace verl::model
