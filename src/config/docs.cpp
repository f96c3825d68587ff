// Markdown reference of the configuration, generated from the schema (hence from the defaults
// file). docs/config.md is exactly this output; a test fails when the two differ.
#include <fmt/format.h>

#include <string>

#include "config/config.h"
#include "config/detail.h"

namespace verl::config {

namespace {

std::string cell(std::string s) {
  for (size_t p = 0; (p = s.find('|', p)) != std::string::npos; p += 2) s.replace(p, 1, "\\|");
  return s;
}

std::string code_list(const std::vector<std::string>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", `" : "`") + v[i] + "`";
  return out;
}

std::string last_component(const std::string& path) {
  return path.substr(path.rfind('.') + 1);
}

std::string range_text(const KeySpec& k) {
  auto num = [](double d) {
    return detail::scalar_text(d == static_cast<int64_t>(d) ? Json(static_cast<int64_t>(d))
                                                            : Json(d));
  };
  if (k.min && k.max) {
    if (k.min_exclusive || k.max_exclusive)
      return fmt::format("{} {}, at most {}", k.min_exclusive ? "above" : "from", num(*k.min),
                         k.max_exclusive ? "below " + num(*k.max) : num(*k.max));
    return fmt::format("{} to {}", num(*k.min), num(*k.max));
  }
  if (k.min) return fmt::format("{} {}", k.min_exclusive ? ">" : ">=", num(*k.min));
  return fmt::format("{} {}", k.max_exclusive ? "<" : "<=", num(*k.max));
}

std::string description(const Schema& s, const KeySpec& k) {
  std::string d = k.doc;
  if (k.is_alias()) {
    d += fmt::format(" Alias: setting it sets {}.", code_list(k.alias_of));
    return d;
  }
  if (!k.choices.empty()) d += fmt::format(" One of {}.", code_list(k.choices));
  if (!k.verl_choices.empty())
    d += fmt::format(" verl's {} not supported yet.",
                     code_list(k.verl_choices) + (k.verl_choices.size() == 1 ? " is" : " are"));
  if (!k.ignored_choices.empty())
    d += fmt::format(" verl's {} accepted and dropped.", code_list(k.ignored_choices));
  if (k.min || k.max) d += fmt::format(" Range: {}.", range_text(k));
  const KeySpec* parent = nullptr;
  size_t dot = k.path.rfind('.');
  if (dot != std::string::npos) parent = s.find(k.path.substr(0, dot));
  // Status marks repeat only where they differ from the section's (stated under its heading).
  bool inherited = parent && parent->support == k.support;
  if (!inherited && k.support == Support::Unsupported) d += " **Not supported yet.**";
  if (!inherited && k.support == Support::Ignored) d += " *No effect in verl.cpp.*";
  if (!k.reason.empty() && !(parent && parent->reason == k.reason)) d += " " + k.reason;
  if (k.group) d += " A Hydra config-group choice (`" + last_component(k.path) + "=...`).";
  if (k.ours && !(parent && parent->ours)) d += " *verl.cpp only.*";
  return d;
}

void section(std::string& out, const Schema& s, const KeySpec& sec) {
  const bool top = sec.path.find('.') == std::string::npos;
  if (!sec.is_section()) {  // a top-level value such as model_engine
    out += fmt::format("\n## `{}`\n\n| key | type | default | description |\n|---|---|---|---|\n",
                       sec.path);
    out += fmt::format("| `{}` | {} | `{}` | {} |\n", cell(sec.path), type_name(sec.type),
                       cell(sec.default_text), cell(description(s, sec)));
    return;
  }
  out += fmt::format("\n{} `{}`\n\n{}", top ? "##" : "###", sec.path, sec.doc);
  if (sec.support == Support::Unsupported)
    out += " **Not supported yet:** every key below must stay at its default.";
  if (sec.support == Support::Ignored)
    out += " *No effect in verl.cpp:* values are accepted and ignored with a warning.";
  if (sec.open) out += " Keys not listed here are accepted too (with a warning).";
  if (!sec.reason.empty()) out += " " + sec.reason;
  if (sec.group)
    out += fmt::format(
        " `{}=NAME` picks verl's config file for it: {} accepted{}.", sec.path,
        code_list(sec.choices),
        sec.verl_choices.empty() ? "" : ", " + code_list(sec.verl_choices) + " rejected");
  if (sec.ours) out += " *verl.cpp only.*";
  out += "\n";
  bool header = false;
  for (const auto& c : sec.children) {
    const KeySpec& k = s.at(c);
    if (k.is_section()) continue;
    if (!header) {
      out += "\n| key | type | default | description |\n|---|---|---|---|\n";
      header = true;
    }
    std::string type =
        k.is_alias() ? "alias" : std::string(type_name(k.type)) + (k.nullable ? " or null" : "");
    std::string def = k.is_alias() ? "" : "`" + k.default_text + "`";
    out += fmt::format("| `{}` | {} | {} | {} |\n", cell(k.path), cell(type), cell(def),
                       cell(description(s, k)));
  }
  for (const auto& c : sec.children) {
    const KeySpec& k = s.at(c);
    if (k.is_section()) section(out, s, k);
  }
}

}  // namespace

