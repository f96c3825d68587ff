// `verl bench quant-linear` and `verl bench score`: the quantised forward-only model's kernels and
// a whole reward-model scoring pass (docs/reward_model.md, "Quantisation").
//   quant-linear: each linear matrix of a model shape (q|k|v, o, gate|up, down) at T tokens, bf16
//     cuBLASLt against the fused int8/int4 kernel, dequant+cuBLASLt and, at up to 8 tokens, the
//     GEMV kernel (ops/cuda/quant_linear.h),
//     one JSON line per (matrix, T, path) with ms, TFLOP/s, achieved GB/s (the bytes a path must
//     move: weights as stored, x, y; the dequant path also writes and reads the bf16 matrix) and
//     the time ratio to bf16. The HBM peak is printed beside it for the roofline.
//   score: trainer::RewardModel (the code `verl score` and the trainer run) over a shape with
//     random weights held in memory (no checkpoint), quantised by round to nearest, scoring
//     --seqs random sequences of --len tokens: seconds of the pass, tokens/s, the model's device
//     bytes and the tracked device peak of the pass.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/bench/bench.h"
#include "cli/bench/shapes.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/timer.h"
#include "model/quantize.h"
#include "model/weights.h"
#include "trainer/reward_model.h"
#ifdef VERL_HAVE_CUDA
#include "model/cuda/quantized_linears.h"
#include "ops/cuda/device.h"
#include "ops/cuda/ops_cuda.h"
#include "ops/cuda/quant_linear.h"
#include "ops/cuda/section_timer.h"
#endif

