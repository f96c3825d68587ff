// Normalizers on UTF-8 text through ICU's Normalizer2 (see normalizer.h). Pure ASCII input is
// unchanged by every normalization form, which skips ICU for most text.
#include "tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include "core/error.h"

namespace verl::tokenizer {

namespace {

void parse_into(const nlohmann::json& cfg, const std::string& where,
                std::vector<Normalizer::Kind>& steps) {
  VERL_CHECK(cfg.is_object() && cfg.contains("type") && cfg["type"].is_string(),
             "{}: normalizer must be an object with a string \"type\", got {}", where, cfg.dump());
  const std::string type = cfg["type"];
  if (type == "NFC") {
    steps.push_back(Normalizer::Kind::kNfc);
  } else if (type == "NFD") {
    steps.push_back(Normalizer::Kind::kNfd);
  } else if (type == "NFKC") {
    steps.push_back(Normalizer::Kind::kNfkc);
  } else if (type == "NFKD") {
    steps.push_back(Normalizer::Kind::kNfkd);
  } else if (type == "Lowercase") {
    steps.push_back(Normalizer::Kind::kLowercase);
  } else if (type == "Sequence") {
    VERL_CHECK(cfg.contains("normalizers") && cfg["normalizers"].is_array(),
               "{}: Sequence normalizer needs a \"normalizers\" array", where);
    for (const auto& sub : cfg["normalizers"]) parse_into(sub, where, steps);
  } else {
    VERL_FAIL(
        "{}: unsupported normalizer type \"{}\" (supported: NFC, NFD, NFKC, NFKD, Lowercase, "
        "Sequence)",
        where, type);
  }
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

const icu::Normalizer2* instance(Normalizer::Kind k) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (k) {
    case Normalizer::Kind::kNfc:
      n = icu::Normalizer2::getNFCInstance(err);
      break;
    case Normalizer::Kind::kNfd:
      n = icu::Normalizer2::getNFDInstance(err);
      break;
    case Normalizer::Kind::kNfkc:
      n = icu::Normalizer2::getNFKCInstance(err);
      break;
    case Normalizer::Kind::kNfkd:
      n = icu::Normalizer2::getNFKDInstance(err);
      break;
    default:
      break;
  }
  VERL_CHECK(U_SUCCESS(err) && n, "ICU: cannot get a normalizer instance: {}", u_errorName(err));
  return n;
}

// One step; returns false when the text is unchanged.
bool apply_one(Normalizer::Kind k, std::string_view in, std::string& out) {
  if (k == Normalizer::Kind::kLowercase) {
    bool any_upper = false;
    for (char c : in) {
      const auto u = static_cast<unsigned char>(c);
      if (u >= 0x80 || (u >= 'A' && u <= 'Z')) any_upper = true;
    }
    if (!any_upper) return false;
    icu::UnicodeString s = icu::UnicodeString::fromUTF8(icu::StringPiece(in.data(), in.size()));
    s.toLower(icu::Locale::getRoot());
    out.clear();
    s.toUTF8String(out);
    return out != in;
  }
  if (is_ascii(in)) return false;
  const icu::Normalizer2* n = instance(k);
  UErrorCode err = U_ZERO_ERROR;
  const icu::StringPiece sp(in.data(), static_cast<int32_t>(in.size()));
  if (n->isNormalizedUTF8(sp, err) && U_SUCCESS(err)) return false;
  err = U_ZERO_ERROR;
  out.clear();
  icu::StringByteSink<std::string> sink(&out);
  n->normalizeUTF8(0, sp, sink, nullptr, err);
  VERL_CHECK(U_SUCCESS(err), "ICU normalization failed: {}", u_errorName(err));
  return true;
}

}  // namespace

Normalizer Normalizer::from_json(const nlohmann::json& config, const std::string& where) {
  Normalizer n;
  if (!config.is_null()) parse_into(config, where, n.steps_);
  return n;
}

bool Normalizer::apply(std::string_view text, std::string& out) const {
  bool changed = false;
  std::string tmp;
  for (Kind k : steps_) {
    const std::string_view cur = changed ? std::string_view(out) : text;
    if (apply_one(k, cur, tmp)) {
      out.swap(tmp);
      changed = true;
    }
  }
  return changed;
}

}  // namespace verl::tokenizer
