// Trainer checkpoints in verl's layout: <default_local_dir>/global_step_<N>/ with actor/ (an HF
// model directory under actor/huggingface, optimizer moments in actor/optim.safetensors), critic/
// likewise, and trainer_state.json (step, data-loader position, KL controller, versioned); the
// tracker file latest_checkpointed_iteration.txt names the newest complete one. A checkpoint is
// written into a temporary directory and renamed, so an interrupted save never leaves a broken
// global_step_N and never touches the previous good one. The files are the same whichever device
// (trainer.device) trained the model: fp32 weights, fp32 AdamW moments and the step count, so a run
// saved on cuda resumes on cpu and the other way round.
// Data parallel: every rank calls save_checkpoint. A ZeRO-sharded optimizer state is written by
// every rank in parallel, each its own slice (actor/optim_world_size_<W>_rank_<r>.safetensors, as
// verl names its FSDP shards), into the same temporary directory (a file system every rank sees);
// rank 0 writes the weights, the HF export and trainer_state.json and publishes. A load takes the
// slice it needs from whichever files are there: a checkpoint of any world size or ZeRO stage
// resumes at any other (resharding on load).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dist/communicator.h"
#include "model/lora.h"
#include "model/weights.h"
#include "optim/adamw.h"
#include "optim/train_state.h"

