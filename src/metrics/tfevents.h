// TensorBoard event files written and read without TensorFlow: TFRecord framing with masked
// CRC32C, and the few fields of the Event / Summary protobufs that scalar logging needs, encoded
// by hand. The reader exists so tests can check what the writer wrote (CRCs included).
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace verl::metrics {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord uses. `crc` continues a
// previous value, so crc32c(ab) == crc32c(b, crc32c(a)).
uint32_t crc32c(std::span<const uint8_t> data, uint32_t crc = 0);
uint32_t crc32c(std::string_view data, uint32_t crc = 0);
// TFRecord's masking: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t mask_crc32c(uint32_t crc);

// Protobuf encodings of the Events we write (field numbers from tensorflow/core/util/event.proto
// and summary.proto: Event.wall_time=1 double, step=2 int64, file_version=3, summary=5;
// Summary.value=1; Summary.Value.tag=1, simple_value=2 float).
std::string encode_file_version_event(double wall_time, std::string_view version = "brain.Event:2");
std::string encode_scalar_event(double wall_time, int64_t step, std::string_view tag, float value);
// One TFRecord: uint64 length, masked crc32c(length), data, masked crc32c(data), little-endian.
std::string frame_record(std::string_view data);

// Appends TensorBoard scalar events to `events.out.tfevents.<unix_ts>.<hostname>` in a directory.
class TfEventsWriter {
 public:
  // Creates `dir` if needed and a new event file in it, starting with the file_version event.
  // `file_name` (tests) replaces the generated name and opens that file as it is.
  explicit TfEventsWriter(const std::string& dir, const std::string& file_name = "");
  ~TfEventsWriter();
  TfEventsWriter(const TfEventsWriter&) = delete;
  TfEventsWriter& operator=(const TfEventsWriter&) = delete;

  // Each is an Error naming the file when the write fails (a full disk): nothing is dropped
  // silently.
  void add_scalar(int64_t step, std::string_view tag, float value, double wall_time);
  void flush();
  void close();
  const std::string& path() const { return path_; }

 private:
  void write_record(std::string_view data);
  std::string path_;
  std::FILE* file_ = nullptr;
};

struct ScalarEvent {
  int64_t step = 0;
  std::string tag;
  float value = 0.0f;
  double wall_time = 0.0;
};

struct TfEvents {
  std::string file_version;          // from the first event that carries one
  std::vector<ScalarEvent> scalars;  // in file order
  size_t num_records = 0;
};

// Parses an event file, verifying both CRCs of every record; throws verl::Error naming the file
// and the byte offset of a truncated or corrupted record. Non-scalar summary values are skipped.
TfEvents read_tfevents(const std::string& path);
// The event files (names containing "tfevents") directly inside `dir`, sorted by name.
std::vector<std::string> list_tfevents(const std::string& dir);

}  // namespace verl::metrics
