#!/usr/bin/env bash
# GRPO with LoRA on one GPU (issue 39, acceptance 5): `verl bench grpo-step` (the trainer's own
# step) with LoRA rank 64, alpha 128 on all linear layers, at the Qwen2.5-7B and Qwen3-8B shapes
# (random weights from `verl init-model`) and the workload of
# configs/examples/grpo_qwen2_5_0_5b_h200.yaml (32 prompts x 8, 256 + 256 tokens, 8192-token
# micro-batches, the k3 KL against the reference: the base with the adapters off), beside its
# TRL-style HF + PEFT peer (tools/bench_grpo_hf.py --lora 64 --ref) in the same call. One JSON line
# per run (step time, each phase's time and peak device memory), then one summary line per shape.
# Activations are recomputed in backward on both sides (verl's LoRA examples'
# enable_gradient_checkpointing=True); it is what fits a 7-8B model's 8192-token micro-batches.
#
#   bench/lora_gpu.sh [SHAPE ...]      (default: qwen2.5-7b qwen3-8b)
#
# Environment: VERL, PYTHON (bench/peer_lib.sh); RANK (64), ALPHA (128), STEPS (1), WARMUP (1),
# UTIL (rollout gpu_memory_utilization, 0.7), HF=0 skips the peer, FULL=1 adds full-parameter
# training at each shape with the actor's state offloaded (actor_offload_ratio=1.0; needs an H200's
# memory), WORK (default out/lora_gpu; the models go to out/models/SHAPE, made once).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/peer_lib.sh
. "$root/bench/peer_lib.sh"
VERL=$(cd "$(dirname "$VERL")" && pwd)/$(basename "$VERL")  # the runs change directory
# grpo_lib.sh calls $verl directly: a wrapper puts the binary's folder (as peer_lib.sh's run_verl
# does) and a ../lib beside it (tools/gpu_bundle.sh --unpack's out/gpu/lib) first on its library
# path, and only on its own (the peer's torch keeps the system's libraries).
verl=$work/verl
libs=$(dirname "$VERL")
[ -d "$libs/../lib" ] && libs="$libs:$(cd "$libs/../lib" && pwd)"
# shellcheck disable=SC2016  # the wrapper expands them
printf '#!/bin/sh\nLD_LIBRARY_PATH="%s:${LD_LIBRARY_PATH:-}" exec "%s" "$@"\n' "$libs" "$VERL" \
  > "$verl" && chmod +x "$verl"
python=$PYTHON
# shellcheck source=bench/grpo_lib.sh
. "$root/bench/grpo_lib.sh"
rank=${RANK:-64}
alpha=${ALPHA:-128}
steps=${STEPS:-1}
warmup=${WARMUP:-1}
util=${UTIL:-0.7}
out=${WORK:-$root/out/lora_gpu}
mkdir -p "$out" && out=$(cd "$out" && pwd)
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(qwen2.5-7b qwen3-8b)

# shape_config SHAPE: tests/fixtures/configs/SHAPE.json, or for qwen3-8b Qwen3-8B's config.json
# fields written to out/configs/qwen3-8b.json.
shape_config() {
  local f=$root/tests/fixtures/configs/$1.json
  if [ -f "$f" ]; then
    echo "$f"
    return 0
  fi
  [ "$1" = qwen3-8b ] || {
    echo "bench/lora_gpu.sh: no config for shape $1" >&2
    return 1
  }
  f=$root/out/configs/qwen3-8b.json
  mkdir -p "$(dirname "$f")"
  cat > "$f" <<'JSON'
{
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 12288,
  "max_position_embeddings": 40960,
  "model_type": "qwen3",
  "num_attention_heads": 32,
  "num_hidden_layers": 36,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "use_sliding_window": false,
  "vocab_size": 151936
}
JSON
  echo "$f"
}

