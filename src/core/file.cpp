#include "core/file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/error.h"

namespace verl {

void open_for_reading(std::ifstream& f, const std::string& path, std::string_view what,
                      std::ios::openmode mode) {
  std::error_code ec;
  VERL_CHECK(!std::filesystem::is_directory(path, ec),
             "cannot open {} {}: it is a directory, not a file", what, path);
  f.open(path, mode | std::ios::in);
  VERL_CHECK(f.good(), "cannot open {} {}: {}", what, path, std::strerror(errno));
}

std::string read_file(const std::string& path, std::string_view what) {
  std::ifstream f;
  open_for_reading(f, path, what, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  VERL_CHECK(!f.bad(), "error reading {} {}", what, path);
  return ss.str();
}

}  // namespace verl
