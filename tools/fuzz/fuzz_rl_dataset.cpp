// libFuzzer target: a prompt dataset in verl's schema (src/data/rl_dataset.cpp) read from
// arbitrary JSONL text with the demo tokenizer, every row then rendered and tokenized as the
// trainer asks for it. A malformed row must end in verl::Error naming the file and line; a crash,
// a sanitizer report, a hang or another exception is a bug. Build and run: tools/fuzz/run.sh
// rl_dataset (docs/design.md#fuzzing).
#include <cstdint>
#include <string>

#include "core/error.h"
#include "data/rl_dataset.h"
#include "input_file.h"  // tools/fuzz/
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const verl::tokenizer::Tokenizer tok = verl::tokenizer::Tokenizer::load(VERL_DEMO_DIR);
  const std::string path = write_input_file(data, size, ".jsonl");
  if (path.empty()) return 0;
  verl::data::DatasetOptions opt;
  opt.max_prompt_length = 64;
  opt.truncation = verl::data::Truncation::Left;
  try {
    const verl::data::RLDataset ds = verl::data::RLDataset::load({path}, tok, opt);
    for (int64_t i = 0; i < ds.size(); ++i) (void)ds.get(i);
  } catch (const verl::Error&) {
  }
  return 0;
}
