// CUDA twin of optim/sparse_sync.cpp (the LightweightSync codec), bit for bit. With `acc` the
// compressed values (carry when there is one, updated in place by the first pass; else grad):
//   1. radix select of the k-th largest key (|x|'s bits), 4 passes of 8 bits from the top: each
//      pass histograms the keys whose higher bytes match the prefix found so far (pass 0 also forms
//      acc = grad + carry), then one warp picks the byte that holds the k-th key. Leaves
//      t = the k-th largest key and ties = k - #(key > t) in device memory.
//   2. count: per chunk #(key > t) and #(key == t), packed in one u64, and their sums per group
//      of 64 chunks, which a one-block scan turns into exclusive prefixes.
//   3. encode: one warp per chunk finds its output offset and the ties it is granted (ties go to
//      the lowest indices: the chunk gets what the earlier chunks left), then writes the chunk's
//      entries in ascending order, its scale and count, and the carry.
// sparse_accumulate: per-group entry counts, the same scan, then one warp per chunk adds its
// entries (each index once, so no atomics).
//
// Float operations are the IEEE ones of the CPU code, in its order, with the _rn intrinsics so
// that nvcc fuses nothing; NaN results are rewritten to what x86-64 gives (see x86_nan).
#include <string>

#include "ops/cuda/common.cuh"
#include "optim/cuda/sparse_sync.h"

