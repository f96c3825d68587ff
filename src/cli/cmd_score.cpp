// `verl score`: scores of a reward model (HF ...ForSequenceClassification, one label) for JSON
// lines. Input lines {"tokens": [ids...]} or {"messages": [{"role", "content"}, ...]} (rendered
// with the model's chat template, no generation prompt, then tokenized as HF's apply_chat_template
// with tokenize=True does); output lines {"score": x}, in input order.
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/io.h"
#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "model/lora.h"
#include "model/quantize.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"
#include "trainer/reward_model.h"

namespace verl::cli {
namespace {

struct Opts {
  std::string model, lora, tokenizer, input = "-", output = "-", device = "auto", quantize = "none";
  int64_t max_batch_tokens = 8192, max_batch_seqs = 256, group_size = 128,
          calibration_samples = 128;
};

std::vector<int32_t> parse_line(const nlohmann::json& j, const std::string& where,
                                const std::optional<tokenizer::Tokenizer>& tok,
                                const std::string& tok_dir) {
  VERL_CHECK(j.is_object() && (j.contains("tokens") || j.contains("messages")),
             "{}: expected {{\"tokens\": [ids...]}} or {{\"messages\": [...]}}", where);
  if (j.contains("tokens")) {
    return token_ids(j, "tokens", where, /*vocab=*/0);  // the model checks its vocabulary
  }
  VERL_CHECK(j["messages"].is_array() && !j["messages"].empty(),
             "{}: \"messages\" must be a non-empty array of {{\"role\", \"content\"}}", where);
  VERL_CHECK(tok.has_value(),
             "{}: \"messages\" need a tokenizer with a chat template, and {} has no tokenizer.json "
             "(pass --tokenizer DIR)",
             where, tok_dir);
  std::vector<int32_t> ids;
  try {
    ids = tok->encode(tok->apply_chat_template(j["messages"], /*add_generation_prompt=*/false));
  } catch (const Error& e) {
    VERL_FAIL("{}: {}", where, e.what());
  }
  VERL_CHECK(!ids.empty(), "{}: the rendered conversation has no tokens", where);
  return ids;
}

int run(const Opts& o) {
  VERL_CHECK(o.quantize == "none" || o.quantize == "int8" || o.quantize == "int4",
             "--quantize {}: want none, int8 or int4", o.quantize);
  VERL_CHECK(o.group_size >= 2 && o.group_size % 2 == 0,
             "--group-size {}: want an even number >= 2", o.group_size);
  VERL_CHECK(o.max_batch_tokens > 0, "--max-batch-tokens must be positive, got {}",
             o.max_batch_tokens);
  VERL_CHECK(o.max_batch_seqs > 0, "--max-batch-seqs must be positive, got {}", o.max_batch_seqs);
  const Device device = resolve_device(o.device, "--device");
  model::Weights w = model::Weights::load(o.model);
  trainer::require_reward_model(w.config, o.model);
  // A LoRA adapter is merged into the weights (W + scale B A) before any quantisation.
  if (!o.lora.empty()) w = model::LoraWeights::load(o.lora, w.config).merged(w);
  const int bits = o.quantize == "int8" ? 8 : o.quantize == "int4" ? 4 : 16;
  VERL_CHECK(o.calibration_samples >= 0 && o.calibration_samples <= model::kMaxCalibrationSamples,
             "--calibration-samples {}: want 0 (round to nearest) to {}", o.calibration_samples,
             model::kMaxCalibrationSamples);
  model::QuantizeOptions qo;
  qo.bits = bits;
  qo.group = o.group_size;
  qo.calibration_samples = o.calibration_samples;
  // On the GPU the linear layers compute from the quantised codes (ops/cuda/quant_linear.h).
  std::vector<model::QuantizedLayer> kept;
  const model::QuantizeReport q =
      model::quantize_linear_weights(w, qo, device == Device::Cuda ? &kept : nullptr);
  if (q.matrices > 0) log::info("{}: {}", o.model, model::describe(q, bits, o.group_size));
  const std::string tok_dir = o.tokenizer.empty() ? o.model : o.tokenizer;
  std::optional<tokenizer::Tokenizer> tok;
  if (!o.tokenizer.empty() || std::filesystem::exists(o.model + "/tokenizer.json"))
    tok = tokenizer::Tokenizer::load(tok_dir);

  InputLines in(o.input);
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::string> where;
  std::string line;
  while (in.next(line)) {
    seqs.push_back(parse_line(in.json(line), in.where(), tok, tok_dir));
    where.push_back(in.where());
  }
  std::vector<float> scores;
  if (!seqs.empty()) {  // the checks of every line (named by `where`) come before the output opens
    trainer::RewardModel rm(device, std::move(w), o.model, o.max_batch_tokens, o.max_batch_seqs,
                            /*offload=*/false, std::move(kept));
    scores = rm.score(seqs, &where);
  }
  Output output(o.output);
  std::ostream& out = output.stream();
  for (float s : scores) out << nlohmann::json{{"score", s}}.dump() << '\n';
  out.flush();
  return 0;
}

Command reg(
    "score",
    "Scores of a reward model (...ForSequenceClassification) for JSON lines of tokens or messages",
    [](CLI::App& app) -> Action {
      auto o = std::make_shared<Opts>();
      app.add_option("--model", o->model, "HF reward-model directory")->required();
      app.add_option("--lora", o->lora, "PEFT LoRA adapter directory on --model (merged)");
      app.add_option("--input", o->input,
                     "JSONL of {\"tokens\": [...]} or {\"messages\": [...]}, - for stdin");
      app.add_option("--output", o->output, "output JSONL file, - for stdout");
      app.add_option("--tokenizer", o->tokenizer,
                     "tokenizer directory for \"messages\" lines (default: the model's)");
      app.add_option("--device", o->device, "cpu, cuda or auto (default auto)");
      app.add_option("--quantize", o->quantize,
                     "weight-only quantisation of the linear layers: none, int8 (per output "
                     "channel) or int4 (per group)");
      app.add_option("--group-size", o->group_size,
                     "inputs per int4 scale and zero point (default 128)");
      app.add_option("--calibration-samples", o->calibration_samples,
                     "int4: random token sequences of 64 for GPTQ's layer inputs; 0 rounds to "
                     "nearest (default 128)");
      app.add_option("--max-batch-tokens", o->max_batch_tokens,
                     "tokens packed into one forward pass (default 8192)");
      app.add_option("--max-batch-seqs", o->max_batch_seqs,
                     "sequences in one forward pass (default 256)");
      return [o] { return run(*o); };
    });

}  // namespace
}  // namespace verl::cli
