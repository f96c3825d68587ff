// VERL_DUMP on the CPU model: a forward of a tiny random 2-layer model writes every named
// intermediate in forward order, the dumped tensors are the ones the forward computed, and
// dumping does not change the model's outputs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "../common/test_util.h"
#include "core/dump.h"
#include "core/tensor.h"
#include "model/transformer.h"

namespace verl::model {
namespace {
namespace fs = std::filesystem;

ModelConfig tiny_config(HeadKind head) {
  ModelConfig c;
  c.architecture = "Qwen3ForCausalLM";
  c.model_type = "qwen3";
  c.family = Family::Qwen3;
  c.head = head;
  c.num_labels = head == HeadKind::TokenClassification ? 3 : 1;
  c.vocab_size = 29;
  c.hidden_size = 16;
  c.intermediate_size = 20;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 6;  // H*D = 24 != C
  c.max_position_embeddings = 64;
  c.qk_norm = true;
  return c;
}

// A path (one per name, not yet created) in this process's scratch directory, removed at exit.
fs::path fresh_dir(const std::string& name) {
  static const verl::test::TempDir scratch("dump_model");
  const fs::path d = scratch / name;
  fs::remove_all(d);
  return d;
}

std::vector<std::string> index_of(const fs::path& tag_dir) {
  std::ifstream f(tag_dir / "index.txt");
  std::vector<std::string> out;
  for (std::string s; std::getline(f, s);) out.push_back(s);
  return out;
}

std::vector<std::string> expected_names(int layers, std::vector<std::string> head) {
  std::vector<std::string> n = {"embed"};
  for (int l = 0; l < layers; ++l) {
    for (const char* op :
         {"attn_norm", "q", "k", "v", "attn", "attn_res", "mlp_norm", "gate_up", "act", "out"}) {
      n.push_back("L" + std::to_string(l) + "." + op);
    }
  }
  n.push_back("final_norm");
  for (auto& h : head) n.push_back(h);
  return n;
}

// Exact equality of a dumped tensor with the first n floats of `expect`, and its shape.
void expect_dumped(const fs::path& tag_dir, const std::string& name, const float* expect,
                   std::vector<int64_t> shape) {
  std::vector<int64_t> got_shape;
  std::vector<float> got = dump::read((tag_dir / (name + ".npy")).string(), &got_shape);
  EXPECT_EQ(got_shape, shape) << name;
  ASSERT_EQ(got.size(), static_cast<size_t>(shape_numel(shape))) << name;
  EXPECT_EQ(std::memcmp(got.data(), expect, 4 * got.size()), 0) << name;
}

TEST(DumpModel, CausalLmWritesEveryNamedOpInOrder) {
  const ModelConfig c = tiny_config(HeadKind::CausalLM);
  Weights w = Weights::from_config(c);
  w.init_random(11, 0.3f);
  Transformer model(w);
  const PackedBatch batch = PackedBatch::from_sequences({{1, 5, 9, 2, 7}, {3, 28, 4}});
  const int64_t T = batch.num_tokens(), C = c.hidden_size, F = c.intermediate_size;

  Activations plain;
  model.forward(batch, plain);  // no dump

  const fs::path dir = fresh_dir("causal");
  dump::set_dir(dir.string());
  Activations acts;
  model.forward(batch, acts);
  const fs::path cpu = dir / "cpu";
  EXPECT_EQ(index_of(cpu), expected_names(2, {"lm_head.logprob", "lm_head.entropy"}));

  // Dumping changes nothing.
  EXPECT_EQ(std::memcmp(acts.logprob.data(), plain.logprob.data(), 4 * T), 0);
  EXPECT_EQ(std::memcmp(acts.entropy.data(), plain.entropy.data(), 4 * T), 0);

  expect_dumped(cpu, "lm_head.logprob", acts.logprob.data(), {T});
  expect_dumped(cpu, "lm_head.entropy", acts.entropy.data(), {T});
  expect_dumped(cpu, "embed", acts.layers[0].x_in.data(), {T, C});
  expect_dumped(cpu, "L0.out", acts.layers[1].x_in.data(), {T, C});
  expect_dumped(cpu, "L1.out", acts.x_final.data(), {T, C});  // the final norm's input
  expect_dumped(cpu, "final_norm", acts.h_final.data(), {T, C});
  const LayerActivations& a1 = acts.layers[1];
  expect_dumped(cpu, "L1.attn_norm", a1.xn1.data(), {T, C});
  expect_dumped(cpu, "L1.q", a1.q.data(), {T, c.q_dim()});  // after q-norm and RoPE
  expect_dumped(cpu, "L1.k", a1.k.data(), {T, c.kv_dim()});
  expect_dumped(cpu, "L1.v", a1.v.data(), {T, c.kv_dim()});
  expect_dumped(cpu, "L1.attn", a1.att.data(), {T, c.q_dim()});
  expect_dumped(cpu, "L1.attn_res", a1.x_mid.data(), {T, C});
  expect_dumped(cpu, "L1.mlp_norm", a1.xn2.data(), {T, C});
  expect_dumped(cpu, "L1.gate_up", a1.gu.data(), {T, 2 * F});
  expect_dumped(cpu, "L1.act", a1.act.data(), {T, F});

  // A second forward of another batch overwrites the files and leaves the index as it was.
  const PackedBatch other = PackedBatch::from_sequences({{6, 6, 1}});
  model.forward(other, acts);
  EXPECT_EQ(index_of(cpu), expected_names(2, {"lm_head.logprob", "lm_head.entropy"}));
  expect_dumped(cpu, "lm_head.logprob", acts.logprob.data(), {3});
  dump::set_dir("");
  fs::remove_all(dir);
}

TEST(DumpModel, ClassificationHeadsAreNamed) {
  for (HeadKind head : {HeadKind::TokenClassification, HeadKind::SequenceClassification}) {
    const ModelConfig c = tiny_config(head);
    Weights w = Weights::from_config(c);
    w.init_random(12, 0.3f);
    Transformer model(w);
    const PackedBatch batch = PackedBatch::from_sequences({{1, 5, 9, 2}, {3, 28, 4}});
    const fs::path dir = fresh_dir("cls");
    dump::set_dir(dir.string());
    Activations acts;
    model.forward(batch, acts);
    const fs::path cpu = dir / "cpu";
    if (head == HeadKind::TokenClassification) {
      EXPECT_EQ(index_of(cpu), expected_names(2, {"value_head.values"}));
      expect_dumped(cpu, "value_head.values", acts.values.data(), {batch.num_tokens(), 3});
    } else {
      EXPECT_EQ(index_of(cpu), expected_names(2, {"score_head.scores"}));
      expect_dumped(cpu, "score_head.scores", acts.scores.data(), {batch.num_seqs(), 1});
    }
    dump::set_dir("");
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace verl::model
