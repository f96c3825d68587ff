// Thrift compact protocol decoding of parquet's FileMetaData and PageHeader (the fields in
// parquet_format.h). Every length, count and nesting depth read from the wire is bounded by the
// bytes that remain, so a hostile footer is an Error, never an over-read or a huge allocation.
//
// Compact protocol (thrift/doc/specs/thrift-compact-protocol.md): a field header byte holds the
// field-id delta (high nibble; 0 = a zigzag i16 id follows) and the type (low nibble); i16/i32/i64
// are zigzag varints; binary is a varint length and the bytes; a list header holds the size (high
// nibble, 15 = a varint size follows) and the element type; a struct ends with a 0 byte.
#include <fmt/format.h>

#include "core/error.h"
#include "data/parquet_format.h"

namespace verl::data::parquet {

const char* type_name(int32_t t) {
  static const char* names[] = {"BOOLEAN", "INT32",  "INT64",      "INT96",
                                "FLOAT",   "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"};
  return t >= 0 && t < 8 ? names[t] : "unknown type";
}

const char* encoding_name(int32_t e) {
  switch (e) {
    case PLAIN:
      return "PLAIN";
    case PLAIN_DICTIONARY:
      return "PLAIN_DICTIONARY";
    case RLE:
      return "RLE";
    case BIT_PACKED:
      return "BIT_PACKED";
    case DELTA_BINARY_PACKED:
      return "DELTA_BINARY_PACKED";
    case DELTA_LENGTH_BYTE_ARRAY:
      return "DELTA_LENGTH_BYTE_ARRAY";
    case DELTA_BYTE_ARRAY:
      return "DELTA_BYTE_ARRAY";
    case RLE_DICTIONARY:
      return "RLE_DICTIONARY";
    case BYTE_STREAM_SPLIT:
      return "BYTE_STREAM_SPLIT";
  }
  return "unknown encoding";
}

const char* codec_name(int32_t c) {
  static const char* names[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO",
                                "BROTLI",       "LZ4",    "ZSTD", "LZ4_RAW"};
  return c >= 0 && c < 8 ? names[c] : "unknown codec";
}

namespace {

// Compact protocol wire types.
enum Wire : int {
  STOP = 0,
  TRUE_ = 1,
  FALSE_ = 2,
  BYTE = 3,
  I16 = 4,
  I32 = 5,
  I64 = 6,
  DOUBLE_ = 7,
  BINARY = 8,
  LIST = 9,
  SET = 10,
  MAP = 11,
  STRUCT = 12
};
constexpr int kMaxDepth = 32;  // parquet's structs nest 5 deep; more is a hostile file

class Reader {
 public:
  Reader(const uint8_t* p, size_t n, const std::string& where) : p_(p), n_(n), where_(where) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return n_ - pos_; }

  uint8_t byte() {
    VERL_CHECK(pos_ < n_, "{}: Thrift data ends early at byte {} of {}", where_, pos_, n_);
    return p_[pos_++];
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const uint8_t b = byte();
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    VERL_FAIL("{}: a Thrift varint at byte {} is longer than 10 bytes", where_, pos_);
  }
  int64_t zigzag() {
    const uint64_t u = varint();
    return static_cast<int64_t>(u >> 1) ^ -static_cast<int64_t>(u & 1);
  }

  // Integer fields: the writer may pick any integer width; the value must fit ours.
  int64_t integer(int wire) {
    if (wire == BYTE) return static_cast<int8_t>(byte());
    VERL_CHECK(wire == I16 || wire == I32 || wire == I64,
               "{}: expected an integer field, got Thrift type {}", where_, wire);
    return zigzag();
  }
  int32_t i32(int wire) {
    const int64_t v = integer(wire);
    VERL_CHECK(v >= INT32_MIN && v <= INT32_MAX, "{}: Thrift i32 value {} out of range", where_, v);
    return static_cast<int32_t>(v);
  }
  bool boolean(int wire) {
    VERL_CHECK(wire == TRUE_ || wire == FALSE_, "{}: expected a bool field, got Thrift type {}",
               where_, wire);
    return wire == TRUE_;
  }
  std::string binary(int wire) {
    VERL_CHECK(wire == BINARY, "{}: expected a string field, got Thrift type {}", where_, wire);
    const uint64_t len = varint();
    VERL_CHECK(len <= remaining(), "{}: Thrift string of {} bytes runs past the end ({} left)",
               where_, len, remaining());
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }

  // A list header; returns the element count (bounded by the bytes left: every element takes one).
  size_t list(int wire, int* elem) {
    VERL_CHECK(wire == LIST || wire == SET, "{}: expected a list field, got Thrift type {}", where_,
               wire);
    const uint8_t h = byte();
    *elem = h & 0x0f;
    uint64_t size = h >> 4;
    if (size == 15) size = varint();
    VERL_CHECK(size <= remaining(),
               "{}: Thrift list of {} elements cannot fit in the {} bytes left", where_, size,
               remaining());
    return static_cast<size_t>(size);
  }

