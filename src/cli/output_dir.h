// The directory a model-writing command (init-model, convert, export) produces, written whole or
// not at all: a non-empty target is refused unless --overwrite (a trained model is not replaced by
// random weights without a word, nor mixed with stale tokenizer files), and the files go into a
// hidden sibling renamed into place at the end, so an interrupted command leaves the target as it
// was.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace verl::cli {

class OutputDir {
 public:
  // Checks `target` (named as `option` in errors) and makes the staging directory.
  OutputDir(std::string target, bool overwrite, std::string option = "--out");
  ~OutputDir();  // removes the staging directory unless committed
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;

  // Where the command writes.
  const std::string& staging() const { return staging_; }
  // The staging directory becomes the target; a replaced target is removed after the rename.
  void commit();

 private:
  std::string target_, option_, staging_;
  bool committed_ = false;
};

// --overwrite, the flag that lets a command replace a non-empty output directory.
void add_overwrite_flag(CLI::App& app, bool& overwrite);

}  // namespace verl::cli
