// `verl logprobs`: per-token log-probs and entropies of a model for JSON lines of token ids.
// Input lines {"tokens": [ids...]}; output lines {"logprobs": [...], "entropy": [...]} where
// element i is about the distribution of tokens[i+1] given tokens[0..i] (n-1 values). With
// --lora DIR the model runs with a PEFT LoRA adapter on --model (unmerged, as PEFT computes it).
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/command.h"
#include "cli/io.h"
#include "core/error.h"
#include "model/lora.h"
#include "model/transformer.h"

namespace verl::cli {
namespace {

struct Opts {
  std::string model, lora, input = "-", output = "-";
  float temperature = 1.0f;
  int64_t max_batch_tokens = 8192;
};

std::vector<int32_t> parse_tokens_line(const nlohmann::json& j, const std::string& where,
                                       int64_t vocab, int64_t max_positions,
                                       const std::string& model) {
  VERL_CHECK(j.is_object() && j.contains("tokens"),
             "{}: expected an object with a \"tokens\" array of ids", where);
  std::vector<int32_t> ids = token_ids(j, "tokens", where, vocab);
  // Positions past the rotary table were never trained: the log-probs would be meaningless.
  VERL_CHECK(max_positions <= 0 || static_cast<int64_t>(ids.size()) <= max_positions,
             "{}: {} tokens are more than the model's max_position_embeddings {} ({}/config.json); "
             "shorten the "
             "sequence",
             where, ids.size(), max_positions, model);
  return ids;
}

int run(const Opts& o) {
  VERL_CHECK(o.temperature > 0, "--temperature must be > 0, got {}", o.temperature);
  VERL_CHECK(o.max_batch_tokens > 0, "--max-batch-tokens must be positive, got {}",
             o.max_batch_tokens);
  model::Weights w = model::Weights::load(o.model);
  VERL_CHECK(w.config.head == model::HeadKind::CausalLM,
             "{}: logprobs needs a causal LM, but config.json has {}", o.model,
             w.config.architecture);
  std::optional<model::LoraWeights> lora;
  if (!o.lora.empty()) lora = model::LoraWeights::load(o.lora, w.config);
  model::Transformer tf(w, lora ? &*lora : nullptr);
  model::ForwardOptions fopt;
  fopt.temperature = o.temperature;

  InputLines in(o.input);
  Output output(o.output);
  std::ostream& out = output.stream();

  model::Activations acts;
  std::vector<std::vector<int32_t>> pending;
  int64_t pending_tokens = 0;
  auto flush = [&] {
    if (pending.empty()) return;
    model::PackedBatch batch = model::PackedBatch::from_sequences(pending);
    tf.forward(batch, acts, fopt);
    for (int64_t s = 0; s < batch.num_seqs(); ++s) {
      int64_t begin = batch.cu_seqlens[s], n = batch.seq_len(s) - 1;
      nlohmann::json j;
      j["logprobs"] =
          std::vector<float>(acts.logprob.begin() + begin, acts.logprob.begin() + begin + n);
      j["entropy"] =
          std::vector<float>(acts.entropy.begin() + begin, acts.entropy.begin() + begin + n);
      out << j.dump() << '\n';
    }
    out.flush();
    pending.clear();
    pending_tokens = 0;
  };
  std::string line;
  while (in.next(line)) {
    std::vector<int32_t> ids = parse_tokens_line(in.json(line), in.where(), w.config.vocab_size,
                                                 w.config.max_position_embeddings, o.model);
    if (pending_tokens + static_cast<int64_t>(ids.size()) > o.max_batch_tokens) flush();
    pending_tokens += static_cast<int64_t>(ids.size());
    pending.push_back(std::move(ids));
  }
  flush();
  return 0;
}

Command reg("logprobs", "Per-token log-probs and entropies of a model for JSON lines of tokens",
            [](CLI::App& app) -> Action {
              auto o = std::make_shared<Opts>();
              app.add_option("--model", o->model, "HF model directory")->required();
              app.add_option("--lora", o->lora, "PEFT LoRA adapter directory on --model");
              app.add_option("--input", o->input, "JSONL file of {\"tokens\": [...]}, - for stdin");
              app.add_option("--output", o->output, "output JSONL file, - for stdout");
              app.add_option("--temperature", o->temperature,
                             "divide logits by T (as the rollout)");
              app.add_option("--max-batch-tokens", o->max_batch_tokens,
                             "tokens packed into one forward pass");
              return [o] { return run(*o); };
            });

}  // namespace
}  // namespace verl::cli
