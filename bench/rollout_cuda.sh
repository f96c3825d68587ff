#!/usr/bin/env bash
# verl.cpp's GPU rollout (`verl bench rollout`) beside HF transformers' `generate`
# (tools/bench_rollout_hf.py) on the same workload, each in its own process: ours in each numerics
# numerics mode (the default, which matches the trainer's log-probs; --no-match-trainer, the split-K
# kernels; --batch-invariant), then the peer; prints their JSON
# lines and one JSON line of ratios; exits 1 when a run failed (its line then carries "error").
#
#   bench/rollout_cuda.sh [SHAPE] [--prompts N] [--n N] [--prompt-len N] [--new-tokens N]
#                         [--temperature T]
#
# SHAPE: qwen2.5-0.5b (default), qwen2.5-1.5b. The flags go to every run.
# Environment: VERL and PYTHON (bench/peer_lib.sh), and
#   MODES      which of ours to run (default "default split_k batch_invariant")
#   VERL_ARGS  extra flags for verl only (e.g. "--max-num-batched-tokens 16384")
#   HF_ARGS    extra flags for the peer only (e.g. "--runs 1")
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
shape=qwen2.5-0.5b
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  shape=$1
  shift
fi
# shellcheck source=bench/peer_lib.sh
. "$root/bench/peer_lib.sh"

names=()
for mode in ${MODES:-default split_k batch_invariant}; do
  case $mode in
    default) flag= ;;
    split_k) flag=--no-match-trainer ;;
    batch_invariant) flag=--batch-invariant ;;
    *) echo "rollout_cuda.sh: MODES: unknown mode '$mode' (default, split_k, batch_invariant)" >&2
       exit 2 ;;
  esac
  # shellcheck disable=SC2086  # flag / VERL_ARGS are word lists on purpose
  run_verl "verl_$mode" bench rollout --shape "$shape" $flag "$@" ${VERL_ARGS:-}
  names+=("verl_$mode")
done
# shellcheck disable=SC2086
run hf "$PYTHON" "$root/tools/bench_rollout_hf.py" --shape "$shape" "$@" ${HF_ARGS:-}
names+=(hf)

"$PYTHON" - "$work" "${names[@]}" <<'EOF'
import json, os, sys
w, names = sys.argv[1], sys.argv[2:]
r = {k: json.load(open(os.path.join(w, k + ".json"))) for k in names}
ok = {k: "error" not in v for k, v in r.items()}
first = next((v for v in r.values() if "error" not in v), {})
out = {"bench": "rollout_cuda_ratio", "shape": first.get("shape") or first.get("model"),
       "prompts": first.get("prompts"), "n": first.get("n"),
       "prompt_len": first.get("prompt_len"), "new_tokens": first.get("new_tokens")}
for k in names:
    out["tokens_per_s_" + k] = round(r[k]["output_tokens_per_s"], 1) if ok[k] else r[k]["error"]
for k in names:
    if k != "hf" and ok[k] and ok["hf"]:
        out[k + "_over_hf"] = round(r[k]["output_tokens_per_s"] / r["hf"]["output_tokens_per_s"], 2)
print(json.dumps(out))
sys.exit(0 if all(ok.values()) else 1)  # every line above is printed either way
EOF
