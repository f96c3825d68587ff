// `verl generate`: sampling from an HF model with the rollout engine. One --prompt streams text
// to the terminal; --input takes JSON lines ("prompt" text, "messages" chat, or "prompt_tokens"
// ids) and writes one JSON line per sample, in input order. --device cuda (or auto with a GPU)
// runs the steps on the GPU (rollout::cuda::CudaModelRunner over the model's bf16 weights).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/command.h"
#include "cli/io.h"
#include "core/device.h"
#include "core/error.h"
#include "model/generation_config.h"
#include "model/lora.h"
#include "rollout/engine.h"
#include "rollout/kv_sizing.h"
#include "tokenizer/tokenizer.h"

#ifdef VERL_HAVE_CUDA
#include "ops/cuda/device.h"
#include "rollout/cuda/model_runner.h"
#endif

namespace verl::cli {
namespace {

namespace fs = std::filesystem;

struct Opts {
  std::string model, lora, tokenizer, prompt, input, output = "-";
  bool chat = false, ignore_eos = false;
  int32_t n = 1, top_k = -1, max_tokens = 256;
  float temperature = 1.0f, top_p = 1.0f;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  int64_t kv_cache_mb = 1024;
  int32_t max_num_seqs = 256, max_num_batched_tokens = 8192;
  std::string device = "auto";
};

// The engine holds every sample (its prompt, tokens and log-probs) until the run ends, so the
// request is checked before anything is allocated.
constexpr int64_t kMaxSamples = 1 << 20;

int run(const Opts& o) {
  VERL_CHECK(o.prompt.empty() != o.input.empty(), "give exactly one of --prompt or --input");
  VERL_CHECK(o.n >= 1 && o.n <= kMaxSamples,
             "--n must be in [1, {}] (samples a run holds at most), got {}", kMaxSamples, o.n);
  VERL_CHECK(o.max_tokens >= 1, "--max-tokens must be >= 1, got {}", o.max_tokens);
  VERL_CHECK(o.kv_cache_mb >= 1 && o.kv_cache_mb <= (int64_t{1} << 30),
             "--kv-cache-mb must be in [1, {}], got {}", int64_t{1} << 30, o.kv_cache_mb);
  model::Weights w = model::Weights::load(o.model);
  // A LoRA adapter is merged into the weights (W + scale B A) once: the engine then runs as usual.
  if (!o.lora.empty()) w = model::LoraWeights::load(o.lora, w.config).merged(w);
  std::string tok_dir = o.tokenizer.empty() ? o.model : o.tokenizer;
  std::unique_ptr<tokenizer::Tokenizer> tok;
  if (fs::exists(fs::path(tok_dir) / "tokenizer.json")) {
    tok = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::load(tok_dir));
  } else {
    VERL_CHECK(o.tokenizer.empty(), "--tokenizer {}: no tokenizer.json there", o.tokenizer);
  }

  rollout::SamplingParams sp;
  sp.temperature = o.temperature;
  sp.top_k = o.top_k;
  sp.top_p = o.top_p;
  sp.max_tokens = o.max_tokens;
  sp.ignore_eos = o.ignore_eos;
  sp.seed = o.seed;
  sp.stop_token_ids = model::generation_eos_ids(o.model, w.config, tok ? tok->eos_token_id() : -1);

  // Encoded with the chat template; the template's own errors (a content it cannot render) name
  // the input line too.
  auto render = [&](const nlohmann::json& msgs, const std::string& where) {
    try {
      return tok->encode(tok->apply_chat_template(msgs, /*add_generation_prompt=*/true));
    } catch (const Error& e) {
      VERL_FAIL("{}: {}", where, e.what());
    }
  };
  auto encode_prompt = [&](const nlohmann::json& line, const std::string& where) {
    if (line.contains("prompt_tokens"))
      return token_ids(line, "prompt_tokens", where, w.config.vocab_size);
    VERL_CHECK(tok != nullptr, "{}: text prompts need a tokenizer (--tokenizer DIR)", where);
    if (line.contains("messages")) return render(line["messages"], where);
    VERL_CHECK(line.contains("prompt") && line["prompt"].is_string(),
               "{}: expected \"prompt\" (text), \"messages\" (chat) or \"prompt_tokens\" (ids)",
               where);
    const std::string text = line["prompt"].get<std::string>();
    if (o.chat)
      return render(nlohmann::json::array({{{"role", "user"}, {"content", text}}}), where);
    return tok->encode(text);
  };

  std::vector<rollout::Request> reqs;
  if (!o.prompt.empty()) {
    nlohmann::json one = {{"prompt", o.prompt}};
    reqs.push_back({encode_prompt(one, "--prompt"), sp, o.n});
  } else {
    InputLines in(o.input);
    std::string line;
    while (in.next(line)) {
      nlohmann::json j = in.json(line);
      VERL_CHECK(j.is_object(), "{}: expected a JSON object", in.where());
      VERL_CHECK(
          static_cast<int64_t>(reqs.size() + 1) * o.n <= kMaxSamples,
          "{}: {} prompts x --n {} is over the limit of {} samples in one run; split the input",
          in.where(), reqs.size() + 1, o.n, kMaxSamples);
      reqs.push_back({encode_prompt(j, in.where()), sp, o.n});
    }
  }

