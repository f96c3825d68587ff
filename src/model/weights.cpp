// Parameter layout for Llama / Qwen2 / Qwen3 and HF checkpoint load/save through the name table.
#include "model/weights.h"

#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/rng.h"
#include "model/safetensors.h"

namespace verl::model {
namespace {

class LayoutBuilder {
 public:
  explicit LayoutBuilder(ParamLayout& l) : l_(l) {}

  int add(const std::string& name, std::vector<int64_t> shape, bool no_decay = false) {
    ParamInfo p;
    p.name = name;
    p.numel = 1;
    for (int64_t d : shape) p.numel *= d;
    p.shape = std::move(shape);
    p.offset = l_.total;
    p.no_weight_decay = no_decay;
    l_.total += p.numel;
    l_.params.push_back(std::move(p));
    return static_cast<int>(l_.params.size()) - 1;
  }
  // Maps an HF tensor of `rows` x (rest) elements at row `row0` of parameter `param`.
  void map(const std::string& hf_name, std::vector<int64_t> hf_shape, int param, int64_t row0) {
    const ParamInfo& p = l_.params[param];
    int64_t row_size = p.shape.size() > 1 ? p.numel / p.shape[0] : 1;
    l_.hf.push_back({hf_name, std::move(hf_shape), param, row0 * row_size});
  }
  // A parameter that is exactly one HF tensor.
  int add_mapped(const std::string& name, const std::string& hf_name, std::vector<int64_t> shape,
                 bool no_decay = false) {
    int p = add(name, shape, no_decay);
    map(hf_name, shape, p, 0);
    return p;
  }

 private:
  ParamLayout& l_;
};

}  // namespace

ParamLayout ParamLayout::build(const ModelConfig& c) {
  ParamLayout l;
  LayoutBuilder b(l);
  const int64_t C = c.hidden_size, V = c.vocab_size, F = c.intermediate_size;
  const int64_t qd = c.q_dim(), kvd = c.kv_dim(), D = c.head_dim;
  l.embed = b.add_mapped("embed", "model.embed_tokens.weight", {V, C});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string ours = fmt::format("layers.{}.", i);
    const std::string hf = fmt::format("model.layers.{}.", i);
    LayerParams lp;
    lp.attn_norm = b.add_mapped(ours + "attn_norm", hf + "input_layernorm.weight", {C}, true);
    lp.wqkv = b.add(ours + "wqkv", {qd + 2 * kvd, C});
    b.map(hf + "self_attn.q_proj.weight", {qd, C}, lp.wqkv, 0);
    b.map(hf + "self_attn.k_proj.weight", {kvd, C}, lp.wqkv, qd);
    b.map(hf + "self_attn.v_proj.weight", {kvd, C}, lp.wqkv, qd + kvd);
    if (c.attention_bias) {
      lp.bqkv = b.add(ours + "bqkv", {qd + 2 * kvd}, true);
      b.map(hf + "self_attn.q_proj.bias", {qd}, lp.bqkv, 0);
      b.map(hf + "self_attn.k_proj.bias", {kvd}, lp.bqkv, qd);
      b.map(hf + "self_attn.v_proj.bias", {kvd}, lp.bqkv, qd + kvd);
    }
    if (c.qk_norm) {
      lp.q_norm = b.add_mapped(ours + "q_norm", hf + "self_attn.q_norm.weight", {D}, true);
      lp.k_norm = b.add_mapped(ours + "k_norm", hf + "self_attn.k_norm.weight", {D}, true);
    }
    lp.wo = b.add_mapped(ours + "wo", hf + "self_attn.o_proj.weight", {C, qd});
    if (c.o_proj_bias) lp.bo = b.add_mapped(ours + "bo", hf + "self_attn.o_proj.bias", {C}, true);
    lp.mlp_norm =
        b.add_mapped(ours + "mlp_norm", hf + "post_attention_layernorm.weight", {C}, true);
    lp.wgu = b.add(ours + "wgu", {2 * F, C});
    b.map(hf + "mlp.gate_proj.weight", {F, C}, lp.wgu, 0);
    b.map(hf + "mlp.up_proj.weight", {F, C}, lp.wgu, F);
    if (c.mlp_bias) {
      lp.bgu = b.add(ours + "bgu", {2 * F}, true);
      b.map(hf + "mlp.gate_proj.bias", {F}, lp.bgu, 0);
      b.map(hf + "mlp.up_proj.bias", {F}, lp.bgu, F);
    }
    lp.wdown = b.add_mapped(ours + "wdown", hf + "mlp.down_proj.weight", {C, F});
    if (c.mlp_bias) lp.bdown = b.add_mapped(ours + "bdown", hf + "mlp.down_proj.bias", {C}, true);
    l.layers.push_back(lp);
  }
  l.final_norm = b.add_mapped("final_norm", "model.norm.weight", {C}, true);
  switch (c.head) {
    case HeadKind::CausalLM:
      if (!c.tie_word_embeddings) l.lm_head = b.add_mapped("lm_head", "lm_head.weight", {V, C});
      break;
    case HeadKind::SequenceClassification:
      // transformers: nn.Linear(hidden, num_labels, bias=False)
      l.score = b.add_mapped("score", "score.weight", {c.num_labels, C});
      break;
    case HeadKind::TokenClassification:
      // transformers: nn.Linear(hidden, num_labels), with bias
      l.score = b.add_mapped("score", "score.weight", {c.num_labels, C});
      l.score_bias = b.add_mapped("score_bias", "score.bias", {c.num_labels}, true);
      break;
  }
  return l;
}

