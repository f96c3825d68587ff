// The parameter layout (embedding, the family's decoder layers, final norm, head) and HF
// checkpoint load/save through the name table. A family's layer table is its model/arch/ file.
#include "model/weights.h"

#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/rng.h"
#include "model/arch/arch.h"
#include "model/safetensors.h"

namespace verl::model {
ParamLayout ParamLayout::build(const ModelConfig& c) {
  ParamLayout l;
  arch::LayoutBuilder b(l);
  const int64_t C = c.hidden_size, V = c.vocab_size;
  l.embed = b.add_mapped("embed", "model.embed_tokens.weight", {V, C});
  // The decoder layers: the family's HF tensor-name table (model/arch/<family>.cpp).
  const arch::FamilySpec& fam = arch::family(c.family);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    LayerParams lp;
    fam.add_layer(b, c, i, lp);
    // The decoder reads the recipe flags; a hand-built config whose flags its family's table
    // does not follow would run without a piece the weights have (or with one they lack).
    VERL_CHECK((lp.bqkv >= 0) == c.attention_bias && (lp.bo >= 0) == c.o_proj_bias &&
                   (lp.bgu >= 0) == c.mlp_bias && (lp.bdown >= 0) == c.mlp_bias &&
                   (lp.q_norm >= 0) == c.qk_norm && (lp.k_norm >= 0) == c.qk_norm,
               "{}: attention_bias {}, o_proj_bias {}, mlp_bias {}, qk_norm {} is not a {} layer",
               c.architecture, c.attention_bias, c.o_proj_bias, c.mlp_bias, c.qk_norm, fam.name);
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
                    (name == "lm_head.weight" && w.config.tie_word_embeddings) ||
                    ignore.count(name);
    VERL_CHECK(harmless,
               "{}: unexpected tensor '{}' in {} for architecture {}; the checkpoint does "
               "not match config.json",
               model_dir, name, st.file_of(name), w.config.architecture);
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
  VERL_CHECK(cfg.head == HeadKind::CausalLM,
             "{}: a critic starts from a causal LM or a token "
             "classification model, not {}",
             model_dir, cfg.architecture);
  cfg.architecture =
      arch::architecture_name(arch::family(cfg.family), HeadKind::TokenClassification);
  cfg.head = HeadKind::TokenClassification;
  cfg.num_labels = 1;
  Weights w = from_config(cfg);
  Rng rng(seed, 0x5c0e);
  float* score = w.param(w.layout.score);
  for (int64_t i = 0; i < w.layout.params[w.layout.score].numel; ++i)
    score[i] = 0.02f * rng.normal();
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

int Weights::lm_head_param() const {
  return layout.lm_head >= 0 ? layout.lm_head : layout.embed;
}
const float* Weights::lm_head() const {
  return param(lm_head_param());
}

}  // namespace verl::model
