// Helpers every test suite shares: a scratch directory of its own per test, the demo config with
// overrides, and the message of the error a call throws. Header only: tests/common/ holds no .cpp,
// so CMake makes no test binary of it.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "config/config.h"
#include "core/error.h"

namespace verl::test {

// A directory under the system temp dir, unique to this process and object (two runs of a suite at
// once must not share files), created empty on construction and removed on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& name) {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("verl_" + name + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;  // a destructor must not throw; a leftover directory is harmless
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  std::filesystem::path operator/(const std::string& sub) const { return path_ / sub; }

 private:
  std::filesystem::path path_;
};

// configs/demo.yaml of this source tree with the given overrides applied.
inline config::Config demo_config(const std::vector<std::string>& overrides) {
  return config::load_config(std::string(VERL_SOURCE_DIR) + "/configs/demo.yaml", overrides);
}

// The message of the verl::Error f throws, or "" when it throws none. Other exceptions pass
// through: gtest reports them as they are.
template <class F>
std::string error_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// As error_of, and a test failure when f throws nothing.
template <class F>
std::string expected_error_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a verl::Error";
  return "";
}

}  // namespace verl::test
