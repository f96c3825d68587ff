// attention_forward_paged (src/ops/cuda/attention.cu) against attention_forward: the rollout's
// paged attention must give every query token the exact bits the trainer's attention gives it
// over the whole sequence (batch-invariant rollout), so the oracle here is attention_forward's own
// output and the comparison is memcmp of the bf16 bits, not a tolerance. Packed sequences of
// lengths 1 .. 1000, GQA, head dims on the 16-byte path (32, 64, 128, and 24 padded to 32) and the
// element path (20, 100; and D = 64 through misaligned pointers); K/V scattered into a paged cache
// of block size 16, 32 or 7 through a shuffled block table; one call mixes whole sequences,
// decode tokens, chunks starting anywhere inside a key tile or a 128-row window, and an empty item.
// Single-token items run in the decode kernel (a warp's rows are the G = H/Hkv heads of a kv
// head) for G <= 16: groups 1, 2, 7, 8, 16 and contexts 1 .. 1000 across the key-tile edges, and
// G = 17, 32 for the fallback to the tiled kernel; more than 256 items in one call (several
// passes of the tile finder); the flags that leave one kind of item out.
// Cache slots past an item's last query position and unused table entries hold NaN, so a read
// beyond the causal limit shows up as a mismatch; out starts as NaN, so a row that should not be
// written shows up too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "ops/cuda/attention.h"
#include "test_util.h"

