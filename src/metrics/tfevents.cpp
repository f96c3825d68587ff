// TFRecord + protobuf encoding and decoding for TensorBoard scalar event files.
// Wire format reminders: a field key is (field_number << 3) | wire_type, with wire types
// 0 = varint, 1 = fixed64, 2 = length-delimited, 5 = fixed32; all fixed-width values little-endian.
#include "metrics/tfevents.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace verl::metrics {

static_assert(std::endian::native == std::endian::little, "tfevents: little-endian host assumed");

namespace {

constexpr uint32_t kCrc32cPoly = 0x82F63B78u;  // Castagnoli polynomial, bit-reversed

constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ kCrc32cPoly : (c >> 1);
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLen = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t field, WireType wt) {
  put_varint(out, (field << 3) | wt);
}

template <typename T>
void put_fixed(std::string& out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out.append(buf, sizeof(T));
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLen);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// A bounded cursor over protobuf bytes; every read checks the bounds and throws with context.
struct Cursor {
  std::string_view buf;
  size_t pos = 0;
  const std::string* path;
  size_t record_offset;

  bool done() const { return pos >= buf.size(); }

  [[noreturn]] void fail(std::string_view what) const {
    VERL_FAIL("{}: malformed event at byte {} (record at offset {}): {}", *path, pos, record_offset,
              what);
  }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= buf.size()) fail("truncated varint");
      const uint8_t b = static_cast<uint8_t>(buf[pos++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return v;
    }
    fail("varint longer than 10 bytes");
  }

  template <typename T>
  T fixed() {
    if (buf.size() - pos < sizeof(T)) fail("truncated fixed-width field");
    T v;
    std::memcpy(&v, buf.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }

  std::string_view bytes() {
    const uint64_t n = varint();
    if (n > buf.size() - pos) fail("length-delimited field runs past its message");
    std::string_view s = buf.substr(pos, n);
    pos += n;
    return s;
  }

  void skip(uint32_t wt) {
    switch (wt) {
      case kVarint:
        varint();
        break;
      case kFixed64:
        fixed<uint64_t>();
        break;
      case kLen:
        bytes();
        break;
      case kFixed32:
        fixed<uint32_t>();
        break;
      default:
        fail(fmt::format("unsupported wire type {}", wt));
    }
  }

  Cursor sub(std::string_view bytes_) const { return Cursor{bytes_, 0, path, record_offset}; }
};

// Summary.Value { tag = 1; simple_value = 2 }. Returns false when it holds no simple_value.
bool parse_value(Cursor c, std::string& tag, float& value) {
  bool has_value = false;
  while (!c.done()) {
    const uint64_t key = c.varint();
    const uint32_t field = static_cast<uint32_t>(key >> 3), wt = static_cast<uint32_t>(key & 7);
    if (field == 1 && wt == kLen) {
      tag = std::string(c.bytes());
    } else if (field == 2 && wt == kFixed32) {
      value = c.fixed<float>();
      has_value = true;
    } else {
      c.skip(wt);
    }
  }
  return has_value;
}

void parse_event(Cursor c, TfEvents& out) {
  double wall_time = 0.0;
  int64_t step = 0;
  std::vector<std::string_view> summaries;
  while (!c.done()) {
    const uint64_t key = c.varint();
    const uint32_t field = static_cast<uint32_t>(key >> 3), wt = static_cast<uint32_t>(key & 7);
    if (field == 1 && wt == kFixed64) {
      wall_time = c.fixed<double>();
    } else if (field == 2 && wt == kVarint) {
      step = static_cast<int64_t>(c.varint());
    } else if (field == 3 && wt == kLen) {
      const auto v = c.bytes();
      if (out.file_version.empty()) out.file_version = std::string(v);
    } else if (field == 5 && wt == kLen) {
      summaries.push_back(c.bytes());
    } else {
      c.skip(wt);
    }
  }
  // Fields may come in any order, so the summaries are read once step and wall_time are known.
  for (std::string_view s : summaries) {
    Cursor sc = c.sub(s);
    while (!sc.done()) {
      const uint64_t key = sc.varint();
      const uint32_t field = static_cast<uint32_t>(key >> 3), wt = static_cast<uint32_t>(key & 7);
      if (field == 1 && wt == kLen) {
        ScalarEvent ev;
        ev.step = step;
        ev.wall_time = wall_time;
        if (parse_value(sc.sub(sc.bytes()), ev.tag, ev.value)) out.scalars.push_back(std::move(ev));
      } else {
        sc.skip(wt);
      }
    }
  }
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

uint32_t crc32c(std::span<const uint8_t> data, uint32_t crc) {
  uint32_t c = ~crc;
  for (uint8_t b : data) c = kCrcTable[(c ^ b) & 0xFFu] ^ (c >> 8);
  return ~c;
}

uint32_t crc32c(std::string_view data, uint32_t crc) {
  return crc32c(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(data.data()), data.size()), crc);
}

