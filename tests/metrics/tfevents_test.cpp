// Tests of the hand-written TensorBoard event files: CRC32C against published vectors, the exact
// protobuf bytes of a scalar event, write -> read round trips, and corruption detection.
#include "metrics/tfevents.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "../common/test_util.h"
#include "core/error.h"
#include "metrics/logger.h"

using namespace verl::metrics;
namespace fs = std::filesystem;

namespace {

// A fresh directory (one per name) in this process's scratch directory, removed at exit.
fs::path fresh_dir(const std::string& name) {
  static const verl::test::TempDir scratch("met");
  const fs::path d = scratch / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void spit(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

}  // namespace

TEST(Crc32c, KnownVectors) {
  // RFC 3720 (iSCSI) appendix B.4 vectors and the common check value.
  EXPECT_EQ(crc32c(std::string_view("123456789")), 0xE3069283u);
  EXPECT_EQ(crc32c(std::string_view("")), 0u);
  std::string zeros(32, '\0'), ones(32, '\xff'), inc(32, 0), dec(32, 0);
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<char>(i);
    dec[i] = static_cast<char>(31 - i);
  }
  EXPECT_EQ(crc32c(zeros), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones), 0x62A8AB43u);
  EXPECT_EQ(crc32c(inc), 0x46DD794Eu);
  EXPECT_EQ(crc32c(dec), 0x113FDB5Cu);
}

TEST(Crc32c, ExtendsAndMasks) {
  EXPECT_EQ(crc32c(std::string_view("6789"), crc32c(std::string_view("12345"))), 0xE3069283u);
  EXPECT_EQ(mask_crc32c(0), 0xa282ead8u);
  // rotate right by 15, then add the constant (mod 2^32)
  EXPECT_EQ(mask_crc32c(0x00008000u), 0x1u + 0xa282ead8u);
  EXPECT_EQ(mask_crc32c(0x00000001u), 0x00020000u + 0xa282ead8u);
}

TEST(TfEvents, ScalarEventBytes) {
  // Event{wall_time=0 (field 1, fixed64), step=1 (field 2, varint),
  //       summary (field 5) = Summary{value (field 1) = Value{tag "a" (1), simple_value 1.0f (2)}}}
  const std::string got = encode_scalar_event(0.0, 1, "a", 1.0f);
  const std::string want = std::string("\x09", 1) + std::string(8, '\0') +
                           std::string("\x10\x01", 2) + std::string("\x2a\x0a", 2) +
                           std::string("\x0a\x08", 2) +
                           std::string(
                               "\x0a\x01"
                               "a",
                               3) +
                           std::string("\x15\x00\x00\x80\x3f", 5);
  EXPECT_EQ(got, want);
}

TEST(TfEvents, RecordFraming) {
  const std::string rec = frame_record("hello");
  ASSERT_EQ(rec.size(), 8u + 4u + 5u + 4u);
  uint64_t len;
  uint32_t data_crc;
  std::memcpy(&len, rec.data(), 8);
  std::memcpy(&data_crc, rec.data() + 17, 4);
  EXPECT_EQ(len, 5u);
  EXPECT_EQ(rec.substr(12, 5), "hello");
  EXPECT_EQ(data_crc, mask_crc32c(crc32c(std::string_view("hello"))));
}

TEST(TfEvents, WriteThenReadBack) {
  const fs::path dir = fresh_dir("tb_roundtrip");
  std::string path;
  {
    TfEventsWriter w(dir.string());
    path = w.path();
    w.add_scalar(1, "critic/score/mean", 0.25f, 1000.5);
    w.add_scalar(1, "timing_s/gen", 3.75f, 1000.5);
    w.add_scalar(2, "critic/score/mean", -1.5f, 1001.0);
    w.add_scalar(-3, "odd/negative_step", 7.0f, 1002.0);
    w.add_scalar(300000000000LL, "big/step", 1e-7f, 1003.0);
  }
  EXPECT_NE(fs::path(path).filename().string().find("events.out.tfevents."), std::string::npos);
  const TfEvents ev = read_tfevents(path);
  EXPECT_EQ(ev.file_version, "brain.Event:2");
  EXPECT_EQ(ev.num_records, 6u);
  ASSERT_EQ(ev.scalars.size(), 5u);
  EXPECT_EQ(ev.scalars[0].step, 1);
  EXPECT_EQ(ev.scalars[0].tag, "critic/score/mean");
  EXPECT_EQ(ev.scalars[0].value, 0.25f);
  EXPECT_DOUBLE_EQ(ev.scalars[0].wall_time, 1000.5);
  EXPECT_EQ(ev.scalars[1].tag, "timing_s/gen");
  EXPECT_EQ(ev.scalars[1].value, 3.75f);
  EXPECT_EQ(ev.scalars[2].step, 2);
  EXPECT_EQ(ev.scalars[2].value, -1.5f);
  EXPECT_EQ(ev.scalars[3].step, -3);
  EXPECT_EQ(ev.scalars[4].step, 300000000000LL);
  EXPECT_EQ(ev.scalars[4].value, 1e-7f);
  fs::remove_all(dir);
}

