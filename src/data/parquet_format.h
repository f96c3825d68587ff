// Internal to the parquet reader: the parts of parquet.thrift (apache/parquet-format) that
// verl.cpp reads, decoded from the Thrift compact protocol by parquet_thrift.cpp. Enum values
// are the spec's numbers; fields we do not need are skipped on the wire.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace verl::data::parquet {

enum Type : int32_t {
  BOOLEAN = 0,
  INT32 = 1,
  INT64 = 2,
  INT96 = 3,
  FLOAT = 4,
  DOUBLE = 5,
  BYTE_ARRAY = 6,
  FIXED_LEN_BYTE_ARRAY = 7
};
enum Repetition : int32_t { REQUIRED = 0, OPTIONAL = 1, REPEATED = 2 };
enum ConvertedType : int32_t {
  CT_UTF8 = 0,
  CT_MAP = 1,
  CT_MAP_KEY_VALUE = 2,
  CT_LIST = 3,
  CT_ENUM = 4,
  CT_DECIMAL = 5,
  CT_UINT_8 = 11,
  CT_UINT_16 = 12,
  CT_UINT_32 = 13,
  CT_UINT_64 = 14,
  CT_JSON = 19,
  CT_BSON = 20
};
// Field ids of the LogicalType union.
enum LogicalType : int32_t {
  LT_STRING = 1,
  LT_MAP = 2,
  LT_LIST = 3,
  LT_ENUM = 4,
  LT_DECIMAL = 5,
  LT_INTEGER = 10,
  LT_JSON = 12,
  LT_BSON = 13,
  LT_UUID = 14,
  LT_FLOAT16 = 15
};
enum Encoding : int32_t {
  PLAIN = 0,
  PLAIN_DICTIONARY = 2,
  RLE = 3,
  BIT_PACKED = 4,
  DELTA_BINARY_PACKED = 5,
  DELTA_LENGTH_BYTE_ARRAY = 6,
  DELTA_BYTE_ARRAY = 7,
  RLE_DICTIONARY = 8,
  BYTE_STREAM_SPLIT = 9
};
enum Codec : int32_t {
  UNCOMPRESSED = 0,
  SNAPPY = 1,
  GZIP = 2,
  LZO = 3,
  BROTLI = 4,
  LZ4 = 5,
  ZSTD = 6,
  LZ4_RAW = 7
};
enum PageType : int32_t { DATA_PAGE = 0, INDEX_PAGE = 1, DICTIONARY_PAGE = 2, DATA_PAGE_V2 = 3 };

const char* type_name(int32_t t);
const char* encoding_name(int32_t e);
const char* codec_name(int32_t c);

struct SchemaElement {
  std::string name;
  int32_t type = -1;  // -1: a group
  int32_t type_length = 0;
  int32_t repetition = -1;  // -1: unset (the root)
  int32_t num_children = 0;
  int32_t converted_type = -1;
  int32_t scale = 0, precision = 0;
  int32_t logical_type = -1;  // field id of the LogicalType union member, -1: none
  int32_t int_bit_width = 0;  // LogicalType INTEGER
  bool int_signed = true;
  int32_t logical_scale = 0;  // LogicalType DECIMAL
};

struct ColumnMeta {
  bool has_meta_data = false;
  std::string file_path;  // set when the chunk lives in another file (unsupported)
  int32_t type = -1;
  std::vector<std::string> path_in_schema;
  int32_t codec = 0;
  int64_t num_values = 0;
  int64_t total_compressed_size = 0;
  int64_t data_page_offset = -1;
  int64_t dictionary_page_offset = -1;  // -1: none
  bool encrypted = false;
};

struct RowGroup {
  std::vector<ColumnMeta> columns;
  int64_t num_rows = 0;
};

struct FileMetaData {
  int32_t version = 0;
  std::vector<SchemaElement> schema;
  int64_t num_rows = 0;
  std::vector<RowGroup> row_groups;
  std::string created_by;
};

struct PageHeader {
  int32_t type = -1;
  int32_t uncompressed_page_size = -1;
  int32_t compressed_page_size = -1;
  // DataPageHeader (v1), DataPageHeaderV2 or DictionaryPageHeader, whichever `type` says.
  bool has_data_v1 = false, has_data_v2 = false, has_dictionary = false;
  int32_t num_values = 0;
  int32_t encoding = -1;
  int32_t definition_level_encoding = RLE, repetition_level_encoding = RLE;      // v1
  int32_t num_nulls = 0, num_rows = 0;                                           // v2
  int32_t definition_levels_byte_length = 0, repetition_levels_byte_length = 0;  // v2
  bool is_compressed = true;                                                     // v2
};

// Both throw verl::Error starting with `where` on any malformed or truncated input.
FileMetaData decode_file_metadata(const uint8_t* data, size_t size, const std::string& where);
// Decodes the header at data[0, size); *consumed is set to its length in bytes.
PageHeader decode_page_header(const uint8_t* data, size_t size, size_t* consumed,
                              const std::string& where);

}  // namespace verl::data::parquet

// ---- Column chunks (parquet_pages.cpp) ----
namespace verl::data::parquet {

// How a leaf's physical values become JSON, from its type and annotations.
enum class ValueKind { String, Bytes, Int, UInt, Float, Double, Bool, Decimal, Uuid, Float16 };

struct LeafInfo {
  std::string path;  // dotted path in the schema, for messages
  int32_t type = -1;
  int32_t type_length = 0;
  int max_def = 0, max_rep = 0;
  ValueKind kind = ValueKind::Bytes;
  int32_t scale = 0;  // DECIMAL
};

// The (repetition level, definition level) of every value slot of a column chunk, and the
// non-null values (those whose definition level is max_def) as JSON, in order.
struct ColumnValues {
  std::vector<uint16_t> rep, def;
  std::vector<nlohmann::ordered_json> values;
};

// Decodes every page of one column chunk (data[0, size) holds exactly its bytes).
ColumnValues read_column_chunk(const uint8_t* data, size_t size, const ColumnMeta& meta,
                               const LeafInfo& leaf, const std::string& where);

}  // namespace verl::data::parquet
