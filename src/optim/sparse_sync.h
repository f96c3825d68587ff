// LightweightSync's codec (docs/lightweight_sync.md): a gradient bucket of n elements is cut into
// chunks of kSparseChunk; the k = ceil(top_k n) entries of largest magnitude are kept (exact
// selection: the k-th largest |x| is the threshold, ties go to the lowest indices), each as its
// index inside its chunk (one byte) and its value in int8 (scaled per chunk by the chunk's largest
// kept magnitude / 127), bf16 or fp32. Since k is fixed by n and top_k, the message's size is too,
// so the ranks exchange messages with one all-gather and every rank adds the W decoded messages in
// rank order: the same sum, bit for bit, on every rank.
//
// The carry buffer (one float per element, per rank) is what this rank has not delivered yet: with
// error feedback, each entry's compression error (the whole value when it was not selected, the
// quantisation error when it was); with sync_interval_steps > 1 also the gradients of the steps
// without a sync. The next compression adds it to the gradient first.
//
// The CUDA versions (optim/cuda/sparse_sync.h) produce the same bytes; tests/cuda checks them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace verl::optim {

// How the selected values travel.
enum class SyncValues { Int8, BF16, F32 };
const char* to_string(SyncValues v);                                     // "int8", "bf16", "fp32"
SyncValues sync_values_named(const std::string& name, const char* key);  // fp32 / float32 too

// trainer.lightweight_sync_config.
struct LightweightConfig {
  double top_k = 0.1;  // fraction of each bucket's entries sent, in (0, 1]
  SyncValues values = SyncValues::Int8;
  int64_t interval = 1;  // sync_interval_steps: optimizer steps per sync (gradient accumulation)
  bool error_feedback = true;
  // Whether a rank keeps a carry: for the error, or for the gradients of the steps between syncs.
  bool needs_carry() const { return error_feedback || interval > 1; }
};

// Fails naming the key when top_k is outside (0, 1] or the interval below 1.
void check_lightweight_config(const LightweightConfig& cfg);

constexpr int64_t kSparseChunk = 256;  // the index inside a chunk is one byte

// Byte layout of one bucket's message: scales f32[chunks], counts u16[chunks] (entries kept per
// chunk, summing to k), index u8[k] (chunk-relative, ascending inside a chunk, chunks in order),
// then values int8 / bf16 / f32 [k] from a 4-byte aligned offset; bytes is a multiple of 4.
struct SparseLayout {
  int64_t n = 0, k = 0, chunks = 0;
  SyncValues values = SyncValues::Int8;
  size_t scales = 0, counts = 0, index = 0, vals = 0, bytes = 0;
};

// Entries kept of a bucket of n: ceil(top_k n), at least 1 (when n > 0), at most n.
int64_t sparse_count(int64_t n, double top_k);
SparseLayout sparse_layout(int64_t n, double top_k, SyncValues values);

// acc = grad + carry (grad alone when carry is null); writes acc's top-k message into `msg`
// (layout.bytes bytes). With a carry: carry = acc - decoded(msg) when keep_error (error
// feedback), else 0.
void sparse_compress(const float* grad, float* carry, bool keep_error, const SparseLayout& layout,
                     uint8_t* msg);
// out[i] += the message's decoded value at i (the entries it holds).
void sparse_accumulate(const uint8_t* msg, const SparseLayout& layout, float* out);

// The int8 scale of a chunk whose largest kept magnitude is `maxabs`, and the quantise / decode
// rules (shared with the CUDA kernels, which use the same IEEE operations).
inline float int8_scale(float maxabs) {
  return maxabs / 127.0f;
}

}  // namespace verl::optim
