// `verl export CKPT DIR`: the actor of a trainer checkpoint as a standalone HF model directory
// (config, safetensors, tokenizer files) that transformers and `verl generate` load.
#include <filesystem>
#include <memory>

#include "cli/command.h"
#include "core/error.h"
#include "core/log.h"
#include "model/weights.h"

namespace verl::cli {
namespace {

namespace fs = std::filesystem;

struct Opts {
  std::string ckpt, out, dtype = "float32";
};

int run(const Opts& o) {
  fs::path src = fs::path(o.ckpt) / "actor" / "huggingface";
  if (!fs::exists(src) && fs::exists(fs::path(o.ckpt) / "huggingface")) src = fs::path(o.ckpt) / "huggingface";
  VERL_CHECK(fs::exists(src / "config.json"),
             "{}: not a checkpoint (expected actor/huggingface/config.json, as under global_step_N)", o.ckpt);
  DType t = o.dtype == "bfloat16" || o.dtype == "bf16" ? DType::BF16
            : o.dtype == "float16" || o.dtype == "f16" ? DType::F16
                                                       : DType::F32;
  VERL_CHECK(t != DType::F32 || o.dtype == "float32" || o.dtype == "f32",
             "--dtype must be float32, bfloat16 or float16, got '{}'", o.dtype);
  model::Weights w = model::Weights::load(src.string());
  w.save(o.out, t);
  for (const auto& e : fs::directory_iterator(src)) {
    const std::string name = e.path().filename().string();
    if (name.find("tokenizer") != std::string::npos || name == "generation_config.json" || name == "vocab.json" ||
        name == "merges.txt" || name == "special_tokens_map.json") {
      fs::copy_file(e.path(), fs::path(o.out) / name, fs::copy_options::overwrite_existing);
    }
  }
  log::info("exported {} to {}", src.string(), o.out);
  return 0;
}

Command reg("export", "Write a checkpoint's actor as an HF model directory", [](CLI::App& app) -> Action {
  auto o = std::make_shared<Opts>();
  app.add_option("ckpt", o->ckpt, "checkpoint directory (global_step_N)")->required();
  app.add_option("out", o->out, "output directory")->required();
  app.add_option("--dtype", o->dtype, "float32 | bfloat16 | float16");
  return [o] { return run(*o); };
});

}  // namespace
}  // namespace verl::cli
