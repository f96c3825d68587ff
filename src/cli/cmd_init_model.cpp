// `verl init-model`: a new HF model directory with random weights from a config.json (plus the
// tokenizer files of --tokenizer), the starting point for training from scratch.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <new>
#include <optional>
#include <sstream>

#include "cli/command.h"
#include "cli/output_dir.h"
#include "core/error.h"
#include "core/file.h"
#include "core/log.h"
#include "model/hf_files.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace verl::cli {
namespace {

namespace fs = std::filesystem;

struct Opts {
  std::string config, tokenizer, out;
  uint64_t seed = 0;
  float std = 0.02f;
  bool overwrite = false;
};

int run(const Opts& o) {
  VERL_CHECK(std::isfinite(o.std) && o.std >= 0, "--std must be a finite number >= 0, got {}",
             o.std);
  const model::ModelConfig mc =
      model::parse_model_config(read_file(o.config, "--config"), o.config);
  std::optional<model::Weights> built;
  try {
    built.emplace(model::Weights::from_config(mc));
  } catch (const std::bad_alloc&) {
    // Not the KV-cache budget main() suspects: the model itself is too large for this machine.
    VERL_FAIL(
        "--config {}: a model of hidden_size {}, intermediate_size {}, {} layers and "
        "vocab_size {} does not fit in this machine's memory (fp32 weights); check those "
        "fields",
        o.config, mc.hidden_size, mc.intermediate_size, mc.num_hidden_layers, mc.vocab_size);
  }
  model::Weights& w = *built;
  if (!o.tokenizer.empty()) {
    // A token without an embedding row could never be encoded nor sampled; more rows than tokens
    // (a padded embedding) are fine.
    const int64_t tokens = tokenizer::Tokenizer::load(o.tokenizer).vocab_size();
    VERL_CHECK(w.config.vocab_size >= tokens,
               "--config {}: vocab_size {} is smaller than the tokenizer's {} tokens (--tokenizer "
               "{}); set "
               "vocab_size to at least {}",
               o.config, w.config.vocab_size, tokens, o.tokenizer, tokens);
  }
  OutputDir out(o.out, o.overwrite);
  w.init_random(o.seed, o.std);
  w.save(out.staging());
  if (!o.tokenizer.empty()) model::copy_tokenizer_files(o.tokenizer, out.staging());
  out.commit();
  log::info("wrote {} ({} parameters, seed {})", o.out, w.layout.total, o.seed);
  return 0;
}

Command reg("init-model", "Create an HF model directory with random weights from a config.json",
            [](CLI::App& app) -> Action {
              auto o = std::make_shared<Opts>();
              app.add_option("--config", o->config, "HF config.json to build")->required();
              app.add_option("--tokenizer", o->tokenizer,
                             "directory whose tokenizer files to copy");
              app.add_option("--out", o->out, "output directory")->required();
              app.add_option("--seed", o->seed);
              app.add_option("--std", o->std, "std of the normal init of matrices");
              add_overwrite_flag(app, o->overwrite);
              return [o] { return run(*o); };
            });

}  // namespace
}  // namespace verl::cli