namespace verl::optim::cuda {

namespace {

using ull = unsigned long long;

constexpr unsigned kFull = 0xffffffffu;
constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kChunk = static_cast<int>(kSparseChunk);  // 256 = 8 elements per lane of a warp
constexpr int kPerLane = kChunk / 32;
constexpr int kChunksPerWarp = 8;
constexpr int kGroup = kWarps * kChunksPerWarp;  // chunks per block of count/encode/accumulate
constexpr int kHistUnroll = 4;
constexpr int64_t kMaxHistBlocks = 1024;
constexpr int kScanThreads = 1024, kScanPer = 4;
constexpr int kPasses = 4;  // 8-bit digits of a 32-bit key

static_assert(kChunk == 32 * kPerLane, "a chunk is a whole number of warp-wide rows");
static_assert(kGroup == 64, "the group prefix is two chunks per lane of one warp");

// Scratch of sparse_compress: the 4 pass histograms and the selection state {prefix, remaining
// k}, then the per-chunk packed counts and the per-group sums (later prefixes).
constexpr size_t kHistWords = kPasses * 256;
constexpr size_t kHeadBytes = (kHistWords + 4) * sizeof(uint32_t);

size_t align256(size_t x) {
  return (x + 255) & ~size_t{255};
}
int64_t groups_of(int64_t chunks) {
  return (chunks + kGroup - 1) / kGroup;
}

struct Scratch {
  uint32_t* hist;
  uint32_t* state;  // [0] prefix (finally t), [1] remaining k (finally ties)
  ull* chunk_cnt;   // (#above << 32) | #ties per chunk
  ull* group_cnt;   // their sums per group, then exclusive prefixes
};

Scratch carve(void* scratch, int64_t chunks) {
  auto* p = static_cast<uint8_t*>(scratch);
  Scratch s;
  s.hist = reinterpret_cast<uint32_t*>(p);
  s.state = s.hist + kHistWords;
  p += align256(kHeadBytes);
  s.chunk_cnt = reinterpret_cast<ull*>(p);
  p += align256(static_cast<size_t>(chunks) * sizeof(ull));
  s.group_cnt = reinterpret_cast<ull*>(p);
  return s;
}

// x86-64 (SSE/AVX) NaN results, which the CPU reference produces: a NaN operand comes out quieted,
// the first one when both are NaN; an invalid operation (inf - inf, 0 * inf, inf / inf) gives the
// default NaN 0xffc00000. The GPU gives 0x7fffffff for every NaN, so NaN results are redone.
__device__ __forceinline__ float x86_nan(float r, float a, float b) {
  if (!(r != r)) return r;
  if (a != a) return __uint_as_float(__float_as_uint(a) | 0x00400000u);
  if (b != b) return __uint_as_float(__float_as_uint(b) | 0x00400000u);
  return __uint_as_float(0xffc00000u);
}
// Operand order as the CPU's instructions have it (first source first).
__device__ __forceinline__ float add_x86(float a, float b) {
  return x86_nan(__fadd_rn(a, b), a, b);
}
__device__ __forceinline__ float sub_x86(float a, float b) {
  return x86_nan(__fsub_rn(a, b), a, b);
}
__device__ __forceinline__ float mul_x86(float a, float b) {
  return x86_nan(__fmul_rn(a, b), a, b);
}

__device__ __forceinline__ uint32_t magnitude_key(float x) {
  return __float_as_uint(x) & 0x7fffffffu;
}

// core/dtype.h's f32_to_bf16: round to nearest even, NaN kept quiet.
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// The CPU's quantise: 0 unless scale > 0, else nearbyint(v / scale) (half to even) clamped to
// +-127; NaN converts to 0 as x86's truncating conversion leaves it in the low byte.
__device__ __forceinline__ int quantise(float v, float scale) {
  if (!(scale > 0.0f)) return 0;
  const float q = rintf(__fdiv_rn(v, scale));
  if (q < -127.0f) return -127;
  if (127.0f < q) return 127;
  if (q != q) return 0;
  return static_cast<int>(q);
}

template <typename T>
__device__ __forceinline__ T warp_inclusive_scan(T v, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const T y = __shfl_up_sync(kFull, v, off);
    if (lane >= off) v += y;
  }
  return v;
}

// One pass of the radix select: histogram of digit `pass` (8 bits from the top) over the keys
// whose higher digits equal the prefix so far. One 256-bin histogram per warp in shared memory,
// a warp's equal digits added by one lane (__match_any_sync), then added to the pass's global
// bins. Pass 0 forms acc = grad + carry into carry first.
template <bool kFirst>
__global__ void __launch_bounds__(kThreads)
    hist_kernel(const float* grad, float* carry, int64_t n, int pass, const uint32_t* state,
                uint32_t* hist) {
  __shared__ uint32_t s_hist[kWarps][256];
  for (int b = threadIdx.x; b < kWarps * 256; b += kThreads) (&s_hist[0][0])[b] = 0;
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int shift = 24 - 8 * pass;
  const uint32_t high = pass == 0 ? 0u : ~0u << (shift + 8);  // the digits already fixed
  const uint32_t prefix = pass == 0 ? 0u : state[0] & high;
  const float* acc = carry != nullptr ? carry : grad;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads * kHistUnroll;
  // i0 is the same for the whole block, so every lane takes part in the warp votes.
  for (int64_t i0 = static_cast<int64_t>(blockIdx.x) * kThreads * kHistUnroll; i0 < n; i0 += step) {
    uint32_t key[kHistUnroll];
    bool ok[kHistUnroll];
#pragma unroll
    for (int u = 0; u < kHistUnroll; ++u) {
      const int64_t i = i0 + u * kThreads + threadIdx.x;
      ok[u] = i < n;
      float x = 0.0f;
      if (ok[u]) {
        if (kFirst) {
          x = grad[i];
          if (carry != nullptr) {
            x = add_x86(carry[i], x);  // acc[i] += carry[i], as the CPU's vector loop orders it
            carry[i] = x;
          }
        } else {
          x = acc[i];
        }
      }
      key[u] = magnitude_key(x);
    }
#pragma unroll
    for (int u = 0; u < kHistUnroll; ++u) {
      const bool match = ok[u] && (key[u] & high) == prefix;
      const unsigned voters = __ballot_sync(kFull, match);
      if (match) {
        const uint32_t digit = (key[u] >> shift) & 255u;
        const unsigned peers = __match_any_sync(voters, digit);
        if (lane == __ffs(peers) - 1) atomicAdd(&s_hist[warp][digit], __popc(peers));
      }
    }
  }
  __syncthreads();
  for (int b = threadIdx.x; b < 256; b += kThreads) {
    uint32_t s = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += s_hist[w][b];
    if (s != 0) atomicAdd(&hist[pass * 256 + b], s);
  }
}

// One warp: the digit of pass `pass` that holds the rem-th largest matching key (rem = k before
// pass 0). Lane l holds bins 255 - 8l down to 248 - 8l, so a scan over lanes counts from the top.
__global__ void select_kernel(uint32_t* state, const uint32_t* hist, int pass, uint32_t k) {
  const int lane = threadIdx.x;
  const int shift = 24 - 8 * pass;
  const uint32_t rem = pass == 0 ? k : state[1];
  const uint32_t prefix = pass == 0 ? 0u : state[0];
  uint32_t c[8], s = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    c[j] = hist[pass * 256 + 255 - (lane * 8 + j)];
    s += c[j];
  }
  const uint32_t incl = warp_inclusive_scan(s, lane), excl = incl - s;
  __syncwarp();  // every lane has read the state before one overwrites it
  if (excl < rem && rem <= incl) {
    uint32_t above = excl;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (rem <= above + c[j]) {
        state[0] = prefix | (static_cast<uint32_t>(255 - (lane * 8 + j)) << shift);
        state[1] = rem - above;
        break;
      }
      above += c[j];
    }
  }
}

