// The family registry and the builders the family files share (arch.h).
#include "model/arch/arch.h"

#include <span>

#include "core/error.h"

namespace verl::model::arch {

int LayoutBuilder::add(const std::string& name, std::vector<int64_t> shape, bool no_decay) {
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

void LayoutBuilder::map(const std::string& hf_name, std::vector<int64_t> hf_shape, int param,
                        int64_t row0) {
  const ParamInfo& p = l_.params[param];
  int64_t row_size = p.shape.size() > 1 ? p.numel / p.shape[0] : 1;
  l_.hf.push_back({hf_name, std::move(hf_shape), param, row0 * row_size});
}

int LayoutBuilder::add_mapped(const std::string& name, const std::string& hf_name,
                              std::vector<int64_t> shape, bool no_decay) {
  int p = add(name, shape, no_decay);
  map(hf_name, shape, p, 0);
  return p;
}

LayerNames::LayerNames(int64_t i)
    : ours(fmt::format("layers.{}.", i)), hf(fmt::format("model.layers.{}.", i)) {}

void add_attn_norm(LayoutBuilder& b, const ModelConfig& c, const LayerNames& n, LayerParams& lp) {
  lp.attn_norm =
      b.add_mapped(n.ours + "attn_norm", n.hf + "input_layernorm.weight", {c.hidden_size}, true);
}

void add_qkv(LayoutBuilder& b, const ModelConfig& c, const LayerNames& n, LayerParams& lp) {
  const int64_t C = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim();
  lp.wqkv = b.add(n.ours + "wqkv", {qd + 2 * kvd, C});
  b.map(n.hf + "self_attn.q_proj.weight", {qd, C}, lp.wqkv, 0);
  b.map(n.hf + "self_attn.k_proj.weight", {kvd, C}, lp.wqkv, qd);
  b.map(n.hf + "self_attn.v_proj.weight", {kvd, C}, lp.wqkv, qd + kvd);
  if (c.attention_bias) {
    lp.bqkv = b.add(n.ours + "bqkv", {qd + 2 * kvd}, true);
    b.map(n.hf + "self_attn.q_proj.bias", {qd}, lp.bqkv, 0);
    b.map(n.hf + "self_attn.k_proj.bias", {kvd}, lp.bqkv, qd);
    b.map(n.hf + "self_attn.v_proj.bias", {kvd}, lp.bqkv, qd + kvd);
  }
}

void add_o_proj(LayoutBuilder& b, const ModelConfig& c, const LayerNames& n, LayerParams& lp) {
  const int64_t C = c.hidden_size;
  lp.wo = b.add_mapped(n.ours + "wo", n.hf + "self_attn.o_proj.weight", {C, c.q_dim()});
  if (c.o_proj_bias) lp.bo = b.add_mapped(n.ours + "bo", n.hf + "self_attn.o_proj.bias", {C}, true);
}

void add_dense_mlp(LayoutBuilder& b, const ModelConfig& c, const LayerNames& n, LayerParams& lp) {
  const int64_t C = c.hidden_size, F = c.intermediate_size;
  lp.mlp_norm =
      b.add_mapped(n.ours + "mlp_norm", n.hf + "post_attention_layernorm.weight", {C}, true);
  lp.wgu = b.add(n.ours + "wgu", {2 * F, C});
  b.map(n.hf + "mlp.gate_proj.weight", {F, C}, lp.wgu, 0);
  b.map(n.hf + "mlp.up_proj.weight", {F, C}, lp.wgu, F);
  if (c.mlp_bias) {
    lp.bgu = b.add(n.ours + "bgu", {2 * F}, true);
    b.map(n.hf + "mlp.gate_proj.bias", {F}, lp.bgu, 0);
    b.map(n.hf + "mlp.up_proj.bias", {F}, lp.bgu, F);
  }
  lp.wdown = b.add_mapped(n.ours + "wdown", n.hf + "mlp.down_proj.weight", {C, F});
  if (c.mlp_bias) lp.bdown = b.add_mapped(n.ours + "bdown", n.hf + "mlp.down_proj.bias", {C}, true);
}

void check_full_attention(const ConfigReader& r) {
  const std::string& source = r.source();
  VERL_CHECK(!r.get_bool("use_sliding_window", false),
             "{}: sliding window attention is not supported (use_sliding_window is true)", source);
  // Newer Qwen configs spell the per-layer attention kind out in layer_types.
  if (r.has("layer_types")) {
    const nlohmann::json& lt = r.at("layer_types");
    VERL_CHECK(lt.is_array(), "{}: key 'layer_types' must be a list of strings", source);
    for (size_t i = 0; i < lt.size(); ++i) {
      VERL_CHECK(lt[i].is_string() && lt[i].get<std::string>() == "full_attention",
                 "{}: sliding window attention is not supported (layer_types[{}] is {})", source, i,
                 lt[i].dump());
    }
  }
}

namespace {

// Registry order is the order errors list the architectures in. A function-local table, so a
// lookup during another file's static initialisation finds it built.
std::span<const FamilySpec* const> families() {
  static const FamilySpec* const all[] = {&llama(), &qwen2(), &qwen3()};
  return all;
}

struct HeadName {
  HeadKind head;
  const char* suffix;
};
constexpr HeadName kHeads[] = {
    {HeadKind::CausalLM, "ForCausalLM"},
    {HeadKind::SequenceClassification, "ForSequenceClassification"},
    {HeadKind::TokenClassification, "ForTokenClassification"},
};

}  // namespace

const FamilySpec& family(Family f) {
  for (const FamilySpec* s : families()) {
    if (s->family == f) return *s;
  }
  VERL_FAIL("no model family {}", static_cast<int>(f));
}

std::string architecture_name(const FamilySpec& f, HeadKind head) {
  for (const HeadName& h : kHeads) {
    if (h.head == head) return std::string(f.name) + h.suffix;
  }
  VERL_FAIL("no head kind {}", static_cast<int>(head));
}

const FamilySpec* find_architecture(std::string_view name, HeadKind* head) {
  for (const FamilySpec* f : families()) {
    for (const HeadName& h : kHeads) {
      if (name == architecture_name(*f, h.head)) {
        if (head) *head = h.head;
        return f;
      }
    }
  }
  return nullptr;
}

std::string supported_architectures() {
  std::string s;
  for (const FamilySpec* f : families()) {
    for (const HeadName& h : kHeads) s += (s.empty() ? "" : ", ") + architecture_name(*f, h.head);
  }
  return s;
}

}  // namespace verl::model::arch