std::string docs_markdown(const Schema& s) {
  size_t leaves = 0, supported = 0, ignored = 0, unsupported = 0, ours = 0, aliases = 0;
  for (const auto& k : s.keys()) {
    if (k.is_alias()) ++aliases;
    if (!k.is_leaf()) continue;
    ++leaves;
    if (k.ours) ++ours;
    if (k.support == Support::Supported) ++supported;
    if (k.support == Support::Ignored) ++ignored;
    if (k.support == Support::Unsupported) ++unsupported;
  }
  std::string out;
  out += "# Configuration reference\n\n";
  out +=
      "<!-- Generated from configs/ppo_trainer.yaml; do not edit by hand. Regenerate with:\n"
      "     build/bin/verl config --docs > docs/config.md -->\n\n";
  out +=
      "verl.cpp reads verl's configuration: the same sections, key names and defaults as verl's\n"
      "`verl/trainer/config/ppo_trainer.yaml`, with verl.cpp's own knobs beside them. The defaults "
      "live in\n"
      "`configs/ppo_trainer.yaml`; this page is generated from that file.\n\n";
  out +=
      "## Using a config\n\n"
      "- `verl config [CONFIG.yaml] [key=value ...]` prints the resolved configuration that would "
      "run.\n"
      "- A config file may be a full verl config or a partial one; it is merged over the defaults. "
      "Its\n"
      "  top-level `defaults:` and `hydra:` keys and every `_target_` key are ignored.\n"
      "- Command-line overrides use Hydra's syntax: `trainer.total_epochs=3`, `+key=value` (the "
      "key must\n"
      "  still exist), lists as `trainer.logger=[console,jsonl]`, `key=null`.\n"
      "- Values may interpolate other keys: `${data.max_prompt_length}`, `${.sibling}` (same "
      "section),\n"
      "  `${oc.select:a.b,default}`, `${oc.env:VAR,default}`; text around them makes a string.\n"
      "- Unknown keys are errors that suggest the nearest valid key; wrong types, values outside "
      "the\n"
      "  allowed set and out-of-range numbers are errors that name the key and what was "
      "expected.\n\n";
  out +=
      "Status of a key:\n\n"
      "- no mark: supported: the trainer reads it and honours it. This is tested: the config "
      "records\n"
      "  the keys the program reads, and tests/trainer/test_config_reads.cpp runs the trainers and "
      "fails\n"
      "  naming every unmarked key that no run read (a few keys read only with several ranks are\n"
      "  listed there with the reason).\n"
      "- **Not supported yet**: a verl key that verl.cpp does not implement; any value other than "
      "the\n"
      "  default is an error naming the key.\n"
      "- *No effect in verl.cpp*: a verl key that does not apply here (Ray, torch.compile, FSDP "
      "wrapping,\n"
      "  inference-engine settings); a non-default value is accepted with a warning that says "
      "why.\n"
      "- *verl.cpp only*: a key verl does not have (the performance knobs of the seed article).\n"
      "- alias: another name for a key; setting it sets the key(s) it names.\n\n";
  out += fmt::format(
      "{} keys: {} supported, {} without effect, {} not supported yet; {} of them verl.cpp only; "
      "{} aliases.\n",
      leaves, supported, ignored, unsupported, ours, aliases);
  for (const auto& top : s.top_level()) section(out, s, s.at(top));
  return out;
}

}  // namespace verl::config