  // Calls on_field(id, wire) for each field of a struct; on_field must consume the value (or skip
  // it).
  template <typename Fn>
  void fields(Fn on_field) {
    VERL_CHECK(++depth_ <= kMaxDepth, "{}: Thrift structs nested deeper than {}", where_,
               kMaxDepth);
    int32_t last = 0;
    for (;;) {
      const uint8_t h = byte();
      if (h == STOP) break;
      const int wire = h & 0x0f;
      const int delta = h >> 4;
      const int32_t id = delta != 0 ? last + delta : static_cast<int32_t>(zigzag());
      last = id;
      on_field(id, wire);
    }
    --depth_;
  }

  // Skips a value; `in_container` because a bool in a list or map takes a byte, in a field none.
  void skip(int wire, bool in_container = false) {
    switch (wire) {
      case TRUE_:
      case FALSE_:
        if (in_container) byte();
        return;
      case BYTE:
        byte();
        return;
      case I16:
      case I32:
      case I64:
        varint();
        return;
      case DOUBLE_:
        VERL_CHECK(remaining() >= 8, "{}: Thrift double runs past the end", where_);
        pos_ += 8;
        return;
      case BINARY:
        binary(BINARY);
        return;
      case LIST:
      case SET: {
        VERL_CHECK(++depth_ <= kMaxDepth, "{}: Thrift containers nested deeper than {}", where_,
                   kMaxDepth);
        int elem = 0;
        const size_t n = list(wire, &elem);
        for (size_t i = 0; i < n; ++i) skip(elem, true);
        --depth_;
        return;
      }
      case MAP: {
        VERL_CHECK(++depth_ <= kMaxDepth, "{}: Thrift containers nested deeper than {}", where_,
                   kMaxDepth);
        const uint64_t n = varint();
        VERL_CHECK(n <= remaining(), "{}: Thrift map of {} entries cannot fit", where_, n);
        if (n > 0) {
          const uint8_t kv = byte();
          for (uint64_t i = 0; i < n; ++i) {
            skip(kv >> 4, true);
            skip(kv & 0x0f, true);
          }
        }
        --depth_;
        return;
      }
      case STRUCT:
        fields([&](int32_t, int w) { skip(w); });
        return;
    }
    VERL_FAIL("{}: unknown Thrift type {} at byte {}", where_, wire, pos_);
  }

