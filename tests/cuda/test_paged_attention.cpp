// Paged attention on the GPU (src/ops/cuda/paged_attention.cu), fast and reference kernels, against
// the CPU runner's attention (ops::cpu::paged_attention_forward, restated here on the same
// bf16-rounded cache): ragged contexts 1..700 over 16-token blocks scattered through the pool,
// decode items (split-K with partitions of 64 and 512 keys, one partition and many) mixed with
// prefill chunks that start after a cached prefix, H/Hkv/D = 14/2/64, 4/4/24 (reference kernels
// only), 12/2/128, 4/2/16, block sizes 16, 24 and 8. Also the KV write (plain and fused with
// q/k-norm and RoPE) and the copy-on-write block copies, which must be exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "ops/cpu/ops.h"
#include "ops/cuda/paged_attention.h"
#include "test_util.h"

namespace verl::ops::cuda::test {
namespace {

using CudaPagedAttention = CudaTest;

struct Item {
  int32_t start;  // cached positions before this step
  int32_t n;      // new tokens this step
};

// A step's metadata as the scheduler builds it, over a pool whose blocks are handed out shuffled.
struct Step {
  int64_t B = 0, T = 0, W = 0, num_blocks = 0, bs = 16;
  std::vector<int32_t> cu, positions, slots, tables, ctx;
};

Step make_step(const std::vector<Item>& items, int64_t bs, uint64_t seed) {
  Step s;
  s.bs = bs;
  s.B = static_cast<int64_t>(items.size());
  s.cu.assign(1, 0);
  int64_t need = 0;
  for (const Item& it : items) {
    const int64_t blocks = (it.start + it.n + bs - 1) / bs;
    s.W = std::max(s.W, blocks);
    need += blocks;
  }
  s.W += 1;  // a padded (-1) column, as the scheduler's fixed-width table has
  s.num_blocks = need + 5;
  std::vector<int32_t> pool(static_cast<size_t>(s.num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  Rng rng(seed);
  for (size_t i = pool.size(); i > 1; --i) std::swap(pool[i - 1], pool[rng.below(i)]);
  s.tables.assign(static_cast<size_t>(s.B * s.W), -1);
  size_t next = 0;
  for (int64_t b = 0; b < s.B; ++b) {
    const Item& it = items[b];
    const int64_t blocks = (it.start + it.n + bs - 1) / bs;
    for (int64_t j = 0; j < blocks; ++j) s.tables[b * s.W + j] = pool[next++];
    for (int32_t p = it.start; p < it.start + it.n; ++p) {
      s.positions.push_back(p);
      s.slots.push_back(static_cast<int32_t>(s.tables[b * s.W + p / bs] * bs + p % bs));
    }
    s.cu.push_back(s.cu.back() + it.n);
    s.ctx.push_back(it.start + it.n);
  }
  s.T = s.cu.back();
  return s;
}

// ops::cpu::paged_attention_forward: token t attends to keys 0..positions[t] of its item's table,
// two passes (max, then exp-sum and weighted values), fp32. `mag` gets sum_j p_j |v_j| per output
// element, the scale of the error from rounding p to bf16 (the tensor-core prefill does).
std::vector<float> cpu_paged_attention(const Step& s, const std::vector<float>& q,
                                       const std::vector<float>& kc, const std::vector<float>& vc,
                                       int64_t H, int64_t Hkv, int64_t D, std::vector<float>& mag) {
  const int64_t group = H / Hkv, ts = Hkv * D;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<float> out(static_cast<size_t>(s.T * H * D), 0.0f), sc;
  mag.assign(out.size(), 0.0f);
  for (int64_t b = 0; b < s.B; ++b) {
    const int32_t* table = s.tables.data() + b * s.W;
    for (int64_t t = s.cu[b]; t < s.cu[b + 1]; ++t) {
      const int64_t n_keys = s.positions[t] + 1;
      sc.assign(static_cast<size_t>(n_keys), 0.0f);
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / group;
        const float* qv = q.data() + (t * H + h) * D;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n_keys; ++j) {
          const float* kv = kc.data() + (table[j / s.bs] * s.bs + j % s.bs) * ts + g * D;
          float dot = 0.0f;
          for (int64_t d = 0; d < D; ++d) dot += qv[d] * kv[d];
          sc[j] = dot * scale;
          mx = std::max(mx, sc[j]);
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < n_keys; ++j) {
          sc[j] = std::exp(sc[j] - mx);
          sum += sc[j];
        }
        float* o = out.data() + (t * H + h) * D;
        float* mg = mag.data() + (t * H + h) * D;
        for (int64_t j = 0; j < n_keys; ++j) {
          const float* vv = vc.data() + (table[j / s.bs] * s.bs + j % s.bs) * ts + g * D;
          const float p = sc[j] / sum;
          for (int64_t d = 0; d < D; ++d) {
            o[d] += p * vv[d];
            mg[d] += p * std::abs(vv[d]);
          }
        }
      }
    }
  }
  return out;
}

// "H14 Hkv2 D64 ..." for SCOPED_TRACE (built with +=: GCC 12 warns falsely on "lit" + string).
std::string label(int64_t H, int64_t Hkv, int64_t D, const std::string& extra) {
  std::string s = "H";
  s += std::to_string(H);
  s += " Hkv";
  s += std::to_string(Hkv);
  s += " D";
  s += std::to_string(D);
  s += extra;
  return s;
}

template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& h) {
  return DeviceBuffer<T>(h);
}

void check_attention(const CudaContext& ctx, const CudaSession& session,
                     const std::vector<Item>& items, int64_t H, int64_t Hkv, int64_t D,
                     int32_t partition, int64_t max_context_pad, uint64_t seed,
                     int32_t max_partitions = 0, int32_t block_size = 16) {
  SCOPED_TRACE(label(H, Hkv, D,
                     " partition " + std::to_string(partition) + " max_partitions " +
                         std::to_string(max_partitions) + " block_size " +
                         std::to_string(block_size)));
  const Step s = make_step(items, block_size, seed);
  const int64_t ts = Hkv * D, pool = s.num_blocks * s.bs * ts;
  // Cache contents: random (stale values where this step writes), new k/v written by the kernel.
  std::vector<float> kc = bf16_rounded(randn(static_cast<size_t>(pool), seed + 1));
  std::vector<float> vc = bf16_rounded(randn(static_cast<size_t>(pool), seed + 2));
  const std::vector<float> knew = bf16_rounded(randn(static_cast<size_t>(s.T * ts), seed + 3));
  const std::vector<float> vnew = bf16_rounded(randn(static_cast<size_t>(s.T * ts), seed + 4));
  const std::vector<float> q = bf16_rounded(randn(static_cast<size_t>(s.T * H * D), seed + 5));
  DeviceBuffer<bf16> d_kc = upload_bf16(kc), d_vc = upload_bf16(vc), d_kn = upload_bf16(knew),
                     d_vn = upload_bf16(vnew), d_q = upload_bf16(q);
  for (int64_t t = 0; t < s.T; ++t) {
    std::copy(knew.begin() + t * ts, knew.begin() + (t + 1) * ts, kc.begin() + s.slots[t] * ts);
    std::copy(vnew.begin() + t * ts, vnew.begin() + (t + 1) * ts, vc.begin() + s.slots[t] * ts);
  }
  auto d_cu = upload(s.cu), d_pos = upload(s.positions), d_slots = upload(s.slots),
       d_tables = upload(s.tables);
  paged_kv_write(ctx, d_kc.data(), d_vc.data(), d_kn.data(), d_vn.data(), d_slots.data(), s.T, Hkv,
                 D);

  session.synchronize();
  EXPECT_TRUE(download_bf16(d_kc) == kc) << "paged_kv_write: K cache differs";
  EXPECT_TRUE(download_bf16(d_vc) == vc) << "paged_kv_write: V cache differs";
  std::vector<float> mag;
  const std::vector<float> want = cpu_paged_attention(s, q, kc, vc, H, Hkv, D, mag);

  // The fast kernels and the plain reference ones, each against the CPU.
  for (bool reference : {false, true}) {
    SCOPED_TRACE(reference ? "reference kernels" : "fast kernels");
    PagedAttentionPlan plan;
    plan.partition = partition;
    plan.max_partitions = max_partitions;
    plan.max_context = *std::max_element(s.ctx.begin(), s.ctx.end()) + max_context_pad;
    plan.reference = reference;
    const size_t ws =
        paged_attention_workspace_bytes(s.B, H, D, plan.max_context, partition, max_partitions);
    DeviceBuffer<uint8_t> d_ws(std::max<size_t>(ws, 1));
    DeviceBuffer<bf16> d_out(static_cast<size_t>(s.T * H * D));
    VERL_CUDA_CHECK(
        cudaMemsetAsync(d_out.data(), 0xff, d_out.bytes(), ctx.stream));  // NaN: all written
    paged_attention(ctx, d_out.data(), d_q.data(), d_kc.data(), d_vc.data(), d_tables.data(), s.W,
                    d_cu.data(), d_pos.data(), s.B, s.T, H, Hkv, D, s.bs,
                    1.0f / std::sqrt(static_cast<float>(D)), plan, d_ws.data(), d_ws.size());
    session.synchronize();
    const std::vector<float> got = download_bf16(d_out);
    int misses = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double bound =
          kAttnOut.atol + kAttnOut.rtol * std::abs(want[i]) + kPagedAttnBf16P * mag[i];
      if (!(std::abs(double(got[i]) - want[i]) <= bound) && ++misses <= 5) {
        ADD_FAILURE() << "out[" << i << "] (token " << i / (H * D) << "): got " << got[i]
                      << " want " << want[i] << " (bound " << bound << ")";
      }
    }
    EXPECT_EQ(misses, 0) << misses << " of " << got.size() << " out of tolerance";
  }
}