namespace verl::cli {
namespace {

constexpr double kH200HbmBytesPerSecond = 4.8e12;  // H200 HBM3e peak (NVIDIA spec sheet)

struct QuantLinearOpts {
  std::vector<std::string> shapes = {"qwen2.5-1.5b", "qwen2.5-7b"};
  std::vector<int64_t> tokens = {1, 8, 32, 128, 512, 2048, 8192};
  std::vector<int> bits = {8, 4};
  int64_t group = 128;
  int iters = 20, warmup = 3;
  uint64_t seed = 1;
};

struct ScoreOpts {
  std::string shape = "qwen2.5-1.5b";
  std::string quantize = "none";
  int64_t group = 128;
  int64_t seqs = 256, len = 512;
  int64_t max_tokens = 8192, max_seqs = 64;
  int repeat = 2;
  uint64_t seed = 1;
};

#ifdef VERL_HAVE_CUDA

// Milliseconds per call of fn (enqueued on `stream`), averaged over `iters` after `warmup`.
template <typename Fn>
double time_ms(ops::cuda::SectionTimer& timer, cudaStream_t stream, int warmup, int iters,
               Fn&& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  timer.mark(stream, "timed");
  for (int i = 0; i < iters; ++i) fn();
  timer.stop(stream);
  return timer.take().front().second / iters;
}

std::vector<uint16_t> random_bf16(size_t n, uint64_t seed, float std) {
  Rng rng(seed);
  std::vector<uint16_t> h(n);
  for (auto& e : h) e = f32_to_bf16(std * rng.normal());
  return h;
}

int run_quant_linear(const QuantLinearOpts& o) {
  using namespace ops::cuda;
  VERL_CHECK(cuda_device_count() > 0, "bench quant-linear: no CUDA device is visible");
  VERL_CHECK(!o.tokens.empty() && o.iters >= 1,
             "bench quant-linear: want --tokens and --iters >= 1");
  for (int b : o.bits)
    VERL_CHECK(b == 8 || b == 4, "bench quant-linear: --bits {}: want 8 and/or 4", b);
  CudaSession session;
  const CudaContext& ctx = session.ctx();
  SectionTimer timer;
  const int64_t max_t = *std::max_element(o.tokens.begin(), o.tokens.end());
  for (const std::string& shape_name : o.shapes) {
    const BenchShape* shape = find_bench_shape(shape_name);
    VERL_CHECK(shape != nullptr, "bench quant-linear: unknown shape '{}' (known: {})", shape_name,
               bench_shape_names());
    const model::ModelConfig c = bench_shape_config(*shape);
    const int64_t C = c.hidden_size, F = c.intermediate_size, qd = c.q_dim(),
                  Q3 = qd + 2 * c.kv_dim();
    struct Mat {
      const char* name;
      int64_t n, k;
    };
    const Mat mats[] = {{"qkv", Q3, C}, {"o", C, qd}, {"gate_up", 2 * F, C}, {"down", C, F}};
    for (const Mat& m : mats) {
      // The bf16 weights and, per bit width, the same weights quantised (round to nearest).
      Rng rng(o.seed);
      std::vector<float> w(static_cast<size_t>(m.n * m.k));
      for (auto& e : w) e = 0.02f * rng.normal();
      std::vector<uint16_t> wb(w.size());
      for (size_t i = 0; i < w.size(); ++i) wb[i] = f32_to_bf16(w[i]);
      DeviceBuffer<bf16> w_bf16(w.size()), x(static_cast<size_t>(max_t * m.k)),
          y(static_cast<size_t>(max_t * m.n)), scratch(w.size());
      copy_to_device(w_bf16.data(), wb.data(), wb.size() * 2);
      std::vector<uint16_t>().swap(wb);
      const std::vector<uint16_t> xh = random_bf16(x.size(), o.seed + 1, 1.0f);
      copy_to_device(x.data(), xh.data(), xh.size() * 2);
      std::vector<std::unique_ptr<model::cuda::QuantizedLinears>> quant;
      for (int b : o.bits) {
        // QuantizedLinears holds a layer's four matrices: this one in each slot's place.
        std::vector<model::QuantizedLayer> one(1);
        one[0].wqkv = model::quantize_matrix(w.data(), m.n, m.k, b, b == 8 ? m.k : o.group);
        one[0].wo = one[0].wgu = one[0].wdown = one[0].wqkv;
        quant.push_back(std::make_unique<model::cuda::QuantizedLinears>(one));
      }
      std::vector<float>().swap(w);
      for (int64_t T : o.tokens) {
        const double flops = 2.0 * static_cast<double>(T) * m.n * m.k;
        const double act_bytes = 2.0 * static_cast<double>(T) * (m.k + m.n);
        const double bf16_w = 2.0 * static_cast<double>(m.n) * m.k;
        const double bf16_ms = time_ms(timer, ctx.stream, o.warmup, o.iters, [&] {
          linear_forward(ctx, y.data(), x.data(), w_bf16.data(), nullptr, T, m.k, m.n);
        });
        auto emit = [&](const char* path, int bits, double ms, double bytes) {
          nlohmann::json j = {{"bench", "quant_linear"},
                              {"shape", shape_name},
                              {"matrix", m.name},
                              {"N", m.n},
                              {"K", m.k},
                              {"T", T},
                              {"path", path},
                              {"bits", bits},
                              {"ms", ms},
                              {"tflops", flops / (ms * 1e-3) / 1e12},
                              {"gbps", bytes / (ms * 1e-3) / 1e9},
                              {"hbm_peak_gbps", kH200HbmBytesPerSecond / 1e9},
                              {"ratio_vs_bf16", bf16_ms / ms}};
          if (bits == 4) j["group"] = o.group;
          std::printf("%s\n", j.dump().c_str());
          std::fflush(stdout);
        };
        emit("bf16_cublaslt", 16, bf16_ms, bf16_w + act_bytes);
        for (size_t i = 0; i < o.bits.size(); ++i) {
          const QuantMatrixView& v = quant[i]->layer(0).wqkv;
          const double qbytes = static_cast<double>(v.bytes());
          const double fused_ms = time_ms(timer, ctx.stream, o.warmup, o.iters, [&] {
            quant_linear_forward(ctx, y.data(), x.data(), v, nullptr, T, m.k, m.n, scratch.data(),
                                 QuantPath::Fused);
          });
          const double deq_ms = time_ms(timer, ctx.stream, o.warmup, o.iters, [&] {
            quant_linear_forward(ctx, y.data(), x.data(), v, nullptr, T, m.k, m.n, scratch.data(),
                                 QuantPath::Dequant);
          });
          emit("fused", o.bits[i], fused_ms, qbytes + act_bytes);
          emit("dequant_cublaslt", o.bits[i], deq_ms, qbytes + 2 * bf16_w + act_bytes);
          if (quant_gemv_supported(v, T, x.data())) {
            const double gemv_ms = time_ms(timer, ctx.stream, o.warmup, o.iters, [&] {
              quant_linear_forward(ctx, y.data(), x.data(), v, nullptr, T, m.k, m.n, nullptr,
                                   QuantPath::Gemv);
            });
            emit("gemv", o.bits[i], gemv_ms, qbytes + act_bytes);
          }
        }
      }
    }
  }
  return 0;
}

int run_score(const ScoreOpts& o) {
  VERL_CHECK(cuda_device_count() > 0, "bench score: no CUDA device is visible");
  VERL_CHECK(o.quantize == "none" || o.quantize == "int8" || o.quantize == "int4",
             "bench score: --quantize {}: want none, int8 or int4", o.quantize);
  VERL_CHECK(o.seqs >= 1 && o.len >= 1 && o.len <= o.max_tokens && o.repeat >= 1,
             "bench score: --seqs {}, --len {} (at most --max-tokens {}), --repeat {} must be >= 1",
             o.seqs, o.len, o.max_tokens, o.repeat);
  const BenchShape* shape = find_bench_shape(o.shape);
  VERL_CHECK(shape != nullptr, "bench score: unknown --shape '{}' (known: {})", o.shape,
             bench_shape_names());
  // The shape as a one-label sequence classifier (a reward model): no LM head, a score head.
  model::ModelConfig c = bench_shape_config(*shape);
  c.architecture = "Qwen2ForSequenceClassification";
  c.head = model::HeadKind::SequenceClassification;
  c.num_labels = 1;
  c.tie_word_embeddings = false;
  Timer setup;
  model::Weights w = bench_random_weights(c, o.seed);
  const int bits = o.quantize == "int8" ? 8 : o.quantize == "int4" ? 4 : 16;
  model::QuantizeOptions qo;
  qo.bits = bits;
  qo.group = o.group;
  qo.calibration_samples = 0;  // round to nearest: GPTQ changes the codes, not the kernels
  std::vector<model::QuantizedLayer> layers;
  const model::QuantizeReport q = model::quantize_linear_weights(w, qo, &layers);
  const int64_t params = w.layout.total;
  const size_t before = tracked_device_memory();
  trainer::RewardModel rm(Device::Cuda, std::move(w), "bench:" + o.shape, o.max_tokens, o.max_seqs,
                          false, std::move(layers));
  const double setup_s = setup.seconds();
  Rng rng(o.seed + 7);
  std::vector<std::vector<int32_t>> seqs(static_cast<size_t>(o.seqs));
  for (auto& s : seqs) {
    s.resize(static_cast<size_t>(o.len));
    for (auto& t : s)
      t = static_cast<int32_t>(rng.uniform() * static_cast<double>(c.vocab_size - 1));
  }
  rm.score(seqs);  // warm-up: cuBLASLt's algorithm choices, first-touch of the kernels
  (void)take_tracked_device_peak();
  double best = 1e30;
  for (int r = 0; r < o.repeat; ++r) {
    Timer t;
    const std::vector<float> scores = rm.score(seqs);  // returns once the scores are on the host
    best = std::min(best, t.seconds());
  }
  const size_t peak = take_tracked_device_peak();
  const double tokens = static_cast<double>(o.seqs * o.len);
  nlohmann::json j = {{"bench", "score"},
                      {"shape", o.shape},
                      {"quantize", o.quantize},
                      {"params", params},
                      {"seqs", o.seqs},
                      {"len", o.len},
                      {"max_tokens", o.max_tokens},
                      {"max_seqs", o.max_seqs},
                      {"seconds", best},
                      {"tokens_per_second", tokens / best},
                      {"model_device_gib", static_cast<double>(rm.device_bytes()) / (1 << 30)},
                      {"device_peak_gib", static_cast<double>(peak) / (1 << 30)},
                      {"device_before_model_gib", static_cast<double>(before) / (1 << 30)},
                      {"setup_seconds", setup_s}};
  if (bits == 4) j["group"] = o.group;
  if (q.matrices > 0) {
    j["quantized_mib"] = static_cast<double>(q.quantized_bytes) / 1048576.0;
    j["quantize_seconds"] = q.seconds;
  }
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
  return 0;
}

#else

int run_quant_linear(const QuantLinearOpts&) {
  VERL_FAIL("bench quant-linear: this build has no CUDA backend (configure with -DVERL_CUDA=ON)");
}
int run_score(const ScoreOpts&) {
  VERL_FAIL("bench score: this build has no CUDA backend (configure with -DVERL_CUDA=ON)");
}

#endif

}  // namespace

Action add_bench_quant_linear(CLI::App& bench) {
  auto o = std::make_shared<QuantLinearOpts>();
  CLI::App* s = bench.add_subcommand("quant-linear",
                                     "Time a model shape's linear matrices at several token "
                                     "counts: bf16 cuBLASLt against the fused "
                                     "int8/int4 dequantising kernel and dequantise + cuBLASLt; one "
                                     "JSON line per (matrix, T, path)");
  s->add_option("--shapes", o->shapes,
                "model shapes: " + bench_shape_names() + " (default qwen2.5-1.5b qwen2.5-7b)");
  s->add_option("--tokens", o->tokens, "token counts T (default 1 8 32 128 512 2048 8192)");
  s->add_option("--bits", o->bits, "8 and/or 4 (default both)");
  s->add_option("--group", o->group, "int4 inputs per scale (default 128)");
  s->add_option("--iters", o->iters, "timed calls per point (default 20)");
  s->add_option("--warmup", o->warmup, "untimed calls first (default 3)");
  return [o, s]() -> int { return s->parsed() ? run_quant_linear(*o) : 0; };
}

Action add_bench_score(CLI::App& bench) {
  auto o = std::make_shared<ScoreOpts>();
  CLI::App* s = bench.add_subcommand(
      "score",
      "Time one reward-model scoring pass on the GPU over a shape with random weights (none on "
      "disk), bf16 or quantised by round to nearest; prints one JSON line (seconds, device peak)");
  s->add_option("--shape", o->shape,
                "model shape: " + bench_shape_names() + " (default qwen2.5-1.5b)");
  s->add_option("--quantize", o->quantize, "none, int8 or int4 (default none)");
  s->add_option("--group", o->group, "int4 inputs per scale (default 128)");
  s->add_option("--seqs", o->seqs, "sequences scored (default 256)");
  s->add_option("--len", o->len, "tokens per sequence (default 512)");
  s->add_option("--max-tokens", o->max_tokens, "tokens a forward (default 8192)");
  s->add_option("--max-seqs", o->max_seqs, "sequences a forward (default 64)");
  s->add_option("--repeat", o->repeat,
                "timed passes after one warm-up, the best reported (default 2)");
  return [o, s]() -> int { return s->parsed() ? run_score(*o) : 0; };
}

}  // namespace verl::cli
