// Pre-tokenizers (see pre_tokenizer.h), following the semantics of HF tokenizers' Split and
// ByteLevel: Split cuts at regex matches according to the delimiter behavior; ByteLevel prepends a
// space to every word that lacks one when add_prefix_space is set, then splits with GPT-2's regex
// when use_regex is set.
#include "tokenizer/pre_tokenizer.h"

#include "core/error.h"

namespace verl::tokenizer {

namespace {

// GPT-2's pre-tokenization pattern, used by ByteLevel when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

SplitBehavior parse_behavior(const nlohmann::json& v, const std::string& where) {
  VERL_CHECK(v.is_string(), "{}: Split \"behavior\" must be a string", where);
  const std::string b = v;
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  VERL_FAIL("{}: unknown Split behavior \"{}\"", where, b);
}

bool get_bool(const nlohmann::json& cfg, const char* key, bool dflt) {
  if (!cfg.contains(key) || cfg[key].is_null()) return dflt;
  return cfg[key].get<bool>();
}

// Cuts `text` at the matches of `re` and groups the parts by `behavior` (HF's
// NormalizedString::split).
void split_by(std::string_view text, const Regex& re, SplitBehavior behavior, bool invert,
              std::vector<std::string_view>& out) {
  thread_local std::vector<std::pair<size_t, size_t>> matches;
  matches.clear();
  re.find_all(text, matches);
  // Parts covering the text: (begin, end, is_delimiter).
  struct Part {
    size_t b, e;
    bool delim;
  };
  thread_local std::vector<Part> parts;
  parts.clear();
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (b > prev) parts.push_back({prev, b, invert});
    parts.push_back({b, e, !invert});
    prev = e;
  }
  if (prev < text.size()) parts.push_back({prev, text.size(), invert});

  auto emit = [&](size_t b, size_t e) {
    if (e > b) out.push_back(text.substr(b, e - b));
  };
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Part& p : parts) emit(p.b, p.e);
      break;
    case SplitBehavior::kRemoved:
      for (const Part& p : parts)
        if (!p.delim) emit(p.b, p.e);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      // A delimiter joins the part before it.
      size_t start = 0;
      bool open = false;
      for (const Part& p : parts) {
        if (p.delim) {
          emit(open ? start : p.b, p.e);
          open = false;
        } else {
          if (open) emit(start, p.b);  // two plain parts in a row (inverted split)
          start = p.b;
          open = true;
        }
      }
      if (open) emit(start, text.size());
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      // A delimiter joins the part after it.
      size_t start = 0;
      bool pending = false;
      for (const Part& p : parts) {
        if (p.delim) {
          if (pending) emit(start, p.b);
          start = p.b;
          pending = true;
        } else {
          emit(pending ? start : p.b, p.e);
          pending = false;
        }
      }
      if (pending) emit(start, text.size());
      break;
    }
    case SplitBehavior::kContiguous: {
      // Runs of adjacent delimiters become one part.
      size_t i = 0;
      while (i < parts.size()) {
        size_t j = i + 1;
        if (parts[i].delim)
          while (j < parts.size() && parts[j].delim) ++j;
        emit(parts[i].b, parts[j - 1].e);
        i = j;
      }
      break;
    }
  }
}

// Flattens nested Sequences into one list of steps.
void flatten(const nlohmann::json& cfg, const std::string& where,
             std::vector<nlohmann::json>& flat) {
  VERL_CHECK(cfg.is_object() && cfg.contains("type") && cfg["type"].is_string(),
             "{}: pre_tokenizer must be an object with a string \"type\", got {}", where,
             cfg.dump());
  if (cfg["type"] == "Sequence") {
    VERL_CHECK(cfg.contains("pretokenizers") && cfg["pretokenizers"].is_array(),
               "{}: Sequence pre_tokenizer needs a \"pretokenizers\" array", where);
    for (const auto& sub : cfg["pretokenizers"]) flatten(sub, where, flat);
  } else {
    flat.push_back(cfg);
  }
}

}  // namespace

PreTokenizer PreTokenizer::from_json(const nlohmann::json& config, const std::string& where) {
  PreTokenizer pt;
  if (config.is_null()) return pt;
  std::vector<nlohmann::json> flat;
  flatten(config, where, flat);
  for (const auto& cfg : flat) {
    const std::string type = cfg["type"];
    Step step;
    if (type == "Split") {
      VERL_CHECK(cfg.contains("pattern") && cfg["pattern"].is_object(),
                 "{}: Split pre_tokenizer needs a \"pattern\" object", where);
      const auto& pat = cfg["pattern"];
      if (pat.contains("Regex")) {
        step.regex = std::make_shared<Regex>(pat["Regex"].get<std::string>(), false,
                                             where + ": Split pattern");
      } else if (pat.contains("String")) {
        step.regex = std::make_shared<Regex>(pat["String"].get<std::string>(), true,
                                             where + ": Split pattern");
      } else {
        VERL_FAIL("{}: Split pattern must have \"Regex\" or \"String\", got {}", where, pat.dump());
      }
      step.behavior = parse_behavior(cfg.value("behavior", nlohmann::json("Isolated")), where);
      step.invert = get_bool(cfg, "invert", false);
    } else if (type == "ByteLevel") {
      pt.has_byte_level_ = true;
      step.prefix_space = get_bool(cfg, "add_prefix_space", true);
      if (get_bool(cfg, "use_regex", true))
        step.regex = std::make_shared<Regex>(kGpt2Pattern, false, where + ": ByteLevel regex");
      step.behavior = SplitBehavior::kIsolated;
    } else {
      VERL_FAIL("{}: unsupported pre_tokenizer type \"{}\" (supported: Split, ByteLevel, Sequence)",
                where, type);
    }
    pt.steps_.push_back(std::move(step));
  }
  return pt;
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out,
                         std::deque<std::string>& storage) const {
  const size_t first = out.size();
  out.push_back(text);
  std::vector<std::string_view> next;
  for (const Step& step : steps_) {
    next.clear();
    for (size_t i = first; i < out.size(); ++i) {
      std::string_view w = out[i];
      if (step.prefix_space && (w.empty() || w[0] != ' ')) {
        storage.push_back(" ");
        storage.back().append(w);
        w = storage.back();
      }
      if (step.regex)
        split_by(w, *step.regex, step.behavior, step.invert, next);
      else if (!w.empty())
        next.push_back(w);
    }
    out.resize(first);
    out.insert(out.end(), next.begin(), next.end());
  }
}

}  // namespace verl::tokenizer
