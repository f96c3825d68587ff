// safetensors IO: write -> read round trips (single file and sharded directory), and one test per
// malformation the parser must reject, each checking that the error names the file and tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../common/test_util.h"
#include "core/error.h"
#include "model/safetensors.h"

namespace verl::model {
namespace {

namespace fs = std::filesystem;

// An image: 8-byte length, header text, then `data_bytes` bytes of data (value = index).
std::vector<uint8_t> make_image(const std::string& header, size_t data_bytes,
                                uint64_t header_len = UINT64_MAX) {
  uint64_t n = header_len == UINT64_MAX ? header.size() : header_len;
  std::vector<uint8_t> img(8);
  for (int i = 0; i < 8; ++i) img[i] = static_cast<uint8_t>(n >> (8 * i));
  img.insert(img.end(), header.begin(), header.end());
  for (size_t i = 0; i < data_bytes; ++i) img.push_back(static_cast<uint8_t>(i));
  return img;
}

void write_bytes(const fs::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

std::string parse_error(const std::string& header, size_t data_bytes,
                        uint64_t header_len = UINT64_MAX) {
  auto img = make_image(header, data_bytes, header_len);
  return test::expected_error_of(
      [&] { SafetensorsFile::from_memory(img.data(), img.size(), "bad.safetensors"); });
}

TEST(Safetensors, RoundTripF32Bf16F16) {
  const test::TempDir tmp("model_io");
  std::vector<float> a = {1.5f, -2.25f, 3.0e-8f, 1e30f, -0.0f, 7.0f};
  // bf16 ties round to even: 1+2^-8 -> 1.0, 1+3*2^-8 -> 1+2^-6; pi -> 3.140625.
  std::vector<float> b = {1.00390625f, 1.01171875f, 3.14159265f, -65504.0f, 0.0f};
  // f16: 0.1 -> 0.0999755859375; 1e-7 is subnormal and rounds to 2 * 2^-24.
  std::vector<float> c = {0.1f, 65504.0f, -2.5f, 1e-7f};
  std::vector<TensorToWrite> ts = {{"layer.a", DType::F32, {2, 3}, a.data()},
                                   {"layer.b", DType::BF16, {5}, b.data()},
                                   {"layer.c", DType::F16, {2, 2}, c.data()},
                                   {"empty", DType::BF16, {0, 4}, nullptr}};
  const std::string path = (tmp / "model.safetensors").string();
  write_safetensors(path, ts, {{"format", "pt"}, {"step", "12"}});
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  auto f = SafetensorsFile::open(path);
  ASSERT_EQ(f->tensors().size(), 4u);
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("step"), "12");
  const TensorInfo* ta = f->find("layer.a");
  const TensorInfo* tb = f->find("layer.b");
  const TensorInfo* tc = f->find("layer.c");
  const TensorInfo* te = f->find("empty");
  ASSERT_TRUE(ta && tb && tc && te);
  EXPECT_EQ(f->find("nope"), nullptr);
  EXPECT_EQ(ta->dtype, DType::F32);
  EXPECT_EQ(tb->dtype, DType::BF16);
  EXPECT_EQ(tc->dtype, DType::F16);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(te->shape, (std::vector<int64_t>{0, 4}));
  // Written in the given order, back to back.
  EXPECT_EQ(ta->begin, 0u);
  EXPECT_EQ(ta->end, 24u);
  EXPECT_EQ(tb->begin, 24u);
  EXPECT_EQ(tb->end, 34u);
  EXPECT_EQ(tc->begin, 34u);
  EXPECT_EQ(tc->end, 42u);
  EXPECT_EQ(te->begin, 42u);
  EXPECT_EQ(te->end, 42u);
  // Header padded so the data starts 8-byte aligned.
  EXPECT_EQ((fs::file_size(path) - 42) % 8, 0u);

  SafetensorsDir dir = SafetensorsDir::open(tmp.str());
  EXPECT_EQ(dir.names(), (std::vector<std::string>{"empty", "layer.a", "layer.b", "layer.c"}));
  std::vector<float> out(6);
  dir.read_f32("layer.a", {2, 3}, out.data());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(std::memcmp(&out[i], &a[i], 4), 0) << i;  // bit exact
  out.assign(5, 0.f);
  dir.read_f32("layer.b", {5}, out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 1.015625f);
  EXPECT_EQ(out[2], 3.140625f);
  EXPECT_EQ(out[3], -65536.0f);  // -65504 is not a bf16; nearest is -2^16
  EXPECT_EQ(out[4], 0.0f);
  out.assign(4, 0.f);
  dir.read_f32("layer.c", {2, 2}, out.data());
  EXPECT_EQ(out[0], 0.0999755859375f);
  EXPECT_EQ(out[1], 65504.0f);
  EXPECT_EQ(out[2], -2.5f);
  EXPECT_EQ(out[3], 2.0f / 16777216.0f);
  dir.read_f32("empty", {0, 4}, out.data());

  std::string msg = test::expected_error_of([&] { dir.read_f32("layer.a", {3, 2}, out.data()); });
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("layer.a"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[3, 2]"), std::string::npos) << msg;
  msg = test::expected_error_of([&] { dir.info("missing.weight"); });
  EXPECT_NE(msg.find("missing.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find(tmp.str()), std::string::npos) << msg;
}

// Tensor data at odd addresses (allowed by the format) still reads correctly.
TEST(Safetensors, ReadsUnalignedData) {
  const test::TempDir tmp("model_io");
  // U8 [1] first puts the BF16 tensor at data offset 1; header length 7+... is not padded.
  std::string header = R"({"u":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("h":{"dtype":"BF16","shape":[2],"data_offsets":[1,5]}})";
  std::vector<uint8_t> img = make_image(header, 0);
  const uint16_t h0 = f32_to_bf16(-3.5f), h1 = f32_to_bf16(0.125f);
  for (uint8_t v :
       {uint8_t{9}, uint8_t(h0 & 0xff), uint8_t(h0 >> 8), uint8_t(h1 & 0xff), uint8_t(h1 >> 8)}) {
    img.push_back(v);
  }
  write_bytes(tmp / "model.safetensors", img);
  SafetensorsDir dir = SafetensorsDir::open(tmp.str());
  std::vector<float> out(2);
  dir.read_f32("h", {2}, out.data());
  EXPECT_EQ(out[0], -3.5f);
  EXPECT_EQ(out[1], 0.125f);
  std::string msg = test::expected_error_of([&] { dir.read_f32("u", {1}, out.data()); });
  EXPECT_NE(msg.find("'u'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("U8"), std::string::npos) << msg;
}

TEST(Safetensors, ShardedDirRoundTripAndStaleFiles) {
  const test::TempDir tmp("model_io");
  std::vector<std::vector<float>> vals(5, std::vector<float>(100));
  std::vector<TensorToWrite> ts;
  for (int k = 0; k < 5; ++k) {
    for (int i = 0; i < 100; ++i) vals[k][i] = static_cast<float>(k * 1000 + i) * 0.5f;
    ts.push_back({fmt::format("model.layers.{}.w", k), DType::F32, {10, 10}, vals[k].data()});
  }
  // A stale single file and an unrelated shard name from an earlier save must go.
  write_safetensors((tmp / "model.safetensors").string(), {ts[0]});
  write_safetensors((tmp / "model-00001-of-00007.safetensors").string(), {ts[0]});

  // 400 bytes each, at most 900 per shard: shards of 2, 2, 1 tensors.
  write_safetensors_dir(tmp.str(), ts, 900);
  EXPECT_FALSE(fs::exists(tmp / "model.safetensors"));
  EXPECT_FALSE(fs::exists(tmp / "model-00001-of-00007.safetensors"));
  for (const char* f : {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                        "model-00003-of-00003.safetensors", "model.safetensors.index.json"}) {
    EXPECT_TRUE(fs::exists(tmp / f)) << f;
  }
  std::ifstream in(tmp / "model.safetensors.index.json");
  nlohmann::json index = nlohmann::json::parse(in);
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), 2000u);
  EXPECT_EQ(index["weight_map"].size(), 5u);
  EXPECT_EQ(index["weight_map"]["model.layers.1.w"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["model.layers.2.w"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["model.layers.4.w"], "model-00003-of-00003.safetensors");

  SafetensorsDir dir = SafetensorsDir::open(tmp.str());
  ASSERT_EQ(dir.names().size(), 5u);
  EXPECT_EQ(fs::path(dir.file_of("model.layers.3.w")).filename(),
            "model-00002-of-00003.safetensors");
  std::vector<float> out(100);
  for (int k = 0; k < 5; ++k) {
    dir.read_f32(fmt::format("model.layers.{}.w", k), {10, 10}, out.data());
    EXPECT_EQ(out, vals[k]) << k;
  }

  // Saving again unsharded removes the index and every shard.
  write_safetensors_dir(tmp.str(), ts);
  EXPECT_TRUE(fs::exists(tmp / "model.safetensors"));
  EXPECT_FALSE(fs::exists(tmp / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(tmp / "model-00001-of-00003.safetensors"));
  SafetensorsDir dir2 = SafetensorsDir::open(tmp.str());
  dir2.read_f32("model.layers.4.w", {10, 10}, out.data());
  EXPECT_EQ(out, vals[4]);
}

TEST(Safetensors, DirErrors) {
  const test::TempDir tmp("model_io");
  std::string msg = test::expected_error_of([&] { SafetensorsDir::open(tmp.str()); });
  EXPECT_NE(msg.find(tmp.str()), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.safetensors.index.json"), std::string::npos) << msg;

  std::vector<float> v(4, 1.0f);
  write_safetensors((tmp / "shard-a.safetensors").string(), {{"x", DType::F32, {4}, v.data()}});
  auto write_index = [&](const std::string& text) {
    std::ofstream(tmp / "model.safetensors.index.json") << text;
  };
  write_index(R"({"weight_map": {"x": "shard-a.safetensors", "y": "shard-b.safetensors"}})");
  msg = test::expected_error_of([&] { SafetensorsDir::open(tmp.str()); });
  EXPECT_NE(msg.find("model.safetensors.index.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("shard-b.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'y'"), std::string::npos) << msg;

  write_index(R"({"weight_map": {"x": "shard-a.safetensors", "z": "shard-a.safetensors"}})");
  msg = test::expected_error_of([&] { SafetensorsDir::open(tmp.str()); });
  EXPECT_NE(msg.find("'z'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("shard-a.safetensors"), std::string::npos) << msg;

  write_index(R"({"weight_map": {"x": 3}})");
  msg = test::expected_error_of([&] { SafetensorsDir::open(tmp.str()); });
  EXPECT_NE(msg.find("'x'"), std::string::npos) << msg;

  write_index(R"({"weight_map": {"x": "shard-a.safetensors"})");
  msg = test::expected_error_of([&] { SafetensorsDir::open(tmp.str()); });
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;

  write_index(R"({"weight_map": {"x": "shard-a.safetensors"}})");
  SafetensorsDir ok = SafetensorsDir::open(tmp.str());
  EXPECT_TRUE(ok.has("x"));
  EXPECT_FALSE(ok.has("z"));
}

TEST(Safetensors, OpenErrors) {
  const test::TempDir tmp("model_io");
  std::string msg =
      test::expected_error_of([&] { SafetensorsFile::open((tmp / "none.safetensors").string()); });
  EXPECT_NE(msg.find("none.safetensors"), std::string::npos) << msg;
  write_bytes(tmp / "short.safetensors", {1, 2, 3});
  msg =
      test::expected_error_of([&] { SafetensorsFile::open((tmp / "short.safetensors").string()); });
  EXPECT_NE(msg.find("short.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3 bytes"), std::string::npos) << msg;
  // A valid header length but truncated data, through the mmap path.
  write_bytes(tmp / "trunc.safetensors",
              make_image(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 10));
  msg =
      test::expected_error_of([&] { SafetensorsFile::open((tmp / "trunc.safetensors").string()); });
  EXPECT_NE(msg.find("trunc.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
}

TEST(Safetensors, WriteErrors) {
  const test::TempDir tmp("model_io");
  std::vector<float> v(4);
  const std::string p = (tmp / "x.safetensors").string();
  std::string msg = test::expected_error_of([&] {
    write_safetensors(p, {{"w", DType::I32, {4}, v.data()}});
  });
  EXPECT_NE(msg.find("'w'"), std::string::npos) << msg;
  msg = test::expected_error_of([&] {
    write_safetensors(p, {{"w", DType::F32, {4}, v.data()}, {"w", DType::F32, {4}, v.data()}});
  });
  EXPECT_NE(msg.find("twice"), std::string::npos) << msg;
  msg = test::expected_error_of([&] {
    write_safetensors(p, {{"w", DType::F32, {-1, 4}, v.data()}});
  });
  EXPECT_NE(msg.find("negative"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(p));
  EXPECT_FALSE(fs::exists(p + ".tmp"));
}

struct BadCase {
  const char* what;
  std::string header;
  size_t data_bytes;
  std::vector<std::string> expect;  // substrings of the message besides the file name
  uint64_t header_len = UINT64_MAX;
};

TEST(Safetensors, MalformedFilesNameFileAndTensor) {
  const std::string w16 = R"("dtype":"F32","shape":[4],"data_offsets":[0,16])";
  std::vector<BadCase> cases = {
      {"header length past EOF", "{}", 0, {"header length 1000", "past the end"}, 1000},
      {"header length over 100 MB", "{}", 0, {"exceeds"}, 200'000'000},
      {"not JSON", "{\"w\": [1, 2", 0, {"not valid JSON", "parse error"}},
      {"not an object", "[1, 2]", 0, {"must be a JSON object", "array"}},
      {"entry not an object", R"({"w": 5})", 0, {"'w'", "must be an object"}},
      {"missing dtype", R"({"w":{"shape":[4],"data_offsets":[0,16]}})", 16, {"'w'", "'dtype'"}},
      {"missing shape", R"({"w":{"dtype":"F32","data_offsets":[0,16]}})", 16, {"'w'", "'shape'"}},
      {"missing offsets", R"({"w":{"dtype":"F32","shape":[4]}})", 16, {"'w'", "'data_offsets'"}},
      {"dtype not a string",
       R"({"w":{"dtype":7,"shape":[4],"data_offsets":[0,16]}})",
       16,
       {"'w'", "dtype must be a string"}},
      {"unknown dtype",
       R"({"w":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})",
       4,
       {"'w'", "'F8_E4M3'"}},
      {"shape not an array",
       R"({"w":{"dtype":"F32","shape":4,"data_offsets":[0,16]}})",
       16,
       {"'w'", "shape must be an array"}},
      {"negative shape",
       R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})",
       16,
       {"'w'", "negative"}},
      {"fractional shape",
       R"({"w":{"dtype":"F32","shape":[4.0],"data_offsets":[0,16]}})",
       16,
       {"'w'", "integers"}},
      {"numel overflow",
       R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})",
       16,
       {"'w'", "overflows"}},
      {"bytes overflow",
       R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})",
       0,
       {"'w'", "overflows"}},
      {"offsets not a pair",
       R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,8,16]}})",
       16,
       {"'w'", "[begin, end]"}},
      {"negative offset",
       R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[-4,12]}})",
       16,
       {"'w'", "negative"}},
      {"begin > end",
       R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[16,0]}})",
       16,
       {"'w'", "begin > end"}},
      {"end past data",
       R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
       12,
       {"'w'", "past the data section"}},
      {"size mismatch",
       R"({"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,16]}})",
       16,
       {"'w'", "needs 8"}},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
       16,
       {"'a'", "'b'", "overlaps"}},
      {"gap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
       20,
       {"gap of 4 bytes", "'b'"}},
      {"trailing bytes", "{\"w\":{" + w16 + "}}", 20, {"4 trailing bytes"}},
      {"metadata not strings",
       "{\"__metadata__\":{\"format\":1},\"w\":{" + w16 + "}}",
       16,
       {"__metadata__", "'format'"}},
      {"metadata not an object", "{\"__metadata__\":[],\"w\":{" + w16 + "}}", 16, {"__metadata__"}},
  };
  for (const BadCase& c : cases) {
    std::string msg = parse_error(c.header, c.data_bytes, c.header_len);
    EXPECT_NE(msg.find("bad.safetensors"), std::string::npos) << c.what << ": " << msg;
    for (const std::string& s : c.expect) {
      EXPECT_NE(msg.find(s), std::string::npos) << c.what << ": '" << s << "' not in: " << msg;
    }
  }
  // Shorter than the length field itself.
  std::vector<uint8_t> tiny = {1, 0, 0};
  std::string msg = test::expected_error_of(
      [&] { SafetensorsFile::from_memory(tiny.data(), tiny.size(), "bad.safetensors"); });
  EXPECT_NE(msg.find("bad.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("shorter than"), std::string::npos) << msg;

  // The same header with exactly the right data is accepted (the cases above fail for the
  // reason they name, not for something else in the fixture).
  auto ok = make_image("{\"__metadata__\":{\"format\":\"pt\"},\"w\":{" + w16 + "}}", 16);
  auto f = SafetensorsFile::from_memory(ok.data(), ok.size(), "ok.safetensors");
  EXPECT_EQ(f->find("w")->numel(), 4);
  EXPECT_EQ(f->data(*f->find("w")), ok.data() + ok.size() - 16);
}

}  // namespace
}  // namespace verl::model