namespace verl::ops::cuda::test {
namespace {

constexpr uint16_t kNanBits = 0x7fc0;  // bf16 quiet NaN: poison for slots never written

std::vector<uint16_t> random_bits(size_t n, uint64_t seed) {
  const std::vector<float> x = randn(n, seed);
  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = f32_to_bf16(x[i]);
  return h;
}

// Copies host bits to dst (a device pointer with room for h.size() elements).
void upload_bits(bf16* dst, const std::vector<uint16_t>& h) {
  copy_to_device(dst, h.data(), h.size() * 2);
}

std::vector<uint16_t> download_bits(const bf16* src, size_t n) {
  std::vector<uint16_t> h(n);
  copy_to_host(h.data(), src, n * 2);
  return h;
}

// Packed sequences and attention_forward's output over them (bf16 bits).
struct Full {
  int64_t B = 0, T = 0, H = 0, Hkv = 0, D = 0;
  float scale = 0;
  std::vector<int32_t> cu;
  std::vector<uint16_t> q, k, v, out;
};

Full run_full(const CudaContext& ctx, const std::vector<int32_t>& lens, int64_t H, int64_t Hkv,
              int64_t D, uint64_t seed) {
  Full f;
  f.B = static_cast<int64_t>(lens.size());
  f.cu.assign(f.B + 1, 0);
  for (int64_t b = 0; b < f.B; ++b) f.cu[b + 1] = f.cu[b] + lens[b];
  f.T = f.cu[f.B];
  f.H = H;
  f.Hkv = Hkv;
  f.D = D;
  f.scale = 1.0f / std::sqrt(static_cast<float>(D));
  f.q = random_bits(f.T * H * D, seed + 1);
  f.k = random_bits(f.T * Hkv * D, seed + 2);
  f.v = random_bits(f.T * Hkv * D, seed + 3);
  DeviceBuffer<bf16> q(f.q.size()), k(f.k.size()), v(f.v.size()), out(f.T * H * D);
  upload_bits(q.data(), f.q);
  upload_bits(k.data(), f.k);
  upload_bits(v.data(), f.v);
  DeviceBuffer<int32_t> cu(f.cu);
  attention_forward(ctx, out.data(), nullptr, q.data(), k.data(), v.data(), cu.data(), f.B, f.T, H,
                    Hkv, D, f.scale);
  VERL_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  f.out = download_bits(out.data(), out.size());
  return f;
}

// One item of a paged call: the query tokens at positions p0 .. p0 + n - 1 of sequence seq.
struct Query {
  int seq, p0, n;
};

std::string name(const Query& q) {
  return "seq " + std::to_string(q.seq) + " positions [" + std::to_string(q.p0) + ", " +
         std::to_string(q.p0 + q.n) + ")";
}

// The inputs of attention_forward_paged for a list of items, each with its own blocks (holding
// keys 0 .. p0 + n - 1 of its sequence, the rest NaN) drawn from a shuffled pool.
struct Paged {
  int64_t B = 0, T = 0, W = 0, block_size = 0, slots = 0;
  std::vector<int32_t> cu, positions, tables;
  std::vector<uint16_t> q, k_cache, v_cache;
  std::vector<int64_t> full_token;  // per query token: its token in Full
};

Paged make_paged(const Full& f, const std::vector<Query>& items, int64_t block_size,
                 uint64_t seed) {
  Paged p;
  p.B = static_cast<int64_t>(items.size());
  p.block_size = block_size;
  const int64_t HD = f.H * f.D, KD = f.Hkv * f.D;
  std::vector<int64_t> nblocks(p.B);
  int64_t total = 1;  // one poison block for the unused table entries
  for (int64_t i = 0; i < p.B; ++i) {
    nblocks[i] = (items[i].p0 + items[i].n + block_size - 1) / block_size;
    if (items[i].n == 0) nblocks[i] = 0;
    total += nblocks[i];
    p.W = std::max(p.W, nblocks[i]);
  }
  p.W += 2;
  std::vector<int32_t> pool(total);
  for (int64_t i = 0; i < total; ++i) pool[i] = static_cast<int32_t>(i);
  Rng rng(seed);
  for (int64_t i = total - 1; i > 0; --i) std::swap(pool[i], pool[rng.below(i + 1)]);
  const int32_t poison = pool[total - 1];

  p.slots = total * block_size;
  p.k_cache.assign(p.slots * KD, kNanBits);
  p.v_cache.assign(p.slots * KD, kNanBits);
  p.tables.assign(p.B * p.W, poison);
  p.cu.assign(p.B + 1, 0);
  int64_t next = 0;
  for (int64_t i = 0; i < p.B; ++i) {
    const Query& it = items[i];
    for (int64_t j = 0; j < nblocks[i]; ++j) p.tables[i * p.W + j] = pool[next++];
    // An empty item has no blocks (its table row is all poison) and no keys to write.
    for (int64_t pos = 0; it.n > 0 && pos < it.p0 + it.n; ++pos) {
      const int64_t slot =
          int64_t(p.tables[i * p.W + pos / block_size]) * block_size + pos % block_size;
      const int64_t src = f.cu[it.seq] + pos;
      std::copy_n(&f.k[src * KD], KD, &p.k_cache[slot * KD]);
      std::copy_n(&f.v[src * KD], KD, &p.v_cache[slot * KD]);
    }
    for (int j = 0; j < it.n; ++j) {
      const int64_t src = f.cu[it.seq] + it.p0 + j;
      p.full_token.push_back(src);
      p.positions.push_back(it.p0 + j);
      p.q.insert(p.q.end(), &f.q[src * HD], &f.q[src * HD] + HD);
    }
    p.cu[i + 1] = p.cu[i] + it.n;
  }
  p.T = p.cu[p.B];
  return p;
}

// Which items a call computes (attention_forward_paged's flags) and how its pointers sit.
struct Call {
  bool misalign = false;  // q, the caches and out one element past a 16-byte boundary: element
                          // staging and element stores
  bool single = true;     // single_token_items
  bool multi = true;      // multi_token_items
};

// Runs attention_forward_paged on the items and expects every output row of a computed item to
// have the bits of attention_forward's row for the same token, and every other row to keep the
// NaN it started with.
void check_paged(const CudaContext& ctx, const Full& f, const std::vector<Query>& items,
                 int64_t block_size, uint64_t seed, Call call = {}) {
  const Paged p = make_paged(f, items, block_size, seed);
  const int64_t HD = f.H * f.D, off = call.misalign ? 1 : 0;
  DeviceBuffer<bf16> q(p.q.size() + 8), kc(p.k_cache.size() + 8), vc(p.v_cache.size() + 8),
      out(p.T * HD + 8);
  upload_bits(q.data() + off, p.q);
  upload_bits(kc.data() + off, p.k_cache);
  upload_bits(vc.data() + off, p.v_cache);
  upload_bits(out.data(), std::vector<uint16_t>(out.size(), kNanBits));  // unwritten rows: NaN
  DeviceBuffer<int32_t> cu(p.cu), positions(p.positions), tables(p.tables);
  attention_forward_paged(ctx, out.data() + off, q.data() + off, kc.data() + off, vc.data() + off,
                          tables.data(), p.W, block_size, cu.data(), positions.data(), p.B, p.T,
                          f.H, f.Hkv, f.D, f.scale, call.single, call.multi);
  VERL_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  const std::vector<uint16_t> got = download_bits(out.data() + off, p.T * HD);

  const std::vector<uint16_t> poison(HD, kNanBits);
  int bad = 0, untouched = 0;
  for (int64_t i = 0; i < p.B; ++i) {
    const bool computed = items[i].n == 1 ? call.single : call.multi;
    for (int64_t t = p.cu[i]; t < p.cu[i + 1]; ++t) {
      const uint16_t* g = &got[t * HD];
      const uint16_t* w = computed ? &f.out[p.full_token[t] * HD] : poison.data();
      if (std::memcmp(g, w, HD * sizeof(uint16_t)) != 0) {
        if (++bad <= 5) {
          int64_t e = 0;
          while (g[e] == w[e]) ++e;
          ADD_FAILURE() << name(items[i]) << (computed ? "" : " (not computed)") << ": position "
                        << p.positions[t] << " head " << e / f.D << " dim " << e % f.D << ": got "
                        << bf16_to_f32(g[e]) << " (bits " << g[e] << ") want " << bf16_to_f32(w[e])
                        << " (bits " << w[e] << ")";
        }
      }
      untouched += computed ? 0 : 1;
    }
  }
  EXPECT_EQ(bad, 0) << bad << " of " << p.T << " query rows differ from attention_forward ("
                    << untouched << " rows should be unwritten)";
}

// The items of the mixed call for a sequence of length L: the whole sequence, its last token
// (decode), a first chunk that ends early, chunks starting on and off 64-key tiles and 128-row
// windows, a chunk crossing a window boundary, single tokens on tile edges.
std::vector<Query> items_for(int seq, int L) {
  std::vector<Query> out;
  auto add = [&](int p0, int n) {
    n = std::min(n, L - p0);
    if (p0 >= 0 && p0 < L && n > 0) out.push_back(Query{seq, p0, n});
  };
  add(0, L);
  add(L - 1, 1);
  add(0, 40);
  add(50, 70);
  add(1, 2);
  add(31, 33);
  add(37, 150);
  add(63, 1);
  add(64, 1);
  add(64, 64);
  add(127, 2);
  add(130, 300);
  add(200, 57);
  add(255, 3);
  add(L / 2 | 1, 17);
  return out;
}

struct Config {
  int64_t H, Hkv, D;
};

const std::vector<int32_t> kLens = {1, 17, 64, 65, 200, 300, 777};

using CudaAttentionPaged = CudaTest;

void check_config(const CudaContext& ctx, const Config& c, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "H" << c.H << " Hkv" << c.Hkv << " D" << c.D);
  const Full f = run_full(ctx, kLens, c.H, c.Hkv, c.D, seed);
  // Mixed: every kind of item of every sequence in one call, with an empty item in the middle.
  std::vector<Query> mixed;
  for (int s = 0; s < static_cast<int>(kLens.size()); ++s) {
    for (const Query& q : items_for(s, kLens[s])) mixed.push_back(q);
    if (s == 3) mixed.push_back(Query{s, 5, 0});
  }
  // Decode: one token per item, as a decode step runs them.
  std::vector<Query> decode;
  for (int s = 0; s < static_cast<int>(kLens.size()); ++s) {
    for (int p : {0, 31, 32, 63, 64, 127, 128, 299, kLens[s] - 1}) {
      if (p < kLens[s]) decode.push_back(Query{s, p, 1});
    }
  }
  const std::vector<Query> longest = {Query{6, 0, kLens[6]}};
  for (int64_t bs : {16, 32, 7}) {
    SCOPED_TRACE(::testing::Message() << "block_size " << bs);
    check_paged(ctx, f, mixed, bs, seed + 10 + bs);
    check_paged(ctx, f, decode, bs, seed + 20 + bs);
    check_paged(ctx, f, longest, bs, seed + 30 + bs);
  }
}

// 16-byte staging: D = 64 (GQA 7), 128 (32 keys per step, no GQA), 32 (GQA 3), 24 (padded to 32).
TEST_F(CudaAttentionPaged, BitwiseEqualToAttentionForwardVectorPath) {
  uint64_t seed = 500;
  for (const Config& c :
       {Config{14, 2, 64}, Config{8, 8, 128}, Config{6, 2, 32}, Config{4, 2, 24}}) {
    check_config(ctx(), c, seed += 100);
  }
}

// D not a multiple of 8: both ops stage element by element (D = 100: padded to 128, 32 keys per
// step); odd D also stores out element by element.
TEST_F(CudaAttentionPaged, BitwiseEqualToAttentionForwardElementPath) {
  uint64_t seed = 900;
  for (const Config& c : {Config{4, 2, 20}, Config{4, 1, 100}, Config{3, 3, 33}}) {
    check_config(ctx(), c, seed += 100);
  }
}

// The same values staged by the other path: attention_forward runs on 16-byte staging, the paged
// op on misaligned pointers (element staging, element stores); the bits must not change.
TEST_F(CudaAttentionPaged, ElementStagingGivesTheSameBits) {
  const Full f = run_full(ctx(), kLens, 14, 2, 64, 77);
  std::vector<Query> mixed;
  for (int s = 0; s < static_cast<int>(kLens.size()); ++s) {
    for (const Query& q : items_for(s, kLens[s])) mixed.push_back(q);
  }
  check_paged(ctx(), f, mixed, 16, 78, Call{.misalign = true});
}

// Sequences for the decode tests: contexts up to 1000 tokens, and short ones.
const std::vector<int32_t> kDecodeLens = {1000, 130, 65, 1};

// Decode tokens at contexts (p + 1) 1 .. 1000: the first keys, both sides of every key-tile edge
// (32 and 64 keys per step) and of the 128-row windows, and long contexts.
std::vector<Query> decode_items() {
  std::vector<Query> out;
  for (int p : {0,   1,   2,   15,  16,  31,  32,  33,  62,  63,  64,  65,  95,  126, 127,
                128, 129, 191, 192, 255, 256, 300, 511, 512, 513, 767, 900, 998, 999}) {
    out.push_back(Query{0, p, 1});
  }
  for (int p : {0, 63, 64, 127, 129}) out.push_back(Query{1, p, 1});
  for (int p : {31, 64}) out.push_back(Query{2, p, 1});
  out.push_back(Query{3, 0, 1});
  return out;
}

// Decode tokens interleaved with chunks of 2 .. 300 tokens and an empty item: both kernels run in
// one call and write disjoint rows.
std::vector<Query> mixed_decode_items() {
  const std::vector<Query> dec = decode_items();
  const std::vector<Query> chunks = {{0, 0, 200},   {1, 0, 130}, {0, 500, 37}, {2, 63, 2},
                                     {0, 700, 300}, {0, 127, 2}, {1, 64, 0},   {2, 0, 65},
                                     {0, 255, 129}, {1, 100, 30}};
  std::vector<Query> out;
  for (size_t i = 0; i < std::max(dec.size(), chunks.size()); ++i) {
    if (i < dec.size()) out.push_back(dec[i]);
    if (i < chunks.size()) out.push_back(chunks[i]);
  }
  return out;
}

void check_decode(const CudaContext& ctx, const Config& c, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "H" << c.H << " Hkv" << c.Hkv << " D" << c.D);
  const Full f = run_full(ctx, kDecodeLens, c.H, c.Hkv, c.D, seed);
  for (int64_t bs : {16, 7}) {
    SCOPED_TRACE(::testing::Message() << "block_size " << bs);
    check_paged(ctx, f, decode_items(), bs, seed + 10 + bs);
    check_paged(ctx, f, mixed_decode_items(), bs, seed + 20 + bs);
  }
}