// Per chunk (one warp, 8 chunks a warp): #(key > t) and #(key == t); per group their sum.
__global__ void __launch_bounds__(kThreads)
    count_kernel(const float* acc, int64_t n, int64_t chunks, const uint32_t* state, ull* chunk_cnt,
                 ull* group_cnt) {
  __shared__ ull s_warp[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t t = state[0];
  ull total = 0;
  for (int r = 0; r < kChunksPerWarp; ++r) {
    const int64_t c = static_cast<int64_t>(blockIdx.x) * kGroup + warp * kChunksPerWarp + r;
    if (c >= chunks) break;
    const int64_t base = c * kChunk;
    uint32_t key[kPerLane];
    bool ok[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int64_t i = base + j * 32 + lane;
      ok[j] = i < n;
      key[j] = ok[j] ? magnitude_key(acc[i]) : 0u;
    }
    uint32_t above = 0, ties = 0;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      above += __popc(__ballot_sync(kFull, ok[j] && key[j] > t));
      ties += __popc(__ballot_sync(kFull, ok[j] && key[j] == t));
    }
    const ull packed = (static_cast<ull>(above) << 32) | ties;
    if (lane == 0) chunk_cnt[c] = packed;
    total += packed;
  }
  if (lane == 0) s_warp[warp] = total;
  __syncthreads();
  if (threadIdx.x == 0) {
    ull s = 0;
    for (int w = 0; w < kWarps; ++w) s += s_warp[w];
    group_cnt[blockIdx.x] = s;
  }
}

// In-place exclusive scan of x[0, m) by one block, tile after tile.
template <typename T>
__global__ void __launch_bounds__(kScanThreads) exclusive_scan_kernel(T* x, int64_t m) {
  __shared__ T s_warp[kScanThreads / 32];
  __shared__ T s_tile;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T running = 0;
  for (int64_t tile = 0; tile < m; tile += static_cast<int64_t>(kScanThreads) * kScanPer) {
    const int64_t i0 = tile + static_cast<int64_t>(threadIdx.x) * kScanPer;
    T v[kScanPer], s = 0;
#pragma unroll
    for (int u = 0; u < kScanPer; ++u) {
      v[u] = i0 + u < m ? x[i0 + u] : T(0);
      s += v[u];
    }
    const T incl = warp_inclusive_scan(s, lane);
    if (lane == 31) s_warp[warp] = incl;
    __syncthreads();
    if (warp == 0) {
      const T w = s_warp[lane], wi = warp_inclusive_scan(w, lane);
      s_warp[lane] = wi - w;
      if (lane == 31) s_tile = wi;
    }
    __syncthreads();
    T run = running + s_warp[warp] + (incl - s);
#pragma unroll
    for (int u = 0; u < kScanPer; ++u) {
      if (i0 + u < m) x[i0 + u] = run;
      run += v[u];
    }
    running += s_tile;
    __syncthreads();  // s_warp and s_tile are rewritten by the next tile
  }
}

