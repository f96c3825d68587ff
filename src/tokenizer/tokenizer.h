// Hugging Face tokenizers for verl.cpp: loads tokenizer.json + tokenizer_config.json of byte-level
// BPE models (Qwen2/2.5/3, Llama-3), encodes and decodes exactly as HF does, renders the model's
// Jinja chat template, and streams decoded text without splitting UTF-8 characters.
//
//   auto tok = verl::tokenizer::Tokenizer::load("/models/Qwen3-8B");
//   std::string prompt = tok.apply_chat_template(messages, /*add_generation_prompt=*/true);
//   std::vector<int32_t> ids = tok.encode(prompt);
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace verl::tokenizer {

class BpeModel;
class AddedVocab;
class Normalizer;
class PreTokenizer;
class ChatTemplate;

// DIR/tokenizer_config.json (an empty object when there is none), with DIR/chat_template.jinja as
// its chat_template when it names none: the configuration Tokenizer::load reads.
nlohmann::json load_tokenizer_config(const std::string& dir);

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json (special tokens, chat
  // template; DIR/chat_template.jinja is used when the config has no template).
  static Tokenizer load(const std::string& dir);
  // The same from the files' parsed contents; `where` names the source in error messages.
  static Tokenizer from_json(const nlohmann::json& tokenizer_json,
                             const nlohmann::json& tokenizer_config, const std::string& where);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Ids of `text` (which must be valid UTF-8), without any BOS/EOS: special tokens written in the
  // text are recognised, as HF's encode(text, add_special_tokens=False) does. Thread-safe.
  std::vector<int32_t> encode(std::string_view text) const;

  // Text of `ids`. Invalid UTF-8 becomes U+FFFD. The config's clean_up_tokenization_spaces is
  // applied, as transformers' decode() does; the second overload chooses it explicitly. Ids at or
  // past vocab_size() (a padded embedding's extra rows) have no text and are skipped, as in HF.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens,
                     bool clean_up_tokenization_spaces) const;

  // Renders the chat template with `messages` (a JSON array of {"role", "content", ...}),
  // bos/eos/pad/unk tokens and `extra` (an object of more template variables such as "tools",
  // "enable_thinking" or "date_string"), as transformers' apply_chat_template(tokenize=False).
  std::string apply_chat_template(const nlohmann::json& messages, bool add_generation_prompt,
                                  const nlohmann::json& extra = nlohmann::json::object()) const;
  // The same with insertion-ordered JSON: dict key order shows in `tojson` output, so callers that
  // parse user input (the CLI, tests) keep the order that Python would.
  std::string apply_chat_template(const nlohmann::ordered_json& messages,
                                  bool add_generation_prompt,
                                  const nlohmann::ordered_json& extra) const;
  bool has_chat_template() const { return chat_template_ != nullptr; }
  // Replaces the chat template (verl's model.custom_chat_template: a Jinja source used instead of
  // the tokenizer's own). A template that does not parse is an error naming `where`.
  void set_chat_template(const std::string& source, const std::string& where);

  int32_t eos_token_id() const { return eos_id_; }
  int32_t bos_token_id() const { return bos_id_; }  // -1 when the model has none (Qwen)
  // The config's pad token; when it has none, the EOS id (what verl sets up for such models).
  int32_t pad_token_id() const { return pad_id_ >= 0 ? pad_id_ : eos_id_; }
  // Number of ids: the model's vocabulary and the added tokens (HF's len(tokenizer)).
  int64_t vocab_size() const { return vocab_size_; }

  int32_t token_to_id(std::string_view token) const;  // -1 if unknown
  std::string id_to_token(int32_t id) const;          // the token string as in tokenizer.json
  bool is_special(int32_t id) const;
  // The raw bytes that id contributes to decoded text (may be part of a UTF-8 character).
  const std::string& token_bytes(int32_t id) const;

 private:
  Tokenizer();
  // from_json's body; from_json turns JSON type errors into errors naming the file.
  static Tokenizer build(const nlohmann::json& tokenizer_json,
                         const nlohmann::json& tokenizer_config, const std::string& where);
  void encode_segment(std::string_view text, std::vector<int32_t>& ids) const;
  void encode_normalized(std::string_view text, std::vector<int32_t>& ids) const;

  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<AddedVocab> added_;
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<ChatTemplate> chat_template_;
  std::vector<std::string> id_bytes_;  // decoded bytes per id
  std::vector<uint8_t> special_;       // 1 for special added tokens
  int32_t eos_id_ = -1, bos_id_ = -1, pad_id_ = -1, unk_id_ = -1;
  int64_t vocab_size_ = 0;
  bool clean_up_spaces_ = false;
  nlohmann::json special_tokens_map_;  // bos_token, eos_token, ... as strings, for templates
  std::string where_;
};

// Streaming detokenizer: feed ids one at a time, get back only text made of whole UTF-8
// characters. The concatenated output (with finish()) equals decode(ids, skip, false).
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  // Text that became complete with this id (possibly empty).
  std::string push(int32_t id);
  // The bytes still held back (an unfinished character), as U+FFFD; resets the decoder.
  std::string finish();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;
};

// Applies transformers' clean_up_tokenization (" ." -> ".", " n't" -> "n't", ...).
std::string clean_up_tokenization(std::string text);

}  // namespace verl::tokenizer
