#include "optim/sparse_sync.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace verl::optim {
namespace {

size_t align4(size_t x) {
  return (x + 3) & ~size_t{3};
}

// The ordering key of |x|: its bits without the sign (non-negative floats order as their bits).
uint32_t magnitude_key(float x) {
  return std::bit_cast<uint32_t>(x) & 0x7fffffffu;
}

size_t value_size(SyncValues v) {
  switch (v) {
    case SyncValues::Int8:
      return 1;
    case SyncValues::BF16:
      return 2;
    case SyncValues::F32:
      return 4;
  }
  return 4;
}

int8_t quantise(float v, float scale) {
  if (!(scale > 0.0f)) return 0;
  const float q = std::nearbyint(v / scale);
  return static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
}

// The k-th largest magnitude key of x[0, n), exactly, and how many entries equal to it are kept
// (`ties`: k less the entries above it). A radix select over the 31 key bits: the first pass
// counts the top 11 bits of every key (into four interleaved histograms, since gradients crowd
// into a few bins and an increment should not wait for the one before it); a second pass copies
// out the keys of the bin that holds the k-th (a few percent of them); the last 20 bits are
// resolved on that copy, 11 and 9 bits a pass.
struct Threshold {
  uint32_t key = 0;
  int64_t ties = 0;
};

// With a carry the first pass also forms acc = carry += grad (one sweep of memory fewer); x is then
// the carry.
Threshold kth_largest_key(const float* grad, float* carry, int64_t n, int64_t k) {
  const float* x = carry != nullptr ? carry : grad;
  constexpr int kBins = 2048;
  std::vector<int64_t> hist(4 * kBins, 0);
  int64_t i = 0;
  if (carry != nullptr) {
    for (; i + 4 <= n; i += 4) {
      for (int u = 0; u < 4; ++u) {
        carry[i + u] += grad[i + u];
        ++hist[u * kBins + (magnitude_key(carry[i + u]) >> 20)];
      }
    }
    for (; i < n; ++i) ++hist[magnitude_key(carry[i] += grad[i]) >> 20];
  } else {
    for (; i + 4 <= n; i += 4)
      for (int u = 0; u < 4; ++u) ++hist[u * kBins + (magnitude_key(x[i + u]) >> 20)];
    for (; i < n; ++i) ++hist[magnitude_key(x[i]) >> 20];
  }
  for (int b = 0; b < kBins; ++b)
    hist[b] += hist[kBins + b] + hist[2 * kBins + b] + hist[3 * kBins + b];
  // want: the rank of the wanted key among the entries matching the prefix, from the top.
  int64_t want = k;
  auto pick = [&](uint32_t bins) {
    uint32_t d = bins;
    while (d-- > 0) {
      if (hist[d] >= want) break;
      want -= hist[d];
    }
    return d;
  };
  const uint32_t top = pick(kBins);
  std::vector<uint32_t> cand(static_cast<size_t>(hist[top]) + 1);
  int64_t m = 0;
  for (int64_t j = 0; j < n; ++j) {  // branch-free append: the bin's keys in index order
    const uint32_t key = magnitude_key(x[j]);
    cand[m] = key;
    m += (key >> 20) == top ? 1 : 0;
  }
  uint32_t prefix = top << 20, prefix_mask = 0x7ffu << 20;
  struct Pass {
    int shift;
    uint32_t bins;
  };
  for (const Pass p : {Pass{9, 2048}, Pass{0, 512}}) {
    std::fill_n(hist.begin(), p.bins, 0);
    const uint32_t digit_mask = p.bins - 1;
    for (int64_t j = 0; j < m; ++j)
      if ((cand[j] & prefix_mask) == prefix) ++hist[(cand[j] >> p.shift) & digit_mask];
    prefix |= pick(p.bins) << p.shift;
    prefix_mask |= digit_mask << p.shift;
  }
  return {prefix, want};
}

}  // namespace

const char* to_string(SyncValues v) {
  switch (v) {
    case SyncValues::Int8:
      return "int8";
    case SyncValues::BF16:
      return "bf16";
    case SyncValues::F32:
      return "fp32";
  }
  return "?";
}

SyncValues sync_values_named(const std::string& name, const char* key) {
  if (name == "int8") return SyncValues::Int8;
  if (name == "bf16" || name == "bfloat16") return SyncValues::BF16;
  if (name == "fp32" || name == "float32" || name == "f32") return SyncValues::F32;
  VERL_FAIL("{}: '{}' is not a compression dtype (int8, bf16 or fp32)", key, name);
}

void check_lightweight_config(const LightweightConfig& cfg) {
  VERL_CHECK(cfg.top_k > 0 && cfg.top_k <= 1,
             "lightweight_sync_config.top_k={}: want a fraction in (0, 1]", cfg.top_k);
  VERL_CHECK(cfg.interval >= 1, "lightweight_sync_config.sync_interval_steps={}: want >= 1",
             cfg.interval);
}