// Encodes the chunks of one group: offsets from the group prefix and the chunk counts, then per
// chunk (one warp) the kept entries, their scale, values and the carry.
template <SyncValues V>
__global__ void __launch_bounds__(kThreads)
    encode_kernel(const float* acc, float* carry, bool keep_error, SparseLayout l,
                  const uint32_t* state, const ull* chunk_cnt, const ull* group_pre, uint8_t* msg) {
  __shared__ ull s_before[kGroup], s_cnt[kGroup];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n = l.n, chunks = l.chunks;
  if (warp == 0) {
    const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kGroup + 2 * lane;
    const ull a = c0 < chunks ? chunk_cnt[c0] : 0, b = c0 + 1 < chunks ? chunk_cnt[c0 + 1] : 0;
    const ull incl = warp_inclusive_scan(a + b, lane);
    const ull before = group_pre[blockIdx.x] + incl - (a + b);
    s_before[2 * lane] = before;
    s_before[2 * lane + 1] = before + a;
    s_cnt[2 * lane] = a;
    s_cnt[2 * lane + 1] = b;
  }
  // The alignment padding, which the CPU's memset leaves zero.
  if (blockIdx.x == 0 && threadIdx.x < 4) {
    const size_t vsize = V == SyncValues::Int8 ? 1 : V == SyncValues::BF16 ? 2 : 4;
    const size_t p0 = l.index + static_cast<size_t>(l.k) + threadIdx.x;
    const size_t p1 = l.vals + static_cast<size_t>(l.k) * vsize + threadIdx.x;
    if (p0 < l.vals) msg[p0] = 0;
    if (p1 < l.bytes) msg[p1] = 0;
  }
  __syncthreads();
  const uint32_t t = state[0], ties = state[1];
  auto* scales = reinterpret_cast<float*>(msg + l.scales);
  auto* counts = reinterpret_cast<uint16_t*>(msg + l.counts);
  uint8_t* index = msg + l.index;
  uint8_t* vals = msg + l.vals;
  const unsigned below = (1u << lane) - 1u;  // lanes of lower index
  // The next chunk's values are loaded while this one is encoded.
  float next[kPerLane];
  auto load = [&](int64_t c) {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int64_t i = c * kChunk + j * 32 + lane;
      next[j] = c < chunks && i < n ? acc[i] : 0.0f;
    }
  };
  load(static_cast<int64_t>(blockIdx.x) * kGroup + warp * kChunksPerWarp);
  for (int r = 0; r < kChunksPerWarp; ++r) {
    const int slot = warp * kChunksPerWarp + r;
    const int64_t c = static_cast<int64_t>(blockIdx.x) * kGroup + slot;
    if (c >= chunks) break;
    const int64_t base = c * kChunk;
    float x[kPerLane];
    bool ok[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      x[j] = next[j];
      ok[j] = base + j * 32 + lane < n;
    }
    if (r + 1 < kChunksPerWarp) load(c + 1);
    // Ties before this chunk take the first min(ties, tie_before) grants, in index order.
    const uint32_t tie_before = static_cast<uint32_t>(s_before[slot]);
    const uint32_t tie_here = static_cast<uint32_t>(s_cnt[slot]);
    const uint32_t granted_before = tie_before < ties ? tie_before : ties;
    const uint32_t left = ties - granted_before;
    const uint32_t grant = left < tie_here ? left : tie_here;
    const int64_t first = static_cast<int64_t>(s_before[slot] >> 32) + granted_before;
    bool keep[kPerLane];
    int pos[kPerLane];
    uint32_t tie_seen = 0, kept = 0, maxbits = 0;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const uint32_t key = magnitude_key(x[j]);
      const unsigned tm = __ballot_sync(kFull, ok[j] && key == t);
      const uint32_t tie_rank = tie_seen + __popc(tm & below);
      tie_seen += __popc(tm);
      keep[j] = ok[j] && (key > t || (key == t && tie_rank < grant));
      const unsigned km = __ballot_sync(kFull, keep[j]);
      pos[j] = static_cast<int>(kept + __popc(km & below));
      kept += __popc(km);
      // The CPU's std::max skips NaN; non-negative floats order as their bits.
      if (keep[j] && key <= 0x7f800000u && key > maxbits) maxbits = key;
    }
    maxbits = __reduce_max_sync(kFull, maxbits);
    const float scale = V == SyncValues::Int8 ? __fdiv_rn(__uint_as_float(maxbits), 127.0f) : 1.0f;
    if (lane == 0) {
      scales[c] = scale;
      counts[c] = static_cast<uint16_t>(kept);
    }
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      float rest = x[j];  // what the carry keeps: the whole value, or the coding error
      if (keep[j]) {
        const int64_t e = first + pos[j];
        index[e] = static_cast<uint8_t>(j * 32 + lane);
        float decoded;
        if (V == SyncValues::Int8) {
          const int q = quantise(x[j], scale);
          reinterpret_cast<int8_t*>(vals)[e] = static_cast<int8_t>(q);
          decoded = mul_x86(scale, static_cast<float>(q));
        } else if (V == SyncValues::BF16) {
          const uint16_t h = f32_to_bf16_bits(x[j]);
          reinterpret_cast<uint16_t*>(vals)[e] = h;
          decoded = __uint_as_float(static_cast<uint32_t>(h) << 16);
        } else {
          reinterpret_cast<uint32_t*>(vals)[e] = __float_as_uint(x[j]);
          decoded = x[j];
        }
        rest = sub_x86(x[j], decoded);
      }
      if (carry != nullptr && ok[j]) carry[base + j * 32 + lane] = keep_error ? rest : 0.0f;
    }
  }
}

