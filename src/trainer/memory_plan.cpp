// The per-phase GPU memory plan (trainer/memory_plan.h). Every figure is the byte count of an
// allocation the CUDA path makes; docs/memory.md gives the arithmetic and the measurements it was
// checked against.
#include "trainer/memory_plan.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/weights.h"
#include "trainer/ppo_config.h"
#include "trainer/run_plan.h"

namespace verl::trainer {

namespace {

constexpr double kAlign = 256;  // the arenas' slice alignment
constexpr double kMiB = 1024.0 * 1024.0;
// The CUDA context with its module images: about 0.5 GiB on an H100 / H200 (CUDA 13), measured as
// in-use minus every counted allocation (docs/memory.md).
constexpr double kContextBytes = 512 * kMiB;
constexpr double kWorkspaceBytes = 32 * kMiB;  // each model's CudaSession: cuBLASLt's workspace
constexpr int64_t kLmHeadChunk = 4096;         // PolicyOptions::lm_head_chunk
constexpr int64_t kOffloadBucket = int64_t{8} << 20;  // optim::OffloadConfig::bucket, elements
constexpr int kOffloadSlots = 3;                      // CudaTrainState's staging slots
constexpr int64_t kQuantFusedMaxTokens = 32;          // ops/cuda/quant_linear.h
constexpr int64_t kZeroSlack = 4096;  // CudaTrainState::kZeroSlack: the gradients' spare floats

double round_up(double bytes) {
  return std::ceil(bytes / kAlign) * kAlign;
}

// optim/cuda/train_state.cpp: the offloaded tail, rounded up to 256 elements.
int64_t offloaded_elems(double share, int64_t n) {
  const int64_t k =
      (static_cast<int64_t>(std::llround(share * static_cast<double>(n))) + 255) / 256 * 256;
  return std::min(k, n);
}

// The quantisable weights of a layout: each layer's q|k|v, o, gate|up and down matrices.
int64_t linear_params(const model::ParamLayout& layout) {
  int64_t n = 0;
  for (const model::LayerParams& lp : layout.layers)
    for (int i : {lp.wqkv, lp.wo, lp.wgu, lp.wdown})
      if (i >= 0) n += layout.params[static_cast<size_t>(i)].numel;
  return n;
}

ModelMemory model_memory(const std::string& role, const ModelPlanInputs& in) {
  const model::ParamLayout layout = model::ParamLayout::build(in.config);
  const int64_t n = layout.total;
  const auto p = static_cast<double>(n);
  ModelMemory m;
  m.role = role;
  m.params = n;
  const bool quantized = !in.trainable && (in.quantization_bits == 8 || in.quantization_bits == 4);
  if (quantized) {
    // int8: a byte a weight (a 4-byte scale a row is noise); int4: half a byte plus a 4-byte scale
    // and a zero-point byte a group. The rest of the model stays bf16.
    const auto linear = static_cast<double>(linear_params(layout));
    const double per =
        in.quantization_bits == 8 ? 1.0 : 0.5 + 5.0 / static_cast<double>(in.quantization_group);
    m.weights = 2.0 * (p - linear) + per * linear;
  } else {
    m.weights = 2.0 * p;
  }
  if (in.trainable) {
    const auto master_host = static_cast<double>(offloaded_elems(in.offload_params, n));
    const auto moments_host = static_cast<double>(offloaded_elems(in.offload_optimizer, n));
    m.master = 4.0 * (p - master_host);
    // Every backward accumulates into the whole buffer (never offloaded, allocated padded).
    m.grads = 4.0 * static_cast<double>(n + kZeroSlack);
    m.moments = 8.0 * (p - moments_host);
    if (in.dp > 1 && in.zero_stage >= 1) {  // this rank's shard: the first ranks' are the largest
      const auto chunk = static_cast<double>((n + in.dp - 1) / in.dp);
      m.master = 4.0 * chunk * in.dp;
      m.moments = 8.0 * chunk;
      if (in.zero_stage >= 2) m.grads += 4.0 * chunk;
    }
    m.host = 4.0 * master_host + 8.0 * moments_host;
    if (master_host > 0 || moments_host > 0)
      m.staging = 4.0 * kOffloadSlots * 3 * static_cast<double>(std::min(kOffloadBucket, n));
  } else if (in.offload_params > 0) {
    m.weights_sleep = true;
    m.host = m.weights;
  }
  m.arena = transformer_arena_bytes(in.config, in.max_tokens, in.max_seqs, in.trainable,
                                    in.trainable && in.recompute, quantized);
  return m;
}

// rollout/cuda/model_runner.cpp's scratch arena: one step of up to max(max_num_batched_tokens,
// max_num_seqs) tokens through a layer at a time, and the logits of max_num_seqs rows. Its decode
// attention and sampling workspaces (a few MiB) are left out.
double runner_scratch_bytes(const model::ModelConfig& c, const RolloutPlanInputs& r) {
  const auto T = static_cast<double>(std::max(r.max_num_batched_tokens, r.max_num_seqs));
  const auto S = static_cast<double>(r.max_num_seqs);
  const auto C = static_cast<double>(c.hidden_size), F = static_cast<double>(c.intermediate_size);
  const auto qd = static_cast<double>(c.q_dim()), kvd = static_cast<double>(c.kv_dim());
  const auto V = static_cast<double>(c.vocab_size);
  const auto bf16 = [](double n) { return round_up(2.0 * n); };
  return 3 * bf16(T * C) + bf16(T * (qd + 2 * kvd)) + 2 * bf16(T * qd) + bf16(T * 2 * F) +
         bf16(T * F) + 3 * bf16(S * C) + round_up(4.0 * S * V);
}

}  // namespace

double transformer_arena_bytes(const model::ModelConfig& c, int64_t max_tokens, int64_t max_seqs,
                               bool trainable, bool recompute, bool quantized) {
  const auto T = static_cast<double>(max_tokens);
  const auto C = static_cast<double>(c.hidden_size), F = static_cast<double>(c.intermediate_size);
  const auto H = static_cast<double>(c.num_attention_heads);
  const auto Hkv = static_cast<double>(c.num_key_value_heads);
  const auto qd = static_cast<double>(c.q_dim()), kvd = static_cast<double>(c.kv_dim());
  const auto V = static_cast<double>(c.vocab_size);
  const auto L = static_cast<double>(c.num_hidden_layers);
  const bool causal = c.head == model::HeadKind::CausalLM;
  const double labels = causal ? 0.0 : static_cast<double>(c.num_labels);
  const bool keep_probs = causal && trainable;  // CudaTransformerOptions::lm_head_keep_probs
  const auto f32 = [](double n) { return round_up(4.0 * n); };
  const auto bf16 = [](double n) { return round_up(2.0 * n); };
  double b = 0;
  if (causal) {
    // The LM head's scratch: fp32 logits of one chunk of rows; the backward without kept
    // probabilities also needs the chunk's bf16 d_z (ops/cuda/lm_head.h).
    const auto chunk = static_cast<double>(std::min(kLmHeadChunk, max_tokens));
    b += keep_probs ? f32(chunk * V) : f32(chunk * V) + bf16(chunk * V);
  }
  b += 3 * f32(T) +
       f32(static_cast<double>(max_seqs) + 1);  // tokens, positions, targets, cu_seqlens
  b += (trainable ? L + 1 : 2) * bf16(T * C);   // the residual stream
  // One layer's saved activations: every layer's when training without recomputation, else one set.
  double layer = bf16(T * C) + f32(T) + 2 * bf16(T * qd) + 2 * bf16(T * kvd) + f32(T * H) +
                 2 * bf16(T * C) + f32(T) + bf16(T * 2 * F) + bf16(T * F);
  if (c.qk_norm) layer += bf16(T * qd) + bf16(T * kvd) + f32(T * H) + f32(T * Hkv);
  b += (trainable && !recompute ? L : 1) * layer;
  b += bf16(T * (qd + 2 * kvd)) + bf16(T * C) +
       4 * f32(T);                            // q|k|v, final norm, log-probs, entropy, lse
  if (causal) b += 4 * f32(T) + bf16(T * C);  // the head rows gathered
  if (labels > 0) b += f32(T * labels);       // values
  if (quantized && max_tokens > kQuantFusedMaxTokens) b += bf16(std::max(2 * F * C, qd * C));
  if (!trainable) return b;
  if (labels > 0) b += f32(T * labels);
  if (keep_probs) b += bf16(T * V);  // softmax kept for the backward: T x V bf16
  b += 2 * f32(T);
  if (causal) b += 2 * f32(T) + bf16(T * C);
  b += 2 * bf16(T * C) + bf16(T * F) + bf16(T * 2 * F) + bf16(T * qd) + f32(T * qd) +
       2 * f32(T * kvd);
  if (c.qk_norm) b += 2 * bf16(T * qd) + 2 * bf16(T * kvd);
  return b;
}

const PhaseMemory& MemoryPlan::peak() const {
  VERL_CHECK(!phases.empty(), "internal: a memory plan without phases");
  return *std::max_element(
      phases.begin(), phases.end(),
      [](const PhaseMemory& a, const PhaseMemory& b) { return a.bytes < b.bytes; });
}

double MemoryPlan::host_pinned() const {
  double h = 0;
  for (const ModelMemory& m : models) h += m.host;
  return h;
}

MemoryPlan plan_memory(const MemoryPlanInputs& in) {
  MemoryPlan plan;
  plan.models.push_back(model_memory("actor", in.actor));
  if (in.reference) plan.models.push_back(model_memory("reference", *in.reference));
  if (in.critic) plan.models.push_back(model_memory("critic", *in.critic));
  if (in.reward_model) plan.models.push_back(model_memory("reward model", *in.reward_model));
  plan.context = kContextBytes;
  plan.runtime = kContextBytes + kWorkspaceBytes * static_cast<double>(plan.models.size());
  plan.resident = plan.runtime;
  for (const ModelMemory& m : plan.models) plan.resident += m.resident();

  // gen: the runner's scratch is taken, then the KV cache gets what gpu_memory_utilization leaves
  // (rollout/kv_sizing.h), at most the blocks that hold every sequence at once.
  const RolloutPlanInputs& r = in.rollout;
  const model::ModelConfig& c = in.actor.config;
  plan.runner_scratch = runner_scratch_bytes(c, r);
  plan.kv_block_bytes =
      2.0 * static_cast<double>(c.num_hidden_layers * r.block_size * c.kv_dim()) * 2.0;
  plan.kv_blocks_wanted =
      (r.sequences * r.sequence_tokens + r.block_size - 1) / r.block_size + r.sequences + 16;
  plan.kv_blocks = plan.kv_blocks_wanted;
  if (in.device_memory > 0) {
    plan.kv_budget =
        r.gpu_memory_utilization * in.device_memory - plan.resident - plan.runner_scratch;
    const auto fit = static_cast<int64_t>(std::max(0.0, *plan.kv_budget) / plan.kv_block_bytes);
    plan.kv_blocks = std::min(plan.kv_blocks_wanted, fit);
  }
  plan.kv_cache = static_cast<double>(plan.kv_blocks) * plan.kv_block_bytes;
  // A capped cache holds whole sequences of ceil(tokens / block) blocks plus one for copy-on-write.
  const int64_t blocks_per_sequence = (r.sequence_tokens + r.block_size - 1) / r.block_size + 1;
  plan.sequences_at_once =
      plan.kv_blocks >= plan.kv_blocks_wanted
          ? r.sequences
          : std::min(r.sequences, plan.kv_blocks / std::max<int64_t>(1, blocks_per_sequence));

  // Between phases everything resident is held (the arenas are planned once); a phase adds what
  // it alone brings to the device.
  auto sleeping = [&](const std::string& role) {
    for (const ModelMemory& m : plan.models)
      if (m.role == role && m.weights_sleep) return m.weights;
    return 0.0;
  };
  plan.phases.push_back({"gen", plan.resident + plan.runner_scratch + plan.kv_cache});
  plan.phases.push_back({"old_log_prob", plan.resident});
  if (in.reference) plan.phases.push_back({"ref", plan.resident + sleeping("reference")});
  if (in.critic) plan.phases.push_back({"values", plan.resident});
  if (in.reward_model) plan.phases.push_back({"reward", plan.resident + sleeping("reward model")});
  if (in.critic) plan.phases.push_back({"update_critic", plan.resident});
  plan.phases.push_back({"update_actor", plan.resident});
  plan.phases.push_back({"optimizer", plan.resident});
  return plan;
}

MemoryPlanInputs memory_plan_inputs(const PpoConfig& cfg, const RunPlan& run,
                                    const model::ModelConfig& actor,
                                    const std::optional<model::ModelConfig>& critic,
                                    const std::optional<model::ModelConfig>& reward_model,
                                    double device_memory) {
  MemoryPlanInputs in;
  in.device_memory = device_memory;
  auto sized = [](ModelPlanInputs& m, const MicroBatchPlan& p) {
    m.max_tokens = p.max_tokens;
    m.max_seqs = p.max_seqs;
  };

  // The actor: verl's fsdp_config switches offload the whole of their part, the seed's ratio a
  // share (OffloadKeys::resolve, as the trainer resolves them on cuda).
  const optim::OffloadConfig actor_offload = cfg.actor.offload.resolve(Device::Cuda);
  in.actor.config = actor;
  in.actor.recompute = cfg.actor.gradient_checkpointing;
  in.actor.offload_params = actor_offload.params;
  in.actor.offload_optimizer = actor_offload.optimizer;
  in.actor.dp = cfg.world;
  in.actor.zero_stage = static_cast<int>(cfg.actor.zero_stage);
  sized(in.actor, run.actor_plan);

  if (run.ref) {
    ModelPlanInputs r;
    r.config = actor;
    r.trainable = false;
    sized(r, run.ref_plan);
    r.offload_params = cfg.ref_offload.param_offload ? 1.0 : 0.0;
    r.quantization_bits = cfg.ref_quantization.bits;
    r.quantization_group = cfg.ref_quantization.group_size;
    in.reference = r;
  }

  if (run.critic) {
    ModelPlanInputs c;
    c.config = critic.value_or(actor);
    if (c.config.head == model::HeadKind::CausalLM) {  // Weights::load_as_critic's value head
      c.config.head = model::HeadKind::TokenClassification;
      c.config.num_labels = 1;
    }
    c.recompute = cfg.critic.gradient_checkpointing;
    c.offload_params = cfg.critic.offload.param_offload ? 1.0 : 0.0;
    c.offload_optimizer = cfg.critic.offload.optimizer_offload.value_or(false) ? 1.0 : 0.0;
    c.dp = cfg.world;
    c.zero_stage = static_cast<int>(cfg.critic.zero_stage);
    sized(c, run.critic_plan);
    in.critic = c;
  }

  if (run.reward_model && reward_model) {
    // The reward-model budget (RewardManager): token-cut forwards of forward_max_token_len_per_gpu,
    // or micro_batch_size_per_gpu sequences of the longest input (a re-rendered input may be twice
    // the actor's sequence unless reward_model.max_length bounds it).
    const RewardModelKeys& rm = *cfg.reward.model;
    ModelPlanInputs m;
    m.config = *reward_model;
    m.trainable = false;
    const int64_t seq_len = cfg.data.max_prompt_length + cfg.data.max_response_length;
    const int64_t longest =
        rm.max_length > 0 ? rm.max_length : (rm.input_tokenizer ? 2 * seq_len : seq_len);
    if (rm.use_dynamic_bsz) {
      m.max_tokens = rm.forward_max_token_len_per_gpu;
      m.max_seqs = std::max<int64_t>(1, m.max_tokens / 8);
    } else {
      m.max_seqs = rm.micro_batch_size_per_gpu.value_or(16);
      m.max_tokens = m.max_seqs * longest;
    }
    m.offload_params = rm.offload.param_offload ? 1.0 : 0.0;
    m.quantization_bits = rm.quantization.bits;
    m.quantization_group = rm.quantization.group_size;
    in.reward_model = m;
  }

  in.rollout.sequences = cfg.data.gen_batch_size * cfg.rollout.train.n / cfg.world;
  in.rollout.sequence_tokens = cfg.data.max_prompt_length + cfg.rollout.response_length;
  in.rollout.max_num_seqs = cfg.rollout.max_num_seqs;
  in.rollout.max_num_batched_tokens = cfg.rollout.max_num_batched_tokens;
  in.rollout.gpu_memory_utilization = cfg.rollout.gpu_memory_utilization;
  return in;
}

}  // namespace verl::trainer
