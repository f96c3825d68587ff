// Tests of the parquet reader against files from independent writers (tests/fixtures/parquet:
// hyparquet-writer via tools/parquet/make_fixtures.mjs, pyarrow/pandas via
// make_fixtures_pyarrow.py): every <stem>_<variant>.parquet must read back as exactly the rows of
// <stem>.jsonl. Then the RL and SFT loaders on parquet against JSONL, and malformed files: each an
// Error naming the file (and the row group / column where one is at fault), never a crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "../common/test_util.h"
#include "core/error.h"
#include "data/dataloader.h"
#include "data/parquet.h"
#include "data/rl_dataset.h"
#include "data_test_util.h"
#include "tokenizer/tokenizer.h"
#include "trainer/sft.h"

namespace verl::data {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;
using OJ = nlohmann::ordered_json;

const std::string kDir = std::string(VERL_SOURCE_DIR) + "/tests/fixtures/parquet";

std::vector<OJ> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::vector<OJ> rows;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) rows.push_back(OJ::parse(line));
  return rows;
}

std::vector<OJ> read_parquet(const std::string& path) {
  ParquetFile pf = ParquetFile::open(path);
  std::vector<OJ> rows;
  for (int g = 0; g < pf.num_row_groups(); ++g) {
    std::vector<OJ> part = pf.read_row_group(g);
    EXPECT_EQ(static_cast<int64_t>(part.size()), pf.row_group_num_rows(g))
        << path << " row group " << g;
    rows.insert(rows.end(), part.begin(), part.end());
  }
  EXPECT_EQ(static_cast<int64_t>(rows.size()), pf.num_rows()) << path;
  return rows;
}

// Every fixture with its expected rows: "rows_pyarrow_zstd.parquet" -> "rows.jsonl".
std::map<std::string, std::string> fixtures() {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(kDir)) {
    if (e.path().extension() != ".parquet") continue;
    const std::string name = e.path().filename().string();
    out[e.path().string()] = kDir + "/" + name.substr(0, name.find('_')) + ".jsonl";
  }
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

const tokenizer::Tokenizer& demo_tokenizer() {
  static tokenizer::Tokenizer tok =
      tokenizer::Tokenizer::load(std::string(VERL_SOURCE_DIR) + "/assets/demo");
  return tok;
}

TEST(Parquet, EveryFixtureReadsAsItsJsonlRows) {
  const auto all = fixtures();
  // The committed hyparquet-writer files; pyarrow's join them when make_fixtures_pyarrow.py has
  // run.
  ASSERT_GE(all.size(), 8u) << "fixtures missing from " << kDir;
  for (const auto& [parquet, jsonl] : all) {
    SCOPED_TRACE(parquet);
    ASSERT_TRUE(fs::exists(jsonl)) << "no companion " << jsonl;
    const std::vector<OJ> want = read_jsonl(jsonl);
    const std::vector<OJ> got = read_parquet(parquet);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      // As JSON values: 1.0 == 1, key order aside (checked below for the top level).
      EXPECT_EQ(nlohmann::json(got[i]), nlohmann::json(want[i]))
          << "row " << i + 1 << "\n got " << got[i].dump() << "\nwant " << want[i].dump();
    }
    std::vector<std::string> keys;
    for (const auto& [k, v] : want[0].items()) keys.push_back(k);
    EXPECT_EQ(ParquetFile::open(parquet).column_names(), keys);
  }
}

TEST(Parquet, TypesAndRowGroupsAreWhatTheWritersMade) {
  ParquetFile many = ParquetFile::open(kDir + "/rows_hyparquet_zstd_rowgroups.parquet");
  EXPECT_EQ(many.num_rows(), 24);
  EXPECT_EQ(many.num_row_groups(), 3);
  EXPECT_EQ(many.row_group_num_rows(2), 4);
  // The second row group starts at row 11: its rows are the JSONL's from there on.
  EXPECT_EQ(many.read_row_group(1)[0]["extra_info"]["index"], 10);
  const OJ row = ParquetFile::open(kDir + "/rows_hyparquet_snappy.parquet").read_row_group(0)[4];
  EXPECT_TRUE(row["extra_info"]["index"].is_number_integer());
  EXPECT_EQ(row["extra_info"]["index"].get<int64_t>(), int64_t{1} << 40);
  EXPECT_TRUE(row["extra_info"]["score"].is_number_float());
  EXPECT_TRUE(row["extra_info"]["flag"].is_boolean());
  EXPECT_EQ(row["extra_info"]["tags"], OJ::parse(R"(["x", null, ""])"));
  EXPECT_TRUE(row["reward_model"]["style"].is_null());
  EXPECT_THROW(many.read_row_group(3), Error);
}