// Decode items at context lengths around the tile (64) and partition (512) edges, and prefill
// chunks: whole prompts (start 0), chunks after a cached prefix, a 2-token chunk, a 129-token one.
const std::vector<Item> kMixed = {{0, 1},   {1, 1},     {16, 1},  {62, 1},   {63, 1},  {64, 1},
                                  {299, 1}, {510, 1},   {511, 1}, {512, 1},  {699, 1}, {0, 37},
                                  {37, 70}, {600, 100}, {0, 2},   {15, 129}, {5, 1}};

TEST_F(CudaPagedAttention, MixedStepMatchesCpuRunner) {
  uint64_t seed = 300;
  for (const auto& hd : {std::vector<int64_t>{14, 2, 64}, std::vector<int64_t>{4, 4, 24},
                         std::vector<int64_t>{12, 2, 128}, std::vector<int64_t>{4, 2, 16}}) {
    for (int32_t partition : {512, 64}) {
      check_attention(ctx(), *session_, kMixed, hd[0], hd[1], hd[2], partition, 0, seed += 10);
    }
  }
}

// Decode only, with the grid sized for a longer context than any item has (as a CUDA graph
// captured for max_model_len), and one long single sequence split 11 ways.
TEST_F(CudaPagedAttention, DecodeWithPaddedGridAndLongContext) {
  std::vector<Item> items;
  Rng rng(9);
  for (int i = 0; i < 37; ++i) items.push_back({static_cast<int32_t>(rng.below(700)), 1});
  check_attention(ctx(), *session_, items, 14, 2, 64, 64, 1000, 41);
  check_attention(ctx(), *session_, {{690, 1}}, 4, 4, 24, 64, 0, 42);
  check_attention(ctx(), *session_, items, 8, 1, 128, 512, 300, 43);
  // Partition count capped (the runner's choice for large batches): contexts cut into at most 2
  // or 3 equal partitions (rounded up to 64 keys), or 1; G = 7, 8 and 3 heads per kv head.
  check_attention(ctx(), *session_, items, 14, 2, 64, 64, 1000, 44, 2);
  check_attention(ctx(), *session_, kMixed, 16, 2, 64, 64, 0, 45, 3);
  check_attention(ctx(), *session_, kMixed, 12, 4, 128, 64, 0, 46, 1);
  // Block sizes that 16 does not divide: the fast decode kernel's 16 keys of a step span blocks.
  check_attention(ctx(), *session_, kMixed, 14, 2, 64, 64, 0, 47, 0, 24);
  check_attention(ctx(), *session_, items, 4, 2, 32, 64, 100, 48, 2, 8);
}

