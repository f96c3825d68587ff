// `verl convert`: loads an HF model directory (validating it) and writes it again, optionally in
// another dtype or shard size. The output is what every verl save uses, and transformers loads it.
// With --lora DIR a PEFT LoRA adapter is merged in first (PEFT's merge_and_unload).
#include <filesystem>
#include <memory>

#include "cli/command.h"
#include "cli/output_dir.h"
#include "core/error.h"
#include "core/log.h"
#include "model/hf_files.h"
#include "model/lora.h"
#include "model/weights.h"

namespace verl::cli {
namespace {

struct Opts {
  std::string model, lora, out, dtype = "float32";
  bool overwrite = false;
};

int run(const Opts& o) {
  const DType t = model::parse_save_dtype(o.dtype);
  namespace fs = std::filesystem;
  VERL_CHECK(fs::weakly_canonical(o.out) != fs::weakly_canonical(o.model),
             "--out must differ from --model ({})", o.model);
  OutputDir out(o.out, o.overwrite);
  model::Weights w = model::Weights::load(o.model);
  if (!o.lora.empty()) w = model::LoraWeights::load(o.lora, w.config).merged(w);
  w.save(out.staging(), t);
  model::copy_tokenizer_files(o.model, out.staging());
  out.commit();
  log::info("wrote {} ({} parameters, {})", o.out, w.layout.total, o.dtype);
  return 0;
}

Command reg("convert", "Load an HF model directory and save it again (dtype, sharding)",
            [](CLI::App& app) -> Action {
              auto o = std::make_shared<Opts>();
              app.add_option("--model", o->model, "input HF model directory")->required();
              app.add_option("--out", o->out, "output directory")->required();
              app.add_option("--lora", o->lora, "PEFT LoRA adapter directory to merge in");
              app.add_option("--dtype", o->dtype, "float32 | bfloat16 | float16");
              add_overwrite_flag(app, o->overwrite);
              return [o] { return run(*o); };
            });

}  // namespace
}  // namespace verl::cli
