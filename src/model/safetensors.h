// safetensors reading (mmap; single file or sharded with model.safetensors.index.json) and
// writing in the layout transformers reads. Format: 8-byte little-endian header length N, then N
// bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the
// data; offsets are relative to the end of the header.
// Every malformation (truncation, header past EOF, offsets out of range or overlapping, a size that
// does not match dtype x shape, unknown dtype) is an Error naming the file and the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace verl::model {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data section
  int64_t numel() const;
};

// One .safetensors file, memory-mapped read-only.
class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path);
  // Parses and validates a header+data image already in memory (used by tests and the fuzzer);
  // `source` names it in errors. The bytes must outlive the object.
  static std::unique_ptr<SafetensorsFile> from_memory(const uint8_t* bytes, size_t size,
                                                      const std::string& source);
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;  // nullptr if absent
  const uint8_t* data(const TensorInfo& t) const { return data_ + t.begin; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  void parse(const uint8_t* bytes, size_t size);
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// All safetensors of a model directory: model.safetensors, or the shards listed by
// model.safetensors.index.json ("weight_map": {tensor: file}).
class SafetensorsDir {
 public:
  static SafetensorsDir open(const std::string& model_dir);

  bool has(const std::string& name) const;
  // Throws naming the directory and tensor when absent.
  const TensorInfo& info(const std::string& name) const;
  // Reads a tensor into fp32 at dst, converting from F32/BF16/F16. The tensor's shape must equal
  // `expected_shape`; a mismatch names the tensor, both shapes and the file.
  void read_f32(const std::string& name, const std::vector<int64_t>& expected_shape,
                float* dst) const;
  std::vector<std::string> names() const;
  const std::string& dir() const { return dir_; }
  const std::string& file_of(const std::string& name) const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor -> index into files_
};

struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;  // the dtype to store; data is always given as fp32
  std::vector<int64_t> shape;
  const float* data = nullptr;
};

// Writes one safetensors file (header padded to 8 bytes with spaces, tensors in the given order).
// Written to `path`.tmp then renamed, so a crash never leaves a half-written file at `path`.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Writes a model's tensors into `dir`: one model.safetensors when the total is at most
// `max_shard_bytes`, otherwise model-0000k-of-0000n.safetensors shards plus
// model.safetensors.index.json, as transformers' save_pretrained does.
void write_safetensors_dir(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                           uint64_t max_shard_bytes = 5ull << 30);

}  // namespace verl::model
