// Tokenizer loading, encoding and decoding (see tokenizer.h). The encode pipeline is HF
// tokenizers': cut out added tokens on the raw text, normalize the rest, cut out added tokens that
// match normalized text, pre-tokenize into words, BPE each word.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/file.h"
#include "core/json_depth.h"
#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

namespace verl::tokenizer {

namespace {

nlohmann::json read_json(const std::string& path) {
  const std::string text = read_file(path, "tokenizer file");
  check_json_depth(text, path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    VERL_FAIL("{}: malformed JSON: {}", path, e.what());
  }
}

// A special token entry of tokenizer_config.json: a string, an AddedToken object
// ({"content": ...}) or null. Returns "" when absent.
std::string token_string(const nlohmann::json& cfg, const char* key, const std::string& where) {
  if (!cfg.contains(key) || cfg[key].is_null()) return "";
  const auto& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  VERL_FAIL("{}: \"{}\" must be a string or an object with \"content\", got {}", where, key,
            v.dump());
}

// The ByteLevel decoder's view of one token: the bytes its characters stand for, or the token's
// own UTF-8 when a character is outside the byte-level alphabet (HF's ByteLevel::decode_chain).
std::string byte_level_bytes(const std::string& token) {
  const ByteLevelAlphabet& alpha = ByteLevelAlphabet::get();
  if (find_invalid_utf8(token) != kUtf8Valid) return token;
  std::string out;
  size_t pos = 0;
  while (pos < token.size()) {
    const int b = alpha.byte_of(next_code_point(token, pos));
    if (b < 0) return token;
    out.push_back(static_cast<char>(b));
  }
  return out;
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

nlohmann::json load_tokenizer_config(const std::string& dir) {
  namespace fs = std::filesystem;
  nlohmann::json config = nlohmann::json::object();
  const fs::path tc = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(tc)) config = read_json(tc.string());
  VERL_CHECK(config.is_object(), "{}: must hold a JSON object", tc.string());
  // transformers >= 4.43 may keep the template in its own file.
  const fs::path jinja_file = fs::path(dir) / "chat_template.jinja";
  if (!config.contains("chat_template") && fs::exists(jinja_file)) {
    std::ifstream f(jinja_file, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    config["chat_template"] = ss.str();
  }
  return config;
}

Tokenizer Tokenizer::load(const std::string& dir) {
  const std::filesystem::path tj = std::filesystem::path(dir) / "tokenizer.json";
  VERL_CHECK(std::filesystem::exists(tj),
             "{}: no tokenizer.json in this directory (only HF "
             "fast-tokenizer files are supported)",
             dir);
  const nlohmann::json config = load_tokenizer_config(dir);
  return from_json(read_json(tj.string()), config, tj.string());
}

Tokenizer Tokenizer::from_json(const nlohmann::json& tj, const nlohmann::json& config_in,
                               const std::string& where) {
  // The checks below name what they expect; a value of another JSON type that slips past them
  // still becomes an error naming the file, not nlohmann's bare message.
  try {
    return build(tj, config_in, where);
  } catch (const nlohmann::json::exception& e) {
    VERL_FAIL("{} (or its tokenizer_config.json): a value of an unexpected type: {}", where,
              e.what());
  }
}

Tokenizer Tokenizer::build(const nlohmann::json& tj, const nlohmann::json& config_in,
                           const std::string& where) {
  VERL_CHECK(tj.is_object(), "{}: must hold a JSON object", where);
  VERL_CHECK(config_in.is_object() || config_in.is_null(),
             "tokenizer_config.json: must hold a JSON object");
  const nlohmann::json config = config_in.is_null() ? nlohmann::json::object() : config_in;
  Tokenizer t;
  t.where_ = where;
  VERL_CHECK(tj.contains("model"), "{}: missing key \"model\"", where);
  t.model_ = BpeModel::from_json(tj["model"], where);
  t.normalizer_ = std::make_unique<Normalizer>(
      Normalizer::from_json(tj.value("normalizer", nlohmann::json()), where));
  t.pre_tokenizer_ = std::make_unique<PreTokenizer>(
      PreTokenizer::from_json(tj.value("pre_tokenizer", nlohmann::json()), where));
  VERL_CHECK(t.pre_tokenizer_->has_byte_level(),
             "{}: pre_tokenizer has no ByteLevel step; only byte-level BPE tokenizers are "
             "supported",
             where);
  if (tj.contains("decoder") && !tj["decoder"].is_null()) {
    const auto& d = tj["decoder"];
    const std::string type = d.value("type", std::string());
    VERL_CHECK(type == "ByteLevel", "{}: unsupported decoder type \"{}\" (supported: ByteLevel)",
               where, type);
  }

  // Added tokens: tokenizer.json's list, then any extra ones of tokenizer_config.json.
  t.added_ = std::make_unique<AddedVocab>();
  auto add_from = [&](const nlohmann::json& e, int64_t id, const std::string& ctx) {
    VERL_CHECK(e.is_object() && e.contains("content") && e["content"].is_string(),
               "{}: added token must be an object with a string \"content\", got {}", ctx,
               e.dump());
    VERL_CHECK(id >= 0 && id < kMaxTokenId, "{}: the id must be in [0, {}), got {}", ctx,
               kMaxTokenId, id);
    const auto flag = [&](const char* key, bool dflt) {
      if (!e.contains(key) || e[key].is_null()) return dflt;
      VERL_CHECK(e[key].is_boolean(), "{}: \"{}\" must be true or false, got {}", ctx, key,
                 e[key].dump());
      return e[key].get<bool>();
    };
    AddedToken a;
    a.id = static_cast<int32_t>(id);
    a.content = e["content"].get<std::string>();
    a.special = flag("special", false);
    a.lstrip = flag("lstrip", false);
    a.rstrip = flag("rstrip", false);
    a.normalized = flag("normalized", !a.special);
    a.single_word = flag("single_word", false);
    t.added_->add(a);
  };
  if (tj.contains("added_tokens")) {
    VERL_CHECK(tj["added_tokens"].is_array(), "{}: \"added_tokens\" must be an array", where);
    size_t i = 0;
    for (const auto& e : tj["added_tokens"]) {
      const std::string ctx = fmt::format("{}: added_tokens[{}]", where, i++);
      VERL_CHECK(e.contains("id") && e["id"].is_number_integer(), "{}: needs an integer \"id\"",
                 ctx);
      add_from(e, e["id"].get<int64_t>(), ctx);
    }
  }
  if (config.contains("added_tokens_decoder") && config["added_tokens_decoder"].is_object()) {
    for (auto it = config["added_tokens_decoder"].begin();
         it != config["added_tokens_decoder"].end(); ++it) {
      int64_t id = -1;
      try {
        id = std::stoll(it.key());
      } catch (...) {
        VERL_FAIL("{}: added_tokens_decoder key \"{}\" is not an integer id", where, it.key());
      }
      VERL_CHECK(id >= 0 && id < kMaxTokenId,
                 "tokenizer_config.json: added_tokens_decoder[\"{}\"]: the id "
                 "must be in [0, {})",
                 it.key(), kMaxTokenId);
      if (!t.added_->by_id(static_cast<int32_t>(id)))
        add_from(it.value(), id,
                 fmt::format("tokenizer_config.json: added_tokens_decoder[{}]", id));
    }
  }
  t.added_->build(config.value("split_special_tokens", false));

  // Per-id decoded bytes and special flags.
  int64_t n = t.model_->size();
  for (const AddedToken& a : t.added_->tokens()) n = std::max<int64_t>(n, a.id + 1);
  t.vocab_size_ = n;
  t.id_bytes_.assign(static_cast<size_t>(n), std::string());
  t.special_.assign(static_cast<size_t>(n), 0);
  for (int64_t id = 0; id < t.model_->size(); ++id)
    t.id_bytes_[static_cast<size_t>(id)] =
        byte_level_bytes(t.model_->id_to_token(static_cast<int32_t>(id)));
  for (const AddedToken& a : t.added_->tokens()) {
    t.id_bytes_[static_cast<size_t>(a.id)] = byte_level_bytes(a.content);
    t.special_[static_cast<size_t>(a.id)] = a.special ? 1 : 0;
  }

  // Special tokens of the config.
  const std::string cfg_where = "tokenizer_config.json";
  t.special_tokens_map_ = nlohmann::json::object();
  auto resolve = [&](const char* key) {
    const std::string s = token_string(config, key, cfg_where);
    if (s.empty()) return -1;
    t.special_tokens_map_[key] = s;
    const int32_t id = t.token_to_id(s);
    VERL_CHECK(id >= 0, "{}: {} \"{}\" is not a token of {}", cfg_where, key, s, where);
    return id;
  };
  t.bos_id_ = resolve("bos_token");
  t.eos_id_ = resolve("eos_token");
  t.pad_id_ = resolve("pad_token");
  t.unk_id_ = resolve("unk_token");
  if (config.contains("additional_special_tokens") &&
      config["additional_special_tokens"].is_array()) {
    nlohmann::json extra = nlohmann::json::array();
    for (const auto& e : config["additional_special_tokens"]) {
      if (e.is_string())
        extra.push_back(e);
      else if (e.is_object() && e.contains("content"))
        extra.push_back(e["content"]);
    }
    t.special_tokens_map_["additional_special_tokens"] = extra;
  }
  t.clean_up_spaces_ = config.value("clean_up_tokenization_spaces", false);

  if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    const auto& ct = config["chat_template"];
    std::string source;
    if (ct.is_string()) {
      source = ct.get<std::string>();
    } else if (ct.is_array()) {  // [{"name": "default", "template": ...}, ...]
      for (const auto& e : ct)
        if (e.is_object() && e.value("name", std::string()) == "default")
          source = e.value("template", std::string());
      VERL_CHECK(!source.empty(), "{}: chat_template list has no entry named \"default\"",
                 cfg_where);
    } else {
      VERL_FAIL("{}: chat_template must be a string or a list of named templates", cfg_where);
    }
    t.chat_template_ = std::make_unique<ChatTemplate>(source, "chat_template");
  }
  return t;
}

void Tokenizer::set_chat_template(const std::string& source, const std::string& where) {
  chat_template_ = std::make_unique<ChatTemplate>(source, where);
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  const int32_t a = added_->id_of(token);
  return a >= 0 ? a : model_->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (const AddedToken* a = added_->by_id(id)) return a->content;
  return model_->id_to_token(id);
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size_ && special_[static_cast<size_t>(id)];
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  VERL_CHECK(id >= 0 && id < vocab_size_, "token id {} is out of range [0, {})", id, vocab_size_);
  return id_bytes_[static_cast<size_t>(id)];
}

void Tokenizer::encode_normalized(std::string_view text, std::vector<int32_t>& ids) const {
  thread_local std::vector<std::string_view> words;
  thread_local std::deque<std::string> storage;
  words.clear();
  storage.clear();
  pre_tokenizer_->split(text, words, storage);
  for (std::string_view w : words) model_->encode_word(w, ids);
}

void Tokenizer::encode_segment(std::string_view text, std::vector<int32_t>& ids) const {
  if (text.empty()) return;
  std::string normalized;
  const std::string_view norm =
      normalizer_->apply(text, normalized) ? std::string_view(normalized) : text;
  if (!added_->has(true)) {
    encode_normalized(norm, ids);
    return;
  }
  std::vector<AddedVocab::Match> matches;
  added_->find(norm, true, matches);
  size_t prev = 0;
  for (const auto& m : matches) {
    if (m.begin > prev) encode_normalized(norm.substr(prev, m.begin - prev), ids);
    ids.push_back(m.id);
    prev = m.end;
  }
  if (prev < norm.size()) encode_normalized(norm.substr(prev), ids);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  const size_t bad = find_invalid_utf8(text);
  VERL_CHECK(bad == kUtf8Valid, "encode: input is not valid UTF-8 (byte 0x{:02X} at offset {})",
             static_cast<uint8_t>(text[bad]), bad);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  std::vector<AddedVocab::Match> matches;
  added_->find(text, false, matches);
  size_t prev = 0;
  for (const auto& m : matches) {
    encode_segment(text.substr(prev, m.begin - prev), ids);
    ids.push_back(m.id);
    prev = m.end;
  }
  encode_segment(text.substr(prev), ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return decode(ids, skip_special_tokens, clean_up_spaces_);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens,
                              bool clean_up_tokenization_spaces) const {
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    VERL_CHECK(id >= 0, "decode: ids[{}] = {} is negative", i, id);
    // An id past the tokenizer (a model's embedding is often padded: Qwen2.5 has 151936 rows for
    // 151665 tokens) has no text; HF's decode skips it too.
    if (id >= vocab_size_) continue;
    if (skip_special_tokens && special_[static_cast<size_t>(id)]) continue;
    bytes += id_bytes_[static_cast<size_t>(id)];
  }
  std::string text = find_invalid_utf8(bytes) == kUtf8Valid ? std::move(bytes) : utf8_lossy(bytes);
  if (clean_up_tokenization_spaces) text = clean_up_tokenization(std::move(text));
  return text;
}

std::string Tokenizer::apply_chat_template(const nlohmann::json& messages,
                                           bool add_generation_prompt,
                                           const nlohmann::json& extra) const {
  return apply_chat_template(nlohmann::ordered_json(messages), add_generation_prompt,
                             nlohmann::ordered_json(extra));
}

std::string Tokenizer::apply_chat_template(const nlohmann::ordered_json& messages,
                                           bool add_generation_prompt,
                                           const nlohmann::ordered_json& extra) const {
  VERL_CHECK(chat_template_ != nullptr, "{}: the tokenizer has no chat_template", where_);
  VERL_CHECK(messages.is_array(), "apply_chat_template: messages must be a JSON array, got {}",
             messages.type_name());
  VERL_CHECK(extra.is_object() || extra.is_null(),
             "apply_chat_template: extra variables must be a JSON object");
  // transformers passes the special tokens map, then the caller's variables.
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  for (auto it = special_tokens_map_.begin(); it != special_tokens_map_.end(); ++it)
    ctx[it.key()] = nlohmann::ordered_json(it.value());
  ctx["messages"] = messages;
  ctx["add_generation_prompt"] = add_generation_prompt;
  if (extra.is_object())
    for (auto it = extra.begin(); it != extra.end(); ++it) ctx[it.key()] = it.value();
  return chat_template_->render(ctx);
}

std::string clean_up_tokenization(std::string text) {
  // transformers' PreTrainedTokenizerBase.clean_up_tokenization, replacement by replacement.
  static const std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (auto [from, to] : kRules) {
    if (text.find(from) == std::string::npos) continue;
    std::string out;
    out.reserve(text.size());
    size_t pos = 0;
    while (true) {
      const size_t hit = text.find(from, pos);
      if (hit == std::string::npos) break;
      out.append(text, pos, hit - pos);
      out.append(to);
      pos = hit + from.size();
    }
    out.append(text, pos, std::string::npos);
    text.swap(out);
  }
  return text;
}

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_(skip_special_tokens) {}

std::string IncrementalDecoder::push(int32_t id) {
  if (skip_special_ && tokenizer_->is_special(id)) return "";
  if (id >= tokenizer_->vocab_size()) return "";  // no text, as in decode()
  pending_ += tokenizer_->token_bytes(id);
  // Emit everything except a trailing sequence that the next token may still complete.
  const size_t keep = incomplete_utf8_suffix(pending_);
  const std::string_view ready(pending_.data(), pending_.size() - keep);
  std::string out = find_invalid_utf8(ready) == kUtf8Valid ? std::string(ready) : utf8_lossy(ready);
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string IncrementalDecoder::finish() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace verl::tokenizer
