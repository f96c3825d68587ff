// CPU rollout benchmark: 64 sequences sampled from a small Qwen2-shaped model with random
// weights (output tokens/s), and a GRPO-shaped run (prompts x n=8) reporting prompt tokens
// computed with prefix sharing against what prefilling every sample would cost. One JSON line each.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "bench_model.h"
#include "core/rng.h"
#include "rollout/engine.h"

using namespace verl;

int main(int argc, char** argv) {
  CLI::App app{"CPU rollout benchmark"};
  int64_t vocab = 8192, hidden = 384, layers = 6, heads = 6, kv_heads = 2, inter = 1024;
  int seqs = 64, prompt_len = 64, new_tokens = 64, groups = 8, n = 8;
  app.add_option("--vocab", vocab);
  app.add_option("--hidden", hidden);
  app.add_option("--layers", layers);
  app.add_option("--intermediate", inter);
  app.add_option("--seqs", seqs);
  app.add_option("--prompt-len", prompt_len);
  app.add_option("--new-tokens", new_tokens);
  app.add_option("--groups", groups);
  app.add_option("--n", n);
  CLI11_PARSE(app, argc, argv);

  model::ModelConfig c = bench::qwen2_shape(vocab, hidden, layers, heads, kv_heads, inter);
  model::Weights w = model::Weights::from_config(c);
  w.init_random(1, 0.02f);

  rollout::EngineConfig ecfg;
  ecfg.scheduler.max_num_seqs = 256;
  ecfg.scheduler.max_num_batched_tokens = 4096;
  ecfg.scheduler.max_model_len = prompt_len + new_tokens + 16;
  ecfg.kv_cache_bytes = 512ll << 20;
  rollout::Engine engine(w, ecfg);
  Rng rng(3);
  auto make = [&](int count, int samples) {
    std::vector<rollout::Request> reqs(count);
    for (int i = 0; i < count; ++i) {
      reqs[i].prompt.resize(prompt_len);
      for (auto& t : reqs[i].prompt) t = static_cast<int32_t>(rng.below(vocab));
      reqs[i].params.temperature = 1.0f;
      reqs[i].params.max_tokens = new_tokens;
      reqs[i].params.ignore_eos = true;
      reqs[i].params.seed = i;
      reqs[i].n = samples;
    }
    return reqs;
  };
  engine.generate(make(4, 1));  // warm-up
  engine.generate(make(seqs, 1));
  const rollout::EngineStats& s = engine.stats();
  nlohmann::json j = {{"bench", "rollout_cpu"},
                      {"params", w.layout.total},
                      {"sequences", seqs},
                      {"prompt_len", prompt_len},
                      {"new_tokens", new_tokens},
                      {"seconds", s.seconds},
                      {"output_tokens_per_s", s.output_tokens / s.seconds},
                      {"steps", s.steps},
                      {"threads", omp_get_max_threads()}};
  std::printf("%s\n", j.dump().c_str());
  engine.generate(make(groups, n));
  const rollout::EngineStats& g = engine.stats();
  nlohmann::json k = {
      {"bench", "rollout_prefix_sharing_cpu"},
      {"prompts", groups},
      {"n", n},
      {"prompt_len", prompt_len},
      {"prompt_tokens_computed", g.prompt_tokens_computed},
      {"prompt_tokens_without_sharing", g.prompt_tokens_without_sharing},
      {"reduction", double(g.prompt_tokens_without_sharing) / g.prompt_tokens_computed},
      {"seconds", g.seconds},
      {"output_tokens_per_s", g.output_tokens / g.seconds}};
  std::printf("%s\n", k.dump().c_str());
  return 0;
}
