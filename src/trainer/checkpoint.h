// Trainer checkpoints in verl's layout: <default_local_dir>/global_step_<N>/ with actor/ (an HF
// model directory under actor/huggingface, optimizer moments in actor/optim.safetensors), critic/
// likewise, and trainer_state.json (step, data-loader position, KL controller, versioned); the
// tracker file latest_checkpointed_iteration.txt names the newest complete one. A checkpoint is
// written into a temporary directory and renamed, so an interrupted save never leaves a broken
// global_step_N and never touches the previous good one. The files are the same whichever device
// (trainer.device) trained the model: fp32 weights, fp32 AdamW moments and the step count, so a run
// saved on cuda resumes on cpu and the other way round.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/weights.h"
#include "optim/adamw.h"

namespace verl::trainer {

using optim::AdamWState;

inline constexpr int kCheckpointVersion = 1;

// One model as a checkpoint stores it: weights and AdamW state in the weights' flat layout (host
// copies; a CUDA model downloads them first).
struct ModelState {
  const model::Weights* weights = nullptr;
  const AdamWState* opt = nullptr;
};

// Writes global_step_<step> under `root` atomically, then updates the tracker, then removes the
// oldest checkpoints beyond `keep` (keep <= 0: keep all), never the one just written. `tokenizer_dir`'s tokenizer files are
// copied into actor/huggingface so it loads on its own. Returns the checkpoint directory.
std::string save_checkpoint(const std::string& root, int64_t step, const ModelState& actor,
                            const std::optional<ModelState>& critic, const nlohmann::json& trainer_state,
                            const std::string& tokenizer_dir, int64_t keep);

// The newest complete checkpoint under `root` (from the tracker file), or "" when there is none. A
// tracker that does not hold a step number is an Error naming it.
std::string find_latest_checkpoint(const std::string& root);

// A fresh run (trainer.resume_mode=disable) in `root`: an Error naming the directory and its steps
// when it already holds checkpoints, so that one run never mixes with (or prunes) another's.
void check_fresh_run_dir(const std::string& root);

// Restores weights (their `data`, checked against their layout) and optimizer state (resized to
// the layout) from a checkpoint directory; returns trainer_state.json. Mismatched shapes or a
// missing file are Errors naming the file and how to fix it.
nlohmann::json load_checkpoint(const std::string& dir, model::Weights& actor, AdamWState& actor_opt,
                               model::Weights* critic, AdamWState* critic_opt);

}  // namespace verl::trainer
