// `verl export CKPT DIR`: the actor of a trainer checkpoint as a standalone HF model directory
// (config, safetensors, tokenizer files) that transformers and `verl generate` load.
#include <filesystem>
#include <memory>

#include "cli/command.h"
#include "cli/output_dir.h"
#include "core/error.h"
#include "core/log.h"
#include "model/hf_files.h"
#include "model/weights.h"

namespace verl::cli {
namespace {

namespace fs = std::filesystem;

struct Opts {
  std::string ckpt, out, dtype = "float32";
  bool overwrite = false;
};

int run(const Opts& o) {
  fs::path src = fs::path(o.ckpt) / "actor" / "huggingface";
  if (!fs::exists(src) && fs::exists(fs::path(o.ckpt) / "huggingface"))
    src = fs::path(o.ckpt) / "huggingface";
  VERL_CHECK(
      fs::exists(src / "config.json"),
      "{}: not a checkpoint (expected actor/huggingface/config.json, as under global_step_N)",
      o.ckpt);
  const DType t = model::parse_save_dtype(o.dtype);
  OutputDir out(o.out, o.overwrite, "the output directory");
  model::Weights w = model::Weights::load(src.string());
  w.save(out.staging(), t);
  model::copy_tokenizer_files(src.string(), out.staging());
  out.commit();
  log::info("exported {} to {}", src.string(), o.out);
  return 0;
}

Command reg("export", "Write a checkpoint's actor as an HF model directory",
            [](CLI::App& app) -> Action {
              auto o = std::make_shared<Opts>();
              app.add_option("ckpt", o->ckpt, "checkpoint directory (global_step_N)")->required();
              app.add_option("out", o->out, "output directory")->required();
              app.add_option("--dtype", o->dtype, "float32 | bfloat16 | float16");
              add_overwrite_flag(app, o->overwrite);
              return [o] { return run(*o); };
            });

}  // namespace
}  // namespace verl::cli
