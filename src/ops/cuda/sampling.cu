// GPU token sampling (sampling.h): Philox4x32-10 on the device; one 512-thread block per logits row
// (every kind of row), or, with a workspace, several blocks per row for greedy and untruncated
// rows. See sampling.h for the definition (the CPU Sampler's) and the fixed-point weights.
#include <cmath>
#include <string>

#include "ops/cuda/common.cuh"
#include "ops/cuda/sampling.h"

namespace verl::ops::cuda {

namespace {

using ull = unsigned long long;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 256;  // radix digit of 8 bits
constexpr unsigned kFull = 0xffffffffu;

// Philox4x32-10 (Salmon et al., SC 2011), word for word verl::philox4x32 (src/core/rng.cpp):
// key = seed, counter = (counter lo, counter hi, stream lo, stream hi).
__device__ __forceinline__ uint4 philox4x32_10(uint64_t seed, uint64_t stream, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return make_uint4(c0, c1, c2, c3);
}

// Sort key of a token: larger key = earlier in "descending logit, ties to the lower id". The
// logit's bits are mapped to an unsigned order (negatives flipped, -0 taken as +0), the id inverted
// below.
__device__ __forceinline__ uint32_t ordered_bits(float f) {
  const uint32_t b = __float_as_uint(f == 0.0f ? 0.0f : f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ ull make_key(float l, int i) {
  return (static_cast<ull>(ordered_bits(l)) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
}
__device__ __forceinline__ float key_logit(ull k) {
  const uint32_t b = static_cast<uint32_t>(k >> 32);
  return __uint_as_float((b & 0x80000000u) ? (b ^ 0x80000000u) : ~b);
}
__device__ __forceinline__ int key_token(ull k) {
  return static_cast<int>(0xFFFFFFFFu - static_cast<uint32_t>(k));
}

// floor(bits / 2^53 * M) exactly (bits < 2^53, M < 2^63): the draw's target in fixed point.
__device__ __forceinline__ ull scale_uniform(ull bits, ull M) {
  const ull hi = __umul64hi(bits, M), lo = bits * M;
  return (hi << 11) | (lo >> 53);
}

struct Row {
  const float* l;
  int V;
  float m, inv_t;
  double scale;  // 2^s of the fixed point
  // The CPU's weight, exp((l - m) / T) in fp32, and its fixed-point value.
  __device__ __forceinline__ float w(float li) const { return expf((li - m) * inv_t); }
  __device__ __forceinline__ ull fx(float li) const {
    return __double2ull_rn(static_cast<double>(w(li)) * scale);
  }
};

struct Smem {
  ull red_u[kWarps];
  double red_d[kWarps];
  ull piece[kWarps];
  uint32_t cnt[kBins];
  ull mass[kBins];
  ull hkey[kBins];
  ull b_cnt, b_mass, b_base;
  int b_bin, b_lo, b_hi, b_token;
};

// Block reductions returned to every thread; the leading sync lets them run back to back.
__device__ ull block_max(ull v, Smem& sh) {
  for (int off = 16; off > 0; off >>= 1) v = max(v, __shfl_xor_sync(kFull, v, off));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.red_u[threadIdx.x >> 5] = v;
  __syncthreads();
  ull r = sh.red_u[0];
  for (int w = 1; w < kWarps; ++w) r = max(r, sh.red_u[w]);
  return r;
}
__device__ double block_sum(double v, Smem& sh) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.red_d[threadIdx.x >> 5] = v;
  __syncthreads();
  double r = 0.0;
  for (int w = 0; w < kWarps; ++w) r += sh.red_d[w];
  return r;
}
__device__ __forceinline__ ull warp_sum(ull v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  return v;
}

// The first token in vocabulary order whose cumulative fixed-point weight exceeds `target`
// (< the row's total). sh.piece holds the sums of the kWarps pieces of `piece_len` ids (pass 2).
// Each level narrows the range to one of kWarps sub-ranges; the last 32 ids are scanned by warp 0.
// Returns the token in thread 0.
__device__ int id_order_search(const Row& r, int piece_len, ull target, Smem& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // every thread has read sh.piece for the total
  if (threadIdx.x == 0) {
    ull cum = 0;
    int sel = -1;
    for (int w = 0; w < kWarps; ++w) {
      if (cum + sh.piece[w] > target) {
        sel = w;
        break;
      }
      cum += sh.piece[w];
    }
    if (sel < 0) {  // unreachable with target < total; keep a valid range anyway
      sel = kWarps - 1;
      cum -= sh.piece[sel];
    }
    sh.b_lo = sel * piece_len;
    sh.b_hi = min(r.V, sh.b_lo + piece_len);
    sh.b_base = cum;
  }
  __syncthreads();
  while (sh.b_hi - sh.b_lo > 32) {
    const int lo = sh.b_lo, hi = sh.b_hi;
    const int len = (hi - lo + kWarps - 1) / kWarps;
    const int a = min(hi, lo + warp * len), b = min(hi, a + len);
    ull s = 0;
    for (int i = a + lane; i < b; i += 32) s += r.fx(r.l[i]);
    s = warp_sum(s);
    if (lane == 0) sh.piece[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
      ull cum = sh.b_base;
      int sel = -1;
      for (int w = 0; w < kWarps; ++w) {
        if (cum + sh.piece[w] > target) {
          sel = w;
          break;
        }
        cum += sh.piece[w];
      }
      if (sel < 0) {
        sel = kWarps - 1;
        cum -= sh.piece[sel];
      }
      sh.b_lo = min(hi, lo + sel * len);
      sh.b_hi = min(hi, sh.b_lo + len);
      sh.b_base = cum;
    }
    __syncthreads();
  }
  int token = -1;
  if (warp == 0) {
    const int lo = sh.b_lo, hi = sh.b_hi;
    const int i = lo + lane;
    const ull f = i < hi ? r.fx(r.l[i]) : 0;
    ull incl = f;
    for (int off = 1; off < 32; off <<= 1) {
      const ull u = __shfl_up_sync(kFull, incl, off);
      if (lane >= off) incl += u;
    }
    const unsigned hit = __ballot_sync(kFull, i < hi && sh.b_base + incl > target);
    token = hit ? lo + __ffs(hit) - 1 : hi - 1;
  }
  return token;
}

struct Cross {
  ull key;            // the token's sort key
  ull count_through;  // tokens with key >= it
  ull mass_through;   // their fixed-point weight
};

// In descending key order, the first token whose cumulative weight (count, or fixed-point mass)
// reaches X (cum >= X) or, with `strict`, exceeds it (cum > X). Radix descent over the 64-bit key,
// 8 bits per pass: a histogram of the tokens sharing the chosen prefix, warp 0 picks the digit
// where the cumulative weight crosses; stops when that bin holds a single token. Sums are exact
// integers, so a crossing found at the first level is found at every later one.
__device__ Cross radix_cross(const Row& r, bool by_mass, ull X, bool strict, Smem& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  ull prefix = 0, above_cnt = 0, above_mass = 0;
  for (int shift = 56;; shift -= 8) {
    __syncthreads();  // readers of the previous histogram are done
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      sh.cnt[b] = 0;
      sh.mass[b] = 0;
      sh.hkey[b] = 0;
    }
    __syncthreads();
    // Runs of equal digits in one thread are added once (all-equal logits would otherwise send
    // every token to one shared-memory address).
    int run_bin = -1;
    uint32_t run_cnt = 0;
    ull run_mass = 0, run_key = 0;
    for (int i = threadIdx.x; i < r.V; i += kThreads) {
      const float li = r.l[i];
      const ull key = make_key(li, i);
      if (shift < 56 && (key >> (shift + 8)) != prefix) continue;
      const int bin = static_cast<int>((key >> shift) & 0xFF);
      if (bin != run_bin) {
        if (run_cnt > 0) {
          atomicAdd(&sh.cnt[run_bin], run_cnt);
          atomicAdd(&sh.mass[run_bin], run_mass);
          atomicMax(&sh.hkey[run_bin], run_key);
        }
        run_bin = bin;
        run_cnt = 0;
        run_mass = 0;
        run_key = 0;
      }
      ++run_cnt;
      run_mass += r.fx(li);
      run_key = max(run_key, key);
    }
    if (run_cnt > 0) {
      atomicAdd(&sh.cnt[run_bin], run_cnt);
      atomicAdd(&sh.mass[run_bin], run_mass);
      atomicMax(&sh.hkey[run_bin], run_key);
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l scans bins 255 - 8 l down to 248 - 8 l (descending keys).
      ull lc = 0, lm = 0;
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const int b = kBins - 1 - 8 * lane - q;
        lc += sh.cnt[b];
        lm += sh.mass[b];
      }
      ull ic = lc, im = lm;
      for (int off = 1; off < 32; off <<= 1) {
        const ull c = __shfl_up_sync(kFull, ic, off), m = __shfl_up_sync(kFull, im, off);
        if (lane >= off) {
          ic += c;
          im += m;
        }
      }
      ull cb = above_cnt + ic - lc, mb = above_mass + im - lm;  // before this lane's first bin
      int found = -1, last = -1;
      ull fc = 0, fm = 0, lcb = 0, lmb = 0;
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const int b = kBins - 1 - 8 * lane - q;
        const ull ca = cb + sh.cnt[b], ma = mb + sh.mass[b];
        const ull wa = by_mass ? ma : ca;
        if (found < 0 && (strict ? wa > X : wa >= X)) {
          found = b;
          fc = cb;
          fm = mb;
        }
        if (sh.cnt[b] > 0) {  // the lowest non-empty bin: fallback when nothing crosses
          last = b;
          lcb = cb;
          lmb = mb;
        }
        cb = ca;
        mb = ma;
      }
      const unsigned hit = __ballot_sync(kFull, found >= 0);
      int src;
      if (hit != 0) {
        src = __ffs(hit) - 1;
      } else {  // unreachable when X is below the total weight; stay on a real token
        const unsigned nonempty = __ballot_sync(kFull, last >= 0);
        src = 31 - __clz(nonempty);
        found = last;
        fc = lcb;
        fm = lmb;
      }
      const int sel = __shfl_sync(kFull, found, src);
      const ull sc = __shfl_sync(kFull, fc, src), sm = __shfl_sync(kFull, fm, src);
      if (lane == 0) {
        sh.b_bin = sel;
        sh.b_cnt = sc;
        sh.b_mass = sm;
      }
    }
    __syncthreads();
    const int sel = sh.b_bin;
    above_cnt = sh.b_cnt;
    above_mass = sh.b_mass;
    prefix = (prefix << 8) | static_cast<ull>(sel);
    const uint32_t c = sh.cnt[sel];
    if (c <= 1 || shift == 0) {
      return Cross{c == 1 ? sh.hkey[sel] : prefix, above_cnt + c, above_mass + sh.mass[sel]};
    }
  }
}

// The rows the split path (below) handles: greedy, or temperature sampling with no truncation.
__device__ __forceinline__ bool simple_row(const SampleParamsDevice& p, int V) {
  const bool truncated = (p.top_k > 0 && p.top_k < V) || p.top_p < 1.0f;
  return p.temperature == 0.0f || !truncated;
}

// One block per row, every kind of row (the reference path); with skip_simple, the rows the split
// path handles exit at once.
__global__ void __launch_bounds__(kThreads)
    sample_kernel(int32_t* tokens, float* logprobs, const float* logits, int64_t ld,
                  const SampleParamsDevice* params, int V, int fx_shift, bool skip_simple) {
  __shared__ Smem sh;
  const int64_t row = blockIdx.x;
  const float* l = logits + row * ld;
  const SampleParamsDevice p = params[row];
  if (skip_simple && simple_row(p, V)) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  // Pass 1: the largest key = argmax with ties to the lowest id, and the max logit.
  ull best = 0;
  for (int i = threadIdx.x; i < V; i += kThreads) best = max(best, make_key(l[i], i));
  best = block_max(best, sh);
  const float m = key_logit(best);

  if (p.temperature == 0.0f) {
    double sum = 0.0;
    for (int i = threadIdx.x; i < V; i += kThreads) sum += exp(static_cast<double>(l[i] - m));
    sum = block_sum(sum, sh);
    if (threadIdx.x == 0) {
      const bool ok = isfinite(m) && isfinite(sum);
      tokens[row] = ok ? key_token(best) : -1;
      if (logprobs != nullptr) logprobs[row] = ok ? static_cast<float>(-log(sum)) : NAN;
    }
    return;
  }

  Row r{l, V, m, 1.0f / p.temperature, ldexp(1.0, fx_shift)};
  // Pass 2: the total weight (double, for the log-prob) and the fixed-point sums of kWarps pieces
  // of consecutive ids (warp w sums piece w).
  const int piece_len = (V + kWarps - 1) / kWarps;
  double total = 0.0;
  {
    const int a = min(V, warp * piece_len), b = min(V, a + piece_len);
    ull s = 0;
    for (int i = a + lane; i < b; i += 32) {
      const float w = r.w(l[i]);
      total += static_cast<double>(w);
      s += __double2ull_rn(static_cast<double>(w) * r.scale);
    }
    s = warp_sum(s);
    if (lane == 0) sh.piece[warp] = s;
  }
  total = block_sum(total, sh);  // its syncs publish sh.piece
  ull total_fx = 0;
  for (int w = 0; w < kWarps; ++w) total_fx += sh.piece[w];
  if (!(isfinite(m) && isfinite(total) && total > 0.0)) {
    if (threadIdx.x == 0) {
      tokens[row] = -1;
      if (logprobs != nullptr) logprobs[row] = NAN;
    }
    return;
  }

  const uint4 rnd = philox4x32_10(p.seed, p.stream, p.counter);
  const ull bits = (static_cast<ull>(rnd.x >> 5) << 26) | (rnd.y >> 6);  // as the CPU: 53 bits
  const int k = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
  const bool nucleus = p.top_p < 1.0f;
  int token;
  if (k == V && !nucleus) {
    token = id_order_search(r, piece_len, scale_uniform(bits, total_fx), sh);
  } else {
    ull kept = total_fx;
    if (k < V) kept = radix_cross(r, false, static_cast<ull>(k), false, sh).mass_through;
    if (nucleus) {
      ull X = static_cast<ull>(ceil(static_cast<double>(p.top_p) * static_cast<double>(kept)));
      X = X < 1 ? 1 : (X > kept ? kept : X);
      kept = radix_cross(r, true, X, false, sh).mass_through;
    }
    token = key_token(radix_cross(r, true, scale_uniform(bits, kept), true, sh).key);
  }
  if (threadIdx.x == 0) {
    tokens[row] = token;
    if (logprobs != nullptr) {
      logprobs[row] =
          static_cast<float>(static_cast<double>((l[token] - m) * r.inv_t) - log(total));
    }
  }
}

// ---- split path: several blocks per row
// ---------------------------------------------------------- Rows of greedy or untruncated
// temperature sampling, in three launches over fixed tiles of kTile ids (block (tile, row)):
//   1. tile_max:  the largest key of each tile -> part_key[row, tile]
//   2. tile_sum:  m = max of the row's part_key; each tile's fixed-point weight sum -> part_fx and
//                 its double sum (greedy: of exp(l - m)) -> part_sum
//   3. select:    one block per row: totals over the tiles in tile order, the target
//                 floor(u * total_fx), the first tile whose running sum exceeds it, then the token
//                 inside that tile by a block scan over contiguous per-thread runs.
// The fixed-point sums are exact integers, so the token is the one the one-block kernel picks (the
// first id whose cumulative weight exceeds the target) bit for bit; only the double total behind
// the log-prob is added in another order (~1e-16 relative).
constexpr int kSplitThreads = 256;
constexpr int kPerThread = 16;                     // ids per thread in a tile
constexpr int kTile = kSplitThreads * kPerThread;  // 4096 ids

__device__ __forceinline__ ull block_max_split(ull v) {
  __shared__ ull red[kSplitThreads / 32];
  for (int off = 16; off > 0; off >>= 1) v = max(v, __shfl_xor_sync(kFull, v, off));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  ull r = red[0];
#pragma unroll
  for (int w = 1; w < kSplitThreads / 32; ++w) r = max(r, red[w]);
  return r;
}
template <typename T>
__device__ __forceinline__ T block_sum_split(T v) {
  __shared__ T red[kSplitThreads / 32];
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFull, v, off);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  T r = red[0];
#pragma unroll
  for (int w = 1; w < kSplitThreads / 32; ++w) r += red[w];
  return r;
}

