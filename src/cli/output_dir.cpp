#include "cli/output_dir.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <vector>

#include "core/error.h"

namespace verl::cli {
namespace fs = std::filesystem;
namespace {

// A sibling of `target` named for this process: on the same file system, so the rename is one step.
fs::path sibling(const fs::path& target, const char* what) {
  const fs::path t = fs::absolute(target).lexically_normal();
  const std::string name =
      t.has_filename() ? t.filename().string() : t.parent_path().filename().string();
  const fs::path parent = t.has_filename() ? t.parent_path() : t.parent_path().parent_path();
  return parent / fmt::format(".{}.{}-{}", name, what, getpid());
}

// The first few entries of a directory, for the message that refuses it.
std::string some_entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  const size_t n = names.size();
  names.resize(std::min<size_t>(n, 4));
  return fmt::format("{}{}", fmt::join(names, ", "),
                     n > 4 ? fmt::format(" and {} more", n - 4) : "");
}

}  // namespace

OutputDir::OutputDir(std::string target, bool overwrite, std::string option)
    : target_(std::move(target)), option_(std::move(option)) {
  VERL_CHECK(!target_.empty(), "{} is empty: name the directory to write", option_);
  std::error_code ec;
  const auto st = fs::status(target_, ec);
  if (fs::exists(st)) {
    VERL_CHECK(fs::is_directory(st), "{} {} is a file, not a directory", option_, target_);
    VERL_CHECK(overwrite || fs::is_empty(target_),
               "{} {} is not empty (it holds {}): pass --overwrite to replace it, or name a new "
               "directory",
               option_, target_, some_entries(target_));
  }
  staging_ = sibling(target_, "writing").string();
  fs::remove_all(staging_);
  fs::create_directories(staging_, ec);
  VERL_CHECK(!ec, "{} {}: cannot create {}: {}", option_, target_, staging_, ec.message());
}

OutputDir::~OutputDir() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(staging_, ec);  // nothing to report from a destructor; a leftover is hidden
}

void OutputDir::commit() {
  std::error_code ec;
  const bool replace = fs::exists(target_);
  const fs::path old = sibling(target_, "replaced");
  if (replace) {
    fs::remove_all(old);
    fs::rename(target_, old, ec);
    VERL_CHECK(!ec, "{} {}: cannot move the old directory aside: {}", option_, target_,
               ec.message());
  }
  fs::rename(staging_, target_, ec);
  if (ec && replace) {
    std::error_code back;
    fs::rename(old, target_, back);  // put the old one back rather than leave nothing
  }
  VERL_CHECK(!ec, "{} {}: cannot rename {} into place: {}", option_, target_, staging_,
             ec.message());
  committed_ = true;
  if (replace) fs::remove_all(old, ec);
}

void add_overwrite_flag(CLI::App& app, bool& overwrite) {
  app.add_flag("--overwrite", overwrite, "replace the output directory if it is not empty");
}

}  // namespace verl::cli