// Entries of each group of 64 chunks (one warp a group), read from the message's counts.
__global__ void __launch_bounds__(kThreads)
    group_count_kernel(const uint8_t* msg, SparseLayout l, uint32_t* group_cnt) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (g * kGroup >= l.chunks) return;
  const auto* counts = reinterpret_cast<const uint16_t*>(msg + l.counts);
  const int64_t c0 = g * kGroup + lane, c1 = c0 + 32;
  const uint32_t s = (c0 < l.chunks ? counts[c0] : 0u) + (c1 < l.chunks ? counts[c1] : 0u);
  const uint32_t total = __reduce_add_sync(kFull, s);
  if (lane == 0) group_cnt[g] = total;
}

// out += decoded message, one warp per chunk; offsets from the group prefix and the counts.
template <SyncValues V>
__global__ void __launch_bounds__(kThreads)
    accumulate_kernel(const uint8_t* msg, SparseLayout l, const uint32_t* group_pre, float* out) {
  __shared__ uint32_t s_before[kGroup], s_cnt[kGroup];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t chunks = l.chunks;
  const auto* scales = reinterpret_cast<const float*>(msg + l.scales);
  const auto* counts = reinterpret_cast<const uint16_t*>(msg + l.counts);
  const uint8_t* index = msg + l.index;
  const uint8_t* vals = msg + l.vals;
  if (warp == 0) {
    const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kGroup + 2 * lane;
    const uint32_t a = c0 < chunks ? counts[c0] : 0u, b = c0 + 1 < chunks ? counts[c0 + 1] : 0u;
    const uint32_t incl = warp_inclusive_scan(a + b, lane);
    const uint32_t before = group_pre[blockIdx.x] + incl - (a + b);
    s_before[2 * lane] = before;
    s_before[2 * lane + 1] = before + a;
    s_cnt[2 * lane] = a;
    s_cnt[2 * lane + 1] = b;
  }
  __syncthreads();
  const int64_t k = l.k;
  for (int r = 0; r < kChunksPerWarp; ++r) {
    const int slot = warp * kChunksPerWarp + r;
    const int64_t c = static_cast<int64_t>(blockIdx.x) * kGroup + slot;
    if (c >= chunks) break;
    const int64_t first = s_before[slot];
    int64_t end = first + s_cnt[slot];
    if (end > k) end = k;  // a malformed message reads no further than its k entries
    const float scale = scales[c];
    const int64_t base = c * kChunk;
    for (int64_t e = first + lane; e < end; e += 32) {
      const int64_t i = base + index[e];
      if (i >= l.n) continue;
      float v;
      if (V == SyncValues::Int8) {
        v = mul_x86(static_cast<float>(reinterpret_cast<const int8_t*>(vals)[e]), scale);
      } else if (V == SyncValues::BF16) {
        v = __uint_as_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(vals)[e])
                            << 16);
      } else {
        v = __uint_as_float(reinterpret_cast<const uint32_t*>(vals)[e]);
      }
      out[i] = add_x86(v, out[i]);
    }
  }
}