namespace verl::trainer {

using optim::AdamWState;

inline constexpr int kCheckpointVersion = 1;

// One model as a checkpoint stores it: weights and AdamW state in the weights' flat layout (host
// copies; a CUDA model downloads them first).
struct ModelState {
  const model::Weights* weights = nullptr;  // needed on rank 0 only
  // The whole moments (needed on rank 0 only), or this rank's slice when `shard` is set.
  const AdamWState* opt = nullptr;
  std::optional<optim::ShardSpec> shard;  // set on every rank of a sharded state, or on none
  int64_t shard_numel = 0;                // with `shard`: the whole layout's elements
  // LightweightSync: this rank's carry (layout order; set on every rank or on none) and the
  // optimizer steps taken (the sync interval's phase). Every rank writes its own file,
  // <model>/sync_carry_world_size_<W>_rank_<r>.safetensors.
  const std::vector<float>* carry = nullptr;
  int64_t sync_calls = 0;
  // checkpoint.save_contents holds "optimizer": the moments are written (else only the model).
  bool optimizer = true;
  // LoRA: the model is these adapters (a PEFT directory <model>/lora_adapter, base model named
  // `lora_base`) and the moments are over their layout; `weights` (the frozen base) is not written.
  const model::LoraWeights* lora = nullptr;
  std::string lora_base;
};

// The PEFT directory a LoRA checkpoint's model part (actor/) holds its adapters in (verl's name).
inline constexpr const char* kLoraAdapterDir = "lora_adapter";

// What a checkpoint.save_contents or load_contents list asks for (verl's names: model, optimizer,
// extra, hf_model). The model is always in a verl.cpp checkpoint (it is the HF directory), and so
// is the trainer state ("extra": the step and data position a resume needs); only the optimizer
// state is optional. A list without model or hf_model, or with another name, is an Error naming
// `key`.
struct CheckpointContents {
  bool optimizer = true;
};
CheckpointContents parse_checkpoint_contents(const std::vector<std::string>& list,
                                             const std::string& key);

// A rank's LightweightSync carry as a checkpoint's model directory (actor/ or critic/) holds it.
struct SyncCarry {
  std::vector<float> carry;
  int64_t sync_calls = 0;
};
// Rank `rank` of `world`'s carry from `model_dir`: its own file when the checkpoint was written by
// as many ranks; else the mean of every rank's carry (the update divides the ranks' sum by the
// world size, so each new rank holding the old mean leaves the gradient still owed unchanged).
// nullopt when the checkpoint has no carry files.
std::optional<SyncCarry> load_sync_carry(const std::string& model_dir, int64_t numel, int world,
                                         int rank);

// Writes global_step_<step> under `root` atomically, then updates the tracker, then removes the
// oldest checkpoints beyond `keep` (keep <= 0: keep all), never the one just written.
// `tokenizer_dir`'s tokenizer files are copied into actor/huggingface so it loads on its own.
// Returns the checkpoint directory. `comm`: the data-parallel ranks (null: this process alone); a
// collective then, returning the directory on rank 0 and "" elsewhere. `keep_critic` > 0 (verl's
// max_critic_ckpt_to_keep) also removes the critic/ of the checkpoints beyond the newest
// keep_critic; a directory whose actor `keep` removes goes whole, its critic too.
std::string save_checkpoint(const std::string& root, int64_t step, const ModelState& actor,
                            const std::optional<ModelState>& critic,
                            const nlohmann::json& trainer_state, const std::string& tokenizer_dir,
                            int64_t keep, dist::Communicator* comm = nullptr,
                            int64_t keep_critic = 0);

// LoRA runs: what trainer_state.json's "lora" records of the adapters' rank and the frozen base
// (its path and a digest of its weights: the shape and every 4099th value), so that a resume into
// another base model or rank is refused naming both.
nlohmann::json lora_checkpoint_meta(int64_t rank, const std::string& base_path,
                                    const model::Weights& base);
// Before a resume from `dir` by a run whose lora_checkpoint_meta is `meta` (null: full
// fine-tuning): an Error naming both sides when the checkpoint was saved with another rank, base
// model, or with(out) LoRA.
void check_lora_resume(const std::string& dir, const nlohmann::json& meta);

// The newest complete checkpoint under `root` (from the tracker file), or "" when there is none. A
// tracker that does not hold a step number is an Error naming it.
std::string find_latest_checkpoint(const std::string& root);

// The checkpoint a run continues from, by trainer.resume_mode: `mode` auto, the latest under `root`
// (or "" when there is none); resume_path, `from` (trainer.resume_from_path, required); disable,
// none ("", after check_fresh_run_dir). A `from` given with another mode is warned about (`warn`).
std::string resume_checkpoint_dir(const std::string& mode, const std::string& root,
                                  const std::optional<std::string>& from, bool warn = true);

// A fresh run (trainer.resume_mode=disable) in `root`: an Error naming the directory and its steps
// when it already holds checkpoints, so that one run never mixes with (or prunes) another's.
void check_fresh_run_dir(const std::string& root);

// The pieces every trainer's checkpoints share (`verl sft` writes its own directories with them:
// the HF model files at the top of global_step_<N>/, so that the directory is also a model path).
//
// `dir`/optim.safetensors: AdamW's moments over `numel` parameters and its step count.
void save_optimizer_state(const std::string& dir, const AdamWState& opt, int64_t numel);
AdamWState load_optimizer_state(const std::string& dir, int64_t numel);
// Fresh AdamW state for `numel` parameters: zero moments, step 0 (load_contents without optimizer).
AdamWState fresh_optimizer_state(int64_t numel);
// Adds trainer_state.json (`trainer_state` with "version" and "global_step") to the finished
// temporary directory `tmp`, renames it to <root>/global_step_<step> in one step, updates the
// tracker, and removes the oldest checkpoints beyond `keep` (<= 0: none), never this one. Returns
// the directory.
std::string publish_checkpoint(const std::string& root, int64_t step, const std::string& tmp,
                               const nlohmann::json& trainer_state, int64_t keep);
// A save of step `step` failed with `cause`: removes `tmp` (rank 0) and throws an Error naming the
// step, the cause and the last complete checkpoint; on a full disk also `keep_key`, the setting
// that keeps fewer.
[[noreturn]] void fail_checkpoint_save(const std::string& root, int64_t step,
                                       const std::string& tmp, const std::string& cause,
                                       std::string_view keep_key, int rank = 0);
// `dir`/trainer_state.json, checked: valid JSON of this build's checkpoint version.
nlohmann::json read_trainer_state(const std::string& dir);

// Restores weights (their `data`, checked against their layout) and optimizer state (resized to
// the layout, or to `*_shard`'s slice when given) from a checkpoint directory; returns
// trainer_state.json. Mismatched shapes or a missing file are Errors naming the file and how to
// fix it. A part whose load_contents leaves out the optimizer (`*_load.optimizer` false) gets
// fresh moments (zeros, step 0) instead. A LoRA actor passes `actor` with its adapters' layout and
// no config: the data come from actor/lora_adapter.
nlohmann::json load_checkpoint(const std::string& dir, model::Weights& actor, AdamWState& actor_opt,
                               model::Weights* critic, AdamWState* critic_opt,
                               const optim::ShardSpec* actor_shard = nullptr,
                               const optim::ShardSpec* critic_shard = nullptr,
                               CheckpointContents actor_load = {},
                               CheckpointContents critic_load = {});

}  // namespace verl::trainer
