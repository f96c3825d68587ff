#!/usr/bin/env bash
# The actor's offload by ratio in the real GRPO step on one GPU: `verl bench grpo-step` (the
# trainer's own step) at the workload of configs/examples/grpo_qwen2_5_0_5b_h200.yaml (32 prompts x
# 8, 256 + 256 tokens, reference policy with the k3 KL loss) on a model shape with random weights,
# one run per actor_offload_ratio, then one JSON line comparing them: step time and its cost
# against the first ratio that ran, each phase's peak device memory, the pinned host memory. A
# ratio whose state does not fit on the device ends with the trainer's error, kept in the line.
#
#   bench/offload_cuda.sh SHAPE [key=value ...]
#
# SHAPE: qwen2.5-0.5b, qwen2.5-1.5b or qwen2.5-7b (tests/fixtures/configs/SHAPE.json). The
# overrides go to every run. Environment: VERL (default build/bin/verl), PYTHON (default python3),
# RATIOS (default "0 0.3 1.0"), STEPS (default 2), WARMUP (default 1), WORK (default
# out/offload_cuda/SHAPE).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
shape=${1:?usage: bench/offload_cuda.sh SHAPE [key=value ...]}
shift
verl=${VERL:-$root/build/bin/verl}
python=${PYTHON:-python3}
work=${WORK:-$root/out/offload_cuda/$shape}
ratios=${RATIOS:-0 0.3 1.0}
mkdir -p "$work" && work=$(cd "$work" && pwd)
# shellcheck source=bench/grpo_lib.sh
. "$root/bench/grpo_lib.sh"
model=$(grpo_model "$shape") || exit 1
for r in $ratios; do
  grpo_run "$work" "$r" configs/examples/grpo_qwen2_5_0_5b_h200.yaml actor_rollout_ref.model.path="$model" \
    trainer.default_local_dir="$work/run_$r" actor_rollout_ref.actor_offload_ratio="$r" "$@" \
    --warmup "${WARMUP:-1}" --steps "${STEPS:-2}"
done
"$python" - "$work" "$shape" $ratios <<'PY'
import json, os, sys
work, shape, ratios = sys.argv[1], sys.argv[2], sys.argv[3:]
r = {x: json.load(open(os.path.join(work, x + ".json"))) for x in ratios}
base = next((v for v in r.values() if "error" not in v), None)
out = {"bench": "offload_cuda", "shape": shape}
for x, v in r.items():
    if "error" in v:
        out[x] = {"error": v["error"]}
        continue
    row = {"step_s": round(v["step_s"], 3), "phase_s": {k: round(s, 3) for k, s in v["phase_s"].items()},
           "peak_gib": {k: round(g, 2) for k, g in v["device_memory_peak_gib"].items()},
           "host_pinned_gib": round(v.get("host_pinned_gib", 0.0), 2)}
    if base is not None:
        row["step_vs_first"] = round(v["step_s"] / base["step_s"], 3)
    out[x] = row
print(json.dumps(out))
PY