void check_layout(const char* op, const SparseLayout& l) {
  VERL_CUDA_REQUIRE(l.n >= 0 && l.n <= 0xffffffffLL,
                    std::string(op) + ": n=" + std::to_string(l.n) + " outside [0, 2^32)");
  VERL_CUDA_REQUIRE(l.chunks == (l.n + kSparseChunk - 1) / kSparseChunk &&
                        (l.n == 0 ? l.k == 0 : (l.k >= 1 && l.k <= l.n)),
                    std::string(op) + ": layout (n " + std::to_string(l.n) + ", k " +
                        std::to_string(l.k) + ", chunks " + std::to_string(l.chunks) +
                        ") is not one of sparse_layout's");
}

template <SyncValues V>
void launch_encode(const ops::cuda::CudaContext& ctx, unsigned grid, const float* acc, float* carry,
                   bool keep_error, const SparseLayout& l, const Scratch& s, uint8_t* msg) {
  encode_kernel<V><<<grid, kThreads, 0, ctx.stream>>>(acc, carry, keep_error, l, s.state,
                                                      s.chunk_cnt, s.group_cnt, msg);
  VERL_CUDA_CHECK_LAUNCH();
}

template <SyncValues V>
void launch_accumulate(const ops::cuda::CudaContext& ctx, unsigned grid, const uint8_t* msg,
                       const SparseLayout& l, const uint32_t* group_pre, float* out) {
  accumulate_kernel<V><<<grid, kThreads, 0, ctx.stream>>>(msg, l, group_pre, out);
  VERL_CUDA_CHECK_LAUNCH();
}

}  // namespace

size_t sparse_scratch_bytes(int64_t n) {
  if (n <= 0) return 0;
  const int64_t chunks = (n + kSparseChunk - 1) / kSparseChunk;
  return align256(kHeadBytes) + align256(static_cast<size_t>(chunks) * sizeof(ull)) +
         align256(static_cast<size_t>(groups_of(chunks)) * sizeof(ull));
}

size_t sparse_accumulate_workspace_bytes(int64_t n) {
  if (n <= 0) return 0;
  return static_cast<size_t>(groups_of((n + kSparseChunk - 1) / kSparseChunk)) * sizeof(uint32_t);
}

