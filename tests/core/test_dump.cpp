// VERL_DUMP: the .npy writer and reader, the index and its overwrite rule, and first_divergence on
// two dumps that differ in one element of one tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../common/test_util.h"
#include "core/dtype.h"
#include "core/dump.h"
#include "core/error.h"

namespace verl {
namespace {
namespace fs = std::filesystem;

// A fresh directory (one per name) in this process's scratch directory, removed at exit.
fs::path fresh_dir(const std::string& name) {
  static const verl::test::TempDir scratch("dump");
  const fs::path d = scratch / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<std::string> lines_of(const fs::path& p) {
  std::ifstream f(p);
  std::vector<std::string> out;
  for (std::string s; std::getline(f, s);) out.push_back(s);
  return out;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<float> ramp(int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * float(i) + 0.1f);
  return v;
}

TEST(Dump, NpyRoundTripsOddShapes) {
  const fs::path d = fresh_dir("roundtrip");
  const std::vector<std::vector<int64_t>> shapes = {{},        {1},       {7},      {19, 1},
                                                    {2, 3, 5}, {1, 0, 3}, {257, 3}, {1, 7, 19, 2}};
  for (size_t s = 0; s < shapes.size(); ++s) {
    int64_t n = 1;
    for (int64_t x : shapes[s]) n *= x;
    std::vector<float> v = ramp(n, 3.0f);
    if (n > 2) v[1] = -0.0f, v[2] = std::numeric_limits<float>::infinity();
    const std::string path = (d / ("t" + std::to_string(s) + ".npy")).string();
    dump::write_npy(path, v.data(), shapes[s]);
    // numpy's layout: the data starts at a multiple of 64 bytes.
    EXPECT_EQ((fs::file_size(path) - 4 * n) % 64, 0u) << path;
    std::vector<int64_t> shape = {42};
    std::vector<float> back = dump::read(path, &shape);
    EXPECT_EQ(shape, shapes[s]);
    ASSERT_EQ(back.size(), v.size());
    EXPECT_EQ(std::memcmp(back.data(), v.data(), 4 * v.size()), 0) << path;
  }
  fs::remove_all(d);
}

TEST(Dump, NpyHeaderIsNumpys) {
  const fs::path d = fresh_dir("header");
  const float x[6] = {1, 2, 3, 4, 5, 6};
  const int64_t s23[] = {2, 3}, s6[] = {6};
  dump::write_npy((d / "a.npy").string(), x, s23);
  dump::write_npy((d / "b.npy").string(), x, s6);
  const std::string a = slurp(d / "a.npy"), b = slurp(d / "b.npy");
  ASSERT_EQ(a.size(), 128u + 24u);
  EXPECT_EQ(a.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(uint8_t(a[8]) | (uint8_t(a[9]) << 8), 118);  // 10 + 118 = 128
  EXPECT_EQ(a.substr(10, 59), "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }");
  EXPECT_EQ(a[127], '\n');
  EXPECT_NE(b.find("'shape': (6,), }"), std::string::npos);
  float first;
  std::memcpy(&first, a.data() + 128, 4);
  EXPECT_EQ(first, 1.0f);
  fs::remove_all(d);
}

TEST(Dump, IndexKeepsFirstPassOrderAndOverwritesData) {
  const fs::path d = fresh_dir("index");
  dump::set_dir(d.string());
  ASSERT_TRUE(dump::enabled());
  const int64_t s3[] = {3};
  const float one[3] = {1, 1, 1}, two[3] = {2, 2, 2};
  dump::tensor("cpu", "embed", one, s3);
  dump::tensor("cpu", "L0.q", one, s3);
  dump::tensor("cuda", "embed", two, s3);
  dump::tensor("cpu", "L0.k", one, s3);
  // A second forward: same names again, new values.
  dump::tensor("cpu", "embed", two, s3);
  dump::tensor("cpu", "L0.q", two, s3);
  EXPECT_EQ(lines_of(d / "cpu" / "index.txt"), (std::vector<std::string>{"embed", "L0.q", "L0.k"}));
  EXPECT_EQ(lines_of(d / "cuda" / "index.txt"), std::vector<std::string>{"embed"});
  EXPECT_EQ(dump::read((d / "cpu" / "embed.npy").string()), std::vector<float>(3, 2.0f));
  EXPECT_EQ(dump::read((d / "cpu" / "L0.k.npy").string()), std::vector<float>(3, 1.0f));

  // set_dir starts a new run: the index is rewritten, not appended to.
  dump::set_dir(d.string());
  dump::tensor("cpu", "L0.k", two, s3);
  EXPECT_EQ(lines_of(d / "cpu" / "index.txt"), std::vector<std::string>{"L0.k"});
  dump::set_dir("");
  fs::remove_all(d);
}

TEST(Dump, DisabledWritesNothing) {
  const fs::path d = fresh_dir("off");
  dump::set_dir(d.string());
  dump::set_dir("");
  EXPECT_FALSE(dump::enabled());
  const int64_t s1[] = {1};
  const float x = 1;
  dump::tensor("cpu", "embed", &x, s1);
  EXPECT_FALSE(fs::exists(d / "cpu"));
  fs::remove_all(d);
}

TEST(Dump, Bf16IsWidened) {
  const fs::path d = fresh_dir("bf16");
  dump::set_dir(d.string());
  const std::vector<float> v = {1.5f, -2.25f, 3.0e-3f, 65280.0f, -0.0f};
  std::vector<uint16_t> h;
  for (float x : v) h.push_back(f32_to_bf16(x));
  const int64_t s[] = {5};
  dump::tensor("cpu", "h", h.data(), s);
  std::vector<float> back = dump::read((d / "cpu" / "h.npy").string());
  ASSERT_EQ(back.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(back[i], bf16_to_f32(h[i])) << i;
  EXPECT_NE(back[2], v[2]);  // 3e-3 is not a bf16: the file holds the rounded value
  dump::set_dir("");
  fs::remove_all(d);
}

TEST(Dump, UnwritableDirectoryNamesThePath) {
  const fs::path d = fresh_dir("unwritable");
  { std::ofstream(d / "plain_file") << "x"; }
  // A regular file where a directory should be: fails even as root.
  const std::string bad = (d / "plain_file" / "sub").string();
  dump::set_dir(bad);
  const int64_t s1[] = {1};
  const float x = 1;
  std::string msg = test::error_of([&] { dump::tensor("cpu", "embed", &x, s1); });
  EXPECT_NE(msg.find(bad), std::string::npos) << msg;
  dump::set_dir("");
  fs::remove_all(d);
}

// Two dumps of the same five tensors; `dir_b` differs within tolerance everywhere, and, when
// `perturb`, by 0.05 at element 17 of L0.k.
void write_pair(const fs::path& a, const fs::path& b, bool perturb) {
  const std::vector<std::pair<std::string, std::vector<int64_t>>> names = {{"embed", {5, 8}},
                                                                           {"L0.q", {5, 12}},
                                                                           {"L0.k", {5, 6}},
                                                                           {"L1.q", {5, 12}},
                                                                           {"final_norm", {5, 8}}};
  for (int pass = 0; pass < 2; ++pass) {
    dump::set_dir((pass ? b : a).string());
    for (const auto& [name, shape] : names) {
      std::vector<float> v = ramp(shape[0] * shape[1], 2.0f);
      if (pass) {
        for (float& x : v) x *= 1.0f + 1e-6f;
        if (perturb && name == "L0.k") v[17] += 0.05f;
      }
      dump::tensor("cpu", name, v.data(), shape);
    }
  }
  dump::set_dir("");
}

TEST(Dump, FirstDivergenceNamesTheTensorAndElement) {
  const fs::path a = fresh_dir("div_a"), b = fresh_dir("div_b");
  write_pair(a, b, true);
  auto d = dump::first_divergence((a / "cpu").string(), (b / "cpu").string(), 1e-5, 1e-4);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->name, "L0.k");
  EXPECT_EQ(d->index, 17);
  EXPECT_EQ(d->compared, 3);
  EXPECT_NEAR(d->value - d->ref_value, 0.05, 1e-5);
  EXPECT_NEAR(d->max_abs_diff, 0.05, 1e-5);
  const std::string msg = dump::describe(*d);
  EXPECT_NE(msg.find("L0.k[17]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 5] of [5, 6]"), std::string::npos) << msg;  // 17 = 2*6 + 5
  EXPECT_NE(msg.find("after 2 names that agree"), std::string::npos) << msg;

  // Tighter than the 1e-6 relative noise: embed is now the first to fail.
  auto tight = dump::first_divergence((a / "cpu").string(), (b / "cpu").string(), 0, 1e-8);
  ASSERT_TRUE(tight.has_value());
  EXPECT_EQ(tight->name, "embed");
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(Dump, AgreementWithinToleranceIsNullopt) {
  const fs::path a = fresh_dir("agree_a"), b = fresh_dir("agree_b");
  write_pair(a, b, false);
  EXPECT_FALSE(dump::first_divergence((a / "cpu").string(), (b / "cpu").string(), 1e-5, 1e-4));
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(Dump, ShapeMismatchAndMissingNames) {
  const fs::path a = fresh_dir("shape_a"), b = fresh_dir("shape_b");
  const std::vector<float> v = ramp(12, 1.0f);
  const int64_t s34[] = {3, 4}, s43[] = {4, 3}, s12[] = {12};
  dump::set_dir(a.string());
  dump::tensor("cpu", "only_ref", v.data(), s12);
  dump::tensor("cpu", "x", v.data(), s12);
  dump::tensor("cpu", "y", v.data(), s34);
  dump::set_dir(b.string());
  dump::tensor("cpu", "x", v.data(), s12);
  dump::tensor("cpu", "y", v.data(), s43);
  dump::set_dir("");
  auto d = dump::first_divergence((a / "cpu").string(), (b / "cpu").string(), 0, 0);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->name, "y");
  EXPECT_EQ(d->index, -1);
  EXPECT_EQ(d->compared, 2);  // only_ref is not in b: skipped
  const std::string msg = dump::describe(*d);
  EXPECT_NE(msg.find("shape [3, 4] vs [4, 3]"), std::string::npos) << msg;
  std::string no_index =
      test::error_of([&] { dump::first_divergence(b.string(), a.string(), 0, 0); });
  EXPECT_NE(no_index.find((b / "index.txt").string()), std::string::npos) << no_index;
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(Dump, BadNpyErrorsNameTheFile) {
  const fs::path d = fresh_dir("bad");
  const std::vector<float> v = ramp(10, 1.0f);
  const int64_t s10[] = {10};
  const std::string good = (d / "good.npy").string();
  dump::write_npy(good, v.data(), s10);
  std::string bytes = slurp(good);

  const std::string magic = (d / "magic.npy").string();
  { std::ofstream(magic, std::ios::binary) << "PK\x03\x04 not numpy at all"; }
  std::string msg = test::error_of([&] { dump::read(magic); });
  EXPECT_NE(msg.find(magic), std::string::npos) << msg;
  EXPECT_NE(msg.find("magic"), std::string::npos) << msg;

  const std::string f8 = (d / "f8.npy").string();
  std::string b8 = bytes;
  b8.replace(b8.find("<f4"), 3, "<f8");
  { std::ofstream(f8, std::ios::binary) << b8; }
  msg = test::error_of([&] { dump::read(f8); });
  EXPECT_NE(msg.find(f8), std::string::npos) << msg;
  EXPECT_NE(msg.find("'<f8'"), std::string::npos) << msg;

  const std::string short_file = (d / "short.npy").string();
  { std::ofstream(short_file, std::ios::binary) << bytes.substr(0, bytes.size() - 5); }
  msg = test::error_of([&] { dump::read(short_file); });
  EXPECT_NE(msg.find(short_file), std::string::npos) << msg;
  EXPECT_NE(msg.find("short"), std::string::npos) << msg;

  const std::string cut_header = (d / "cut_header.npy").string();
  { std::ofstream(cut_header, std::ios::binary) << bytes.substr(0, 30); }
  msg = test::error_of([&] { dump::read(cut_header); });
  EXPECT_NE(msg.find(cut_header), std::string::npos) << msg;
  fs::remove_all(d);
}

}  // namespace
}  // namespace verl
