// Encoding and decoding of the real Qwen3 and Llama-3 tokenizers against the ids made by the
// independent JavaScript implementation (@lenml/tokenizers) on the >1000-line corpus.
#include <gtest/gtest.h>

#include <thread>

#include "fixtures.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

namespace verl::tokenizer::testing {
namespace {

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

class RealTokenizer : public ::testing::TestWithParam<std::string> {};

TEST_P(RealTokenizer, IdsEqualReferenceLineByLine) {
  const Tokenizer* tok = real_tokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  const auto expected = read_jsonl(fixture_dir() + "/ids_" + GetParam() + ".jsonl");
  ASSERT_EQ(expected.size(), corpus().size()) << "regenerate with tools/tokenizer/make_ids.mjs";
  ASSERT_GE(corpus().size(), 1000u);
  int mismatches = 0;
  for (size_t i = 0; i < corpus().size(); ++i) {
    const std::vector<int32_t> ids = tok->encode(corpus()[i]);
    const auto want = expected[i]["ids"].get<std::vector<int32_t>>();
    if (ids != want && ++mismatches <= 5) {
      ADD_FAILURE() << GetParam() << " corpus line " << i + 1 << ": "
                    << nlohmann::json(corpus()[i]).dump() << "\n  got:  " << show(ids)
                    << "\n  want: " << show(want);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST_P(RealTokenizer, DecodeSkippingSpecialTokensEqualsReference) {
  const Tokenizer* tok = real_tokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  const auto expected = read_jsonl(fixture_dir() + "/ids_" + GetParam() + ".jsonl");
  int mismatches = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto ids = expected[i]["ids"].get<std::vector<int32_t>>();
    const std::string got = tok->decode(ids, /*skip_special_tokens=*/true);
    const std::string want = expected[i]["skip"].get<std::string>();
    if (got != want && ++mismatches <= 5)
      ADD_FAILURE() << GetParam() << " line " << i + 1 << "\n  got:  " << nlohmann::json(got).dump()
                    << "\n  want: " << nlohmann::json(want).dump();
  }
  EXPECT_EQ(mismatches, 0);
}

// decode(encode(x)) gives back x, after the tokenizer's normalizer (Qwen's NFC folds NFD input).
TEST_P(RealTokenizer, DecodeOfEncodeRoundTrips) {
  const Tokenizer* tok = real_tokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  const Normalizer nfc = Normalizer::from_json(nlohmann::json{{"type", "NFC"}}, "test");
  int mismatches = 0, normalized_lines = 0;
  for (size_t i = 0; i < corpus().size(); ++i) {
    const std::string& text = corpus()[i];
    std::string want = text;
    if (GetParam() == "qwen3") {
      std::string out;
      if (nfc.apply(text, out)) {
        want = out;
        ++normalized_lines;
      }
    }
    const std::string got =
        tok->decode(tok->encode(text), false, /*clean_up_tokenization_spaces=*/false);
    if (got != want && ++mismatches <= 5)
      ADD_FAILURE() << GetParam() << " line " << i + 1 << ": " << nlohmann::json(got).dump();
  }
  EXPECT_EQ(mismatches, 0);
  if (GetParam() == "qwen3") {
    EXPECT_GT(normalized_lines, 10);  // the corpus really has NFD input
  }
}

TEST_P(RealTokenizer, SpecialTokenIdsComeFromTheConfig) {
  const Tokenizer* tok = real_tokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  if (GetParam() == "qwen3") {
    EXPECT_EQ(tok->eos_token_id(), 151645);  // <|im_end|>
    EXPECT_EQ(tok->pad_token_id(), 151643);  // <|endoftext|>
    EXPECT_EQ(tok->bos_token_id(), -1);      // Qwen has no BOS
    EXPECT_EQ(tok->vocab_size(), 151669);
    EXPECT_EQ(tok->token_to_id("<think>"), 151667);
    EXPECT_FALSE(tok->is_special(151667));  // <think> is added but not special
  } else {
    EXPECT_EQ(tok->bos_token_id(), 128000);  // <|begin_of_text|>
    EXPECT_EQ(tok->eos_token_id(), 128001);  // <|end_of_text|>
    EXPECT_EQ(tok->pad_token_id(), 128001);  // no pad token: falls back to EOS as verl does
    EXPECT_EQ(tok->vocab_size(), 128256);
    EXPECT_EQ(tok->token_to_id("<|eot_id|>"), 128009);
  }
}

TEST_P(RealTokenizer, SkipSpecialTokensDropsOnlySpecialOnes) {
  const Tokenizer* tok = real_tokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  const std::string special = GetParam() == "qwen3" ? "<|im_end|>" : "<|eot_id|>";
  const std::vector<int32_t> ids = tok->encode("Hi" + special + "there");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], tok->token_to_id(special));
  EXPECT_EQ(tok->decode(ids, false, false), "Hi" + special + "there");
  EXPECT_EQ(tok->decode(ids, true, false), "Hithere");
  if (GetParam() == "qwen3") {  // <think> is not special: kept by skip_special_tokens
    const std::vector<int32_t> think = tok->encode("<think>x</think>");
    EXPECT_EQ(tok->decode(think, true), "<think>x</think>");
  }
}

TEST_P(RealTokenizer, EncodeIsThreadSafe) {
  const Tokenizer* tok = real_tokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  std::vector<std::vector<int32_t>> serial;
  for (const std::string& line : corpus()) serial.push_back(tok->encode(line));
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = static_cast<size_t>(t); i < corpus().size(); i += 2)
        if (tok->encode(corpus()[i]) != serial[i]) ++bad[static_cast<size_t>(t)];
    });
  }
  for (auto& th : threads) th.join();
  for (int b : bad) EXPECT_EQ(b, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, RealTokenizer, ::testing::Values("qwen3", "llama3"));

TEST(Tokenizer, CleanUpTokenizationMatchesTransformers) {
  EXPECT_EQ(clean_up_tokenization("Hello , world ! Is it ? I do n't know . He 's here ' ok"),
            "Hello, world! Is it? I don't know. He's here'ok");
}

}  // namespace
}  // namespace verl::tokenizer::testing
