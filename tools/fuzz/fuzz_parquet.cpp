// libFuzzer target: the Parquet reader (src/data/parquet*) on arbitrary bytes. Anything malformed
// must end in verl::Error; a crash, a sanitizer report, a hang or another exception is a bug.
// Build and run: tools/fuzz/run.sh parquet (docs/design.md#fuzzing).
#include <cstdint>
#include <string>

#include "core/error.h"
#include "data/parquet.h"
#include "input_file.h"  // tools/fuzz/

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = write_input_file(data, size, ".parquet");
  if (path.empty()) return 0;
  try {
    verl::data::ParquetFile pf = verl::data::ParquetFile::open(path);
    for (int g = 0; g < pf.num_row_groups(); ++g) {
      for (const auto& row : pf.read_row_group(g)) (void)row.dump();
    }
  } catch (const verl::Error&) {
  }
  return 0;
}