// The decode kernel for every group size its 16-row tile holds: G = 7 (Qwen2.5-0.5B), 8, 1 (no
// GQA), 16 (a full tile), 2; D = 64 (64 keys per step) and 128 (32 keys per step).
TEST_F(CudaAttentionPaged, DecodeKernelGivesTheBitsForGqaGroupsUpTo16) {
  uint64_t seed = 1300;
  for (int64_t D : {64, 128}) {
    for (const Config& c : {Config{14, 2, D}, Config{16, 2, D}, Config{8, 8, D}, Config{32, 2, D},
                            Config{16, 16, D}, Config{4, 2, D}}) {
      check_decode(ctx(), c, seed += 100);
    }
  }
  // Head dims whose padding columns are zero (D = 40, 48 on the 64 kernel) and the 32 kernel, whose
  // P V columns take only the first two of the block's warps.
  for (int64_t D : {32, 40, 48}) {
    for (const Config& c : {Config{14, 2, D}, Config{16, 16, D}}) {
      check_decode(ctx(), c, seed += 100);
    }
  }
}

// G > 16 does not fit a warp's tile: single tokens take tiles of the training kernel.
TEST_F(CudaAttentionPaged, GroupsAbove16FallBackToTheTiledKernel) {
  uint64_t seed = 2700;
  for (const Config& c : {Config{34, 2, 64}, Config{64, 2, 128}}) {
    check_decode(ctx(), c, seed += 100);
  }
}