uint32_t mask_crc32c(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string encode_file_version_event(double wall_time, std::string_view version) {
  std::string ev;
  put_key(ev, 1, kFixed64);
  put_fixed(ev, wall_time);
  put_bytes(ev, 3, version);
  return ev;
}

std::string encode_scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string val;  // Summary.Value
  put_bytes(val, 1, tag);
  put_key(val, 2, kFixed32);
  put_fixed(val, value);
  std::string summary;  // Summary
  put_bytes(summary, 1, val);
  std::string ev;  // Event
  put_key(ev, 1, kFixed64);
  put_fixed(ev, wall_time);
  put_key(ev, 2, kVarint);
  put_varint(ev, static_cast<uint64_t>(step));  // int64: negative steps take ten bytes
  put_bytes(ev, 5, summary);
  return ev;
}

std::string frame_record(std::string_view data) {
  std::string rec;
  rec.reserve(data.size() + 16);
  const uint64_t len = data.size();
  std::string len_bytes;
  put_fixed(len_bytes, len);
  rec += len_bytes;
  put_fixed(rec, mask_crc32c(crc32c(len_bytes)));
  rec.append(data);
  put_fixed(rec, mask_crc32c(crc32c(data)));
  return rec;
}

TfEventsWriter::TfEventsWriter(const std::string& dir, const std::string& file_name) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  VERL_CHECK(!ec, "tensorboard: cannot create log directory '{}': {}", dir, ec.message());
  const auto ts = static_cast<long long>(std::time(nullptr));
  const std::string base = fmt::format("{}/events.out.tfevents.{}.{}", dir, ts, host_name());
  // Two writers in one second on one host (a quick restart) must not clobber each other.
  path_ = base;
  for (int i = 1; fs::exists(path_); ++i) path_ = fmt::format("{}.{}", base, i);
  if (!file_name.empty()) path_ = (fs::path(dir) / file_name).string();
  file_ = std::fopen(path_.c_str(), "wb");
  VERL_CHECK(file_ != nullptr, "tensorboard: cannot open event file '{}' for writing", path_);
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  try {
    write_record(encode_file_version_event(now));
    flush();
  } catch (...) {
    std::fclose(file_);  // the destructor does not run for a constructor that throws
    file_ = nullptr;
    throw;
  }
}

TfEventsWriter::~TfEventsWriter() {
  try {
    close();
  } catch (...) {
    // Destructors must not throw; close() explicitly to see errors.
  }
}

void TfEventsWriter::write_record(std::string_view data) {
  VERL_CHECK(file_ != nullptr, "tensorboard: event file '{}' is closed", path_);
  const std::string rec = frame_record(data);
  VERL_CHECK(std::fwrite(rec.data(), 1, rec.size(), file_) == rec.size(),
             "tensorboard: write to '{}' failed: {}", path_, std::strerror(errno));
}

void TfEventsWriter::add_scalar(int64_t step, std::string_view tag, float value, double wall_time) {
  write_record(encode_scalar_event(wall_time, step, tag, value));
}

void TfEventsWriter::flush() {
  VERL_CHECK(file_ == nullptr || std::fflush(file_) == 0, "tensorboard: write to '{}' failed: {}",
             path_, std::strerror(errno));
}

void TfEventsWriter::close() {
  if (file_ == nullptr) return;
  std::FILE* f = file_;
  file_ = nullptr;
  VERL_CHECK(std::fclose(f) == 0, "tensorboard: write to '{}' failed: {}", path_,
             std::strerror(errno));
}

TfEvents read_tfevents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  VERL_CHECK(in.good(), "tensorboard: cannot open event file '{}'", path);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string_view all(bytes);
  TfEvents out;
  size_t pos = 0;
  while (pos < all.size()) {
    const size_t rec_off = pos;
    VERL_CHECK(all.size() - pos >= 12, "{}: truncated record header at offset {}", path, rec_off);
    uint64_t len;
    uint32_t len_crc;
    std::memcpy(&len, all.data() + pos, 8);
    std::memcpy(&len_crc, all.data() + pos + 8, 4);
    VERL_CHECK(mask_crc32c(crc32c(all.substr(pos, 8))) == len_crc,
               "{}: length CRC mismatch in record at offset {} (file corrupted)", path, rec_off);
    pos += 12;
    VERL_CHECK(len <= all.size() - pos && all.size() - pos - len >= 4,
               "{}: truncated record at offset {} (length {}, {} bytes left)", path, rec_off, len,
               all.size() - pos);
    const std::string_view data = all.substr(pos, len);
    uint32_t data_crc;
    std::memcpy(&data_crc, all.data() + pos + len, 4);
    VERL_CHECK(mask_crc32c(crc32c(data)) == data_crc,
               "{}: data CRC mismatch in record at offset {} (file corrupted)", path, rec_off);
    pos += len + 4;
    parse_event(Cursor{data, 0, &path, rec_off}, out);
    ++out.num_records;
  }
  return out;
}

std::vector<std::string> list_tfevents(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.is_regular_file() && e.path().filename().string().find("tfevents") != std::string::npos) {
      out.push_back(e.path().string());
    }
  }
  VERL_CHECK(!ec, "tensorboard: cannot list '{}': {}", dir, ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace verl::metrics
