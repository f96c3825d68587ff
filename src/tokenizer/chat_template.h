// The chat template of a tokenizer: a parsed Jinja template rendered with the conversation.
// Kept as its own class so that tokenizer.h does not expose the interpreter.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tokenizer/jinja.h"

namespace verl::tokenizer {

class ChatTemplate {
 public:
  ChatTemplate(const std::string& source, const std::string& name) : template_(source, name) {}
  std::string render(const nlohmann::ordered_json& context) const {
    return template_.render(context);
  }

 private:
  jinja::Template template_;
};

}  // namespace verl::tokenizer
