#!/usr/bin/env bash
# verl.cpp's GPU training step (`verl bench train`) beside its HuggingFace peer
# (tools/bench_train_hf.py, eager and torch.compile) on one shape with the same flags, each in its
# own process: prints the three JSON lines and one JSON line of ratios; exits 1 when a run failed
# (its line then carries "error").
#
#   bench/train_cuda.sh [SHAPE] [--batch N] [--seq N] [--steps N] [--warmup N] [--recompute]
#
# SHAPE: tiny, qwen2.5-0.5b (default), qwen2.5-1.5b, qwen2.5-7b. The flags go to all three runs.
# Environment: VERL and PYTHON (bench/peer_lib.sh), and
#   VERL_ARGS  extra flags for verl only (e.g. "--lm-head-chunk 2048")
#   HF_ARGS    extra flags for the peer only (e.g. "--precision amp" or "--loss logprob")
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
shape=qwen2.5-0.5b
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  shape=$1
  shift
fi
# shellcheck source=bench/peer_lib.sh
. "$root/bench/peer_lib.sh"

# shellcheck disable=SC2086  # VERL_ARGS / HF_ARGS are word lists on purpose
run_verl verl bench train --device cuda --shape "$shape" "$@" ${VERL_ARGS:-}
# shellcheck disable=SC2086
run hf_eager "$PYTHON" "$root/tools/bench_train_hf.py" --shape "$shape" "$@" ${HF_ARGS:-}
# shellcheck disable=SC2086
run hf_compile "$PYTHON" "$root/tools/bench_train_hf.py" --shape "$shape" --compile "$@" ${HF_ARGS:-}

"$PYTHON" - "$work" <<'EOF'
import json, os, sys
w = sys.argv[1]
r = {k: json.load(open(os.path.join(w, k + ".json"))) for k in ("verl", "hf_eager", "hf_compile")}
ok = {k: "error" not in v for k, v in r.items()}
v = r["verl"]
out = {"bench": "train_cuda_ratio", "shape": v.get("shape") or r["hf_eager"].get("shape"),
       "batch": v.get("batch"), "seq": v.get("seq"), "recompute": v.get("recompute")}
gib = float(1 << 30)
for k in r:
    out["tokens_per_s_" + k] = round(r[k]["tokens_per_s"], 1) if ok[k] else r[k]["error"]
    # device memory held, total - free, on both sides (torch's allocated peak is in its own line)
    used = r[k].get("device_used_peak_bytes")
    out["device_used_gib_" + k] = round(used / gib, 2) if ok[k] and used else None
for peer, name in (("hf_compile", "compile"), ("hf_eager", "eager")):
    if ok["verl"] and ok[peer]:
        out["ours_over_" + name] = round(v["tokens_per_s"] / r[peer]["tokens_per_s"], 3)
        if out["device_used_gib_verl"] and out["device_used_gib_" + peer]:
            out["memory_ours_over_" + name] = round(
                v["device_used_peak_bytes"] / r[peer]["device_used_peak_bytes"], 3)
print(json.dumps(out))
sys.exit(0 if all(ok.values()) else 1)  # every line above is printed either way
EOF
