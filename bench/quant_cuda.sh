#!/usr/bin/env bash
# The quantised reward model on one GPU (docs/reward_model.md, "Quantisation"):
#   1. `verl bench quant-linear`: each linear matrix of the 1.5B and 7B shapes at T in
#      {1, 8, 32, 128, 512, 2048, 8192}: bf16 cuBLASLt, the fused int8/int4 kernel, dequantise +
#      cuBLASLt; one JSON line per (matrix, T, path) with ms, GB/s, TFLOP/s and the ratio to bf16.
#   2. `verl bench score`: a whole scoring pass (SEQS sequences of LEN tokens) of the 1.5B and 7B
#      shapes as reward models with random weights (no checkpoint), bf16, int8 and int4 (groups of
#      128, round to nearest): seconds, tokens/s, the model's device memory and the pass's peak.
# Then one summary line per shape: for each matrix the crossover T (the smallest T where the fused
# kernel is no faster than dequantise + cuBLASLt), and the score runs side by side.
#
#   bench/quant_cuda.sh
#
# Environment: VERL (default build/bin/verl), PYTHON (default python3), SHAPES (default
# "qwen2.5-1.5b qwen2.5-7b"), SEQS (default 256), LEN (default 512), WORK (default out/quant_cuda).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
verl=${VERL:-$root/build/bin/verl}
python=${PYTHON:-python3}
shapes=${SHAPES:-qwen2.5-1.5b qwen2.5-7b}
work=${WORK:-$root/out/quant_cuda}
mkdir -p "$work"
# shellcheck disable=SC2086
"$verl" bench quant-linear --shapes $shapes | tee "$work/quant_linear.jsonl"
: >"$work/score.jsonl"
for s in $shapes; do
  for q in none int8 int4; do
    "$verl" bench score --shape "$s" --quantize "$q" --seqs "${SEQS:-256}" --len "${LEN:-512}" |
      tee -a "$work/score.jsonl" || echo "{\"bench\": \"score\", \"shape\": \"$s\", \"quantize\": \"$q\", \"error\": \"failed\"}" >>"$work/score.jsonl"
  done
done
"$python" - "$work" <<'PY'
import json, os, sys
from collections import defaultdict
work = sys.argv[1]
lin = [json.loads(l) for l in open(os.path.join(work, "quant_linear.jsonl")) if l.startswith("{")]
by = defaultdict(dict)
for r in lin:
    by[(r["shape"], r["matrix"], r["bits"] if r["path"] != "bf16_cublaslt" else 16)][(r["path"], r["T"])] = r["ms"]
cross = defaultdict(dict)
for (shape, matrix, bits), v in by.items():
    if bits == 16:
        continue
    ts = sorted({t for (_, t) in v})
    slower = [t for t in ts if v[("fused", t)] >= v[("dequant_cublaslt", t)]]
    cross[shape][f"{matrix}_int{bits}"] = slower[0] if slower else None
score = [json.loads(l) for l in open(os.path.join(work, "score.jsonl")) if l.startswith("{")]
for shape in sorted({r["shape"] for r in lin} | {r["shape"] for r in score}):
    out = {"bench": "quant_cuda", "shape": shape, "fused_no_faster_from_T": cross.get(shape, {})}
    for r in score:
        if r["shape"] == shape:
            out[r["quantize"]] = {k: (round(r[k], 3) if isinstance(r[k], float) else r[k])
                                  for k in ("seconds", "tokens_per_second", "model_device_gib", "device_peak_gib", "error")
                                  if k in r}
    print(json.dumps(out))
PY