TEST(TfEvents, CorruptedByteIsDetected) {
  const fs::path dir = fresh_dir("tb_corrupt");
  std::string path;
  {
    TfEventsWriter w(dir.string());
    path = w.path();
    w.add_scalar(5, "actor/pg_loss", 0.125f, 42.0);
  }
  const std::string good = slurp(path);
  ASSERT_NO_THROW(read_tfevents(path));

  // Flip one bit of the last record's payload: its data CRC no longer matches.
  std::string bad = good;
  bad[bad.size() - 6] ^= 0x01;
  spit(path, bad);
  try {
    read_tfevents(path);
    FAIL() << "corruption not detected";
  } catch (const verl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("CRC"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  // A damaged length field is caught by the length CRC.
  bad = good;
  bad[0] ^= 0x40;
  spit(path, bad);
  EXPECT_THROW(read_tfevents(path), verl::Error);
  // A file cut mid-record (killed writer) is reported as truncated.
  spit(path, good.substr(0, good.size() - 3));
  try {
    read_tfevents(path);
    FAIL() << "truncation not detected";
  } catch (const verl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// A full disk: the event file's first record (written and flushed when it is opened) fails with an
// error naming the file, and so does every later flush.
TEST(TfEvents, FullDiskIsAnErrorNamingTheFile) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const fs::path dir = fresh_dir("tb_full");
  fs::create_symlink("/dev/full", dir / "events.out.tfevents.full");
  try {
    TfEventsWriter w(dir.string(), "events.out.tfevents.full");
    FAIL() << "opening an event file on a full disk did not fail";
  } catch (const verl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensorboard: write to '" +
                                         (dir / "events.out.tfevents.full").string() + "' failed"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

TEST(TfEvents, TwoWritersInOneSecondGetTwoFiles) {
  const fs::path dir = fresh_dir("tb_two");
  TfEventsWriter a(dir.string());
  TfEventsWriter b(dir.string());
  EXPECT_NE(a.path(), b.path());
  EXPECT_EQ(list_tfevents(dir.string()).size(), 2u);
  fs::remove_all(dir);
}

TEST(TensorBoardLogger, LogsEveryMetricWithItsStep) {
  const fs::path dir = fresh_dir("tb_logger");
  std::string path;
  {
    TensorBoardLogger tb(dir.string());
    path = tb.path();
    for (int step = 1; step <= 3; ++step) {
      Metrics m;
      m.set("critic/score/mean", 0.1 * step);
      m.set("perf/throughput", 1000.0 + step);
      tb.log(step, m);
    }
  }
  const TfEvents ev = read_tfevents(path);
  ASSERT_EQ(ev.scalars.size(), 6u);
  for (int step = 1; step <= 3; ++step) {
    const auto& s = ev.scalars[2 * (step - 1)];
    const auto& p = ev.scalars[2 * (step - 1) + 1];
    EXPECT_EQ(s.step, step);
    EXPECT_EQ(s.tag, "critic/score/mean");
    EXPECT_FLOAT_EQ(s.value, static_cast<float>(0.1 * step));
    EXPECT_EQ(p.tag, "perf/throughput");
    EXPECT_FLOAT_EQ(p.value, static_cast<float>(1000.0 + step));
  }
  fs::remove_all(dir);
}

// Writes a known series for tools/check_tensorboard.py --expect-sample (TensorBoard's own reader)
// into $VERL_METRICS_SAMPLE_DIR when set (kept), else into a temporary directory (removed); in
// both cases the file is read back here too.
TEST(TensorBoardLogger, SampleForExternalCheck) {
  const char* env = std::getenv("VERL_METRICS_SAMPLE_DIR");
  const bool keep = env != nullptr && env[0] != '\0';
  const fs::path dir = keep ? fs::path(env) : fresh_dir("tb_sample");
  fs::create_directories(dir);
  std::string path;
  {
    TensorBoardLogger tb(dir.string());
    path = tb.path();
    for (int s = 1; s <= 5; ++s) {
      Metrics m;
      m.set("critic/score/mean", 0.1 * s);
      m.set("timing_s/gen", 1.5 + s);
      m.set("perf/throughput", 1000.0 * s);
      tb.log(s, m);
    }
  }
  const TfEvents ev = read_tfevents(path);
  ASSERT_EQ(ev.scalars.size(), 15u);
  EXPECT_EQ(ev.scalars.back().step, 5);
  EXPECT_EQ(ev.scalars.back().tag, "timing_s/gen");
  EXPECT_FLOAT_EQ(ev.scalars.back().value, 6.5f);
  if (!keep) fs::remove_all(dir);
}

TEST(TfEvents, EverySingleByteFlipIsDetected) {
  // Each byte of a record is covered by one of its two CRCs (or is a CRC), so any flip must be
  // reported as an error, never parsed into wrong values or crash the reader.
  const fs::path dir = fresh_dir("tb_flip");
  std::string path;
  {
    TfEventsWriter w(dir.string());
    path = w.path();
    w.add_scalar(7, "critic/vf_loss", 0.5f, 10.0);
  }
  const std::string good = slurp(path);
  for (size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] ^= 0x10;
    spit(path, bad);
    EXPECT_THROW(read_tfevents(path), verl::Error) << "flip at byte " << i;
  }
  fs::remove_all(dir);
}