# lora_model SHAPE: the benchmark's data (grpo_lib.sh) and a random-weight model of the shape
# (out/models/SHAPE), each made once; prints the model's directory.
lora_model() {
  local data=$root/out/grpo_bench model=$root/out/models/$1 cfg
  cfg=$(shape_config "$1") || return 1
  [ -f "$data/train.jsonl" ] || "$python" "$root/tools/bench/make_grpo_bench_data.py" "$data" >&2 || return 1
  if [ ! -f "$model/config.json" ]; then
    "$verl" init-model --config "$cfg" --tokenizer "$data/tokenizer" --out "$model" >&2 || return 1
  fi
  echo "$model"
}

common=(actor_rollout_ref.model.enable_gradient_checkpointing=true
  actor_rollout_ref.rollout.gpu_memory_utilization="$util")
lora=(actor_rollout_ref.model.lora_rank="$rank" actor_rollout_ref.model.lora_alpha="$alpha"
  actor_rollout_ref.model.target_modules=all-linear)
for shape in "${shapes[@]}"; do
  model=$(lora_model "$shape") || {
    echo "{\"bench\": \"lora_gpu\", \"shape\": \"$shape\", \"error\": \"no model\"}"
    continue
  }
  grpo_run "$out" "$shape.lora" configs/examples/grpo_qwen2_5_0_5b_h200.yaml \
    actor_rollout_ref.model.path="$model" trainer.default_local_dir="$out/run_$shape" \
    "${common[@]}" "${lora[@]}" --warmup "$warmup" --steps "$steps"
  if [ "${FULL:-0}" = 1 ]; then
    grpo_run "$out" "$shape.full" configs/examples/grpo_qwen2_5_0_5b_h200.yaml \
      actor_rollout_ref.model.path="$model" trainer.default_local_dir="$out/run_${shape}_full" \
      "${common[@]}" actor_rollout_ref.actor_offload_ratio=1.0 --warmup "$warmup" --steps "$steps"
  fi
  if [ "${HF:-1}" != 0 ]; then
    run "$shape.hf" "$PYTHON" "$root/tools/bench_grpo_hf.py" --shape "$shape" --lora "$rank" \
      --lora-alpha "$alpha" --ref --recompute --steps "$steps" --warmup "$warmup"
    cp "$work/$shape.hf.json" "$out/"
  fi
done

# One line per shape: ours (LoRA, and full-parameter with FULL=1) beside the peer, in GiB and s.
"$python" - "$out" "${shapes[@]}" <<'PY'
import json, os, sys
out, shapes = sys.argv[1], sys.argv[2:]
GIB = 1024.0 ** 3


def load(name):
    p = os.path.join(out, name + ".json")
    return json.load(open(p)) if os.path.exists(p) else None


def ours(v):
    if v is None or "error" in v:
        return v and {"error": v["error"]}
    return {"device": v.get("device_name"), "step_s": round(v["step_s"], 3),
            "phase_s": {k: round(s, 3) for k, s in v["phase_s"].items()},
            "peak_gib": {k: round(g, 2) for k, g in v["device_memory_peak_gib"].items()}}


def peer(v):
    if v is None or "error" in v:
        return v and {"error": v["error"]}
    return {"device": v.get("device_name"), "step_s": round(v["step_s"], 3),
            "phase_s": {k: round(s, 3) for k, s in v["phase_s"].items()},
            "peak_gib": {k: round(b / GIB, 2) for k, b in v["peak_memory_bytes"].items()},
            "used_gib": {k: round(b / GIB, 2) for k, b in v["device_used_bytes"].items()}}


for shape in shapes:
    row = {"bench": "lora_gpu", "shape": shape, "lora": ours(load(shape + ".lora"))}
    full, hf = load(shape + ".full"), load(shape + ".hf")
    if full is not None:
        row["full_offload"] = ours(full)
    if hf is not None:
        row["hf_peft"] = peer(hf)
        if "error" not in hf and row["lora"] and "error" not in row["lora"]:
            row["hf_step_over_ours"] = round(hf["step_s"] / row["lora"]["step_s"], 3)
    print(json.dumps(row))
PY
