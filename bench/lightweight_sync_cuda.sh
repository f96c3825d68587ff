#!/usr/bin/env bash
# LightweightSync against the dense all-reduce in the real GRPO step on GPUs: `verl bench
# grpo-step` (it runs the trainer's own step) at the Qwen2.5-0.5B workload of
# configs/examples/grpo_qwen2_5_0_5b_h200.yaml, under `mpirun -np NP` with NCCL, one line per
# gradient-sync setting, then one line of ratios against the dense run (step time, sync time and
# gradient bytes per step). The per-GPU batch is fixed (32 prompts x 8 a rank), so NP > 1 is weak
# scaling.
#
#   bench/lightweight_sync_cuda.sh [NP] [key=value ...]
#
# NP: ranks, one GPU each (default 1; with one rank the codec runs and the all-gather is a copy,
# which measures the codec's cost in the step). The overrides go to every run. Environment: VERL
# (default build/bin/verl), PYTHON (default python3), SETTINGS (default "dense 0.1:int8 0.05:int8
# 0.01:int8"), STEPS (default 3), WORK (default out/lightweight_sync_cuda).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
np=1
if [ $# -gt 0 ] && [ "${1#*=}" = "$1" ]; then
  np=$1
  shift
fi
verl=${VERL:-$root/build/bin/verl}
python=${PYTHON:-python3}
work=${WORK:-$root/out/lightweight_sync_cuda}
mkdir -p "$work"
data=$root/out/grpo_bench
if [ ! -f "$data/model/config.json" ]; then
  "$python" "$root/tools/bench/make_grpo_bench_data.py" "$data" || exit 1
  "$verl" init-model --config "$root/tests/fixtures/configs/qwen2.5-0.5b.json" \
    --tokenizer "$data/tokenizer" --out "$data/model" || exit 1
fi
cd "$root" || exit 1
export NCCL_NVLS_ENABLE=0
for s in ${SETTINGS:-dense 0.1:int8 0.05:int8 0.01:int8}; do
  name=${s/:/_}
  args=(trainer.nnodes=1 trainer.n_gpus_per_node="$np" trainer.default_local_dir="$work/run_$name"
    data.train_batch_size=$((32 * np)) actor_rollout_ref.actor.ppo_mini_batch_size=$((32 * np)))
  if [ "$s" != dense ]; then
    args+=(trainer.gradient_sync_method=lightweight trainer.lightweight_sync_config.top_k="${s%%:*}"
      trainer.lightweight_sync_config.compression_dtype="${s#*:}")
  fi
  mpirun --allow-run-as-root -np "$np" -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH "$verl" bench grpo-step \
    configs/examples/grpo_qwen2_5_0_5b_h200.yaml "${args[@]}" "$@" --warmup 1 --steps "${STEPS:-3}" \
    > "$work/$name.out" 2> "$work/$name.err"
  rc=$?
  line=$(grep -m1 '^{"bench"' "$work/$name.out")
  if [ $rc -ne 0 ] || [ -z "$line" ]; then
    line="{\"bench\": \"grpo_step\", \"setting\": \"$s\", \"error\": \"exit $rc, see $work/$name.err\"}"
  fi
  echo "$line" > "$work/$name.json"
  echo "$line"
done
"$python" - "$work" "$np" ${SETTINGS:-dense 0.1:int8 0.05:int8 0.01:int8} <<'EOF'
import json, os, sys
work, np, settings = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
r = {s: json.load(open(os.path.join(work, s.replace(":", "_") + ".json"))) for s in settings}
d = r.get("dense")
out = {"bench": "lightweight_sync_cuda", "ranks": np}
for s, v in r.items():
    if "error" in v:
        out[s] = v["error"]
        continue
    row = {"step_s": round(v["step_s"], 4), "grad_sync_s": round(v["phase_s"].get("grad_sync", 0.0), 4),
           "grad_sync_bytes": v["grad_sync_bytes"], "grad_sync_bytes_dense": v["grad_sync_bytes_dense"]}
    if d and "error" not in d and s != "dense":
        row["step_ratio_vs_dense"] = round(v["step_s"] / d["step_s"], 3)
        if v["grad_sync_bytes"] > 0:
            row["bytes_ratio_vs_dense"] = round(v["grad_sync_bytes_dense"] / v["grad_sync_bytes"], 1)
    out[s] = row
print(json.dumps(out))
sys.exit(1 if any("error" in v for v in r.values()) else 0)
EOF
