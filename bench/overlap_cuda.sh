#!/usr/bin/env bash
# Stage overlap on a long-tailed workload on one GPU: `verl bench grpo-step` (the trainer's own
# step) at the workload of configs/examples/grpo_qwen2_5_0_5b_h200.yaml with response lengths drawn
# from a lognormal (mean 300, cap 1024: --length-dist, docs/overlap.md) on a model shape with random
# weights, one run per setting, then one JSON line: step time, the stages, perf/gpu_idle_share and
# the overlap of each pipelined pass with generation, each setting against its baseline.
#
#   bench/overlap_cuda.sh SHAPE [key=value ...]
#
# Settings (SETTINGS, default all ten): grpo (GRPO, switches off), grpo_serial (GRPO with
# actor_reward_parallel=false: rewards scored after generation), grpo_rm (GRPO scored by a reward
# model of the same shape, random weights: scoring overlaps generation), grpo_rm_serial (the same,
# actor_reward_parallel=false), grpo_pipe (+ token_level_pipeline),
# grpo_osp (+ one_step_off_policy: the next step's rollout beside this step's training),
# ppo (PPO with a critic, off), ppo_pipe (+ token_level_pipeline), ppo_critic (+ critic_actor_overlap),
# ppo_all (+ both).
# Environment: VERL, PYTHON, STEPS (default 2), WARMUP (default 1), LENGTH_DIST (default
# lognormal:300:1024), WORK (default out/overlap_cuda/SHAPE). From the 1.5B shape up, PPO's actor,
# critic and reference leave no KV cache under the config's gpu_memory_utilization=0.5: pass
# actor_rollout_ref.rollout.gpu_memory_utilization=0.8.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
shape=${1:?usage: bench/overlap_cuda.sh SHAPE [key=value ...]}
shift
verl=${VERL:-$root/build/bin/verl}
python=${PYTHON:-python3}
work=${WORK:-$root/out/overlap_cuda/$shape}
settings=${SETTINGS:-grpo grpo_serial grpo_rm grpo_rm_serial grpo_pipe grpo_osp ppo ppo_pipe ppo_critic ppo_all}
mkdir -p "$work" && work=$(cd "$work" && pwd)
# shellcheck source=bench/grpo_lib.sh
. "$root/bench/grpo_lib.sh"
model=$(grpo_model "$shape") || exit 1
long=(data.max_response_length=1024 actor_rollout_ref.rollout.response_length=1024)
ppo=(algorithm.adv_estimator=gae critic.model.path="$model" critic.ppo_max_token_len_per_gpu=8192
  critic.model.enable_gradient_checkpointing=false)
on=(trainer.token_level_pipeline=true)
rm=()
case " $settings " in
  # input_tokenizer=null: the policy's tokens are scored as they are (the reward model has the
  # policy's tokenizer; re-rendering random token ids as text and encoding it again with the
  # benchmark's merge-less tokenizer would make every response several times longer).
  *" grpo_rm"*) rm=(reward_model.enable=true reward_model.model.path="$(grpo_reward_model "$shape")"
    reward_model.model.input_tokenizer=null) || exit 1 ;;
esac
for s in $settings; do
  case $s in
    grpo) args=() ;;
    grpo_serial) args=(trainer.actor_reward_parallel=false) ;;
    grpo_rm) args=("${rm[@]}") ;;
    grpo_rm_serial) args=("${rm[@]}" trainer.actor_reward_parallel=false) ;;
    grpo_pipe) args=("${on[@]}") ;;
    grpo_osp) args=(trainer.one_step_off_policy=true) ;;
    ppo) args=("${ppo[@]}") ;;
    ppo_pipe) args=("${ppo[@]}" "${on[@]}") ;;
    ppo_critic) args=("${ppo[@]}" trainer.critic_actor_overlap=true) ;;
    ppo_all) args=("${ppo[@]}" "${on[@]}" trainer.critic_actor_overlap=true) ;;
    *) echo "unknown setting $s" >&2; exit 2 ;;
  esac
  grpo_run "$work" "$s" configs/examples/grpo_qwen2_5_0_5b_h200.yaml actor_rollout_ref.model.path="$model" \
    trainer.default_local_dir="$work/run_$s" "${long[@]}" "${args[@]}" "$@" \
    --length-dist "${LENGTH_DIST:-lognormal:300:1024}" --warmup "${WARMUP:-1}" --steps "${STEPS:-2}"
done
"$python" - "$work" "$shape" $settings <<'PY'
import json, os, sys
work, shape, settings = sys.argv[1], sys.argv[2], sys.argv[3:]
r = {s: json.load(open(os.path.join(work, s + ".json"))) for s in settings}
out = {"bench": "overlap_cuda", "shape": shape}
for s, v in r.items():
    if "error" in v:
        out[s] = {"error": v["error"]}
        continue
    m = v["last_step_metrics"]
    row = {"step_s": round(v["step_s"], 3), "phase_s": {k: round(x, 3) for k, x in v["phase_s"].items()},
           "gpu_idle_share": m.get("perf/gpu_idle_share"), "response_length_mean": m.get("response_length/mean"),
           "response_length_max": m.get("response_length/max")}
    for k in ("timing_s/gen_wait", "rollout/staleness"):
        if k in m:
            row[k.split("/", 1)[1]] = round(m[k], 3)
    for k, x in m.items():
        if k.endswith("_overlap_gen") or k.endswith("_overlap_actor"):
            row[k.split("/", 1)[1]] = round(x, 3)
    base = r.get("grpo_rm" if s == "grpo_rm_serial" else s.split("_")[0])
    if base is not None and "error" not in base and base is not v:
        row["step_vs_off"] = round(v["step_s"] / base["step_s"], 3)
    out[s] = row
print(json.dumps(out))
PY
