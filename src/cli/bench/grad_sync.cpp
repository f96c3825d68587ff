// `verl bench grad-sync`: bytes and seconds of one data-parallel gradient sync of a model shape's
// gradient, dense against LightweightSync settings, through the trainer's own optim::GradSync (the
// sink the backward hands its buckets to) over the launcher's communicator: run it under
// `mpirun -np W`. The buckets are the model's (the LM head when untied, the final norm, each layer,
// the embedding); one bucket at a time goes through a buffer of the largest bucket's size (so a
// 1.5B shape fits a small machine), as the step's last backward would hand them out, and the
// seconds are those of the sync alone (nothing for the backward to hide it behind). The codec's
// share (compress plus decode of every rank's message, no communication) is timed on its own, and
// a link of --link-gbps models the time the same bytes take across nodes.
#include "optim/grad_sync.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/bench/bench.h"
#include "cli/bench/shapes.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/timer.h"
#include "dist/launch.h"
#include "model/weights.h"
#include "optim/sparse_sync.h"

namespace verl::cli {
namespace {

struct GradSyncOpts {
  std::string shape = "qwen2.5-0.5b";
  std::vector<std::string> settings = {"dense", "0.1:int8", "0.05:int8", "0.01:int8", "0.1:bf16"};
  int iters = 2;
  double link_gbps = 100;
};

struct Bucket {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// The ranges the backward hands to the sink, in its order (model/cpu/decoder.cpp): the LM head
// when it has its own weights, the final norm, each layer from the last, the embedding.
std::vector<Bucket> backward_buckets(const model::ParamLayout& lay) {
  std::map<int64_t, Bucket> layers;
  Bucket embed, head, fnorm;
  for (size_t i = 0; i < lay.params.size(); ++i) {
    const model::ParamInfo& p = lay.params[i];
    const Bucket r{p.offset, p.offset + p.numel};
    if (p.name.rfind("layers.", 0) == 0) {
      const int64_t l = std::stoll(p.name.substr(7));
      auto [it, fresh] = layers.try_emplace(l, r);
      if (!fresh)
        it->second = {std::min(it->second.begin, r.begin), std::max(it->second.end, r.end)};
    } else if (static_cast<int>(i) == lay.embed) {
      embed = r;
    } else if (static_cast<int>(i) == lay.final_norm) {
      fnorm = r;
    } else if (static_cast<int>(i) == lay.lm_head) {
      head = r;
    }
  }
  std::vector<Bucket> out;
  if (head.size() > 0) out.push_back(head);
  out.push_back(fnorm);
  for (auto it = layers.rbegin(); it != layers.rend(); ++it) out.push_back(it->second);
  out.push_back(embed);
  return out;
}

struct Setting {
  std::string name;
  std::optional<optim::LightweightConfig> lw;  // none: the dense all-reduce
};

Setting parse_setting(const std::string& s) {
  if (s == "dense" || s == "allreduce") return {"dense", std::nullopt};
  const size_t colon = s.find(':');
  VERL_CHECK(colon != std::string::npos, "--settings '{}': want dense or TOP_K:DTYPE (0.05:int8)",
             s);
  optim::LightweightConfig lw;
  try {
    lw.top_k = std::stod(s.substr(0, colon));
  } catch (const std::exception&) {
    VERL_FAIL("--settings '{}': '{}' is not a number", s, s.substr(0, colon));
  }
  VERL_CHECK(lw.top_k > 0 && lw.top_k <= 1, "--settings '{}': top_k must be in (0, 1]", s);
  lw.values = optim::sync_values_named(s.substr(colon + 1), "--settings");
  return {s, lw};
}

int run_grad_sync(const GradSyncOpts& o) {
  const BenchShape* shape = find_bench_shape(o.shape);
  VERL_CHECK(shape != nullptr, "--shape '{}' is not a known shape; choose one of {}", o.shape,
             bench_shape_names());
  VERL_CHECK(o.iters >= 1, "--iters must be >= 1, got {}", o.iters);
  VERL_CHECK(o.link_gbps > 0, "--link-gbps must be positive, got {}", o.link_gbps);
  std::vector<Setting> settings;
  for (const std::string& s : o.settings) settings.push_back(parse_setting(s));
  const model::ModelConfig cfg =
      qwen2_shape(shape->vocab, shape->hidden, shape->layers, shape->heads, shape->kv_heads,
                  shape->intermediate, shape->tied);
  const model::ParamLayout lay = model::ParamLayout::build(cfg);
  const std::vector<Bucket> buckets = backward_buckets(lay);
  int64_t largest = 0, covered = 0;
  for (const Bucket& b : buckets) {
    largest = std::max(largest, b.size());
    covered += b.size();
  }
  VERL_CHECK(covered == lay.total, "grad-sync: the buckets cover {} of {} parameters", covered,
             lay.total);
  std::unique_ptr<dist::Communicator> comm = dist::make_communicator(dist::detect_launch(), 600);
  const int world = comm->world_size(), rank = comm->rank();
  VERL_CHECK(
      world >= 2,
      "verl bench grad-sync measures a sync between ranks: run it under mpirun -np 2 (or more)");

  // Gradient-like values (N(0, 1e-3), different on every rank), restored before every bucket
  // since a sync overwrites the buffer with the sum.
  std::vector<float> pristine(static_cast<size_t>(largest));
  Rng rng(1000 + static_cast<uint64_t>(rank));
  for (float& x : pristine) x = 1e-3f * rng.normal();
  std::vector<float> grads(pristine.size()), carry(pristine.size(), 0.0f);

  double dense_seconds = 0, dense_bytes = 0;
  for (const Setting& s : settings) {
    double best = 1e30, bytes = 0, dense = 0;
    for (int it = 0; it < o.iters; ++it) {
      optim::SyncStats stats;
      double seconds = 0;
      for (const Bucket& b : buckets) {
        std::copy_n(pristine.begin(), b.size(), grads.begin());
        comm->barrier();
        Timer t;
        optim::GradSync sync(*comm, 0, b.size(), b.size(), grads.data(), stats);
        if (s.lw) sync.use_lightweight(*s.lw, carry.data());
        sync.arm(true);
        sync.open(0, b.size());
        sync.ready(0, b.size());
        sync.finish();
        seconds += t.seconds();
      }
      best =
          std::min(best, comm->max(static_cast<int64_t>(seconds * 1e9)) / 1e9);  // the slowest rank
      bytes = stats.bytes;
      dense = stats.dense_bytes;
    }
    // The codec alone: this rank's compress plus the decode of W messages, per bucket.
    double codec = 0;
    if (s.lw) {
      Timer t;
      for (const Bucket& b : buckets) {
        const optim::SparseLayout l = optim::sparse_layout(b.size(), s.lw->top_k, s.lw->values);
        std::vector<uint8_t> msg(l.bytes);
        optim::sparse_compress(pristine.data(), carry.data(), true, l, msg.data());
        std::fill_n(grads.begin(), b.size(), 0.0f);
        for (int r = 0; r < world; ++r) optim::sparse_accumulate(msg.data(), l, grads.data());
      }
      codec = t.seconds();
    }
    if (!s.lw) {
      dense_seconds = best;
      dense_bytes = bytes;
    }
    // Across nodes the bytes dominate: the same bytes over a link of --link-gbps, plus the codec.
    const double link_bps = o.link_gbps * 1e9 / 8;
    const double modelled = codec + bytes / link_bps;
    if (rank == 0) {
      nlohmann::json j = {{"bench", "grad_sync"},
                          {"shape", o.shape},
                          {"params", lay.total},
                          {"buckets", buckets.size()},
                          {"world", world},
                          {"setting", s.name},
                          {"bytes_sent", bytes},
                          {"bytes_dense", dense},
                          {"bytes_ratio_vs_dense", bytes > 0 ? dense / bytes : 0.0},
                          {"seconds", best},
                          {"codec_seconds", codec},
                          {"link_gbps", o.link_gbps},
                          {"modelled_link_seconds", modelled},
                          {"modelled_dense_link_seconds", dense / link_bps}};
      if (dense_seconds > 0) j["time_ratio_vs_dense"] = dense_seconds / best;
      if (dense_bytes > 0 && !s.lw)
        j["note"] = "the peer: the dense all-reduce of the same buckets";
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

Action add_bench_grad_sync(CLI::App& bench) {
  auto o = std::make_shared<GradSyncOpts>();
  CLI::App* s = bench.add_subcommand(
      "grad-sync",
      "Time one data-parallel gradient sync of a model shape, dense against LightweightSync "
      "settings (run under mpirun -np 2 or more); prints one JSON line per setting");
  s->add_option("--shape", o->shape,
                "model shape: " + bench_shape_names() + " (default qwen2.5-0.5b)");
  s->add_option(
      "--settings", o->settings,
      "dense and/or TOP_K:DTYPE entries (default dense 0.1:int8 0.05:int8 0.01:int8 0.1:bf16)");
  s->add_option("--iters", o->iters, "timed syncs per setting, the best reported (default 2)");
  s->add_option("--link-gbps", o->link_gbps,
                "link speed in Gbit/s for the modelled cross-node time (default 100)");
  return [o, s]() -> int { return s->parsed() ? run_grad_sync(*o) : 0; };
}

}  // namespace verl::cli
