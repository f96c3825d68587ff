// `verl tokenize`: JSON lines in, JSON lines out, through a HF tokenizer directory.
//   {"text": "..."}                              -> {"ids": [...]}
//   --decode  {"ids": [...]}                     -> {"text": "..."}
//   --chat    {"messages": [...], "add_generation_prompt": true, ...}  -> {"text": ..., "ids":
//   [...]}
// In --chat mode every other key of the line (tools, enable_thinking, ...) is a template variable.
#include <fstream>
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "core/error.h"
#include "core/file.h"
#include "core/json_depth.h"
#include "tokenizer/tokenizer.h"

namespace verl::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer_dir;
  std::string input;  // empty or "-": stdin
  bool decode = false;
  bool chat = false;
  bool skip_special_tokens = false;
};

std::string dump(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

nlohmann::ordered_json process_line(const tokenizer::Tokenizer& tok, const TokenizeOptions& o,
                                    const nlohmann::ordered_json& row) {
  VERL_CHECK(row.is_object(), "expected a JSON object, got {}", row.type_name());
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  if (o.decode) {
    VERL_CHECK(row.contains("ids") && row["ids"].is_array(),
               "expected key \"ids\" with an array of token ids");
    std::vector<int32_t> ids;
    for (size_t i = 0; i < row["ids"].size(); ++i) {
      const auto& v = row["ids"][i];
      VERL_CHECK(v.is_number_integer(), "ids[{}] is not an integer: {}", i, v.dump());
      const int64_t id = v.get<int64_t>();
      VERL_CHECK(id >= 0 && id <= INT32_MAX, "ids[{}] = {} is not a token id", i, id);
      ids.push_back(static_cast<int32_t>(id));
    }
    out["text"] = tok.decode(ids, o.skip_special_tokens);
  } else if (o.chat) {
    VERL_CHECK(row.contains("messages") && row["messages"].is_array(),
               "expected key \"messages\" with an array");
    VERL_CHECK(!row.contains("add_generation_prompt") || row["add_generation_prompt"].is_boolean(),
               "\"add_generation_prompt\" must be true or false, got {}",
               dump(row["add_generation_prompt"]));
    const bool gen = row.value("add_generation_prompt", true);
    nlohmann::ordered_json extra = nlohmann::ordered_json::object();
    for (auto it = row.begin(); it != row.end(); ++it)
      if (it.key() != "messages" && it.key() != "add_generation_prompt")
        extra[it.key()] = it.value();
    const std::string text = tok.apply_chat_template(row["messages"], gen, extra);
    out["text"] = text;
    out["ids"] = tok.encode(text);
  } else {
    VERL_CHECK(row.contains("text") && row["text"].is_string(),
               "expected key \"text\" with a string");
    out["ids"] = tok.encode(row["text"].get_ref<const std::string&>());
  }
  return out;
}

int run(const TokenizeOptions& o) {
  VERL_CHECK(!(o.decode && o.chat), "--decode and --chat cannot be used together");
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(o.tokenizer_dir);
  std::ifstream file;
  const bool from_stdin = o.input.empty() || o.input == "-";
  if (!from_stdin) {
    open_for_reading(file, o.input, "--input", std::ios::binary);
  }
  std::istream& in = from_stdin ? std::cin : file;
  const std::string source = from_stdin ? "<stdin>" : o.input;
  std::string line;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;  // blank lines
    const std::string where = fmt::format("{}:{}", source, lineno);
    check_json_depth(line, where);
    nlohmann::ordered_json row;
    try {
      row = nlohmann::ordered_json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      VERL_FAIL("{}: malformed JSON: {}", where, e.what());
    }
    try {
      std::cout << dump(process_line(tok, o, row)) << '\n';
    } catch (const Error& e) {
      VERL_FAIL("{}: {}", where, e.what());
    }
  }
  std::cout.flush();
  return 0;
}

const Command kTokenize(
    "tokenize", "Encode, decode or chat-render JSON lines with a HF tokenizer", [](CLI::App& app) {
      auto o = std::make_shared<TokenizeOptions>();
      app.add_option("--tokenizer", o->tokenizer_dir,
                     "Directory with tokenizer.json and tokenizer_config.json")
          ->required();
      app.add_option("--input", o->input, "JSON-lines input file (default: stdin)");
      app.add_flag("--decode", o->decode, "Map {\"ids\": [...]} to {\"text\": ...}");
      app.add_flag(
          "--chat", o->chat,
          "Map {\"messages\": [...], \"add_generation_prompt\": bool} to {\"text\", \"ids\"}");
      app.add_flag("--skip-special-tokens", o->skip_special_tokens,
                   "With --decode: drop special tokens");
      return [o] { return run(*o); };
    });

}  // namespace
}  // namespace verl::cli
