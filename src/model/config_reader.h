// Typed reads of one config.json object, shared by the generic parser (model/config.cpp) and the
// family files (model/arch/): a key that is absent or null counts as absent (HF writes null for
// unset optional fields); a present key of the wrong type is an error naming file, key and type.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"

namespace verl::model {

class ConfigReader {
 public:
  // `prefix` is prepended to key names in errors (e.g. "rope_scaling.").
  ConfigReader(const nlohmann::json& j, const std::string& source, std::string prefix = "")
      : j_(j), source_(source), prefix_(std::move(prefix)) {}

  const std::string& source() const { return source_; }
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  const nlohmann::json& at(const char* key) const { return j_[key]; }

  int64_t get_int(const char* key) const {
    VERL_CHECK(has(key), "{}: missing required key '{}{}' (an integer)", source_, prefix_, key);
    return as_int(j_[key], key);
  }
  int64_t get_int(const char* key, int64_t def) const { return has(key) ? get_int(key) : def; }
  int64_t get_positive_int(const char* key) const {
    int64_t v = get_int(key);
    VERL_CHECK(v > 0, "{}: key '{}{}' must be positive, got {}", source_, prefix_, key, v);
    return v;
  }

  double get_double(const char* key) const {
    VERL_CHECK(has(key), "{}: missing required key '{}{}' (a number)", source_, prefix_, key);
    const nlohmann::json& v = j_[key];
    VERL_CHECK(v.is_number(), "{}: key '{}{}' must be a number, got {} {}", source_, prefix_, key,
               v.type_name(), v.dump());
    return v.get<double>();
  }
  double get_double(const char* key, double def) const { return has(key) ? get_double(key) : def; }

  bool get_bool(const char* key, bool def) const {
    if (!has(key)) return def;
    const nlohmann::json& v = j_[key];
    VERL_CHECK(v.is_boolean(), "{}: key '{}{}' must be a boolean, got {} {}", source_, prefix_, key,
               v.type_name(), v.dump());
    return v.get<bool>();
  }

  std::string get_string(const char* key, const std::string& def) const {
    if (!has(key)) return def;
    const nlohmann::json& v = j_[key];
    VERL_CHECK(v.is_string(), "{}: key '{}{}' must be a string, got {} {}", source_, prefix_, key,
               v.type_name(), v.dump());
    return v.get<std::string>();
  }

  int64_t as_int(const nlohmann::json& v, const std::string& key) const {
    VERL_CHECK(v.is_number_integer(), "{}: key '{}{}' must be an integer, got {} {}", source_,
               prefix_, key, v.type_name(), v.dump());
    VERL_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX),
               "{}: key '{}{}' value {} is too large", source_, prefix_, key, v.dump());
    return v.get<int64_t>();
  }

 private:
  const nlohmann::json& j_;
  const std::string& source_;
  std::string prefix_;
};

}  // namespace verl::model
