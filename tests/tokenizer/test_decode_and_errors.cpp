// The streaming decoder, UTF-8 helpers, a hand-made tokenizer for BPE/added-token rules, and the
// error messages of bad tokenizer files and bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../common/test_util.h"
#include "core/error.h"
#include "fixtures.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace verl::tokenizer::testing {
namespace {

TEST(Utf8, LossyReplacesMaximalSubpartsLikePython) {
  // Expected values from Python's bytes.decode("utf-8", "replace").
  EXPECT_EQ(utf8_lossy("a\xE2\x82"
                       "b"),
            "a\xEF\xBF\xBD"
            "b");  // truncated 3-byte
  EXPECT_EQ(utf8_lossy("\xF0\x80\x80"),
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // F0 80: invalid 2nd
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  EXPECT_EQ(utf8_lossy("\xC3\xA9\xFF"), "\xC3\xA9\xEF\xBF\xBD");
  EXPECT_EQ(find_invalid_utf8("ok \xC3\xA9 \xF0\x9F\x98\x80"), kUtf8Valid);
  EXPECT_EQ(find_invalid_utf8("abc\xC3"), 3u);
  EXPECT_EQ(incomplete_utf8_suffix("x\xF0\x9F\x98"), 3u);
  EXPECT_EQ(incomplete_utf8_suffix("x\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(incomplete_utf8_suffix("x\xE0\x80"), 0u);  // can never complete: not held back
}

TEST(ByteLevel, AlphabetIsGpt2s) {
  const ByteLevelAlphabet& a = ByteLevelAlphabet::get();
  EXPECT_EQ(a.char_of(' '), 0x120u);   // "Ġ"
  EXPECT_EQ(a.char_of('\n'), 0x10Au);  // "Ċ"
  EXPECT_EQ(a.char_of('A'), static_cast<uint32_t>('A'));
  EXPECT_EQ(a.char_of(0xAD), 0x143u);  // the soft hyphen is the last remapped byte
  for (int b = 0; b < 256; ++b) EXPECT_EQ(a.byte_of(a.char_of(static_cast<uint8_t>(b))), b);
}

class Streaming : public ::testing::TestWithParam<std::string> {};

// Streaming every corpus line id by id gives decode()'s text, in chunks of whole characters.
TEST_P(Streaming, ConcatenationEqualsDecodeAndChunksAreValidUtf8) {
  const Tokenizer* tok = real_tokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  int held_back = 0;
  for (size_t i = 0; i < corpus().size(); ++i) {
    const std::vector<int32_t> ids = tok->encode(corpus()[i]);
    for (bool skip : {false, true}) {
      IncrementalDecoder dec(*tok, skip);
      std::string streamed;
      for (int32_t id : ids) {
        const std::string chunk = dec.push(id);
        ASSERT_EQ(find_invalid_utf8(chunk), kUtf8Valid) << "line " << i + 1;
        held_back += dec.pending_bytes() > 0;
        streamed += chunk;
      }
      streamed += dec.finish();
      ASSERT_EQ(streamed, tok->decode(ids, skip, false)) << "line " << i + 1;
    }
  }
  EXPECT_GT(held_back, 0);  // the corpus does split characters across tokens
}

INSTANTIATE_TEST_SUITE_P(Models, Streaming, ::testing::Values("qwen3", "llama3"));

TEST(Streaming, HoldsBackHalfCharactersAndReplacesBrokenOnes) {
  const Tokenizer* tok = real_tokenizer("qwen3");
  ASSERT_NE(tok, nullptr);
  // Byte-level tokens for single bytes of "😀" (F0 9F 98 80).
  const ByteLevelAlphabet& a = ByteLevelAlphabet::get();
  auto byte_token = [&](uint8_t b) { return tok->token_to_id(a.utf8_of(b)); };
  IncrementalDecoder dec(*tok);
  EXPECT_EQ(dec.push(byte_token(0xF0)), "");
  EXPECT_EQ(dec.push(byte_token(0x9F)), "");
  EXPECT_EQ(dec.push(byte_token(0x98)), "");
  EXPECT_EQ(dec.pending_bytes(), 3u);
  EXPECT_EQ(dec.push(byte_token(0x80)), "\xF0\x9F\x98\x80");
  // A started character interrupted by ASCII: U+FFFD, then the ASCII.
  EXPECT_EQ(dec.push(byte_token(0xE2)), "");
  EXPECT_EQ(dec.push(tok->token_to_id("a")),
            "\xEF\xBF\xBD"
            "a");
  // A dangling start at the end comes out of finish() as U+FFFD.
  EXPECT_EQ(dec.push(byte_token(0xC3)), "");
  EXPECT_EQ(dec.finish(), "\xEF\xBF\xBD");
  EXPECT_EQ(dec.pending_bytes(), 0u);
}

// A hand-made byte-level BPE tokenizer whose merges and added tokens are known.
nlohmann::json tiny_tokenizer(bool pair_merges) {
  const ByteLevelAlphabet& a = ByteLevelAlphabet::get();
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[a.utf8_of(static_cast<uint8_t>(b))] = b;
  const std::string sp = a.utf8_of(' ');
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  vocab["bc"] = 258;
  vocab[sp + "a"] = 259;
  nlohmann::json merges = nlohmann::json::array();
  // Rank order matters: "b c" outranks "a b", so "abc" becomes a + bc, which has no merge, and
  // the token "abc" is never produced from it.
  for (auto [l, r] : std::vector<std::pair<std::string, std::string>>{
           {"b", "c"}, {"a", "b"}, {"ab", "c"}, {sp, "a"}})
    merges.push_back(pair_merges ? nlohmann::json::array({l, r}) : nlohmann::json(l + " " + r));
  return {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", R"( ?\p{L}+|\s+|[^\s\p{L}]+)"}}},
           {"behavior", "Isolated"}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens",
       {{{"id", 300}, {"content", "<eos>"}, {"special", true}, {"normalized", false}},
        {{"id", 301},
         {"content", "[L]"},
         {"special", false},
         {"lstrip", true},
         {"normalized", false}},
        {{"id", 302},
         {"content", "[R]"},
         {"special", false},
         {"rstrip", true},
         {"normalized", false}},
        {{"id", 303}, {"content", "<eos>x"}, {"special", false}, {"normalized", false}}}},
  };
}

TEST(TinyTokenizer, MergesInRankOrderInBothFileFormats) {
  for (bool pairs : {false, true}) {
    const Tokenizer tok =
        Tokenizer::from_json(tiny_tokenizer(pairs), {{"eos_token", "<eos>"}}, "tiny");
    EXPECT_EQ(tok.encode("ab"), (std::vector<int32_t>{256}));
    EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{'a', 258}));  // "b c" merges first
    EXPECT_EQ(tok.encode("abab"), (std::vector<int32_t>{256, 256}));
    EXPECT_EQ(tok.encode(" a"), (std::vector<int32_t>{259}));
    EXPECT_EQ(tok.eos_token_id(), 300);
  }
}

TEST(TinyTokenizer, AddedTokensMatchLongestFirstAndStripWhitespace) {
  const Tokenizer tok =
      Tokenizer::from_json(tiny_tokenizer(false), nlohmann::json::object(), "tiny");
  EXPECT_EQ(tok.encode("<eos>x"), (std::vector<int32_t>{303}));  // longest match wins
  EXPECT_EQ(tok.encode("c<eos>c"), (std::vector<int32_t>{'c', 300, 'c'}));
  EXPECT_EQ(tok.encode("c  [L]c"),
            (std::vector<int32_t>{'c', 301, 'c'}));  // lstrip eats the spaces
  EXPECT_EQ(tok.encode("c[R] \n c"), (std::vector<int32_t>{'c', 302, 'c'}));  // rstrip eats after
  EXPECT_EQ(tok.decode(tok.encode("c<eos>c"), true), "cc");
}

TEST(Errors, BadTokenizerFilesNameTheProblem) {
  nlohmann::json t = tiny_tokenizer(false);
  t["model"]["type"] = "WordPiece";
  EXPECT_NE(test::error_of([&] {
              Tokenizer::from_json(t, {}, "x.json");
            }).find("unsupported model type \"WordPiece\""),
            std::string::npos);
  t = tiny_tokenizer(false);
  t["model"]["type"] = "Unigram";
  EXPECT_NE(test::error_of([&] { Tokenizer::from_json(t, {}, "x.json"); }).find("\"Unigram\""),
            std::string::npos);
  t = tiny_tokenizer(false);
  t["model"]["merges"][1] = "zz qq";
  EXPECT_NE(test::error_of([&] { Tokenizer::from_json(t, {}, "x.json"); }).find("model.merges[1]"),
            std::string::npos);
  t = tiny_tokenizer(false);
  t["pre_tokenizer"] = {{"type", "Metaspace"}};
  EXPECT_NE(test::error_of([&] {
              Tokenizer::from_json(t, {}, "x.json");
            }).find("unsupported pre_tokenizer type \"Metaspace\""),
            std::string::npos);
  t = tiny_tokenizer(false);
  t["normalizer"] = {{"type", "BertNormalizer"}};
  EXPECT_NE(test::error_of([&] {
              Tokenizer::from_json(t, {}, "x.json");
            }).find("unsupported normalizer type \"BertNormalizer\""),
            std::string::npos);
  t = tiny_tokenizer(false);
  EXPECT_NE(test::error_of([&] {
              Tokenizer::from_json(t, {{"eos_token", "<nope>"}}, "x.json");
            }).find("eos_token \"<nope>\""),
            std::string::npos);
}

// Ids far past any vocabulary and values of the wrong JSON type (found by
// tools/fuzz/fuzz_tokenizer.cpp: an id of 1.1e14 asked for a 9.8 GB table, a negative added-token
// id wrote before the per-id table, "special": "yes" was nlohmann's bare type error).
TEST(Errors, TokenIdsAndFlagsAreChecked) {
  const auto err = [](const nlohmann::json& t,
                      const nlohmann::json& cfg = nlohmann::json::object()) {
    return test::error_of([&] { Tokenizer::from_json(t, cfg, "x.json"); });
  };
  const auto has = [](const std::string& msg, const std::string& want) {
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
  };
  nlohmann::json t = tiny_tokenizer(false);
  t["model"]["vocab"]["zz"] = 111111111111146LL;
  has(err(t),
      "x.json: model.vocab[\"zz\"] must be an integer id in [0, 16777216), got 111111111111146");
  t = tiny_tokenizer(false);
  t["model"]["vocab"]["zz"] = 3000000000LL;  // was cast to a negative int32
  has(err(t), "must be an integer id in [0, 16777216), got 3000000000");
  t = tiny_tokenizer(false);
  t["added_tokens"] = {{{"id", -1}, {"content", "<x>"}, {"special", true}}};
  has(err(t), "x.json: added_tokens[0]: the id must be in [0, 16777216), got -1");
  t = tiny_tokenizer(false);
  t["added_tokens"] = {{{"id", 400}, {"content", "<x>"}, {"special", "yes"}}};
  has(err(t), "x.json: added_tokens[0]: \"special\" must be true or false, got \"yes\"");
  t = tiny_tokenizer(false);
  has(err(t, {{"added_tokens_decoder", {{"-5", {{"content", "<y>"}}}}}}),
      "tokenizer_config.json: added_tokens_decoder[\"-5\"]: the id must be in [0, 16777216)");
  t = tiny_tokenizer(false);
  t["decoder"] = {{"type", 5}};  // a type error no check names: still the file's error
  has(err(t), "x.json (or its tokenizer_config.json): a value of an unexpected type");
}

TEST(Errors, MalformedJsonNamesTheFile) {
  const std::string dir = std::string(VERL_BINARY_DIR) + "/tokenizer_bad_json";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << "{\"model\": {";
  const std::string msg = test::error_of([&] { Tokenizer::load(dir); });
  EXPECT_NE(msg.find(dir + "/tokenizer.json: malformed JSON"), std::string::npos) << msg;
  EXPECT_NE(test::error_of([&] { Tokenizer::load(dir + "/missing"); }).find("no tokenizer.json"),
            std::string::npos);
}

TEST(Errors, InvalidUtf8InputNamesTheOffset) {
  const Tokenizer tok = Tokenizer::from_json(tiny_tokenizer(false), {}, "tiny");
  const std::string msg = test::error_of([&] {
    tok.encode(
        "ab\xFF"
        "c");
  });
  EXPECT_NE(msg.find("not valid UTF-8 (byte 0xFF at offset 2)"), std::string::npos) << msg;
  EXPECT_NE(test::error_of([&] { tok.decode({-1}, false); }).find("ids[0] = -1 is negative"),
            std::string::npos);
}

// A model's embedding may have more rows than the tokenizer has tokens (Qwen2.5: 151936 for
// 151665), so a sampled id can lie past the vocabulary: it has no text and is skipped, as HF's
// decode does.
TEST(Decode, IdsPastTheVocabularyAreSkipped) {
  const Tokenizer tok = Tokenizer::from_json(tiny_tokenizer(false), {}, "tiny");
  std::vector<int32_t> ids = tok.encode("ab c");
  ASSERT_GE(ids.size(), 2u);
  const std::string want = tok.decode(ids, false);
  const int32_t past = static_cast<int32_t>(tok.vocab_size());
  std::vector<int32_t> with_extra = {past};
  for (int32_t id : ids) {
    with_extra.push_back(id);
    with_extra.push_back(past + 7);
  }
  EXPECT_EQ(tok.decode(with_extra, false), want);
  EXPECT_EQ(tok.decode(with_extra, true), tok.decode(ids, true));
  IncrementalDecoder inc(tok);
  std::string streamed;
  for (int32_t id : with_extra) streamed += inc.push(id);
  streamed += inc.finish();
  EXPECT_EQ(streamed, tok.decode(ids, false, false));
}

}  // namespace
}  // namespace verl::tokenizer::testing
