#include "cli/io.h"

#include "core/error.h"

namespace verl::cli {

InputLines::InputLines(const std::string& path, const std::string& option)
    : in_(&std::cin), source_(path == "-" ? "<stdin>" : path) {
  if (path != "-") {
    file_.open(path);
    VERL_CHECK(file_.good(), "cannot open {} {}", option, path);
    in_ = &file_;
  }
}

bool InputLines::next(std::string& line) {
  while (std::getline(*in_, line)) {
    ++lineno_;
    if (line.find_first_not_of(" \t\r") != std::string::npos) return true;
  }
  return false;
}

std::string InputLines::where() const { return fmt::format("{}:{}", source_, lineno_); }

nlohmann::json InputLines::json(const std::string& line) const {
  try {
    return nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    VERL_FAIL("{}: not valid JSON: {}", where(), e.what());
  }
}

Output::Output(const std::string& path, const std::string& option) : out_(&std::cout) {
  if (path != "-") {
    file_.open(path);
    VERL_CHECK(file_.good(), "cannot open {} {}", option, path);
    out_ = &file_;
  }
}

std::pair<std::string, std::vector<std::string>> split_config_args(const std::vector<std::string>& args) {
  std::string path;
  std::vector<std::string> overrides;
  for (const auto& a : args) {
    if (path.empty() && overrides.empty() && a.find('=') == std::string::npos) {
      path = a;
    } else {
      overrides.push_back(a);
    }
  }
  return {path, overrides};
}

}  // namespace verl::cli