// Fused split + q/k rmsnorm + RoPE + KV write against the CPU ops (rmsnorm rounded to bf16 as the
// kernel does, then rope in fp32), with and without q/k norms; a slot of -1 writes nothing.
void check_rope_write(const CudaContext& ctx, const CudaSession& session, int64_t H, int64_t Hkv,
                      int64_t D, bool qk_norm, uint64_t seed) {
  SCOPED_TRACE(label(H, Hkv, D, qk_norm ? " qk_norm" : ""));
  const int64_t T = 19, qd = H * D, kvd = Hkv * D, Q3 = qd + 2 * kvd, slots_n = 64;
  const float eps = 1e-6f;
  const std::vector<float> qkv = bf16_rounded(randn(static_cast<size_t>(T * Q3), seed));
  const std::vector<float> qn = bf16_rounded(randn(static_cast<size_t>(D), seed + 1, 0.5f));
  const std::vector<float> kn = bf16_rounded(randn(static_cast<size_t>(D), seed + 2, 0.5f));
  std::vector<int32_t> pos(T), slots(T);
  Rng rng(seed + 3);
  for (int64_t t = 0; t < T; ++t) {
    pos[t] = static_cast<int32_t>(rng.below(3000));
    slots[t] = t == 5 ? -1 : static_cast<int32_t>((t * 7) % slots_n);
  }
  std::vector<float> inv_freq(static_cast<size_t>(D / 2));
  for (int64_t i = 0; i < D / 2; ++i) {
    inv_freq[i] = static_cast<float>(1.0 / std::pow(10000.0, 2.0 * i / D));
  }
  const std::vector<float> cache0 =
      bf16_rounded(randn(static_cast<size_t>(slots_n * kvd), seed + 4));

  // CPU: split, [rmsnorm -> bf16], rope.
  std::vector<float> q(T * qd), k(T * kvd), v(T * kvd);
  for (int64_t t = 0; t < T; ++t) {
    std::copy(qkv.begin() + t * Q3, qkv.begin() + t * Q3 + qd, q.begin() + t * qd);
    std::copy(qkv.begin() + t * Q3 + qd, qkv.begin() + t * Q3 + qd + kvd, k.begin() + t * kvd);
    std::copy(qkv.begin() + t * Q3 + qd + kvd, qkv.begin() + (t + 1) * Q3, v.begin() + t * kvd);
  }
  if (qk_norm) {
    std::vector<float> tmp = q;
    cpu::rmsnorm_forward(q.data(), nullptr, tmp.data(), qn.data(), T * H, D, eps);
    tmp = k;
    cpu::rmsnorm_forward(k.data(), nullptr, tmp.data(), kn.data(), T * Hkv, D, eps);
    q = bf16_rounded(q);
    k = bf16_rounded(k);
  }
  cpu::rope_forward(q.data(), pos.data(), inv_freq.data(), T, H, D);
  cpu::rope_forward(k.data(), pos.data(), inv_freq.data(), T, Hkv, D);
  std::vector<float> kc = cache0, vc = cache0;
  for (int64_t t = 0; t < T; ++t) {
    if (slots[t] < 0) continue;
    std::copy(k.begin() + t * kvd, k.begin() + (t + 1) * kvd, kc.begin() + slots[t] * kvd);
    std::copy(v.begin() + t * kvd, v.begin() + (t + 1) * kvd, vc.begin() + slots[t] * kvd);
  }

  DeviceBuffer<bf16> d_qkv = upload_bf16(qkv), d_qn = upload_bf16(qn), d_kn = upload_bf16(kn),
                     d_kc = upload_bf16(cache0), d_vc = upload_bf16(cache0),
                     d_q(static_cast<size_t>(T * qd));
  DeviceBuffer<int32_t> d_pos(pos), d_slots(slots);
  DeviceBuffer<float> d_freq(inv_freq);
  qkv_rope_paged_write(ctx, d_q.data(), d_kc.data(), d_vc.data(), d_qkv.data(),
                       qk_norm ? d_qn.data() : nullptr, qk_norm ? d_kn.data() : nullptr, eps,
                       d_pos.data(), d_freq.data(), d_slots.data(), T, H, Hkv, D);
  session.synchronize();
  expect_close("q", download_bf16(d_q), q, kBf16Out);
  expect_close("k cache", download_bf16(d_kc), kc, kBf16Out);
  EXPECT_TRUE(download_bf16(d_vc) == vc) << "v cache must be an exact copy";
}