TEST(Parquet, RLDatasetFromParquetEqualsJsonl) {
  DatasetOptions opts;
  opts.max_prompt_length = 256;
  RLDataset ref = RLDataset::load({kDir + "/rows.jsonl"}, demo_tokenizer(), opts);
  int checked = 0;
  for (const auto& [parquet, jsonl] : fixtures()) {
    if (jsonl != kDir + "/rows.jsonl") continue;
    SCOPED_TRACE(parquet);
    RLDataset ds = RLDataset::load({parquet}, demo_tokenizer(), opts);
    ASSERT_EQ(ds.size(), ref.size());
    LoaderOptions lo;
    lo.batch_size = 8;
    lo.num_workers = 0;
    DataLoader a(ds, lo), b(ref, lo);
    const auto ba = a.next(), bb = b.next();
    ASSERT_TRUE(ba && bb);
    ASSERT_EQ(ba->samples.size(), 8u);
    for (size_t i = 0; i < ba->samples.size(); ++i) {
      const Sample &x = ba->samples[i], &y = bb->samples[i];
      EXPECT_EQ(x.prompt_ids, y.prompt_ids) << i;
      EXPECT_FALSE(x.prompt_ids.empty());
      EXPECT_EQ(x.line, y.line);  // the 1-based row number, as the JSONL line
      EXPECT_EQ(x.file, parquet);
      EXPECT_EQ(x.ground_truth, y.ground_truth);
      EXPECT_EQ(x.data_source, y.data_source);
      EXPECT_EQ(x.ability, y.ability);
      EXPECT_EQ(x.extra_info, y.extra_info);
    }
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

TEST(Parquet, SftExamplesFromParquetEqualJsonl) {
  for (bool multiturn : {true, false}) {
    trainer::SftDataOptions opt;
    opt.multiturn = multiturn;
    opt.prompt_key = "prompt";
    opt.response_key = "response";
    const auto want = trainer::load_sft_examples(kDir + "/sft.jsonl", demo_tokenizer(), opt);
    const auto got =
        trainer::load_sft_examples(kDir + "/sft_hyparquet_snappy.parquet", demo_tokenizer(), opt);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
      EXPECT_EQ(got[i].loss_mask, want[i].loss_mask) << i;
    }
  }
  // A row that lacks the key is named by file and 1-based row.
  trainer::SftDataOptions opt;
  opt.messages_key = "conversation";
  const std::string path = kDir + "/sft_hyparquet_snappy.parquet";
  EXPECT_NE(test::error_of([&] {
              trainer::load_sft_examples(path, demo_tokenizer(), opt);
            }).find(path + ":1: missing \"conversation\""),
            std::string::npos);
}

// ---- malformed files, written from a good fixture's bytes ----

class Broken : public ::testing::Test {
 protected:
  const std::string good_path = kDir + "/rows_hyparquet_snappy.parquet";
  std::string good = read_file(good_path);
  ScratchDir dir;

  // The footer's Thrift bytes.
  size_t footer_start() const {
    const size_t n = good.size();
    const uint32_t len = static_cast<uint8_t>(good[n - 8]) |
                         static_cast<uint8_t>(good[n - 7]) << 8 |
                         static_cast<uint8_t>(good[n - 6]) << 16 |
                         static_cast<uint32_t>(static_cast<uint8_t>(good[n - 5])) << 24;
    return n - 8 - len;
  }
  // Reads the whole file; returns the Error message ("" when it read fine).
  std::string read_all(const std::string& bytes, const std::string& name = "bad.parquet") {
    const std::string p = dir.write(name, bytes);
    return test::error_of([&] { read_parquet(p); });
  }
  void fuzz();
};

TEST_F(Broken, FooterAndMagic) {
  const std::string p = dir.write("short.parquet", good.substr(0, good.size() - 3));
  std::string e = read_all(good.substr(0, good.size() - 3), "short.parquet");
  EXPECT_NE(e.find(p), std::string::npos) << e;
  EXPECT_NE(e.find("PAR1"), std::string::npos) << e;

  std::string magic = good;
  magic.replace(magic.size() - 4, 4, "PAR2");
  e = read_all(magic);
  EXPECT_NE(e.find("bad.parquet: not a parquet file"), std::string::npos) << e;

  std::string len = good;
  len[len.size() - 5] = 0x7f;  // footer length far past the file
  e = read_all(len);
  EXPECT_NE(e.find("footer length"), std::string::npos) << e;

  // The footer cut short inside its Thrift: keep the tail (length + magic), drop footer bytes.
  const size_t fs0 = footer_start();
  std::string cut = good.substr(0, fs0) + good.substr(fs0 + 40);
  e = read_all(cut);
  EXPECT_NE(e.find("bad.parquet"), std::string::npos) << e;
  EXPECT_FALSE(e.empty());

  EXPECT_NE(read_all("PAR1").find("too short"), std::string::npos);
  EXPECT_NE(test::error_of([&] {
              ParquetFile::open(dir.write("x", "") + ".missing");
            }).find("cannot open"),
            std::string::npos);
}

TEST_F(Broken, UnknownCodecNamesRowGroupAndColumn) {
  // ColumnMetaData: path_in_schema ["data_source"], then field 4 (codec): header 0x15, zigzag(1 =
  // SNAPPY).
  const std::string needle = std::string("data_source") + "\x15\x02";
  const size_t at = good.find(needle, footer_start());
  ASSERT_NE(at, std::string::npos);
  std::string bad = good;
  bad[at + needle.size() - 1] = 0x08;  // zigzag(4) = BROTLI
  const std::string e = read_all(bad);
  EXPECT_NE(e.find("bad.parquet: row group 0, column data_source"), std::string::npos) << e;
  EXPECT_NE(e.find("BROTLI"), std::string::npos) << e;
}

TEST_F(Broken, RenamedColumnFailsTheRowCheckWithFileAndRow) {
  // Rename "prompt" to "prampt" everywhere in the footer: a valid file without the prompt column.
  std::string bad = good;
  for (size_t at = footer_start(); (at = bad.find("prompt", at)) != std::string::npos; at += 6)
    bad[at + 2] = 'a';
  const std::string p = dir.write("noprompt.parquet", bad);
  EXPECT_EQ(read_parquet(p)[0].count("prampt"), 1u);
  const std::string e =
      test::error_of([&] { RLDataset::load({p}, demo_tokenizer(), DatasetOptions{}); });
  EXPECT_NE(e.find(p + ":1: the row has no 'prompt' field"), std::string::npos) << e;
}

TEST_F(Broken, PagesBeyondTheFile) {
  // Cut the file in the middle of the data: the footer still points at the missing bytes.
  const size_t fs0 = footer_start();
  const std::string e = read_all(good.substr(0, 200) + good.substr(fs0));
  EXPECT_NE(e.find("bad.parquet: row group 0, column"), std::string::npos) << e;
}

TEST_F(Broken, CorruptCompressedPagesNameTheColumn) {
  // The first page of each file starts with the codec's magic: zstd 28 b5 2f fd, gzip 1f 8b.
  const std::pair<const char*, std::string> cases[] = {
      {"rows_hyparquet_zstd_rowgroups.parquet", "\x28\xb5\x2f\xfd"},
      {"rows_hyparquet_gzip.parquet", "\x1f\x8b"}};
  for (const auto& [name, magic] : cases) {
    std::string bad = read_file(kDir + "/" + name);
    const size_t at = bad.find(magic);
    ASSERT_NE(at, std::string::npos) << name;
    for (size_t i = at + 6; i < at + 14; ++i) bad[i] = static_cast<char>(0xff);
    const std::string e = read_all(bad);
    EXPECT_NE(e.find("bad.parquet: row group 0, column data_source, page 0"), std::string::npos)
        << e;
    EXPECT_NE(e.find(std::string(name).find("zstd") != std::string::npos ? "zstd" : "gzip"),
              std::string::npos)
        << e;
  }
}

// Any single corrupted byte or truncation: an Error or a good read, nothing else. Two writers:
// hyparquet's v2 pages, arrow-rs's v1 pages with dictionaries and nested lists.
TEST_F(Broken, NoCrashOnAnyCorruptByte) {
  for (const char* name : {"rows_hyparquet_snappy.parquet", "nested_arrowrs_v1_snappy.parquet"}) {
    SCOPED_TRACE(name);
    good = read_file(kDir + "/" + name);
    fuzz();
  }
}

void Broken::fuzz() {
  int errors = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t v : {uint8_t{0x00}, uint8_t{0xff}, static_cast<uint8_t>(good[i] ^ 0x41)}) {
      std::string bad = good;
      bad[i] = static_cast<char>(v);
      try {
        read_parquet(dir.write("fuzz.parquet", bad));
      } catch (const Error&) {
        ++errors;
      }
    }
  }
  for (size_t n = 0; n < good.size(); n += 7) {
    try {
      read_parquet(dir.write("cut.parquet", good.substr(0, n)));
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 100);
}

}  // namespace
}  // namespace verl::data

namespace verl::data {
namespace {

// A column of the wrong type (tools/parquet/make_fixtures.mjs: `prompt` written as INT64 by
// hyparquet-writer): the file reads, and the dataset refuses the row naming file, row and field.
TEST(Parquet, AColumnOfTheWrongTypeNamesFileRowAndField) {
  const std::string p =
      std::string(VERL_SOURCE_DIR) + "/tests/fixtures/parquet/bad/prompt_int64_hyparquet.parquet";
  const std::vector<OJ> rows = read_parquet(p);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_TRUE(rows[0]["prompt"].is_number_integer());
  const std::string e =
      test::error_of([&] { RLDataset::load({p}, demo_tokenizer(), DatasetOptions{}); });
  EXPECT_NE(e.find(p + ":1:"), std::string::npos) << e;
  EXPECT_NE(e.find("prompt"), std::string::npos) << e;
}

}  // namespace
}  // namespace verl::data
