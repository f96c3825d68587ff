// Reading files (a directory given as a file is an error naming it), the nesting bound on JSON
// text, and the run lock (a second run on a directory gets an error naming the holder's pid; the
// lock goes with its holder).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "../common/test_util.h"
#include "core/error.h"
#include "core/file.h"
#include "core/json_depth.h"
#include "core/run_lock.h"

namespace verl {
namespace {

namespace fs = std::filesystem;

// A fresh directory (one per name) in this process's scratch directory, removed at exit.
fs::path fresh_dir(const std::string& name) {
  static const verl::test::TempDir scratch("core");
  const fs::path d = scratch / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(ReadFile, ADirectoryIsAnErrorNamingIt) {
  const fs::path d = fresh_dir("read_dir");
  const std::string msg = test::error_of([&] { read_file(d.string(), "config file"); });
  EXPECT_NE(msg.find("cannot open config file " + d.string() + ": it is a directory"),
            std::string::npos)
      << msg;
  std::ifstream f;
  EXPECT_NE(test::error_of([&] {
              open_for_reading(f, d.string(), "--input");
            }).find("--input " + d.string()),
            std::string::npos);
  EXPECT_NE(test::error_of([&] {
              read_file((d / "missing.yaml").string(), "config file");
            }).find("cannot open config file " + (d / "missing.yaml").string() + ": No such file"),
            std::string::npos);
  std::ofstream(d / "a.txt") << "hello\n";
  EXPECT_EQ(read_file((d / "a.txt").string(), "x"), "hello\n");
  fs::remove_all(d);
}

// Brackets count outside strings only; escaped quotes do not end a string; the bound is inclusive.
TEST(JsonDepth, CountsBracketsOutsideStrings) {
  const auto nest = [](int n) { return std::string(n, '[') + std::string(n, ']'); };
  EXPECT_TRUE(json_depth_ok(nest(kMaxJsonDepth)));
  EXPECT_FALSE(json_depth_ok(nest(kMaxJsonDepth + 1)));
  EXPECT_FALSE(json_depth_ok("{\"a\": " + nest(kMaxJsonDepth) + "}"));
  // Brackets inside a string, with an escaped quote and an escaped backslash before its end.
  const std::string in_string = "{\"s\": \"" + std::string(1000, '[') + "\\\" \\\\\"}";
  EXPECT_TRUE(json_depth_ok(in_string));
  EXPECT_TRUE(json_depth_ok("[\"\\\\\", " + nest(kMaxJsonDepth - 1) + "]"));
  EXPECT_FALSE(json_depth_ok("[\"\\\\\", " + nest(kMaxJsonDepth) + "]"));
  EXPECT_TRUE(test::error_of([&] {
                check_json_depth(nest(100000), "rows.jsonl:7");
              }).starts_with("rows.jsonl:7: JSON nested more than 512 levels deep"));
}

TEST(RunLock, SecondHolderGetsAnErrorNamingThePid) {
  const fs::path d = fresh_dir("lock");
  {
    RunLock first(d.string());
    std::ifstream f(first.path());
    std::string pid;
    f >> pid;
    EXPECT_EQ(pid, std::to_string(getpid()));
    // flock conflicts between two open files even in one process, as between two runs.
    const std::string msg = test::error_of([&] { RunLock second(d.string()); });
    EXPECT_NE(
        msg.find(d.string() + " is in use by another run (pid " + std::to_string(getpid()) + ","),
        std::string::npos)
        << msg;
  }
  // Released with its holder: the next run takes it (the file stays behind, harmless).
  EXPECT_EQ(test::error_of([&] { RunLock again(d.string()); }), "");
  fs::remove_all(d);
}

}  // namespace
}  // namespace verl
