// Internal helpers of the config module shared by the schema builder and the loader: scalar
// parsing, conversion of YAML nodes and JSON values to a key's type, value checks and the
// ${...} interpolation resolver. Not part of the public API.
#pragma once

#include <yaml-cpp/yaml.h>

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "config/schema.h"

namespace verl::config::detail {

// A problem with a configuration value. The loader collects these and reports them together, so a
// ported config shows every problem in one run; the message is complete on its own.
struct Issue : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void raise(std::string msg);
// A value too large to expand (generic's bound); the caller adds where it was written.
struct TooLarge : Issue {
  using Issue::Issue;
};

bool is_null_text(const std::string& s);
std::optional<bool> parse_bool(const std::string& s);
std::optional<int64_t> parse_int(const std::string& s);
std::optional<double> parse_float(const std::string& s);

// A YAML scalar written with quotes is always a string.
bool is_quoted(const YAML::Node& n);

// YAML -> JSON without a schema: plain scalars become null/bool/int/float/string by their text.
// A value expanding past 2^16 nodes or 256 levels (nested aliases) throws TooLarge.
Json generic(const YAML::Node& n);

// YAML -> the key's type. `origin` says where the value came from (file:line or command line).
Json convert_node(const YAML::Node& n, const KeySpec& spec, const std::string& origin);
// JSON (an interpolation result) -> the key's type.
Json convert_json(const Json& v, const KeySpec& spec, const std::string& origin);
// Allowed values, verl-only values and numeric bounds.
void check_value(const Json& v, const KeySpec& spec, const std::string& origin);

// Shortest text of a double that reads back the same, always with a '.' in the mantissa
// (1.0e-06) so YAML 1.1 readers see a float too.
std::string format_float(double d);
// Text of a scalar as YAML would print it (for messages and string interpolation).
std::string scalar_text(const Json& v);
// Short rendering of any value for messages: 5, "abc", [a, b], {...}.
std::string show(const Json& v);

// The value of every leaf of a schema while a config is being built: either final or an
// interpolation string still to resolve.
struct Slot {
  Json value;
  std::string interp;  // the ${...} text while pending
  bool pending = false;
  bool resolving = false;  // cycle detection
  bool explicit_set = false;
  std::string origin = "defaults";
};

// True when s contains a ${...} interpolation.
bool has_interpolation(const std::string& s);

// Resolves every pending slot in place. `schema` gives the keys (indices match `slots`);
// `index_of` maps a path to its key index (or -1). Problems are passed to `report`.
void resolve_all(const std::vector<KeySpec>& keys,
                 const std::function<long(const std::string&)>& index_of,
                 const std::function<std::string(const std::string&)>& suggest,
                 std::vector<Slot>& slots, const std::function<void(const std::string&)>& report);

// The path an interpolation refers to, made absolute against the key that holds it
// (".x" is a sibling, "..x" a sibling of the parent). `expr` is the text inside ${ }.
struct RefExpr {
  std::string path;                     // absolute path ("" for oc.env)
  bool select = false;                  // oc.select: a missing key gives the default
  std::optional<std::string> fallback;  // the default text of oc.select / oc.env
  std::string env;                      // oc.env variable name
};
RefExpr parse_ref(const std::string& expr, const std::string& holder_path);
// If s is exactly one ${...}, the text inside it.
std::optional<std::string> whole_interpolation(const std::string& s);

}  // namespace verl::config::detail
