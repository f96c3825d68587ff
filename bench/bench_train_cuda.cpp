// CUDA training-step benchmark: forward + backward + AdamW (with grad-norm clipping) of a
// Qwen2.5-shaped causal LM with random weights (src/ops/cuda/transformer_cuda.h) over packed
// sequences of equal length. Prints one JSON line:
//   model_flops_per_step = 6 * params * tokens + 6 * layers * B * S^2 * H * D
// (params counts the tied embedding once, as the LM head GEMM; the attention term is the causal
// QK^T and PV matmuls, forward 2 S^2 H D per layer, backward twice that), tflops = that / time,
// mfu = tflops / 800 (the H200's dense bf16 peak used across this project), and the device
// memory in use after the steps (cudaMemGetInfo: total - free).
//
//   bench_train_cuda --shape qwen2.5-0.5b --batch 8 --seq 1024 --steps 10 --warmup 2
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_model.h"

#ifdef VERL_HAVE_CUDA
#include <cuda_runtime.h>

#include "core/rng.h"
#include "model/batch.h"
#include "model/weights.h"
#include "ops/cuda/device.h"
#include "ops/cuda/transformer_cuda.h"
#endif

using namespace verl;

namespace {

void fail(const std::string& msg) {
  nlohmann::json j = {{"bench", "train_step_cuda"}, {"error", msg}};
  std::printf("%s\n", j.dump().c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape = "qwen2.5-0.5b";
  int64_t batch = 8, seq = 1024, chunk = 1024;
  int steps = 10, warmup = 2;
  float lr = 1e-5f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) fail("missing value for " + a);
      return argv[++i];
    };
    if (a == "--shape") shape = next();
    else if (a == "--batch") batch = std::atoll(next().c_str());
    else if (a == "--seq") seq = std::atoll(next().c_str());
    else if (a == "--steps") steps = std::atoi(next().c_str());
    else if (a == "--warmup") warmup = std::atoi(next().c_str());
    else if (a == "--chunk") chunk = std::atoll(next().c_str());
    else if (a == "--lr") lr = std::strtof(next().c_str(), nullptr);
    else fail("unknown option " + a + " (--shape qwen2.5-0.5b|qwen2.5-1.5b --batch --seq --steps "
              "--warmup --chunk --lr)");
  }
  if (batch <= 0 || seq <= 1 || steps <= 0 || warmup < 0) fail("bad --batch/--seq/--steps/--warmup");

  model::ModelConfig c;
  if (shape == "qwen2.5-0.5b") {
    c = bench::qwen2_shape(151936, 896, 24, 14, 2, 4864);
  } else if (shape == "qwen2.5-1.5b") {
    c = bench::qwen2_shape(151936, 1536, 28, 12, 2, 8960);
  } else {
    fail("unknown --shape " + shape + " (qwen2.5-0.5b or qwen2.5-1.5b)");
  }
  c.rms_norm_eps = 1e-6;

#ifndef VERL_HAVE_CUDA
  (void)lr;
  (void)chunk;
  fail("built without CUDA (VERL_CUDA=OFF)");
  return 1;
#else
  try {
    if (ops::cuda::device_count() == 0) fail("no CUDA device");
    model::Weights w = model::Weights::from_config(c);
    w.init_random(1, 0.02f);

    Rng rng(2);
    std::vector<std::vector<int32_t>> seqs(batch, std::vector<int32_t>(seq));
    for (auto& s : seqs)
      for (auto& t : s) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(c.vocab_size)));
    model::PackedBatch b = model::PackedBatch::from_sequences(seqs);
    const int64_t T = b.num_tokens();
    const int64_t n_targets = T - batch;
    std::vector<float> d_lp(T);
    // Loss = mean token NLL over the batch (a cross-entropy step).
    for (int64_t t = 0; t < T; ++t) d_lp[t] = b.targets[t] >= 0 ? -1.0f / n_targets : 0.0f;

    ops::cuda::CudaSession session;
    const ops::cuda::CudaContext& ctx = session.ctx();
    ops::cuda::CudaTransformer tf(ctx, w, T, batch, chunk);
    const int64_t params = w.layout.total;
    w.data.clear();
    w.data.shrink_to_fit();
    ops::cuda::DeviceBuffer<float> d_lp_dev(d_lp);

    double grad_norm = 0;
    auto step = [&] {
      tf.zero_grad();
      tf.forward(b, 1.0f);
      tf.backward(d_lp_dev.data(), nullptr);
      grad_norm = tf.optimizer_step(lr);  // synchronises (reads the norm back)
    };
    for (int i = 0; i < warmup; ++i) step();
    session.synchronize();

    cudaEvent_t e0, e1;
    VERL_CUDA_CHECK(cudaEventCreate(&e0));
    VERL_CUDA_CHECK(cudaEventCreate(&e1));
    VERL_CUDA_CHECK(cudaEventRecord(e0, ctx.stream));
    for (int i = 0; i < steps; ++i) step();
    VERL_CUDA_CHECK(cudaEventRecord(e1, ctx.stream));
    VERL_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    VERL_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    const double secs = ms / 1e3 / steps;

    size_t free_b = 0, total_b = 0;
    VERL_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    const std::vector<float> lp = tf.download_logprob();
    double loss = 0;
    for (int64_t t = 0; t < T; ++t) loss -= lp[t];
    loss /= static_cast<double>(n_targets);

    const double H = static_cast<double>(c.num_attention_heads), D = static_cast<double>(c.head_dim);
    const double L = static_cast<double>(c.num_hidden_layers);
    const double S = static_cast<double>(seq), Bd = static_cast<double>(batch);
    const double flops = 6.0 * static_cast<double>(params) * static_cast<double>(T) +
                         6.0 * L * Bd * S * S * H * D;
    const double tflops = flops / secs / 1e12;
    nlohmann::json j = {
        {"bench", "train_step_cuda"},
        {"impl", "verl.cpp"},
        {"shape", shape},
        {"params", params},
        {"batch", batch},
        {"seq", seq},
        {"tokens_per_step", T},
        {"lm_head_chunk", chunk},
        {"steps", steps},
        {"warmup", warmup},
        {"seconds_per_step", secs},
        {"tokens_per_s", static_cast<double>(T) / secs},
        {"model_flops_per_step", flops},
        {"flops_formula", "6*params*tokens + 6*layers*B*S^2*H*D (causal attention)"},
        {"tflops", tflops},
        {"mfu", tflops / 800.0},
        {"mfu_peak_tflops", 800.0},
        {"device_mem_used_gib", static_cast<double>(total_b - free_b) / (1ull << 30)},
        {"arena_gib", static_cast<double>(tf.arena_bytes()) / (1ull << 30)},
        {"loss", loss},
        {"grad_norm", grad_norm}};
    std::printf("%s\n", j.dump().c_str());
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  } catch (const std::exception& e) {
    fail(e.what());
  }
  return 0;
#endif
}