// Thread t's ids of a tile are t*kPerThread .. +kPerThread-1 (contiguous, so the select kernel's
// scan runs in id order); loaded as float4 when the row allows it (vec), else scalar.
__device__ __forceinline__ void load_run(const float* l, int begin, int V, bool vec, float* x) {
  if (vec && begin + kPerThread <= V) {
    const float4* p = reinterpret_cast<const float4*>(l + begin);
#pragma unroll
    for (int q = 0; q < kPerThread / 4; ++q) {
      const float4 f = p[q];
      x[4 * q] = f.x;
      x[4 * q + 1] = f.y;
      x[4 * q + 2] = f.z;
      x[4 * q + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int q = 0; q < kPerThread; ++q) x[q] = begin + q < V ? l[begin + q] : 0.0f;
  }
}

__global__ void __launch_bounds__(kSplitThreads)
    split_tile_max_kernel(ull* part_key, const float* logits, int64_t ld,
                          const SampleParamsDevice* params, int V, int tiles, bool vec) {
  const int tile = blockIdx.x;
  const int64_t row = blockIdx.y;
  if (!simple_row(params[row], V)) return;
  const float* l = logits + row * ld;
  const int begin = tile * kTile + threadIdx.x * kPerThread;
  float x[kPerThread];
  load_run(l, begin, V, vec, x);
  ull best = 0;
#pragma unroll
  for (int q = 0; q < kPerThread; ++q) {
    if (begin + q < V) best = max(best, make_key(x[q], begin + q));
  }
  best = block_max_split(best);
  if (threadIdx.x == 0) part_key[row * tiles + tile] = best;
}

__device__ __forceinline__ ull row_max_key(const ull* part_key, int tiles) {
  __shared__ ull s_best;
  if (threadIdx.x < 32) {
    ull b = 0;
    for (int t = threadIdx.x; t < tiles; t += 32) b = max(b, part_key[t]);
    for (int off = 16; off > 0; off >>= 1) b = max(b, __shfl_xor_sync(kFull, b, off));
    if (threadIdx.x == 0) s_best = b;
  }
  __syncthreads();
  return s_best;
}

__global__ void __launch_bounds__(kSplitThreads)
    split_tile_sum_kernel(ull* part_fx, double* part_sum, const ull* part_key, const float* logits,
                          int64_t ld, const SampleParamsDevice* params, int V, int tiles,
                          int fx_shift, bool vec) {
  const int tile = blockIdx.x;
  const int64_t row = blockIdx.y;
  const SampleParamsDevice p = params[row];
  if (!simple_row(p, V)) return;
  const float* l = logits + row * ld;
  const float m = key_logit(row_max_key(part_key + row * tiles, tiles));
  const int begin = tile * kTile + threadIdx.x * kPerThread;
  float x[kPerThread];
  load_run(l, begin, V, vec, x);
  double sum = 0.0;
  ull fx = 0;
  if (p.temperature == 0.0f) {
#pragma unroll
    for (int q = 0; q < kPerThread; ++q) {
      if (begin + q < V) sum += exp(static_cast<double>(x[q] - m));
    }
  } else {
    const Row r{l, V, m, 1.0f / p.temperature, ldexp(1.0, fx_shift)};
#pragma unroll
    for (int q = 0; q < kPerThread; ++q) {
      if (begin + q < V) {
        const float w = r.w(x[q]);
        sum += static_cast<double>(w);
        fx += __double2ull_rn(static_cast<double>(w) * r.scale);
      }
    }
    fx = block_sum_split(fx);
  }
  sum = block_sum_split(sum);
  if (threadIdx.x == 0) {
    part_fx[row * tiles + tile] = fx;
    part_sum[row * tiles + tile] = sum;
  }
}

__global__ void __launch_bounds__(kSplitThreads)
    split_select_kernel(int32_t* tokens, float* logprobs, const ull* part_key, const ull* part_fx,
                        const double* part_sum, const float* logits, int64_t ld,
                        const SampleParamsDevice* params, int V, int tiles, int fx_shift,
                        bool vec) {
  __shared__ ull s_scan[kSplitThreads / 32];
  __shared__ ull s_target, s_base;
  __shared__ int s_tile, s_token;
  const int64_t row = blockIdx.x;
  const SampleParamsDevice p = params[row];
  if (!simple_row(p, V)) return;
  const float* l = logits + row * ld;
  const ull best = row_max_key(part_key + row * tiles, tiles);
  const float m = key_logit(best);
  const double* ps = part_sum + row * tiles;
  const ull* pf = part_fx + row * tiles;
  // The totals in tile order (one thread: deterministic, and only ~40 tiles).
  __shared__ double s_total;
  __shared__ ull s_total_fx;
  if (threadIdx.x == 0) {
    double total = 0.0;
    ull total_fx = 0;
    for (int t = 0; t < tiles; ++t) {
      total += ps[t];
      total_fx += pf[t];
    }
    s_total = total;
    s_total_fx = total_fx;
  }
  __syncthreads();
  const double total = s_total;
  if (p.temperature == 0.0f) {
    if (threadIdx.x == 0) {
      const bool ok = isfinite(m) && isfinite(total);
      tokens[row] = ok ? key_token(best) : -1;
      if (logprobs != nullptr) logprobs[row] = ok ? static_cast<float>(-log(total)) : NAN;
    }
    return;
  }
  if (!(isfinite(m) && isfinite(total) && total > 0.0)) {
    if (threadIdx.x == 0) {
      tokens[row] = -1;
      if (logprobs != nullptr) logprobs[row] = NAN;
    }
    return;
  }
  const Row r{l, V, m, 1.0f / p.temperature, ldexp(1.0, fx_shift)};
  if (threadIdx.x == 0) {
    const uint4 rnd = philox4x32_10(p.seed, p.stream, p.counter);
    const ull bits = (static_cast<ull>(rnd.x >> 5) << 26) | (rnd.y >> 6);  // as the CPU: 53 bits
    const ull target = scale_uniform(bits, s_total_fx);
    ull cum = 0;
    int sel = tiles - 1;
    for (int t = 0; t < tiles; ++t) {
      if (cum + pf[t] > target) {
        sel = t;
        break;
      }
      cum += pf[t];
    }
    if (cum + pf[sel] <= target) cum -= pf[sel];  // unreachable (target < total); stay in range
    s_target = target;
    s_base = cum;
    s_tile = sel;
    s_token = -1;
  }
  __syncthreads();
  const ull target = s_target;
  const int begin = s_tile * kTile + threadIdx.x * kPerThread;
  float x[kPerThread];
  load_run(l, begin, V, vec, x);
  ull f[kPerThread];
  ull own = 0;
#pragma unroll
  for (int q = 0; q < kPerThread; ++q) {
    f[q] = begin + q < V ? r.fx(x[q]) : 0;
    own += f[q];
  }
  // Exclusive scan of the per-thread sums over the block, in thread (= id) order.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  ull incl = own;
  for (int off = 1; off < 32; off <<= 1) {
    const ull u = __shfl_up_sync(kFull, incl, off);
    if (lane >= off) incl += u;
  }
  if (lane == 31) s_scan[warp] = incl;
  __syncthreads();
  ull before = s_base;
  for (int w = 0; w < warp; ++w) before += s_scan[w];
  before += incl - own;
  // The crossing lies in the first thread whose run ends above the target.
  if (before <= target && before + own > target) {
    ull cum = before;
    int tok = begin + kPerThread - 1;
#pragma unroll
    for (int q = 0; q < kPerThread; ++q) {
      cum += f[q];
      if (cum > target) {
        tok = begin + q;
        break;
      }
    }
    s_token = tok;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int token = s_token;
    if (token < 0) token = min(V, (s_tile + 1) * kTile) - 1;  // unreachable; a valid id anyway
    tokens[row] = token;
    if (logprobs != nullptr) {
      logprobs[row] =
          static_cast<float>(static_cast<double>((l[token] - m) * r.inv_t) - log(total));
    }
  }
}

__global__ void philox_kernel(uint32_t* out, const uint64_t* keys, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 r = philox4x32_10(keys[3 * i], keys[3 * i + 1], keys[3 * i + 2]);
    out[4 * i] = r.x;
    out[4 * i + 1] = r.y;
    out[4 * i + 2] = r.z;
    out[4 * i + 3] = r.w;
  }
}

}  // namespace

