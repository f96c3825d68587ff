// libFuzzer target: the Parquet reader (src/data/parquet*) on arbitrary bytes. Anything malformed
// must end in verl::Error; a crash, a sanitizer report, a hang or another exception is a bug.
// Build and run: tools/fuzz/run.sh parquet (docs/design.md#fuzzing).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "data/parquet.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/dev/shm/verl_fuzz_parquet_" + std::to_string(getpid()) + ".parquet";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    verl::data::ParquetFile pf = verl::data::ParquetFile::open(path);
    for (int g = 0; g < pf.num_row_groups(); ++g) {
      for (const auto& row : pf.read_row_group(g)) (void)row.dump();
    }
  } catch (const verl::Error&) {
  }
  return 0;
}
