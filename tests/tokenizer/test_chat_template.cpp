// Chat templates: our Jinja interpreter against reference renders (transformers'
// apply_chat_template, or jinja2 configured like it) for Qwen3, Llama-3, Qwen2.5 and Llama-3.2
// templates, plus one-feature cases rendered by jinja2, plus error messages.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "fixtures.h"
#include "tokenizer/jinja.h"

namespace verl::tokenizer::testing {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct ChatCase {
  std::string name;           // fixture chat_<name>.jsonl
  std::string tokenizer;      // real tokenizer whose config supplies bos/eos (and the template)
  std::string template_file;  // empty: the tokenizer's own template
};

class ChatTemplates : public ::testing::TestWithParam<ChatCase> {};

TEST_P(ChatTemplates, RenderEqualsReference) {
  const ChatCase& c = GetParam();
  const std::string dir = model_dir(c.tokenizer);
  ASSERT_TRUE(std::filesystem::exists(dir + "/tokenizer_config.json"))
      << dir << " is missing: run `make npm-fixtures`";
  // A tokenizer whose config carries the template under test.
  std::ifstream cf(dir + "/tokenizer_config.json");
  nlohmann::json config = nlohmann::json::parse(cf);
  if (!c.template_file.empty())
    config["chat_template"] = read_file(fixture_dir() + "/templates/" + c.template_file);
  std::ifstream tf(dir + "/tokenizer.json");
  const Tokenizer tok = Tokenizer::from_json(nlohmann::json::parse(tf), config, dir);

  const auto rows = read_jsonl(fixture_dir() + "/chat_" + c.name + ".jsonl");
  ASSERT_GE(rows.size(), 10u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    const std::string got = tok.apply_chat_template(
        row["messages"], row["add_generation_prompt"].get<bool>(), row["extra"]);
    EXPECT_EQ(got, row["text"].get<std::string>()) << "chat_" << c.name << ".jsonl line " << i + 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Templates, ChatTemplates,
                         ::testing::Values(ChatCase{"qwen3", "qwen3", ""},
                                           ChatCase{"llama3", "llama3", ""},
                                           ChatCase{"qwen2_5", "qwen3", "qwen2_5.jinja"},
                                           ChatCase{"llama3_2", "llama3", "llama3_2.jinja"}),
                         [](const auto& info) { return info.param.name; });

TEST(Jinja, CasesEqualJinja2) {
  const auto rows = read_jsonl(fixture_dir() + "/jinja_cases.jsonl");
  ASSERT_GE(rows.size(), 50u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& row = rows[i];
    const std::string src = row["template"].get<std::string>();
    if (row.contains("error")) {
      EXPECT_THROW(jinja::Template(src, "case").render(row["context"]), Error)
          << "jinja_cases.jsonl line " << i + 1 << ": " << src << " should fail like jinja2 ("
          << row["jinja2_error"].get<std::string>() << ")";
      continue;
    }
    try {
      EXPECT_EQ(jinja::Template(src, "case").render(row["context"]),
                row["expected"].get<std::string>())
          << "jinja_cases.jsonl line " << i + 1 << ": " << src;
    } catch (const Error& e) {
      ADD_FAILURE() << "jinja_cases.jsonl line " << i + 1 << ": " << src
                    << "\n  threw: " << e.what();
    }
  }
}

// The message of the error thrown by rendering `src`.
std::string error_of(const std::string& src,
                     const nlohmann::ordered_json& ctx = nlohmann::ordered_json::object()) {
  try {
    jinja::Template(src, "tmpl").render(ctx);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Jinja, UnsupportedConstructsNameTheConstructAndPosition) {
  EXPECT_NE(error_of("ok\n  {% include 'x.jinja' %}")
                .find("tmpl:2:3: unsupported construct: {% include %}"),
            std::string::npos)
      << error_of("ok\n  {% include 'x.jinja' %}");
  EXPECT_NE(error_of("{{ x | frobnicate }}").find("tmpl:1:8: unsupported filter 'frobnicate'"),
            std::string::npos)
      << error_of("{{ x | frobnicate }}");
  EXPECT_NE(error_of("{% if x is weird %}{% endif %}").find("unsupported test 'weird'"),
            std::string::npos);
  EXPECT_NE(error_of("{% for x in y recursive %}{% endfor %}").find("recursive"),
            std::string::npos);
  EXPECT_NE(
      error_of("{% if x %}never closed").find("expected {% elif %} or {% else %} or {% endif %}"),
      std::string::npos)
      << error_of("{% if x %}never closed");
  EXPECT_NE(error_of("{{ 'unterminated }}").find("unterminated string literal"), std::string::npos);
}

TEST(Jinja, RuntimeErrorsNameWhatFailed) {
  EXPECT_NE(error_of("{{ raise_exception('Only user and assistant roles') }}")
                .find("template raised an exception: Only user and assistant roles"),
            std::string::npos);
  EXPECT_NE(error_of("\n{{ message.content }}").find("tmpl:2:11: 'message' is undefined"),
            std::string::npos)
      << error_of("\n{{ message.content }}");
  EXPECT_NE(
      error_of("{{ 'a' + n }}", {{"n", 1}}).find("can only concatenate str (not \"int\") to str"),
      std::string::npos);
}

// A runaway template stops with an error naming its line instead of a stack overflow (was a
// segfault) or unbounded memory (range(100000000) grew to 6.7 GB).
TEST(Jinja, RenderIsBounded) {
  auto has = [](const std::string& src, const std::string& want) {
    const std::string msg = error_of(src);
    EXPECT_NE(msg.find(want), std::string::npos) << src << "\n  -> " << msg;
  };
  has("{% macro f(x) %}{{ f(x) }}{% endmacro %}\n{{ f(1) }}",
      "tmpl:1:1: macro 'f' nested more than 100 calls deep");
  has("\n{% for i in range(100000000) %}{% endfor %}", "tmpl:2:");
  has("{% for i in range(100000000) %}{% endfor %}",
      "range() of 100000000 items is over the limit of 100000");
  has("{% for i in range(1000) %}\n{% for j in range(1001) %}{% endfor %}{% endfor %}",
      "tmpl:2:1: more than 1000000 loop iterations in one render");
  has("{{ 'ab' * 100000000 }}", "str repeated 100000000 times is over the limit");
  has("{% set ns = namespace(s='x' * 1000000) %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s "
      "%}{% endfor %}",
      "a string grew past 67108864 bytes");
  // Nesting is bounded while parsing (100000 brackets were a stack overflow in the parser, found
  // by tools/fuzz/fuzz_jinja.cpp): brackets, unary operators, chained operands and blocks alike.
  has("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}",
      "tmpl:1:132: expressions or blocks nested more than 256 levels deep");
  has("{{ " + std::string(100000, '-') + "1 }}", "nested more than 256 levels deep");
  std::string chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) chain += " + 1";
  has(chain + " }}", "nested more than 256 levels deep");
  std::string blocks;
  for (int i = 0; i < 1000; ++i) blocks += "{% if true %}";
  has(blocks + "x", "nested more than 256 levels deep");
  // Widths of indent and center are bounded like any string (indent(794565170) ran out of time).
  has("{{ 'a\nb' | indent(794565170) }}", "indent's width grew past 67108864 bytes");
  has("{{ ('x' * 1000 ~ '\n' ~ 'y\n' * 100000) | indent(1000, true) }}",
      "indent's output grew past");
  has("{{ 'x' | center(1000000000) }}", "center's width grew past 67108864 bytes");
  // A template that is not UTF-8 is refused where the broken byte is (string methods walked code
  // points past the end of such a literal: a heap overflow under AddressSanitizer, found by
  // fuzzing).
  has("{{ 'ok' }}\n{{ 'ab\xff\xff'.isalnum() }}", "tmpl:2:7: byte 0xFF is not valid UTF-8");
  // Nesting real templates use is far below the bound, and a macro recursing at depth renders.
  std::string ifs, endifs;
  for (int i = 0; i < 50; ++i) {
    ifs += "{% if true %}";
    endifs += "{% endif %}";
  }
  EXPECT_EQ(jinja::Template(ifs + "{{ " + std::string(60, '(') + "'a' ~ 'b' ~ 'c'" +
                                std::string(60, ')') + " }}" + endifs,
                            "ok")
                .render(nlohmann::ordered_json::object()),
            "abc");
  EXPECT_EQ(
      jinja::Template("{% macro f(n) %}{{ " + std::string(100, '(') + "(f(n - 1) if n > 0 else 0)" +
                          std::string(100, ')') + " }}{% endmacro %}{{ f(99) }}",
                      "ok")
          .render(nlohmann::ordered_json::object()),
      "0");
  // Recursion that ends, ranges and loops of ordinary size still render.
  EXPECT_EQ(
      jinja::Template(
          "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}",
          "ok")
          .render(nlohmann::ordered_json::object()),
      "54321");
  EXPECT_EQ(jinja::Template("{{ range(3, 10, 3) | list }}|{{ 2 ** 10 }}", "ok")
                .render(nlohmann::ordered_json::object()),
            "[3, 6, 9]|1024");
}

TEST(ChatTemplate, TokenizerWithoutTemplateSaysSo) {
  const Tokenizer* tok = real_tokenizer("qwen3");
  ASSERT_NE(tok, nullptr);
  std::ifstream tf(model_dir("qwen3") + "/tokenizer.json");
  const Tokenizer bare =
      Tokenizer::from_json(nlohmann::json::parse(tf), nlohmann::json::object(), "bare");
  EXPECT_FALSE(bare.has_chat_template());
  try {
    bare.apply_chat_template(nlohmann::json::array(), true);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no chat_template"), std::string::npos);
  }
}

// The rendered prompt tokenizes with the template's special tokens as single ids.
TEST(ChatTemplate, RenderedPromptEncodesSpecialTokensAsSingleIds) {
  const Tokenizer* tok = real_tokenizer("qwen3");
  ASSERT_NE(tok, nullptr);
  const std::string text = tok->apply_chat_template(
      nlohmann::json::array({{{"role", "user"}, {"content", "Hi"}}}), true);
  EXPECT_EQ(text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<int32_t> ids = tok->encode(text);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 151644);                            // <|im_start|>
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 151645), 1);  // one <|im_end|>
}

}  // namespace
}  // namespace verl::tokenizer::testing
