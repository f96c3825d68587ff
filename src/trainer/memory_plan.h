// The GPU memory a run needs, phase by phase, from its config and its models' config.json: what
// `verl doctor --config` checks a run against, with the arithmetic of docs/memory.md. It counts
// the allocations of the CUDA path as they are made: the training states
// (optim/cuda/train_state.h), each model's activation arena (model/cuda/transformer.cpp), the
// rollout runner's scratch and its KV cache (rollout/cuda/model_runner.cpp, rollout/kv_sizing.h),
// and the CUDA runtime's own share.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"

namespace verl::trainer {

struct PpoConfig;
struct RunPlan;

// One model on the GPU as the trainer builds it.
struct ModelPlanInputs {
  model::ModelConfig config;
  bool trainable = true;  // false: forward only (reference policy, reward model)
  // The largest micro-batch the model is planned for (CudaTransformerOptions::max_tokens /
  // max_seqs).
  int64_t max_tokens = 0, max_seqs = 0;
  bool recompute = false;  // enable_gradient_checkpointing (trainable models)
  // Trainable: the shares of the fp32 master weights and of the AdamW moments in pinned host memory
  // (optim::OffloadConfig). Forward only: params > 0 keeps the bf16 weights on the host between
  // the model's passes (param_offload).
  double offload_params = 0, offload_optimizer = 0;
  // Trainable: the data-parallel ranks and the ZeRO stage (optim/cuda/strategy.h). With dp > 1,
  // stage 1 keeps the moments of a shard of ceil(params / dp) elements, stage 2 also that shard's
  // reduced gradients beside the whole buffer the backward writes; the master weights stay whole
  // (padded to dp x the shard). ZeRO-3 is refused on the GPU (issue 43) and planned as stage 2.
  int dp = 1;
  int zero_stage = 0;
  int quantization_bits = 16;  // forward only: 8 or 4 keeps the linear layers' codes
  int64_t quantization_group = 128;
};

// The rollout of one step on this rank.
struct RolloutPlanInputs {
  int64_t sequences = 0;        // data.gen_batch_size x rollout.n / ranks
  int64_t sequence_tokens = 0;  // max_prompt_length + rollout.response_length
  int64_t max_num_seqs = 0, max_num_batched_tokens = 0;
  double gpu_memory_utilization = 0.5;
  int32_t block_size = 16;  // the trainer's KV block
};

struct MemoryPlanInputs {
  ModelPlanInputs actor;
  std::optional<ModelPlanInputs> reference, critic, reward_model;
  RolloutPlanInputs rollout;
  // Bytes of the GPU; 0 when unknown (the KV cache is then planned to hold every sequence).
  double device_memory = 0;
};

// One model's bytes: on the device while resident, and in pinned host memory.
struct ModelMemory {
  std::string role;  // actor, reference, critic, reward model
  int64_t params = 0;
  double weights = 0;  // the bf16 compute copy, or the quantised codes plus the bf16 rest
  double master = 0, grads = 0, moments = 0;  // the device-resident shares (trainable)
  double staging = 0;  // offload: the slots the host-resident elements pass through
  double arena = 0;    // activations of the largest micro-batch, LM head scratch and probabilities
  double host = 0;     // pinned host bytes: offloaded master weights and moments, sleeping weights
  bool weights_sleep = false;  // the weights are on the device only during the model's own phase
  double resident() const {
    return (weights_sleep ? 0 : weights) + master + grads + moments + staging + arena;
  }
};

struct PhaseMemory {
  std::string phase;  // verl's stage names: gen, old_log_prob, ref, values, reward, update_critic,
                      // update_actor, and optimizer (the optimizer steps)
  double bytes = 0;   // device memory in use at the phase's peak
};

struct MemoryPlan {
  std::vector<ModelMemory> models;  // actor first
  double runtime = 0;               // the CUDA context and each model's cuBLASLt workspace
  double context = 0;   // the CUDA context's share of runtime: the one part no allocator counts
  double resident = 0;  // runtime + every model's resident bytes: in use between phases
  double runner_scratch = 0;     // the rollout runner's activations and logits (gen only)
  int64_t kv_blocks_wanted = 0;  // blocks that hold every sequence of the step at once
  int64_t kv_blocks = 0;         // blocks the cache gets (capped by gpu_memory_utilization)
  double kv_block_bytes = 0, kv_cache = 0;
  // gpu_memory_utilization x the device - what is in use when the cache is sized (resident +
  // runner scratch); <= 0: the rollout cannot start. Unset when the device memory is unknown.
  std::optional<double> kv_budget;
  int64_t sequences_at_once = 0;  // sequences the cache holds at full length
  std::vector<PhaseMemory> phases;

  const PhaseMemory& peak() const;
  double host_pinned() const;
};

MemoryPlan plan_memory(const MemoryPlanInputs& in);

// The inputs as the trainer derives them: its typed config (offload, quantisation and rollout keys,
// cfg.world data-parallel ranks) and its run plan (roles, micro-batch plans). `critic` and
// `reward_model` are those models' config.json (a causal LM given for the critic gets the value
// head, as Weights::load_as_critic does); they are used only when the plan has the model.
MemoryPlanInputs memory_plan_inputs(const PpoConfig& cfg, const RunPlan& run,
                                    const model::ModelConfig& actor,
                                    const std::optional<model::ModelConfig>& critic,
                                    const std::optional<model::ModelConfig>& reward_model,
                                    double device_memory);

// Bytes of a model's activation arena (model/cuda/transformer.cpp's plan, counted the same way).
double transformer_arena_bytes(const model::ModelConfig& cfg, int64_t max_tokens, int64_t max_seqs,
                               bool trainable, bool recompute, bool quantized);

}  // namespace verl::trainer