TEST_F(CudaPagedAttention, FusedRopeKvWriteMatchesCpuOps) {
  check_rope_write(ctx(), *session_, 14, 2, 64, false, 51);
  check_rope_write(ctx(), *session_, 4, 4, 24, true, 52);
  check_rope_write(ctx(), *session_, 16, 8, 128, true, 53);
}

// Copy-on-write: every array (layer x K/V) gets the copies; other blocks are untouched.
TEST_F(CudaPagedAttention, CopyBlocksIsExact) {
  const int64_t arrays = 6, blocks = 40, block_elems = 16 * 2 * 24;  // block 16, Hkv 2, D 24
  const int64_t stride = blocks * block_elems;
  std::vector<float> h = bf16_rounded(randn(static_cast<size_t>(arrays * stride), 61));
  const std::vector<int32_t> pairs = {3, 17, 3, 18, 0, 39, 25, 1};
  DeviceBuffer<bf16> d = upload_bf16(h);
  DeviceBuffer<int32_t> d_pairs(pairs);
  paged_kv_copy_blocks(ctx(), d.data(), arrays, stride, block_elems, d_pairs.data(), 4);
  sync();
  for (int64_t a = 0; a < arrays; ++a) {
    for (size_t c = 0; c < pairs.size(); c += 2) {
      std::copy_n(h.begin() + a * stride + pairs[c] * block_elems, block_elems,
                  h.begin() + a * stride + pairs[c + 1] * block_elems);
    }
  }
  EXPECT_TRUE(download_bf16(d) == h);
}

}  // namespace
}  // namespace verl::ops::cuda::test
