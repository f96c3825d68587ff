// Pages of a parquet column chunk: decompression (snappy, gzip, zstd), the RLE/bit-packed hybrid
// levels, PLAIN and dictionary values (parquet-format Encodings.md), data pages v1 and v2.
// Every size read from the file is checked against the bytes that hold it.
#include <snappy.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "data/parquet_format.h"

namespace verl::data::parquet {
namespace {

using OJ = nlohmann::ordered_json;

// One page may hold at most this many value slots: real writers cut pages near 1 MiB or 20k
// rows; the cap keeps a forged count from allocating gigabytes before the levels run out.
constexpr int64_t kMaxPageValues = int64_t{1} << 24;
constexpr int64_t kMaxPageBytes = int64_t{1} << 30;

uint32_t load_u32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
uint64_t load_u64(const uint8_t* p) {
  return uint64_t{load_u32(p)} | uint64_t{load_u32(p + 4)} << 32;
}

std::vector<uint8_t> decompress(int32_t codec, const uint8_t* src, size_t n, size_t expected,
                                const std::string& where) {
  std::vector<uint8_t> out;
  switch (codec) {
    case UNCOMPRESSED:
      VERL_CHECK(n == expected, "{}: uncompressed page holds {} bytes but its header says {}",
                 where, n, expected);
      return std::vector<uint8_t>(src, src + n);
    case SNAPPY: {
      size_t len = 0;
      VERL_CHECK(
          snappy::GetUncompressedLength(reinterpret_cast<const char*>(src), n, &len) &&
              len == expected,
          "{}: snappy page is corrupt or does not decompress to the {} bytes its header says",
          where, expected);
      out.resize(expected);
      VERL_CHECK(snappy::RawUncompress(reinterpret_cast<const char*>(src), n,
                                       reinterpret_cast<char*>(out.data())),
                 "{}: snappy decompression failed (corrupt page)", where);
      return out;
    }
    case ZSTD: {
      const unsigned long long len = ZSTD_getFrameContentSize(src, n);
      VERL_CHECK(len != ZSTD_CONTENTSIZE_ERROR, "{}: zstd page is not a zstd frame", where);
      VERL_CHECK(len == ZSTD_CONTENTSIZE_UNKNOWN || len == expected,
                 "{}: zstd page decompresses to {} bytes but its header says {}", where, len,
                 expected);
      out.resize(expected);
      const size_t got = ZSTD_decompress(out.data(), out.size(), src, n);
      VERL_CHECK(!ZSTD_isError(got), "{}: zstd decompression failed: {}", where,
                 ZSTD_getErrorName(got));
      VERL_CHECK(got == expected, "{}: zstd page decompressed to {} bytes, its header says {}",
                 where, got, expected);
      return out;
    }
    case GZIP: {
      // Deflate expands at most ~1032x; a larger claim is a forged header, not a page.
      VERL_CHECK(expected <= n * 1032 + 1024,
                 "{}: gzip page of {} bytes cannot decompress to {} bytes", where, n, expected);
      out.resize(expected);
      z_stream zs{};
      VERL_CHECK(inflateInit2(&zs, 16 + MAX_WBITS) == Z_OK, "{}: zlib inflateInit2 failed", where);
      zs.next_in = const_cast<Bytef*>(src);
      zs.avail_in = static_cast<uInt>(n);
      zs.next_out = out.data();
      zs.avail_out = static_cast<uInt>(out.size());
      const int rc = inflate(&zs, Z_FINISH);
      const size_t got = zs.total_out;
      inflateEnd(&zs);
      VERL_CHECK(rc == Z_STREAM_END, "{}: gzip decompression failed ({}; zlib code {})", where,
                 zs.msg != nullptr ? zs.msg : "truncated or corrupt stream", rc);
      VERL_CHECK(got == expected, "{}: gzip page decompressed to {} bytes, its header says {}",
                 where, got, expected);
      return out;
    }
  }
  VERL_FAIL(
      "{}: compression codec {} ({}) is not supported (supported: UNCOMPRESSED, SNAPPY, GZIP, "
      "ZSTD)",
      where, codec_name(codec), codec);
}

int bit_width_of(uint64_t max_value) {
  int w = 0;
  while (max_value > 0) {
    ++w;
    max_value >>= 1;
  }
  return w;
}

// The RLE / bit-packed hybrid (Encodings.md): runs of `header = varint`; header & 1 = 1 is
// (header >> 1) groups of 8 bit-packed values (LSB first), else a run of (header >> 1) copies of
// one value stored in ceil(bit_width / 8) little-endian bytes. Appends `count` values to out.
template <typename T>
void decode_hybrid(const uint8_t* p, size_t n, int bit_width, size_t count, std::vector<T>& out,
                   const std::string& where, const char* what) {
  VERL_CHECK(bit_width >= 0 && bit_width <= 32, "{}: {} bit width {} is out of range", where, what,
             bit_width);
  const size_t target = out.size() + count;
  size_t pos = 0;
  while (out.size() < target) {
    VERL_CHECK(pos < n, "{}: {} end after {} of {} values", where, what,
               count - (target - out.size()), count);
    uint64_t header = 0;
    for (int shift = 0;; shift += 7) {
      VERL_CHECK(pos < n && shift < 64, "{}: {}: truncated run header", where, what);
      const uint8_t b = p[pos++];
      header |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) break;
    }
    const size_t want = target - out.size();
    if (header & 1) {
      const uint64_t groups = header >> 1;
      // The last run may stop short of its declared groups; decode what its bytes hold.
      const uint64_t left = n - pos;
      const uint64_t bytes =
          bit_width == 0   ? 0
          : groups >= left ? left
                           : std::min<uint64_t>(groups * static_cast<uint64_t>(bit_width), left);
      const uint64_t values = bit_width == 0 ? (groups >= want ? want : groups * 8)
                                             : bytes * 8 / static_cast<uint64_t>(bit_width);
      const size_t take = static_cast<size_t>(std::min<uint64_t>(values, want));
      const uint8_t* data = p + pos;
      for (size_t i = 0; i < take; ++i) {
        uint64_t v = 0;
        const uint64_t bit0 = i * static_cast<uint64_t>(bit_width);
        for (int b = 0; b < bit_width; ++b) {
          const uint64_t bit = bit0 + static_cast<uint64_t>(b);
          v |= static_cast<uint64_t>((data[bit >> 3] >> (bit & 7)) & 1) << b;
        }
        out.push_back(static_cast<T>(v));
      }
      pos += static_cast<size_t>(bytes);
    } else {
      const uint64_t run = header >> 1;
      const int value_bytes = (bit_width + 7) / 8;
      VERL_CHECK(static_cast<size_t>(value_bytes) <= n - pos, "{}: {}: truncated RLE run", where,
                 what);
      uint64_t v = 0;
      for (int b = 0; b < value_bytes; ++b) v |= static_cast<uint64_t>(p[pos + b]) << (8 * b);
      pos += static_cast<size_t>(value_bytes);
      out.insert(out.end(), static_cast<size_t>(std::min<uint64_t>(run, want)), static_cast<T>(v));
    }
  }
}

// Levels of a data page; v1 prefixes them with a 4-byte length, v2 gives the length in the header.
size_t read_levels(const uint8_t* p, size_t n, bool length_prefixed, int max_level, size_t count,
                   std::vector<uint16_t>& out, const std::string& where, const char* what) {
  size_t len = n, start = 0;
  if (length_prefixed) {
    VERL_CHECK(n >= 4, "{}: {} length runs past the page", where, what);
    len = load_u32(p);
    start = 4;
    VERL_CHECK(len <= n - 4, "{}: {} of {} bytes run past the page ({} left)", where, what, len,
               n - 4);
  }
  const size_t before = out.size();
  decode_hybrid(p + start, len, bit_width_of(static_cast<uint64_t>(max_level)), count, out, where,
                what);
  for (size_t i = before; i < out.size(); ++i)
    VERL_CHECK(out[i] <= max_level, "{}: {} value {} exceeds the schema's maximum {}", where, what,
               out[i], max_level);
  return start + len;
}

bool valid_utf8(const uint8_t* s, size_t n) {
  size_t i = 0;
  while (i < n) {
    const uint8_t c = s[i];
    int len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else
      return false;
    if (n - i < static_cast<size_t>(len)) return false;
    for (int k = 1; k < len; ++k) {
      if ((s[i + k] & 0xc0) != 0x80) return false;
      cp = cp << 6 | (s[i + k] & 0x3f);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

// Big-endian two's complement (DECIMAL in byte arrays) as a double.
double be_signed(const uint8_t* p, size_t n) {
  double v = 0;
  for (size_t i = 0; i < n; ++i) v = v * 256 + p[i];
  if (n > 0 && (p[0] & 0x80)) v -= std::ldexp(1.0, static_cast<int>(8 * n));
  return v;
}

double half_to_double(uint16_t h) {
  const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  if (exp == 31) return mant ? NAN : sign * INFINITY;
  return sign * std::ldexp(1024 + mant, exp - 25);
}

OJ bytes_value(const uint8_t* p, size_t n, const LeafInfo& leaf, const std::string& where) {
  switch (leaf.kind) {
    case ValueKind::Decimal:
      return be_signed(p, n) / std::pow(10.0, leaf.scale);
    case ValueKind::Float16:
      return half_to_double(static_cast<uint16_t>(p[0] | p[1] << 8));
    case ValueKind::Uuid: {
      static const char* hex = "0123456789abcdef";
      std::string s;
      for (size_t i = 0; i < n; ++i) {
        if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
        s += hex[p[i] >> 4];
        s += hex[p[i] & 15];
      }
      return s;
    }
    default:
      break;
  }
  VERL_CHECK(valid_utf8(p, n), "{}: a {} value is not valid UTF-8 (binary columns are not read)",
             where, type_name(leaf.type));
  return std::string(reinterpret_cast<const char*>(p), n);
}

OJ int_value(int64_t v, const LeafInfo& leaf) {
  switch (leaf.kind) {
    case ValueKind::UInt:
      return leaf.type == INT32 ? OJ(static_cast<uint64_t>(static_cast<uint32_t>(v)))
                                : OJ(static_cast<uint64_t>(v));
    case ValueKind::Decimal:
      return static_cast<double>(v) / std::pow(10.0, leaf.scale);
    default:
      return v;
  }
}

// PLAIN values (Encodings.md): fixed-width little-endian numbers, booleans one bit each (LSB
// first), BYTE_ARRAY as a 4-byte length and the bytes, FIXED_LEN_BYTE_ARRAY as type_length bytes.
void decode_plain(const uint8_t* p, size_t n, size_t count, const LeafInfo& leaf,
                  std::vector<OJ>& out, const std::string& where) {
  auto need = [&](size_t width) {
    VERL_CHECK(count <= n / width,
               "{}: {} PLAIN values of {} bytes do not fit in the {} bytes of the page", where,
               count, width, n);
  };
  switch (leaf.type) {
    case BOOLEAN:
      VERL_CHECK(count <= n * 8, "{}: {} PLAIN booleans do not fit in {} bytes", where, count, n);
      for (size_t i = 0; i < count; ++i) out.emplace_back(((p[i >> 3] >> (i & 7)) & 1) != 0);
      return;
    case INT32:
      need(4);
      for (size_t i = 0; i < count; ++i)
        out.push_back(int_value(static_cast<int32_t>(load_u32(p + 4 * i)), leaf));
      return;
    case INT64:
      need(8);
      for (size_t i = 0; i < count; ++i)
        out.push_back(int_value(static_cast<int64_t>(load_u64(p + 8 * i)), leaf));
      return;
    case FLOAT:
      need(4);
      for (size_t i = 0; i < count; ++i) {
        float f;
        const uint32_t u = load_u32(p + 4 * i);
        std::memcpy(&f, &u, 4);
        out.emplace_back(static_cast<double>(f));
      }
      return;
    case DOUBLE:
      need(8);
      for (size_t i = 0; i < count; ++i) {
        double d;
        const uint64_t u = load_u64(p + 8 * i);
        std::memcpy(&d, &u, 8);
        out.emplace_back(d);
      }
      return;
    case BYTE_ARRAY: {
      need(4);  // at least the lengths
      size_t pos = 0;
      for (size_t i = 0; i < count; ++i) {
        VERL_CHECK(n - pos >= 4, "{}: BYTE_ARRAY value {} of {} runs past the page", where, i,
                   count);
        const uint32_t len = load_u32(p + pos);
        pos += 4;
        VERL_CHECK(len <= n - pos,
                   "{}: BYTE_ARRAY value {} of {} bytes runs past the page ({} left)", where, i,
                   len, n - pos);
        out.push_back(bytes_value(p + pos, len, leaf, where));
        pos += len;
      }
      return;
    }
    case FIXED_LEN_BYTE_ARRAY: {
      const size_t w = static_cast<size_t>(leaf.type_length);
      need(w);
      for (size_t i = 0; i < count; ++i) out.push_back(bytes_value(p + w * i, w, leaf, where));
      return;
    }
  }
  VERL_FAIL("{}: physical type {} is not supported", where, type_name(leaf.type));
}

// The values section of a data page: `count` non-null values.
void decode_values(const uint8_t* p, size_t n, int32_t encoding, size_t count,
                   const std::vector<OJ>* dict, const LeafInfo& leaf, std::vector<OJ>& out,
                   const std::string& where) {
  switch (encoding) {
    case PLAIN:
      decode_plain(p, n, count, leaf, out, where);
      return;
    case PLAIN_DICTIONARY:
    case RLE_DICTIONARY: {
      VERL_CHECK(dict != nullptr, "{}: a {} page without a dictionary page before it", where,
                 encoding_name(encoding));
      if (count == 0) return;
      VERL_CHECK(n >= 1, "{}: dictionary-encoded page has no bit width byte", where);
      std::vector<uint32_t> idx;
      idx.reserve(count);
      decode_hybrid(p + 1, n - 1, p[0], count, idx, where, "dictionary indices");
      for (uint32_t i : idx) {
        VERL_CHECK(i < dict->size(),
                   "{}: dictionary index {} is out of range (the dictionary has {} values)", where,
                   i, dict->size());
        out.push_back((*dict)[i]);
      }
      return;
    }
    case RLE: {
      VERL_CHECK(leaf.type == BOOLEAN, "{}: RLE values are only defined for BOOLEAN, not {}", where,
                 type_name(leaf.type));
      VERL_CHECK(n >= 4, "{}: RLE boolean page has no length", where);
      const uint32_t len = load_u32(p);
      VERL_CHECK(len <= n - 4, "{}: RLE booleans of {} bytes run past the page", where, len);
      std::vector<uint8_t> bits;
      bits.reserve(count);
      decode_hybrid(p + 4, len, 1, count, bits, where, "RLE booleans");
      for (uint8_t b : bits) out.emplace_back(b != 0);
      return;
    }
  }
  VERL_FAIL(
      "{}: encoding {} ({}) is not supported (supported: PLAIN, PLAIN_DICTIONARY, RLE_DICTIONARY, "
      "RLE for "
      "booleans); rewrite the file with pyarrow defaults, e.g. pq.write_table(pq.read_table(p), q)",
      where, encoding_name(encoding), encoding);
}

}  // namespace

ColumnValues read_column_chunk(const uint8_t* data, size_t size, const ColumnMeta& meta,
                               const LeafInfo& leaf, const std::string& where) {
  ColumnValues cv;
  std::vector<OJ> dict;
  bool has_dict = false, seen_data = false;
  const int64_t expected_values = meta.num_values;
  VERL_CHECK(expected_values >= 0, "{}: negative num_values {}", where, expected_values);
  size_t pos = 0;
  int page_no = 0;
  while (pos < size && static_cast<int64_t>(cv.def.size()) < expected_values) {
    const std::string at = fmt::format("{}, page {} (byte {} of the chunk)", where, page_no++, pos);
    size_t header_len = 0;
    const PageHeader h = decode_page_header(data + pos, size - pos, &header_len, at);
    pos += header_len;
    VERL_CHECK(
        h.compressed_page_size >= 0 && static_cast<size_t>(h.compressed_page_size) <= size - pos,
        "{}: page of {} bytes runs past the column chunk ({} bytes left)", at,
        h.compressed_page_size, size - pos);
    VERL_CHECK(h.uncompressed_page_size >= 0 && h.uncompressed_page_size <= kMaxPageBytes,
               "{}: uncompressed page size {} is out of range", at, h.uncompressed_page_size);
    const uint8_t* page = data + pos;
    const size_t page_len = static_cast<size_t>(h.compressed_page_size);
    pos += page_len;

    if (h.type == DICTIONARY_PAGE) {
      VERL_CHECK(h.has_dictionary, "{}: dictionary page without a DictionaryPageHeader", at);
      VERL_CHECK(!has_dict && !seen_data, "{}: a second dictionary page, or one after data pages",
                 at);
      VERL_CHECK(h.encoding == PLAIN || h.encoding == PLAIN_DICTIONARY,
                 "{}: dictionary page encoding {} is not "
                 "supported",
                 at, encoding_name(h.encoding));
      VERL_CHECK(h.num_values >= 0, "{}: negative dictionary size", at);
      const std::vector<uint8_t> buf =
          decompress(meta.codec, page, page_len, static_cast<size_t>(h.uncompressed_page_size), at);
      decode_plain(buf.data(), buf.size(), static_cast<size_t>(h.num_values), leaf, dict, at);
      has_dict = true;
      continue;
    }
    if (h.type != DATA_PAGE && h.type != DATA_PAGE_V2) continue;  // index pages: nothing to read
    seen_data = true;
    VERL_CHECK(h.num_values >= 0 && h.num_values <= kMaxPageValues,
               "{}: page value count {} is out of range", at, h.num_values);
    const size_t count = static_cast<size_t>(h.num_values);
    const size_t first = cv.def.size();

    std::vector<uint8_t> buf;
    const uint8_t* values = nullptr;
    size_t values_len = 0;
    if (h.type == DATA_PAGE) {
      VERL_CHECK(h.has_data_v1, "{}: data page without a DataPageHeader", at);
      buf =
          decompress(meta.codec, page, page_len, static_cast<size_t>(h.uncompressed_page_size), at);
      size_t off = 0;
      if (leaf.max_rep > 0) {
        VERL_CHECK(h.repetition_level_encoding == RLE,
                   "{}: repetition level encoding {} is not supported", at,
                   encoding_name(h.repetition_level_encoding));
        off += read_levels(buf.data(), buf.size(), true, leaf.max_rep, count, cv.rep, at,
                           "repetition levels");
      }
      if (leaf.max_def > 0) {
        VERL_CHECK(h.definition_level_encoding == RLE,
                   "{}: definition level encoding {} is not supported", at,
                   encoding_name(h.definition_level_encoding));
        off += read_levels(buf.data() + off, buf.size() - off, true, leaf.max_def, count, cv.def,
                           at, "definition levels");
      }
      values = buf.data() + off;
      values_len = buf.size() - off;
    } else {
      VERL_CHECK(h.has_data_v2, "{}: data page v2 without a DataPageHeaderV2", at);
      const int64_t rl = h.repetition_levels_byte_length, dl = h.definition_levels_byte_length;
      VERL_CHECK(rl >= 0 && dl >= 0 && rl + dl <= static_cast<int64_t>(page_len) &&
                     rl + dl <= h.uncompressed_page_size,
                 "{}: level lengths {} + {} do not fit in the page of {} bytes", at, rl, dl,
                 page_len);
      if (leaf.max_rep > 0)
        read_levels(page, static_cast<size_t>(rl), false, leaf.max_rep, count, cv.rep, at,
                    "repetition levels");
      if (leaf.max_def > 0)
        read_levels(page + rl, static_cast<size_t>(dl), false, leaf.max_def, count, cv.def, at,
                    "definition levels");
      const uint8_t* body = page + rl + dl;
      const size_t body_len = page_len - static_cast<size_t>(rl + dl);
      const size_t body_expected = static_cast<size_t>(h.uncompressed_page_size - rl - dl);
      if (h.is_compressed && meta.codec != UNCOMPRESSED) {
        buf = decompress(meta.codec, body, body_len, body_expected, at);
        values = buf.data();
        values_len = buf.size();
      } else {
        VERL_CHECK(body_len == body_expected,
                   "{}: uncompressed page holds {} bytes but its header says {}", at, body_len,
                   body_expected);
        values = body;
        values_len = body_len;
      }
    }
    // Required columns carry no levels: every slot is a value (and, without repetition, a row).
    if (leaf.max_rep == 0) cv.rep.resize(first + count, 0);
    if (leaf.max_def == 0) cv.def.resize(first + count, 0);
    size_t non_null = 0;
    for (size_t i = first; i < cv.def.size(); ++i) non_null += cv.def[i] == leaf.max_def;
    decode_values(values, values_len, h.encoding, non_null, has_dict ? &dict : nullptr, leaf,
                  cv.values, at);
  }
  VERL_CHECK(static_cast<int64_t>(cv.def.size()) == expected_values,
             "{}: the column chunk holds {} values but its metadata says {} (truncated chunk?)",
             where, cv.def.size(), expected_values);
  return cv;
}

}  // namespace verl::data::parquet