  rollout::EngineConfig ecfg;
  ecfg.kv_cache_bytes = o.kv_cache_mb << 20;
  ecfg.scheduler.max_num_seqs = o.max_num_seqs;
  ecfg.scheduler.max_num_batched_tokens = o.max_num_batched_tokens;
  int64_t longest = 0;
  for (const auto& r : reqs)
    longest = std::max<int64_t>(longest, static_cast<int64_t>(r.prompt.size()));
  ecfg.scheduler.max_model_len = static_cast<int32_t>(longest + o.max_tokens);
  // The GPU runner's pieces outlive the engine (declared first, destroyed last).
#ifdef VERL_HAVE_CUDA
  std::unique_ptr<ops::cuda::CudaSession> session;
  ops::cuda::DeviceBuffer<ops::cuda::bf16> wbf;
#endif
  std::unique_ptr<rollout::StepRunner> gpu_runner;
  std::optional<rollout::Engine> engine_holder;
  if (resolve_device(o.device, "--device") == Device::Cuda) {
#ifdef VERL_HAVE_CUDA
    session = std::make_unique<ops::cuda::CudaSession>();
    wbf = rollout::cuda::upload_weights_bf16(session->ctx(), w);
    rollout::cuda::CudaRunnerOptions ro;
    ro.kv_cache_bytes = o.kv_cache_mb << 20;
    gpu_runner = std::make_unique<rollout::cuda::CudaModelRunner>(
        session->ctx(), w.config, w.layout, wbf.data(), ecfg.scheduler, ro);
    engine_holder.emplace(*gpu_runner, ecfg);
#endif
  } else {
    // The CPU engine's cache is host memory: more than the machine has is named here, not as a
    // failed allocation.
    const int64_t host_mb = rollout::host_memory_bytes() >> 20;
    VERL_CHECK(host_mb <= 0 || o.kv_cache_mb <= host_mb,
               "--kv-cache-mb {} is more than this machine's {} MiB of memory (the CPU engine "
               "keeps its KV cache "
               "there)",
               o.kv_cache_mb, host_mb);
    engine_holder.emplace(w, ecfg);
  }
  rollout::Engine& engine = *engine_holder;

  // Stop strings: decode the output so far and look for any of them.
  rollout::GenerateHooks hooks;
  if (!o.stop.empty()) {
    VERL_CHECK(tok != nullptr, "--stop needs a tokenizer");
    hooks.stop = [&](int64_t, std::span<const int32_t> out) {
      std::string text = tok->decode(std::vector<int32_t>(out.begin(), out.end()), true);
      for (const auto& s : o.stop)
        if (text.find(s) != std::string::npos) return true;
      return false;
    };
  }
  auto text_of = [&](const rollout::Completion& c) {
    std::string text = tok->decode(c.tokens, /*skip_special_tokens=*/true);
    for (const auto& s : o.stop) {  // the text ends before the stop string, as vLLM's does
      size_t p = text.find(s);
      if (p != std::string::npos) text.resize(p);
    }
    return text;
  };

  const bool stream = !o.prompt.empty() && o.n == 1 && tok && o.output == "-";
  if (stream) {
    tokenizer::IncrementalDecoder dec(*tok, /*skip_special_tokens=*/true);
    hooks.on_token = [&](int64_t, int32_t, int32_t token) {
      std::cout << dec.push(token) << std::flush;
    };
    std::vector<rollout::Completion> out = engine.generate(reqs, hooks);
    std::cout << dec.finish() << "\n[finish_reason: " << rollout::to_string(out[0].finish_reason)
              << ", " << out[0].tokens.size() << " tokens]\n";
    return 0;
  }
  Output output(o.output);
  std::ostream& out = output.stream();
  for (const rollout::Completion& c : engine.generate(reqs, hooks)) {
    nlohmann::json j = {{"index", c.request},
                        {"sample", c.sample},
                        {"response_tokens", c.tokens},
                        {"response_logprobs", c.logprobs},
                        {"finish_reason", rollout::to_string(c.finish_reason)}};
    if (tok) j["text"] = text_of(c);
    out << j.dump() << '\n';
  }
  return 0;
}

Command reg(
    "generate", "Sample from an HF model with the rollout engine", [](CLI::App& app) -> Action {
      auto o = std::make_shared<Opts>();
      app.add_option("--model", o->model, "HF model directory")->required();
      app.add_option("--lora", o->lora, "PEFT LoRA adapter directory on --model (merged)");
      app.add_option("--tokenizer", o->tokenizer, "tokenizer directory (default: the model's)");
      app.add_option("--prompt", o->prompt, "one prompt; its output streams to the terminal");
      app.add_option("--input", o->input, "JSONL of {prompt|messages|prompt_tokens}, - for stdin");
      app.add_option("--output", o->output, "output JSONL (default stdout)");
      app.add_flag("--chat", o->chat, "render text prompts with the chat template");
      app.add_option("--n", o->n, "samples per prompt");
      app.add_option("--temperature", o->temperature, "0 = greedy");
      app.add_option("--top-p", o->top_p);
      app.add_option("--top-k", o->top_k);
      app.add_option("--max-tokens", o->max_tokens);
      app.add_option("--seed", o->seed);
      app.add_flag("--ignore-eos", o->ignore_eos);
      app.add_option("--stop", o->stop, "stop string (repeatable)");
      app.add_option("--kv-cache-mb", o->kv_cache_mb, "KV-cache budget in MiB");
      app.add_option("--max-num-seqs", o->max_num_seqs);
      app.add_option("--max-num-batched-tokens", o->max_num_batched_tokens);
      app.add_option("--device", o->device,
                     "cpu, cuda or auto (default: cuda when built with CUDA and a GPU is visible)");
      return [o] { return run(*o); };
    });

}  // namespace
}  // namespace verl::cli