size_t sample_workspace_bytes(int64_t S, int64_t V) {
  const int64_t tiles = detail::ceil_div(V, kTile);
  const size_t n = static_cast<size_t>(S * tiles);
  return 3 * ((n * 8 + 255) / 256 * 256);
}

void sample_tokens(const CudaContext& ctx, int32_t* tokens, float* logprobs, const float* logits,
                   int64_t ld, const SampleParamsDevice* params, int64_t S, int64_t V,
                   void* workspace, size_t workspace_bytes) {
  VERL_CUDA_REQUIRE(S >= 0 && V >= 1 && V < (int64_t{1} << 31) && ld >= V && S < (int64_t{1} << 31),
                    detail::shape_str("sample_tokens", {S, V, ld}));
  if (S == 0) return;
  int bits = 0;  // ceil(log2 V)
  while ((int64_t{1} << bits) < V) ++bits;
  const int fx_shift = 62 - bits;  // V * 2^fx_shift <= 2^62: no sum of weights <= 1 overflows
  const bool split = workspace != nullptr;
  if (split) {
    const size_t need = sample_workspace_bytes(S, V);
    VERL_CUDA_REQUIRE(workspace_bytes >= need,
                      detail::shape_str("sample_tokens", {S, V, ld}) + ": workspace of " +
                          std::to_string(workspace_bytes) + " bytes, the split path needs " +
                          std::to_string(need));
    VERL_CUDA_REQUIRE(S < 65536, detail::shape_str("sample_tokens", {S, V, ld}) +
                                     ": the split path takes fewer than 65536 rows");
    const int tiles = static_cast<int>(detail::ceil_div(V, kTile));
    const size_t slice = need / 3;
    auto* part_key = static_cast<ull*>(workspace);
    auto* part_fx = reinterpret_cast<ull*>(static_cast<uint8_t*>(workspace) + slice);
    auto* part_sum = reinterpret_cast<double*>(static_cast<uint8_t*>(workspace) + 2 * slice);
    const bool vec = ld % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
    const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(S));
    split_tile_max_kernel<<<grid, kSplitThreads, 0, ctx.stream>>>(part_key, logits, ld, params,
                                                                  static_cast<int>(V), tiles, vec);
    VERL_CUDA_CHECK_LAUNCH();
    split_tile_sum_kernel<<<grid, kSplitThreads, 0, ctx.stream>>>(
        part_fx, part_sum, part_key, logits, ld, params, static_cast<int>(V), tiles, fx_shift, vec);
    VERL_CUDA_CHECK_LAUNCH();
    split_select_kernel<<<static_cast<unsigned>(S), kSplitThreads, 0, ctx.stream>>>(
        tokens, logprobs, part_key, part_fx, part_sum, logits, ld, params, static_cast<int>(V),
        tiles, fx_shift, vec);
    VERL_CUDA_CHECK_LAUNCH();
  }
  // The one-block-per-row kernel: every row without a workspace, else only the truncated ones.
  sample_kernel<<<static_cast<unsigned>(S), kThreads, 0, ctx.stream>>>(
      tokens, logprobs, logits, ld, params, static_cast<int>(V), fx_shift, split);
  VERL_CUDA_CHECK_LAUNCH();
}

void philox4x32_batch(const CudaContext& ctx, uint32_t* out, const uint64_t* keys, int64_t n) {
  VERL_CUDA_REQUIRE(n >= 0, detail::shape_str("philox4x32_batch", {n}));
  if (n == 0) return;
  philox_kernel<<<detail::grid_for(n, 256), 256, 0, ctx.stream>>>(out, keys, n);
  VERL_CUDA_CHECK_LAUNCH();
}

}  // namespace verl::ops::cuda
