// A bound on how deeply JSON text nests, checked before the text is parsed. nlohmann's parser
// keeps its own stack, but dumping, copying and comparing a parsed value recurse once a level:
// a dataset row of 200000 nested brackets overflowed the stack when its extra_info was copied.
// Every JSON a user or a program hands us (datasets, model and tokenizer files, input lines,
// reward-command answers) goes through this first.
#pragma once

#include <string_view>

namespace verl {

// No file we read nests anywhere near this (a tokenizer.json nests 6 levels).
constexpr int kMaxJsonDepth = 512;

// Whether brackets outside strings nest at most kMaxJsonDepth deep; malformed text is left for
// the parser to report.
bool json_depth_ok(std::string_view text);

// Throws a verl::Error naming `where` when json_depth_ok is false.
void check_json_depth(std::string_view text, std::string_view where);

}  // namespace verl