// Over 256 items in one call, so the tile finder makes several passes (256 items each) and the
// decode grid has hundreds of warps: a decode token at every position of one sequence, chunks of
// 2 and 3 tokens at every position of another, empty items, all interleaved.
std::vector<Query> many_items() {
  std::vector<Query> out;
  for (int p = 0; p < 260; ++p) {
    out.push_back(Query{0, p, 1});
    if (p < 199) out.push_back(Query{1, p, 2});
    if (p < 198 && p % 2 == 0) out.push_back(Query{1, p, 3});
    if (p % 50 == 7) out.push_back(Query{1, p, 0});
  }
  return out;
}

TEST_F(CudaAttentionPaged, ManyItemsInOneCall) {
  for (const Config& c : {Config{14, 2, 64}, Config{34, 2, 64}}) {
    SCOPED_TRACE(::testing::Message() << "H" << c.H << " Hkv" << c.Hkv << " D" << c.D);
    const Full f = run_full(ctx(), {260, 200}, c.H, c.Hkv, c.D, 41 + c.H);
    check_paged(ctx(), f, many_items(), 32, 42 + c.H);
  }
}

// single_token_items = false leaves the decode tokens' rows alone, multi_token_items = false the
// chunks' rows, on both decode paths (G = 7: the decode kernel; G = 17: the tiled kernel); a
// decode step with multi_token_items = false launches no tiled kernel and still gets every row.
TEST_F(CudaAttentionPaged, FlagsLeaveTheOtherItemsUnwritten) {
  for (const Config& c : {Config{14, 2, 64}, Config{34, 2, 64}}) {
    SCOPED_TRACE(::testing::Message() << "H" << c.H << " Hkv" << c.Hkv << " D" << c.D);
    const Full f = run_full(ctx(), kDecodeLens, c.H, c.Hkv, c.D, 61 + c.H);
    check_paged(ctx(), f, mixed_decode_items(), 16, 62, Call{.single = false});
    check_paged(ctx(), f, mixed_decode_items(), 16, 63, Call{.multi = false});
    check_paged(ctx(), f, mixed_decode_items(), 16, 64, Call{.single = false, .multi = false});
    check_paged(ctx(), f, decode_items(), 16, 65, Call{.multi = false});  // a decode step
  }
}

TEST_F(CudaAttentionPaged, RejectsBadShapes) {
  DeviceBuffer<int32_t> g_cu(std::vector<int32_t>{0, 1}), g_pos(std::vector<int32_t>{0}),
      g_tab(std::vector<int32_t>{0});
  EXPECT_ANY_THROW(attention_forward_paged(ctx(), nullptr, nullptr, nullptr, nullptr, g_tab.data(),
                                           1, 16, g_cu.data(), g_pos.data(), 1, 1, 1, 1, 160,
                                           1.0f));  // D > 128
  EXPECT_ANY_THROW(attention_forward_paged(ctx(), nullptr, nullptr, nullptr, nullptr, g_tab.data(),
                                           1, 0, g_cu.data(), g_pos.data(), 1, 1, 1, 1, 64,
                                           1.0f));  // block_size 0
}

}  // namespace
}  // namespace verl::ops::cuda::test