int ParamLayout::find(const std::string& name) const {
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

Weights Weights::from_config(const ModelConfig& cfg) {
  Weights w;
  w.config = cfg;
  w.layout = ParamLayout::build(cfg);
  w.data.assign(static_cast<size_t>(w.layout.total), 0.0f);
  return w;
}

namespace {

// Reads every tensor of the layout from the directory; `optional` params may be absent (left as
// they are). Unused tensors are an error unless harmless or listed in `ignore`.
void read_checkpoint(Weights& w, const std::string& model_dir, const std::set<int>& optional,
                     const std::set<std::string>& ignore) {
  SafetensorsDir st = SafetensorsDir::open(model_dir);
  std::set<std::string> used;
  for (const HfTensorMap& m : w.layout.hf) {
    if (!st.has(m.hf_name) && optional.count(m.param)) continue;
    VERL_CHECK(st.has(m.hf_name), "{}: missing tensor '{}' required by {} (config.json)", model_dir,
               m.hf_name, w.config.architecture);
    st.read_f32(m.hf_name, m.hf_shape, w.param(m.param) + m.offset);
    used.insert(m.hf_name);
  }
  for (const std::string& name : st.names()) {
    if (used.count(name)) continue;
    // Harmless extras: rotary caches, and an lm_head stored although the config ties it.
    bool harmless = name.find("rotary_emb.inv_freq") != std::string::npos ||
                    (name == "lm_head.weight" && w.config.tie_word_embeddings) || ignore.count(name);
    VERL_CHECK(harmless, "{}: unexpected tensor '{}' in {} for architecture {}; the checkpoint does "
               "not match config.json", model_dir, name, st.file_of(name), w.config.architecture);
  }
}

}  // namespace

Weights Weights::load(const std::string& model_dir) {
  Weights w = from_config(load_model_config(model_dir));
  read_checkpoint(w, model_dir, {}, {});
  return w;
}

Weights Weights::load_as_critic(const std::string& model_dir, uint64_t seed) {
  ModelConfig cfg = load_model_config(model_dir);
  if (cfg.head == HeadKind::TokenClassification) return load(model_dir);
  VERL_CHECK(cfg.head == HeadKind::CausalLM, "{}: a critic starts from a causal LM or a token "
             "classification model, not {}", model_dir, cfg.architecture);
  static const char* kNames[] = {"Llama", "Qwen2", "Qwen3"};
  cfg.architecture = std::string(kNames[static_cast<int>(cfg.family)]) + "ForTokenClassification";
  cfg.head = HeadKind::TokenClassification;
  cfg.num_labels = 1;
  Weights w = from_config(cfg);
  Rng rng(seed, 0x5c0e);
  float* score = w.param(w.layout.score);
  for (int64_t i = 0; i < w.layout.params[w.layout.score].numel; ++i) score[i] = 0.02f * rng.normal();
  read_checkpoint(w, model_dir, {w.layout.score, w.layout.score_bias}, {"lm_head.weight"});
  return w;
}

void Weights::save(const std::string& model_dir, DType dtype) const {
  namespace fs = std::filesystem;
  fs::create_directories(model_dir);
  ModelConfig cfg = config;
  cfg.torch_dtype = dtype == DType::BF16 ? "bfloat16" : dtype == DType::F16 ? "float16" : "float32";
  {
    std::string tmp = model_dir + "/config.json.tmp";
    std::ofstream f(tmp);
    VERL_CHECK(f.good(), "cannot write {}", tmp);
    f << model_config_to_json(cfg);
    f.close();
    VERL_CHECK(f.good(), "error writing {}", tmp);
    fs::rename(tmp, model_dir + "/config.json");
  }
  std::vector<TensorToWrite> out;
  for (const HfTensorMap& m : layout.hf) {
    out.push_back({m.hf_name, dtype, m.hf_shape, param(m.param) + m.offset});
  }
  write_safetensors_dir(model_dir, out);
}

void Weights::init_random(uint64_t seed, float std) {
  // Each parameter draws from its own stream (seed, i), so the threads change no value.
  const int64_t count = static_cast<int64_t>(layout.params.size());
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < count; ++i) {
    const ParamInfo& p = layout.params[static_cast<size_t>(i)];
    float* x = param(static_cast<int>(i));
    if (p.shape.size() == 2) {
      Rng rng(seed, i);
      for (int64_t j = 0; j < p.numel; ++j) x[j] = std * rng.normal();
    } else {
      // 1-D: norm weights start at one, biases at zero (as transformers' _init_weights).
      bool is_norm = p.name.find("norm") != std::string::npos;
      std::fill(x, x + p.numel, is_norm ? 1.0f : 0.0f);
    }
  }
}

int Weights::lm_head_param() const { return layout.lm_head >= 0 ? layout.lm_head : layout.embed; }
const float* Weights::lm_head() const { return param(lm_head_param()); }

}  // namespace verl::model
