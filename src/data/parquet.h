// A small, strict Apache Parquet reader for verl's datasets (Debian ships no Arrow C++): it
// reads a file row group by row group and hands out each row as a JSON object, the same rows
// the JSONL path parses, so RLDataset and the SFT loader validate both alike.
//
//   ParquetFile pf = ParquetFile::open("gsm8k/train.parquet");
//   for (int g = 0; g < pf.num_row_groups(); ++g)
//     for (nlohmann::ordered_json& row : pf.read_row_group(g)) ...  // {"data_source": ...,
//     "prompt": [...]}
//
// Supported: data pages v1 and v2, dictionary pages, PLAIN / PLAIN_DICTIONARY / RLE_DICTIONARY
// (and RLE booleans), codecs UNCOMPRESSED, SNAPPY, GZIP, ZSTD; nested groups, LIST (3-level and
// the legacy 2-level forms), MAP, bare repeated fields, nulls at any level. Values: strings
// (UTF8/STRING/ENUM/JSON annotated or valid UTF-8 bytes) as strings, INT32/INT64 as integers
// (unsigned when annotated), FLOAT/DOUBLE and DECIMAL as doubles, BOOLEAN, null; structs as
// objects, lists as arrays, maps as objects. Anything else (DELTA_* and BYTE_STREAM_SPLIT
// encodings, LZ4/BROTLI/LZO, INT96, encryption) is an Error naming the file and the column.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace verl::data {

class ParquetFile {
 public:
  // Reads and checks the footer and the schema; the data is read by read_row_group.
  // Throws verl::Error naming the file on anything malformed or unsupported.
  static ParquetFile open(const std::string& path);
  ParquetFile(ParquetFile&&) noexcept;
  ParquetFile& operator=(ParquetFile&&) noexcept;
  ~ParquetFile();

  const std::string& path() const;
  int64_t num_rows() const;
  int num_row_groups() const;
  int64_t row_group_num_rows(int i) const;
  // The top-level field names, in schema order (the keys of every row).
  std::vector<std::string> column_names() const;
  // Every row of row group i, in order, one object per row with a key per top-level field
  // (null where the value is null). Reads only that row group's column chunks.
  std::vector<nlohmann::ordered_json> read_row_group(int i) const;

 private:
  struct Impl;
  explicit ParquetFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace verl::data
