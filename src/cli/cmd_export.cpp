// `verl export CKPT DIR`: the actor of a trainer checkpoint as a standalone HF model directory
// (config, safetensors, tokenizer files) that transformers and `verl generate` load. A LoRA run's
// checkpoint exports its PEFT adapter directory, or with --merge the base model with the adapters
// merged in (the base: adapter_config.json's base_model_name_or_path, or --base).
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/output_dir.h"
#include "core/error.h"
#include "core/log.h"
#include "model/hf_files.h"
#include "model/lora.h"
#include "model/weights.h"

namespace verl::cli {
namespace {

namespace fs = std::filesystem;

struct Opts {
  std::string ckpt, out, dtype = "float32", base;
  bool merge = false, overwrite = false;
};

// A LoRA checkpoint's adapters (actor/lora_adapter, or lora_adapter of a `verl sft` one).
int export_lora(const Opts& o, const fs::path& adapter) {
  std::string base = o.base;
  if (base.empty()) {
    std::ifstream f(adapter / "adapter_config.json");
    base = nlohmann::json::parse(f, nullptr, false).value("base_model_name_or_path", "");
  }
  VERL_CHECK(!base.empty(),
             "{}: the adapter names no base model (base_model_name_or_path); pass --base DIR",
             adapter.string());
  OutputDir out(o.out, o.overwrite, "the output directory");
  if (!o.merge) {
    model::LoraWeights::load(adapter.string(), model::load_model_config(base))
        .save(out.staging(), base);
    out.commit();
    log::info("exported the LoRA adapters of {} to {} (PEFT, base {})", o.ckpt, o.out, base);
    return 0;
  }
  model::Weights w = model::Weights::load(base);
  model::LoraWeights::load(adapter.string(), w.config)
      .merged(w)
      .save(out.staging(), model::parse_save_dtype(o.dtype));
  model::copy_tokenizer_files(base, out.staging());
  out.commit();
  log::info("exported {} with the LoRA adapters of {} merged to {}", base, o.ckpt, o.out);
  return 0;
}

int run(const Opts& o) {
  for (const fs::path& a :
       {fs::path(o.ckpt) / "actor" / "lora_adapter", fs::path(o.ckpt) / "lora_adapter"})
    if (fs::exists(a / "adapter_config.json")) return export_lora(o, a);
  VERL_CHECK(!o.merge, "{}: --merge is for a LoRA run's checkpoint (actor/lora_adapter)", o.ckpt);
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
              app.add_flag("--merge", o->merge,
                           "LoRA: write the base model with the adapters merged in (an HF model) "
                           "instead of the PEFT adapter directory");
              app.add_option("--base", o->base,
                             "LoRA: the base model directory (default: the adapter's "
                             "base_model_name_or_path)");
              return [o] { return run(*o); };
            });

}  // namespace
}  // namespace verl::cli