int64_t sparse_count(int64_t n, double top_k) {
  if (n <= 0) return 0;
  const auto k = static_cast<int64_t>(std::ceil(top_k * static_cast<double>(n) - 1e-9));
  return std::clamp<int64_t>(k, 1, n);
}

SparseLayout sparse_layout(int64_t n, double top_k, SyncValues values) {
  SparseLayout l;
  l.n = n;
  l.k = sparse_count(n, top_k);
  l.chunks = (n + kSparseChunk - 1) / kSparseChunk;
  l.values = values;
  const auto c = static_cast<size_t>(l.chunks), k = static_cast<size_t>(l.k);
  l.scales = 0;
  l.counts = 4 * c;
  l.index = l.counts + 2 * c;
  l.vals = align4(l.index + k);
  l.bytes = align4(l.vals + k * value_size(values));
  return l;
}

void sparse_compress(const float* grad, float* carry, bool keep_error, const SparseLayout& l,
                     uint8_t* msg) {
  const int64_t n = l.n, k = l.k;
  if (n == 0) return;
  // acc = gradient + carry, built in the carry itself (by the selection's first pass); without a
  // carry the gradient is acc. The threshold: the k-th largest key. Entries above it are all kept;
  // of those equal to it, the first `ties` by index.
  const Threshold th = kth_largest_key(grad, carry, n, k);
  const float* acc = carry != nullptr ? carry : grad;
  const uint32_t t = th.key;
  int64_t ties = th.ties;

  auto* scales = reinterpret_cast<float*>(msg + l.scales);
  auto* counts = reinterpret_cast<uint16_t*>(msg + l.counts);
  uint8_t* index = msg + l.index;
  uint8_t* vals = msg + l.vals;
  std::memset(msg, 0, l.bytes);
  float* residual = keep_error ? carry : nullptr;  // where the error is kept, if it is
  int64_t out = 0;
  for (int64_t c = 0; c < l.chunks; ++c) {
    const int64_t b = c * kSparseChunk, e = std::min(n, b + kSparseChunk);
    const int64_t first = out;
    float maxabs = 0.0f;
    for (int64_t i = b; i < e; ++i) {
      const uint32_t key = magnitude_key(acc[i]);
      const bool take = key > t || (key == t && ties > 0);
      if (!take) continue;
      if (key == t) --ties;
      index[out++] = static_cast<uint8_t>(i - b);
      maxabs = std::max(maxabs, std::fabs(acc[i]));
    }
    counts[c] = static_cast<uint16_t>(out - first);
    const float scale = l.values == SyncValues::Int8 ? int8_scale(maxabs) : 1.0f;
    scales[c] = scale;
    for (int64_t j = first; j < out; ++j) {
      const int64_t i = b + index[j];
      float decoded = acc[i];
      switch (l.values) {
        case SyncValues::Int8: {
          const int8_t q = quantise(acc[i], scale);
          reinterpret_cast<int8_t*>(vals)[j] = q;
          decoded = static_cast<float>(q) * scale;
          break;
        }
        case SyncValues::BF16: {
          const uint16_t h = f32_to_bf16(acc[i]);
          std::memcpy(vals + 2 * j, &h, 2);
          decoded = bf16_to_f32(h);
          break;
        }
        case SyncValues::F32:
          std::memcpy(vals + 4 * j, &acc[i], 4);
          break;
      }
      if (residual != nullptr) residual[i] -= decoded;  // what is left: its quantisation error
    }
    // Entries not kept keep their whole value in the carry: the error of this chunk.
  }
  VERL_CHECK(out == k, "sparse_compress: kept {} entries, want {}", out, k);
  if (carry != nullptr && !keep_error) std::fill_n(carry, n, 0.0f);
}

void sparse_accumulate(const uint8_t* msg, const SparseLayout& l, float* out) {
  const auto* scales = reinterpret_cast<const float*>(msg + l.scales);
  const auto* counts = reinterpret_cast<const uint16_t*>(msg + l.counts);
  const uint8_t* index = msg + l.index;
  const uint8_t* vals = msg + l.vals;
  int64_t j = 0;
  for (int64_t c = 0; c < l.chunks; ++c) {
    float* base = out + c * kSparseChunk;
    const int64_t end = j + counts[c];
    VERL_CHECK(end <= l.k, "sparse_accumulate: chunk {} counts past the message's {} entries", c,
               l.k);
    for (; j < end; ++j) {
      float v = 0.0f;
      switch (l.values) {
        case SyncValues::Int8:
          v = static_cast<float>(reinterpret_cast<const int8_t*>(vals)[j]) * scales[c];
          break;
        case SyncValues::BF16: {
          uint16_t h;
          std::memcpy(&h, vals + 2 * j, 2);
          v = bf16_to_f32(h);
          break;
        }
        case SyncValues::F32:
          std::memcpy(&v, vals + 4 * j, 4);
          break;
      }
      base[index[j]] += v;
    }
  }
}

}  // namespace verl::optim