  void expect_struct(int wire) {
    VERL_CHECK(wire == STRUCT, "{}: expected a struct field, got Thrift type {}", where_, wire);
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
  const std::string& where_;
  int depth_ = 0;
};

void read_logical_type(Reader& r, SchemaElement& el) {
  // A union: exactly one member, itself a struct (mostly empty).
  r.fields([&](int32_t id, int wire) {
    el.logical_type = id;
    if (id == LT_INTEGER && wire == STRUCT) {
      r.fields([&](int32_t f, int w) {
        if (f == 1)
          el.int_bit_width = r.i32(w);
        else if (f == 2)
          el.int_signed = r.boolean(w);
        else
          r.skip(w);
      });
    } else if (id == LT_DECIMAL && wire == STRUCT) {
      r.fields([&](int32_t f, int w) {
        if (f == 1)
          el.logical_scale = r.i32(w);
        else
          r.skip(w);
      });
    } else {
      r.skip(wire);
    }
  });
}

SchemaElement read_schema_element(Reader& r) {
  SchemaElement el;
  bool has_name = false;
  r.fields([&](int32_t id, int wire) {
    switch (id) {
      case 1:
        el.type = r.i32(wire);
        break;
      case 2:
        el.type_length = r.i32(wire);
        break;
      case 3:
        el.repetition = r.i32(wire);
        break;
      case 4:
        el.name = r.binary(wire);
        has_name = true;
        break;
      case 5:
        el.num_children = r.i32(wire);
        break;
      case 6:
        el.converted_type = r.i32(wire);
        break;
      case 7:
        el.scale = r.i32(wire);
        break;
      case 8:
        el.precision = r.i32(wire);
        break;
      case 10:
        r.expect_struct(wire);
        read_logical_type(r, el);
        break;
      default:
        r.skip(wire);
    }
  });
  (void)has_name;  // pyarrow always writes it; a nameless element just has an empty name
  return el;
}

ColumnMeta read_column_meta(Reader& r, ColumnMeta cm) {
  cm.has_meta_data = true;
  r.fields([&](int32_t id, int wire) {
    switch (id) {
      case 1:
        cm.type = r.i32(wire);
        break;
      case 3: {
        int elem = 0;
        const size_t n = r.list(wire, &elem);
        for (size_t i = 0; i < n; ++i) cm.path_in_schema.push_back(r.binary(elem));
        break;
      }
      case 4:
        cm.codec = r.i32(wire);
        break;
      case 5:
        cm.num_values = r.integer(wire);
        break;
      case 7:
        cm.total_compressed_size = r.integer(wire);
        break;
      case 9:
        cm.data_page_offset = r.integer(wire);
        break;
      case 11:
        cm.dictionary_page_offset = r.integer(wire);
        break;
      default:
        r.skip(wire);
    }
  });
  return cm;
}

ColumnMeta read_column_chunk(Reader& r) {
  ColumnMeta cm;
  r.fields([&](int32_t id, int wire) {
    switch (id) {
      case 1:
        cm.file_path = r.binary(wire);
        break;
      case 3:
        r.expect_struct(wire);
        cm = read_column_meta(r, cm);
        break;
      case 8:  // crypto_metadata
      case 9:  // encrypted_column_metadata
        cm.encrypted = true;
        r.skip(wire);
        break;
      default:
        r.skip(wire);
    }
  });
  return cm;
}

RowGroup read_row_group(Reader& r) {
  RowGroup rg;
  r.fields([&](int32_t id, int wire) {
    switch (id) {
      case 1: {
        int elem = 0;
        const size_t n = r.list(wire, &elem);
        for (size_t i = 0; i < n; ++i) {
          r.expect_struct(elem);
          rg.columns.push_back(read_column_chunk(r));
        }
        break;
      }
      case 3:
        rg.num_rows = r.integer(wire);
        break;
      default:
        r.skip(wire);
    }
  });
  return rg;
}

}  // namespace

FileMetaData decode_file_metadata(const uint8_t* data, size_t size, const std::string& where) {
  Reader r(data, size, where);
  FileMetaData md;
  r.fields([&](int32_t id, int wire) {
    switch (id) {
      case 1:
        md.version = r.i32(wire);
        break;
      case 2: {
        int elem = 0;
        const size_t n = r.list(wire, &elem);
        for (size_t i = 0; i < n; ++i) {
          r.expect_struct(elem);
          md.schema.push_back(read_schema_element(r));
        }
        break;
      }
      case 3:
        md.num_rows = r.integer(wire);
        break;
      case 4: {
        int elem = 0;
        const size_t n = r.list(wire, &elem);
        for (size_t i = 0; i < n; ++i) {
          r.expect_struct(elem);
          md.row_groups.push_back(read_row_group(r));
        }
        break;
      }
      case 6:
        md.created_by = r.binary(wire);
        break;
      default:
        r.skip(wire);
    }
  });
  return md;
}

PageHeader decode_page_header(const uint8_t* data, size_t size, size_t* consumed,
                              const std::string& where) {
  Reader r(data, size, where);
  PageHeader h;
  r.fields([&](int32_t id, int wire) {
    switch (id) {
      case 1:
        h.type = r.i32(wire);
        break;
      case 2:
        h.uncompressed_page_size = r.i32(wire);
        break;
      case 3:
        h.compressed_page_size = r.i32(wire);
        break;
      case 5:
        r.expect_struct(wire);
        h.has_data_v1 = true;
        r.fields([&](int32_t f, int w) {
          switch (f) {
            case 1:
              h.num_values = r.i32(w);
              break;
            case 2:
              h.encoding = r.i32(w);
              break;
            case 3:
              h.definition_level_encoding = r.i32(w);
              break;
            case 4:
              h.repetition_level_encoding = r.i32(w);
              break;
            default:
              r.skip(w);
          }
        });
        break;
      case 7:
        r.expect_struct(wire);
        h.has_dictionary = true;
        r.fields([&](int32_t f, int w) {
          switch (f) {
            case 1:
              h.num_values = r.i32(w);
              break;
            case 2:
              h.encoding = r.i32(w);
              break;
            default:
              r.skip(w);
          }
        });
        break;
      case 8:
        r.expect_struct(wire);
        h.has_data_v2 = true;
        r.fields([&](int32_t f, int w) {
          switch (f) {
            case 1:
              h.num_values = r.i32(w);
              break;
            case 2:
              h.num_nulls = r.i32(w);
              break;
            case 3:
              h.num_rows = r.i32(w);
              break;
            case 4:
              h.encoding = r.i32(w);
              break;
            case 5:
              h.definition_levels_byte_length = r.i32(w);
              break;
            case 6:
              h.repetition_levels_byte_length = r.i32(w);
              break;
            case 7:
              h.is_compressed = r.boolean(w);
              break;
            default:
              r.skip(w);
          }
        });
        break;
      default:
        r.skip(wire);
    }
  });
  *consumed = r.pos();
  return h;
}

}  // namespace verl::data::parquet