void sparse_compress(const ops::cuda::CudaContext& ctx, const float* grad, float* carry,
                     bool keep_error, const SparseLayout& l, uint8_t* msg, void* scratch) {
  check_layout("sparse_compress", l);
  if (l.n == 0) return;
  VERL_CUDA_REQUIRE(grad != nullptr && msg != nullptr && scratch != nullptr,
                    "sparse_compress: null grad, msg or scratch");
  VERL_CUDA_REQUIRE(
      reinterpret_cast<uintptr_t>(msg) % 4 == 0 && reinterpret_cast<uintptr_t>(scratch) % 8 == 0,
      "sparse_compress: msg must be 4-byte and scratch 8-byte aligned");
  const int64_t n = l.n, chunks = l.chunks, groups = groups_of(chunks);
  const Scratch s = carve(scratch, chunks);
  VERL_CUDA_CHECK(cudaMemsetAsync(s.hist, 0, kHeadBytes, ctx.stream));

  int64_t hist_blocks = ops::cuda::detail::ceil_div(n, int64_t{kThreads} * kHistUnroll);
  if (hist_blocks > kMaxHistBlocks) hist_blocks = kMaxHistBlocks;
  const auto hgrid = static_cast<unsigned>(hist_blocks);
  const auto k = static_cast<uint32_t>(l.k);
  for (int pass = 0; pass < kPasses; ++pass) {
    if (pass == 0) {
      hist_kernel<true><<<hgrid, kThreads, 0, ctx.stream>>>(grad, carry, n, pass, s.state, s.hist);
    } else {
      hist_kernel<false><<<hgrid, kThreads, 0, ctx.stream>>>(grad, carry, n, pass, s.state, s.hist);
    }
    VERL_CUDA_CHECK_LAUNCH();
    select_kernel<<<1, 32, 0, ctx.stream>>>(s.state, s.hist, pass, k);
    VERL_CUDA_CHECK_LAUNCH();
  }

  const float* acc = carry != nullptr ? carry : grad;
  const auto grid = static_cast<unsigned>(groups);
  count_kernel<<<grid, kThreads, 0, ctx.stream>>>(acc, n, chunks, s.state, s.chunk_cnt,
                                                  s.group_cnt);
  VERL_CUDA_CHECK_LAUNCH();
  exclusive_scan_kernel<ull><<<1, kScanThreads, 0, ctx.stream>>>(s.group_cnt, groups);
  VERL_CUDA_CHECK_LAUNCH();
  switch (l.values) {
    case SyncValues::Int8:
      launch_encode<SyncValues::Int8>(ctx, grid, acc, carry, keep_error, l, s, msg);
      break;
    case SyncValues::BF16:
      launch_encode<SyncValues::BF16>(ctx, grid, acc, carry, keep_error, l, s, msg);
      break;
    case SyncValues::F32:
      launch_encode<SyncValues::F32>(ctx, grid, acc, carry, keep_error, l, s, msg);
      break;
  }
}

void sparse_accumulate(const ops::cuda::CudaContext& ctx, const uint8_t* msg, const SparseLayout& l,
                       float* out) {
  check_layout("sparse_accumulate", l);
  if (l.n == 0) return;
  const size_t need = sparse_accumulate_workspace_bytes(l.n);
  VERL_CUDA_REQUIRE(msg != nullptr && out != nullptr, "sparse_accumulate: null msg or out");
  VERL_CUDA_REQUIRE(reinterpret_cast<uintptr_t>(msg) % 4 == 0,
                    "sparse_accumulate: msg must be 4-byte aligned");
  VERL_CUDA_REQUIRE(ctx.workspace != nullptr && ctx.workspace_bytes >= need,
                    "sparse_accumulate: needs " + std::to_string(need) +
                        " bytes of workspace, have " + std::to_string(ctx.workspace_bytes));
  const int64_t groups = groups_of(l.chunks);
  auto* group_cnt = static_cast<uint32_t*>(ctx.workspace);
  group_count_kernel<<<static_cast<unsigned>(ops::cuda::detail::ceil_div(groups, kWarps)), kThreads,
                       0, ctx.stream>>>(msg, l, group_cnt);
  VERL_CUDA_CHECK_LAUNCH();
  exclusive_scan_kernel<uint32_t><<<1, kScanThreads, 0, ctx.stream>>>(group_cnt, groups);
  VERL_CUDA_CHECK_LAUNCH();
  const auto grid = static_cast<unsigned>(groups);
  switch (l.values) {
    case SyncValues::Int8:
      launch_accumulate<SyncValues::Int8>(ctx, grid, msg, l, group_cnt, out);
      break;
    case SyncValues::BF16:
      launch_accumulate<SyncValues::BF16>(ctx, grid, msg, l, group_cnt, out);
      break;
    case SyncValues::F32:
      launch_accumulate<SyncValues::F32>(ctx, grid, msg, l, group_cnt, out);
      break;
  }
}

}  // namespace verl::optim::cuda
