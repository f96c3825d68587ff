// ZeRO 1 and 2 on the GPU training state (optim/cuda/strategy.h) with several ranks on ONE GPU
// (device collectives staged through host memory): gradients written into the state's buffer and
// reported range by range as the GPU backward does, over two micro-batches, then AdamW steps; each
// stage equals one CPU process stepping on the ranks' mean gradient (the oracle), every rank's
// bf16 copy is its whole master rounded, the moments are the shard's and gather whole; a state
// saved at W ranks resumes at W/2 (its moments re-split) and goes on as one process would; ZeRO-3
// and ZeRO with offload are refused by key; the demo model's policy (its GPU backward reporting
// the ranges) steps with ZeRO 1 and 2 as with ZeRO 0. Run under
//   mpirun --allow-run-as-root --oversubscribe -np 2 (or -np 4) test_cuda_mpi
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/arch/arch.h"
#include "model/batch.h"
#include "model/weights.h"
#include "ops/cuda/device.h"
#include "optim/adamw.h"
#include "optim/cuda/train_state.h"
#include "optim/strategy.h"
#include "optim/train_state.h"
#include "trainer/policy_model.h"
#include "trainer/update_loop.h"
#include "world.h"

namespace verl::optim {
namespace {

using dist::comm;

// "a" [7, 19] and "b" [257]: 390 elements, so 4 ranks pad the last shard (chunk 98).
model::ParamLayout two_tensors() {
  model::ParamLayout l;
  model::arch::LayoutBuilder b(l);
  b.add("a", {7, 19});
  b.add("b", {257});
  return l;
}
constexpr int64_t kN = 390;

std::vector<float> initial() {
  std::vector<float> w(kN);
  for (int64_t i = 0; i < kN; ++i) w[i] = 0.05f * static_cast<float>(i % 9) - 0.2f;
  return w;
}

// Rank r's gradient of element i at step k (step 1 large enough to be clipped).
float grad(int r, int64_t i, int k) {
  return (k == 1 ? 0.9f : 0.05f) * std::cos(0.3f * static_cast<float>(i + 7 * r + 5 * k)) +
         0.01f * static_cast<float>(r);
}

AdamWConfig optim_config() {
  AdamWConfig c;
  c.lr = 0.02f;
  c.weight_decay = 0.05f;
  c.grad_clip = 1.0f;
  return c;
}

// The oracle: one CPU process whose step k gradient is the mean over worlds[k] ranks.
CpuTrainState one_process(const std::vector<int>& worlds) {
  CpuTrainState st(two_tensors(), initial(), true);
  dist::SingleProcess single;
  const AdamW opt(optim_config());
  for (int k = 0; k < static_cast<int>(worlds.size()); ++k) {
    st.zero_grad();
    for (int64_t i = 0; i < kN; ++i) {
      float sum = 0;
      for (int r = 0; r < worlds[k]; ++r) sum += grad(r, i, k);
      st.grads()[i] = sum / static_cast<float>(worlds[k]);
    }
    opt.step(st, optim_config().lr, single);
  }
  return st;
}

// y[begin, end) += x on the device (as a backward accumulates), synchronously.
void accumulate(float* y, int64_t begin, const std::vector<float>& x) {
  std::vector<float> h(x.size());
  dist::cuda_ok(cudaDeviceSynchronize(), "sync");
  ops::cuda::copy_to_host(h.data(), y + begin, h.size() * sizeof(float));
  for (size_t i = 0; i < h.size(); ++i) h[i] += x[i];
  ops::cuda::copy_to_device(y + begin, h.data(), h.size() * sizeof(float));
  dist::cuda_ok(cudaDeviceSynchronize(), "sync");
}

// Optimizer steps [k0, k1) over `c`'s ranks, two micro-batches each; the ranges reported as the
// GPU backward reports them (the last tensor first).
void train(cuda::CudaTrainState& st, Strategy& s, dist::Communicator& c, int k0, int k1) {
  const AdamW opt(optim_config());
  for (int k = k0; k < k1; ++k) {
    st.zero_grad();
    for (bool last : {false, true}) {
      s.prepare_backward(last);
      for (const auto& [b, e] : {std::pair<int64_t, int64_t>{133, kN}, {0, 133}}) {
        std::vector<float> g(static_cast<size_t>(e - b));
        for (int64_t i = b; i < e; ++i) g[i - b] = 0.5f * grad(c.rank(), i, k);
        accumulate(st.grads(), b, g);
        s.grads_ready(b, e);
      }
    }
    opt.step(st, s, optim_config().lr, c);
  }
}

void expect_near_all(const char* what, const std::vector<float>& got,
                     const std::vector<float>& want, int stage) {
  ASSERT_EQ(got.size(), want.size()) << what << ", stage " << stage;
  int misses = 0;
  for (size_t i = 0; i < want.size() && misses < 5; ++i) {
    // AdamW in fp32 on both sides, FMAs contracted differently; sums over ranks in another order.
    const double tol = 1e-6 + 1e-5 * std::abs(want[i]);
    if (std::abs(got[i] - want[i]) > tol) {
      ++misses;
      ADD_FAILURE() << what << ", stage " << stage << ", element " << i << ": " << got[i] << " vs "
                    << want[i];
    }
  }
}

struct Session {
  Session() : s(std::make_unique<ops::cuda::CudaSession>()) {}
  std::unique_ptr<ops::cuda::CudaSession> s;
};

TEST(ZeroCuda, StagesOneAndTwoEqualOneProcess) {
  SKIP_WITHOUT_GPU();
  const int world = comm().world_size();
  ASSERT_GE(world, 2) << "run under mpirun -np 2 or 4";
  constexpr int kSteps = 3;
  const CpuTrainState want = one_process(std::vector<int>(kSteps, world));
  Session session;
  for (int stage = 0; stage <= 2; ++stage) {
    cuda::CudaTrainState st(session.s->ctx(), two_tensors(), initial(), true);
    StrategyConfig cfg;
    cfg.zero_stage = stage;
    std::unique_ptr<Strategy> s = make_strategy(st, comm(), cfg);
    ASSERT_EQ(s->zero_stage(), stage);
    const int64_t chunk = (kN + world - 1) / world;
    if (stage > 0) {
      EXPECT_EQ(st.shard().begin, std::min<int64_t>(kN, comm().rank() * chunk));
      EXPECT_EQ(st.shard().end, std::min<int64_t>(kN, (comm().rank() + 1) * chunk));
    }
    train(st, *s, comm(), 0, kSteps);
    const std::vector<float> w = st.download_weights();
    expect_near_all("master", w, want.download_weights(), stage);
    // Every rank holds the whole weights, the same bits, and its bf16 copy is them rounded.
    const auto digest = static_cast<int64_t>(st.weights_digest());
    std::vector<int64_t> digests(static_cast<size_t>(world));
    comm().all_gather<int64_t>(std::span<const int64_t>(&digest, 1), digests);
    for (int r = 1; r < world; ++r) EXPECT_EQ(digests[r], digests[0]) << "stage " << stage;
    std::vector<uint16_t> bits(static_cast<size_t>(kN));
    ops::cuda::copy_to_host(bits.data(), st.weights_bf16(), bits.size() * sizeof(uint16_t));
    for (int64_t i = 0; i < kN; ++i)
      ASSERT_EQ(bits[i], f32_to_bf16(w[i])) << "stage " << stage << ", element " << i;
    // This rank's moments are its shard's; gathered, the whole equals the oracle's.
    const AdamWState mine = st.download_optimizer_state();
    EXPECT_EQ(static_cast<int64_t>(mine.exp_avg.size()), stage > 0 ? st.shard().size() : kN);
    const AdamWState whole = s->download_optimizer_state();
    expect_near_all("exp_avg", whole.exp_avg, want.optimizer_state().exp_avg, stage);
    expect_near_all("exp_avg_sq", whole.exp_avg_sq, want.optimizer_state().exp_avg_sq, stage);
    EXPECT_EQ(whole.step, kSteps);
  }
}

TEST(ZeroCuda, SavedAtWRanksResumesAtHalf) {
  SKIP_WITHOUT_GPU();
  const int world = comm().world_size();
  ASSERT_GE(world, 2) << "run under mpirun -np 2 or 4";
  ASSERT_EQ(world % 2, 0);
  Session session;
  // Two steps at W ranks with ZeRO-1; the checkpoint's content: the whole weights and moments.
  std::vector<float> w;
  AdamWState whole;
  {
    cuda::CudaTrainState st(session.s->ctx(), two_tensors(), initial(), true);
    StrategyConfig cfg;
    cfg.zero_stage = 1;
    std::unique_ptr<Strategy> s = make_strategy(st, comm(), cfg);
    train(st, *s, comm(), 0, 2);
    w = st.download_weights();
    whole = s->download_optimizer_state();
  }
  // Step 3 in groups of W/2 ranks with ZeRO-2 (one rank alone at W = 2 shards nothing).
  std::unique_ptr<dist::Communicator> half =
      comm().split(comm().rank() / (world / 2), comm().rank());
  ASSERT_EQ(half->world_size(), world / 2);
  cuda::CudaTrainState st(session.s->ctx(), two_tensors(), initial(), true);
  StrategyConfig cfg;
  cfg.zero_stage = 2;
  std::unique_ptr<Strategy> s = make_strategy(st, *half, cfg);
  st.upload(w, &whole);  // resume: this rank's slice of the whole moments
  const AdamWState mine = st.download_optimizer_state();
  ASSERT_EQ(static_cast<int64_t>(mine.exp_avg.size()), st.shard().size());
  for (int64_t i = 0; i < st.shard().size(); ++i) {
    ASSERT_EQ(mine.exp_avg[i], whole.exp_avg[st.shard().begin + i]) << i;
    ASSERT_EQ(mine.exp_avg_sq[i], whole.exp_avg_sq[st.shard().begin + i]) << i;
  }
  EXPECT_EQ(st.steps(), 2);
  train(st, *s, *half, 2, 3);
  const CpuTrainState want = one_process({world, world, world / 2});
  expect_near_all("master after resume", st.download_weights(), want.download_weights(), 2);
  expect_near_all("exp_avg after resume", s->download_optimizer_state().exp_avg,
                  want.optimizer_state().exp_avg, 2);
}

std::string refusal(cuda::CudaTrainState& st, int stage, const std::string& key) {
  StrategyConfig cfg;
  cfg.zero_stage = stage;
  cfg.zero_stage_key = key;
  try {
    make_strategy(st, comm(), cfg);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ZeroCuda, RefusesZeroThreeAndOffloadByKey) {
  SKIP_WITHOUT_GPU();
  ASSERT_GE(comm().world_size(), 2);
  Session session;
  cuda::CudaTrainState plain(session.s->ctx(), two_tensors(), initial(), true);
  const std::string three = refusal(plain, 3, "critic.zero_stage");
  EXPECT_NE(three.find("critic.zero_stage=3 on trainer.device=cuda"), std::string::npos) << three;
  EXPECT_TRUE(plain.whole());
  OffloadConfig off;
  off.optimizer = 0.5;
  cuda::CudaTrainState offloaded(session.s->ctx(), two_tensors(), initial(), true, off);
  const std::string e = refusal(offloaded, 1, "actor_rollout_ref.actor.zero_stage");
  EXPECT_NE(e.find("actor_rollout_ref.actor.zero_stage=1"), std::string::npos) << e;
  EXPECT_NE(e.find("actor_rollout_ref.actor.fsdp_config.param_offload"), std::string::npos) << e;
  EXPECT_NE(e.find("actor_offload_ratio"), std::string::npos) << e;
  EXPECT_TRUE(offloaded.whole());
}

// The repository, from this file's path (test_cuda_mpi has no VERL_SOURCE_DIR).
std::string repo_root() {
  const std::string f = __FILE__;
  return f.substr(0, f.rfind("/tests/cuda/mpi/"));
}

// Three optimizer steps of the demo model's policy at `stage` over every rank, two micro-batches of
// this rank's own random sequences each, the loss sum_t c_t logprob_t; returns the weights and
// the gradient norms.
std::pair<std::vector<float>, std::vector<double>> demo_steps(const model::Weights& w, int stage) {
  trainer::PolicyOptions po;
  po.optim = optim_config();
  po.optim.lr = 1e-3f;
  po.max_tokens = 256;
  po.max_seqs = 8;
  std::unique_ptr<trainer::PolicyModel> p = trainer::make_policy(Device::Cuda, w, po);
  trainer::UpdateKeys u;
  u.zero_stage_key = "actor_rollout_ref.actor.zero_stage";
  u.zero_stage = stage;
  trainer::setup_data_parallel(u, std::nullopt, *p, comm());
  EXPECT_EQ(p->strategy().zero_stage(), stage);
  std::vector<double> norms;
  for (int k = 0; k < 3; ++k) {
    p->zero_grad();
    for (int mb = 0; mb < 2; ++mb) {
      Rng rng(1000 * static_cast<uint64_t>(comm().rank()) + 10 * k + mb);
      std::vector<std::vector<int32_t>> seqs;
      for (int64_t len : {37, 12, 50}) {
        seqs.emplace_back();
        for (int64_t i = 0; i < len; ++i)
          seqs.back().push_back(static_cast<int32_t>(rng.below(w.config.vocab_size)));
      }
      const model::PackedBatch pb = model::PackedBatch::from_sequences(seqs);
      std::vector<float> lp;
      p->strategy().prepare_backward(mb == 1);
      p->forward(pb, 1.0f, lp, nullptr);
      std::vector<float> d_lp(lp.size());
      for (size_t t = 0; t < d_lp.size(); ++t)
        d_lp[t] = (t % 3 == 0 ? -1.0f : 0.5f) / static_cast<float>(d_lp.size());
      p->backward(d_lp.data(), nullptr);
    }
    norms.push_back(p->optimizer_step(po.optim.lr, comm()));
  }
  return {p->weights().data, norms};
}

TEST(ZeroCuda, DemoPolicyStepsWithZeroOneAndTwoAsWithZeroZero) {
  SKIP_WITHOUT_GPU();
  ASSERT_GE(comm().world_size(), 2);
  const model::Weights w = model::Weights::load(repo_root() + "/assets/demo/model");
  const auto [want, want_norms] = demo_steps(w, 0);
  for (int stage : {1, 2}) {
    const auto [got, norms] = demo_steps(w, stage);
    // The same bf16 forward and backward; only the order of the gradient sums over ranks and
    // micro-batches differs (fp32), so the norms agree to rounding, and a weight moves apart only
    // where a flipped bf16 rounding changed a later step's tiny gradient (AdamW moves each weight
    // about lr a step whatever the gradient's size, so such a weight may differ by up to 2 lr).
    const double lr = 1e-3;
    for (int k = 0; k < 3; ++k)
      EXPECT_NEAR(norms[k], want_norms[k], 1e-3 * want_norms[k])
          << "stage " << stage << " step " << k;
    ASSERT_EQ(got.size(), want.size());
    double worst = 0;
    int64_t far = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double d = std::abs(double(got[i]) - want[i]);
      worst = std::max(worst, d);
      far += d > 0.1 * lr ? 1 : 0;
    }
    EXPECT_LE(worst, 6 * lr) << "stage " << stage;
    EXPECT_LE(static_cast<double>(far), 1e-3 * static_cast<double>(want.size()))
        << "stage " << stage << ": weights apart by more than lr / 10";
    std::printf("ZeRO-%d vs ZeRO-0, demo policy, %d ranks: max |dw| %.3g lr, %lld of %zu > lr/10\n",
                stage, comm().world_size(), worst / lr, static_cast<long long>(far), want.size());
  }
}

}  // namespace
}  // namespace verl::optim
