// CPU training-step benchmark: forward + backward + AdamW on a small Qwen2-shaped model with
// random weights, over packed sequences, through the trainer's own policy (trainer::make_policy on
// the CPU: the model over its flat training state and the one optimizer, as update_actor runs it).
// Prints one JSON line; bench/train_cpu.sh runs the same step in PyTorch beside it and reports the
// ratio.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "bench_model.h"
#include "core/rng.h"
#include "core/timer.h"
#include "dist/communicator.h"
#include "trainer/policy_model.h"

using namespace verl;

int main(int argc, char** argv) {
  CLI::App app{"CPU training step benchmark"};
  int64_t vocab = 8192, hidden = 384, layers = 6, heads = 6, kv_heads = 2, inter = 1024;
  int64_t batch = 4, seq = 256;
  int steps = 3;
  app.add_option("--vocab", vocab);
  app.add_option("--hidden", hidden);
  app.add_option("--layers", layers);
  app.add_option("--heads", heads);
  app.add_option("--kv-heads", kv_heads);
  app.add_option("--intermediate", inter);
  app.add_option("--batch", batch);
  app.add_option("--seq", seq);
  app.add_option("--steps", steps);
  CLI11_PARSE(app, argc, argv);

  model::ModelConfig c = bench::qwen2_shape(vocab, hidden, layers, heads, kv_heads, inter);
  model::Weights w = model::Weights::from_config(c);
  w.init_random(1, 0.02f);
  const int64_t params = w.layout.total;

  Rng rng(2);
  std::vector<std::vector<int32_t>> seqs(batch, std::vector<int32_t>(seq));
  for (auto& s : seqs)
    for (auto& t : s) t = static_cast<int32_t>(rng.below(vocab));
  model::PackedBatch b = model::PackedBatch::from_sequences(seqs);
  trainer::PolicyOptions po;
  po.optim.lr = 1e-4f;
  auto policy = trainer::make_policy(Device::Cpu, std::move(w), po);
  dist::SingleProcess comm;
  std::vector<float> logprob;
  std::vector<float> d_lp(b.num_tokens());
  // Loss = mean token NLL over the batch (as a cross-entropy step).
  for (int64_t t = 0; t < b.num_tokens(); ++t)
    d_lp[t] = b.targets[t] >= 0 ? -1.0f / (b.num_tokens() - batch) : 0.0f;

  auto step = [&] {
    policy->zero_grad();
    policy->forward(b, 1.0f, logprob, nullptr);
    policy->backward(d_lp.data(), nullptr);
    policy->optimizer_step(po.optim.lr, comm);
  };
  step();  // warm-up: grows the activation buffers
  Timer timer;
  for (int i = 0; i < steps; ++i) step();
  double secs = timer.seconds() / steps;
  double loss = 0;
  for (int64_t t = 0; t < b.num_tokens(); ++t) loss -= logprob[t];
  loss /= (b.num_tokens() - batch);
  nlohmann::json j = {{"bench", "train_step_cpu"},
                      {"impl", "verl.cpp"},
                      {"params", params},
                      {"tokens_per_step", b.num_tokens()},
                      {"seconds_per_step", secs},
                      {"tokens_per_s", b.num_tokens() / secs},
                      {"threads", omp_get_max_threads()},
                      {"loss", loss}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
