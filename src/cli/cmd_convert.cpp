// `verl convert`: loads an HF model directory (validating it) and writes it again, optionally in
// another dtype or shard size. The output is what every verl save uses, and transformers loads it.
#include <filesystem>
#include <memory>

#include "cli/command.h"
#include "core/error.h"
#include "core/log.h"
#include "model/weights.h"

namespace verl::cli {
namespace {

struct Opts {
  std::string model, out, dtype = "float32";
};

int run(const Opts& o) {
  DType t;
  if (o.dtype == "float32" || o.dtype == "f32") {
    t = DType::F32;
  } else if (o.dtype == "bfloat16" || o.dtype == "bf16") {
    t = DType::BF16;
  } else if (o.dtype == "float16" || o.dtype == "f16") {
    t = DType::F16;
  } else {
    VERL_FAIL("--dtype must be float32, bfloat16 or float16, got '{}'", o.dtype);
  }
  namespace fs = std::filesystem;
  VERL_CHECK(fs::weakly_canonical(o.out) != fs::weakly_canonical(o.model),
             "--out must differ from --model ({})", o.model);
  model::Weights w = model::Weights::load(o.model);
  w.save(o.out, t);
  // Carry the tokenizer and generation files along so the output is a complete model directory.
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                        "special_tokens_map.json", "vocab.json", "merges.txt"}) {
    fs::path src = fs::path(o.model) / f;
    if (fs::exists(src)) fs::copy_file(src, fs::path(o.out) / f, fs::copy_options::overwrite_existing);
  }
  log::info("wrote {} ({} parameters, {})", o.out, w.layout.total, o.dtype);
  return 0;
}

Command reg("convert", "Load an HF model directory and save it again (dtype, sharding)",
            [](CLI::App& app) -> Action {
              auto o = std::make_shared<Opts>();
              app.add_option("--model", o->model, "input HF model directory")->required();
              app.add_option("--out", o->out, "output directory")->required();
              app.add_option("--dtype", o->dtype, "float32 | bfloat16 | float16");
              return [o] { return run(*o); };
            });

}  // namespace
}  // namespace verl::cli
