// For fuzz targets whose reader takes a path: writes the input to a file of this process under
// /dev/shm (the same one every run) and returns its path, or "" when it cannot be written.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

inline std::string write_input_file(const uint8_t* data, size_t size, const char* suffix) {
  const std::string path = "/dev/shm/verl_fuzz_" + std::to_string(getpid()) + suffix;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return "";
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  return path;
}
